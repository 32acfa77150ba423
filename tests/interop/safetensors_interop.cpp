// The flux-cpp half of the PyTorch interoperability test (driven by torch_interop.py):
//   safetensors_interop DIR
// loads DIR/torch_model.safetensors (nn.Sequential(Linear(4, 8), ReLU(), Linear(8, 3)) written by
// PyTorch) into Chain(Dense(4, 8), relu, Dense(8, 3)) on every test device, checks its outputs on
// DIR/torch_io.safetensors against PyTorch's (<= 1e-5), re-saves DIR/torch_dtypes.safetensors as
// DIR/flux_dtypes.safetensors, and writes a model of its own (flux_model) with its outputs (flux_io)
// for PyTorch to check.
#include <cmath>
#include <cstdio>
#include <string>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;

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
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
