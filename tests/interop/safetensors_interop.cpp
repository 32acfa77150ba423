// The flux-cpp half of the PyTorch interoperability test (driven by torch_interop.py):
//   safetensors_interop DIR
// loads DIR/torch_model.safetensors (nn.Sequential(Linear(4, 8), ReLU(), Linear(8, 3)) written by
// PyTorch) into Chain(Dense(4, 8), relu, Dense(8, 3)) on every test device, checks its outputs on
// DIR/torch_io.safetensors against PyTorch's (<= 1e-5), re-saves DIR/torch_dtypes.safetensors as
// DIR/flux_dtypes.safetensors, and writes a model of its own (flux_model) with its outputs (flux_io)
// for PyTorch to check. Low precision: PyTorch's bf16/f16 state dicts (torch_model_{bf16,f16}) load
// into flux models of that dtype bit for bit (re-saved as flux_from_torch_*), the float32 file into a
// bf16 model is an error unless LoadOptions{.convert_dtypes} asks, and converting gives PyTorch's
// rounding bit for bit; the bf16 model's outputs match PyTorch's (torch_io_bf16); flux's own model is
// saved as bf16/f16 (flux_model_*) with the bf16 outputs (flux_io_bf16).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {

template <class M> M cast_model(const M& m, DType t) {
  return fmap([&](const Tensor& x) { return is_floating(x.dtype()) ? x.cast(t) : x; }, m);
}

std::string bytes_of(const Tensor& t) {
  Tensor host = to(t, Device());
  std::string out(host.nbytes(), '\0');
  if (host.nbytes()) std::memcpy(out.data(), host.buffer().handle, host.nbytes());
  return out;
}

/// Fails unless every tensor of `model` has the bits of the same-named tensor in `path`.
template <class M> void expect_file_bits(const M& model, const std::string& path, const std::string& what) {
  TensorMap file = load_state(path);
  for (const auto& [name, t] : pytorch_state(model))
    if (bytes_of(t) != bytes_of(file.at(name)))
      throw std::runtime_error(what + ": '" + name + "' differs from " + path);
}

/// PyTorch's bf16/f16 models through flux, on every device; returns the worst bf16 output error.
double low_precision_from_torch(const std::string& dir) {
  using Mlp = decltype(Chain(Dense(4, 8), relu, Dense(8, 3)));
  double worst = 0;
  for (const Device& d : flux::testing::test_devices()) {
    for (auto [t, tag] : {std::pair{DType::bf16, "bf16"}, std::pair{DType::f16, "f16"}}) {
      const std::string file = dir + "/torch_model_" + tag + ".safetensors";
      Mlp model = cast_model(Chain(Dense(4, 8), relu, Dense(8, 3)), t) | d;
      load(file, model);
      expect_file_bits(model, file, std::string("load of PyTorch's ") + tag + " state dict on " + to_string(d));
      if (d.is_cpu()) save(dir + "/flux_from_torch_" + tag + ".safetensors", model);

      // Float32 file into a low-precision model: an error by default, PyTorch's rounding when asked.
      Mlp converted = cast_model(Chain(Dense(4, 8), relu, Dense(8, 3)), t) | d;
      std::string message;
      try {
        load(dir + "/torch_model.safetensors", converted);
      } catch (const Error& e) {
        message = e.what();
      }
      const std::string want = std::string("'0.weight' is Float32 in the file but ") + dtype_name(t) + " in the model";
      if (message.find(want) == std::string::npos || message.find(".convert_dtypes = true") == std::string::npos)
        throw std::runtime_error("loading Float32 into a " + std::string(tag) + " model: expected an error naming " +
                                 want + " and .convert_dtypes, got: " + (message.empty() ? "no error" : message));
      load(dir + "/torch_model.safetensors", converted, {.convert_dtypes = true});
      expect_file_bits(converted, file, std::string("Float32 converted to ") + tag + " on " + to_string(d));

      if (t == DType::bf16) {
        TensorMap io = load_state(dir + "/torch_io_bf16.safetensors");
        std::vector<double> got = model(to(io.at("x"), d)).to_vector<double>(), want_y = io.at("y").to_vector<double>();
        double err = 0;
        for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want_y[i]));
        std::printf("torch bf16 -> flux bf16 on %s: max |flux - torch| = %.3g\n", to_string(d).c_str(), err);
        worst = std::max(worst, err);
      }
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    TensorMap io = load_state(dir + "/torch_io.safetensors");
    const Tensor x = io.at("x"), y = io.at("y");
    std::vector<float> want = y.to_vector<float>();
    double worst = 0;
    for (const Device& d : flux::testing::test_devices()) {
      auto model = Chain(Dense(4, 8), relu, Dense(8, 3)) | d;
      load(dir + "/torch_model.safetensors", model);
      std::vector<float> got = model(to(x, d)).to_vector<float>();
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - want[i])));
      std::printf("torch -> flux on %s: max |flux - torch| = %.3g\n", to_string(d).c_str(), err);
      worst = std::max(worst, err);
    }
    if (!(worst <= 1e-5)) {
      std::fprintf(stderr, "FAIL: flux's outputs differ from PyTorch's by %.3g (> 1e-5)\n", worst);
      return 1;
    }

    save_state(dir + "/flux_dtypes.safetensors", load_state(dir + "/torch_dtypes.safetensors"),
               load_metadata(dir + "/torch_dtypes.safetensors"));

    seed(2024);
    auto own = Chain(Dense(4, 8), relu, Dense(8, 3));
    save(dir + "/flux_model.safetensors", own, {{"written_by", "flux-cpp"}});
    save_state(dir + "/flux_io.safetensors", {{"x", x}, {"y", own(x)}});

    const double worst16 = low_precision_from_torch(dir);
    if (!(worst16 <= 0.05)) {
      std::fprintf(stderr, "FAIL: flux's bf16 outputs differ from PyTorch's by %.3g (> 0.05)\n", worst16);
      return 1;
    }
    for (auto [t, tag] : {std::pair{DType::bf16, "bf16"}, std::pair{DType::f16, "f16"}})
      save(dir + "/flux_model_" + tag + ".safetensors", cast_model(own, t), {{"written_by", "flux-cpp"}});
    auto own16 = cast_model(own, DType::bf16);
    Tensor x16 = x.cast(DType::bf16);
    save_state(dir + "/flux_io_bf16.safetensors", {{"x", x16}, {"y", own16(x16)}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
