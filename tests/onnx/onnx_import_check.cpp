// Imports the ONNX files tests/onnx/torch_models.py exported from PyTorch and checks them
// (tests/onnx.cmake, onnx_import.torch):
//   - onnx::load(file) | dev reproduces PyTorch's output y on x within 1e-5 (abs + rel) on every test
//     device (the CPU and OpenCL:0 on PoCL where built);
//   - resnet18: one SGD step (lr 0.1) on sum(net(x) * seed_grad) gives PyTorch's parameters after its
//     same step within 1e-5 (names: the file's initialisers, torch's named_parameters);
//   - round trip: the imported model is exported again with onnx::save into ROUNDTRIP_DIR with its
//     outputs at batch 2 and 3, for ort_check.py (ONNX Runtime) to compare.
//     onnx_import_check DIR ROUNDTRIP_DIR
#include <cmath>
#include <cstdio>
#include <string>

#include "flux/flux.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {
int failures = 0;

void compare(const std::string& what, const Tensor& got, const Tensor& want, double tol = 1e-5) {
  if (got.shape() != want.shape()) {
    std::printf("FAIL %s: shape %s, PyTorch %s\n", what.c_str(), to_string(got.shape()).c_str(), to_string(want.shape()).c_str());
    ++failures;
    return;
  }
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0, excess = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double e = std::abs(g[i] - w[i]);
    worst = std::max(worst, e);
    excess = std::max(excess, e - (tol + tol * std::abs(w[i])));
  }
  bool ok = excess <= 0 && std::isfinite(worst);
  if (!ok) ++failures;
  std::printf("%s %s: max |flux - PyTorch| %.3g\n", ok ? "ok  " : "FAIL", what.c_str(), worst);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: onnx_import_check DIR ROUNDTRIP_DIR\n");
    return 2;
  }
  const std::string dir = argv[1], rt = argv[2];
  for (const char* name : {"resnet18", "mobilenet_v2", "lstm", "gru", "transformer", "transformer_gelu"}) {
    TensorMap ref = load_state(dir + "/" + name + ".safetensors");
    onnx::Model net = onnx::load(dir + "/" + name + ".onnx");
    std::printf("%s\n", net.summary().c_str());
    for (const Device& dev : flux::testing::test_devices()) {
      auto m = net | dev;
      compare(std::string(name) + " on " + to_string(dev), to(m(to(ref["x"], dev)), Device()), ref["y"]);
    }
    // Round trip: export the imported model (traced on the CPU) for ONNX Runtime.
    Tensor x2 = ref["x"], x3 = concat({x2, x2.slice(0, 1)}, 0);
    onnx::save(rt + "/" + std::string(name) + ".onnx", net, x2);
    save_state(rt + "/" + std::string(name) + ".safetensors", {{"x2", x2}, {"y2", net(x2)}, {"x3", x3}, {"y3", net(x3)}});
    if (std::string(name) == "resnet18") {
      auto opt = optimisers::setup(optimisers::Descent(0.1), net);
      Tensor w = ref["seed_grad"];
      auto [loss, grads] = withgradient([&](const onnx::Model& m) { return sum(m(ref["x"]) * w); }, net);
      optimisers::update(opt, net, grads);
      int checked = 0;
      for (const auto& [pname, p] : net.parameters) {
        auto it = ref.find("after." + pname);
        if (it == ref.end()) continue;
        compare("resnet18 SGD step: " + pname, p, it->second);
        ++checked;
      }
      if (checked != 62) {
        std::printf("FAIL resnet18 SGD step: %d parameters matched by name, expected 62\n", checked);
        ++failures;
      }
    }
  }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
