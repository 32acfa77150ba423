// Imports every DIR/NAME.onnx that has a DIR/NAME.safetensors (input.K, output.K: the oracle's
// outputs, from ONNX Runtime or PyTorch) and compares flux's outputs with them on every test device
// (the CPU and OpenCL:0 on PoCL where built), within TOL times the output's scale (its largest
// magnitude, at least 1): float32 rounding grows with the values, not with each element. One line per case
// and device with the largest difference; exit status 1 when any case fails.
//     onnx_compare DIR [TOL]     (tests/onnx.cmake: onnx_import.ops, onnx_import.torch113, ...)
#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flux/flux.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: onnx_compare DIR [TOL]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const double tol = argc > 2 ? std::atof(argv[2]) : 1e-5;
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string f = e->d_name;
      if (f.size() > 5 && f.substr(f.size() - 5) == ".onnx") names.push_back(f.substr(0, f.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    std::printf("FAIL: no .onnx files in %s\n", dir.c_str());
    return 1;
  }
  int failures = 0, cases = 0;
  for (const std::string& name : names) {
    try {
      TensorMap ref = load_state(dir + "/" + name + ".safetensors");
      onnx::Model net = onnx::load(dir + "/" + name + ".onnx");
      std::vector<Tensor> inputs, want;
      for (size_t k = 0; ref.count("input." + std::to_string(k)); ++k) inputs.push_back(ref["input." + std::to_string(k)]);
      for (size_t k = 0; ref.count("output." + std::to_string(k)); ++k) want.push_back(ref["output." + std::to_string(k)]);
      for (const Device& dev : flux::testing::test_devices()) {
        ++cases;
        auto m = net | dev;
        std::vector<Tensor> xs;
        for (const Tensor& x : inputs) xs.push_back(to(x, dev));
        std::vector<Tensor> got = m.forward(xs);
        double worst = 0, out_scale = 0;
        std::string why;
        for (size_t k = 0; k < want.size() && why.empty(); ++k) {
          if (k >= got.size() || got[k].shape() != want[k].shape()) {
            why = "output " + std::to_string(k) + " shape " + (k < got.size() ? to_string(got[k].shape()) : "missing") +
                  ", expected " + to_string(want[k].shape());
            break;
          }
          std::vector<double> g = to(got[k], Device()).to_vector<double>(), w = want[k].to_vector<double>();
          double scale = 1;  // the tolerance is relative to the output's scale (its largest magnitude, at least 1)
          for (double v : w) scale = std::max(scale, std::abs(v)), out_scale = std::max(out_scale, std::abs(v));
          for (size_t i = 0; i < g.size(); ++i) {
            const double e = std::abs(g[i] - w[i]);
            worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
            if (!(e <= tol * scale)) why = "output " + std::to_string(k) + " differs beyond " + std::to_string(tol) + " x its scale " + std::to_string(scale);
          }
        }
        if (!why.empty()) ++failures;
        std::printf("%s %s on %s: max difference %.3g (largest output %.3g)%s%s\n", why.empty() ? "ok  " : "FAIL", name.c_str(),
                    to_string(dev).c_str(), worst, out_scale, why.empty() ? "" : "; ", why.c_str());
        // FLUX_ONNX_NO_STEP=1 leaves the step out (minutes on the largest models).
        if (!ref.count("seed_grad") || !why.empty() || std::getenv("FLUX_ONNX_NO_STEP")) continue;
        // Fine-tuning: one SGD step as PyTorch took it, then the output again. Reported, not failed:
        // files whose exporter folded BatchNorm into the convolutions cannot match (FINE_TUNE_MISMATCH).
        Tensor w = to(ref["seed_grad"], dev);
        auto tuned = onnx::load(dir + "/" + name + ".onnx") | dev;  // its own tensors: m shares net's
        auto opt = optimisers::setup(optimisers::Descent(0.01), tuned);
        auto [loss, grads] = withgradient([&](const onnx::Model& mm) { return sum(mm.forward(xs)[0] * w); }, tuned);
        optimisers::update(opt, tuned, grads);
        std::vector<double> g = to(tuned.forward(xs)[0], Device()).to_vector<double>(), a = ref["output_after_step.0"].to_vector<double>();
        double step_worst = 0, scale = 0;
        bool finite = g.size() == a.size();
        for (size_t i = 0; i < g.size() && i < a.size(); ++i) {
          finite = finite && std::isfinite(a[i]) && std::isfinite(g[i]);
          step_worst = std::max(step_worst, std::abs(g[i] - a[i])), scale = std::max(scale, std::abs(a[i]));
        }
        std::printf("%s %s on %s: after one SGD step, max difference %.3g (output scale %.3g)\n",
                    !finite ? "FINE_TUNE_NOT_FINITE" : step_worst <= 1e-4 * std::max(1.0, scale) ? "fine-tunes" : "FINE_TUNE_MISMATCH", name.c_str(), to_string(dev).c_str(),
                    step_worst, scale);
      }
    } catch (const Error& e) {
      ++failures, ++cases;
      std::printf("FAIL %s: %s\n", name.c_str(), e.what());
    }
  }
  std::printf("%d of %d case-device pairs failed\n", failures, cases);
  return failures ? 1 : 0;
}
