// Compares flux's BatchNorm with PyTorch's results written by batchnorm_interop.py: outputs of two
// training steps and one inference step, the running statistics and num_batches_tracked, and the
// training-mode gradients of sum(y * r) for x, weight and bias; then PyTorch's own state_dict file
// loaded with load(). Exit status 0 when all match.
#include <cstdio>
#include <string>

#include "flux/flux.hpp"

using namespace flux;

namespace {
int failures = 0;
void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double tol) {
  double diff = max(abs(got.f64() - want.f64())).item<double>();
  double scale = std::max(1.0, max(abs(want.f64())).item<double>());
  bool ok = got.shape() == want.shape() && diff <= tol * scale;
  std::printf("%s %-28s max abs diff %.3g (scale %.3g)\n", ok ? "ok  " : "FAIL", what.c_str(), diff, scale);
  failures += !ok;
}

void check(const TensorMap& file, const std::string& name, double eps, double momentum) {
  auto at = [&](const std::string& k) { return file.at(name + "." + k); };
  int64_t c = at("weight").numel();
  auto fresh = [&] {
    BatchNorm bn(c, {.eps = eps, .momentum = momentum});
    copy_(bn.weight, at("weight"));
    copy_(bn.bias, at("bias"));
    return bn;
  };
  BatchNorm bn = fresh();
  Tensor r = at("r");
  // training: automatic mode inside gradient, the first step also gives the gradients
  auto [gm, gx] = gradient([&](const BatchNorm& m, const Tensor& x) { return sum(m(x) * r); }, bn, at("x1"));
  expect_close(name + " dx", gx, at("dx"), 1e-5);
  expect_close(name + " dweight", gm.weight, at("dweight"), 1e-5);
  expect_close(name + " dbias", gm.bias, at("dbias"), 1e-5);
  BatchNorm again = fresh();
  expect_close(name + " y1 (training)", trainmode(again)(at("x1")), at("y1"), 1e-5);
  expect_close(name + " y2 (training)", again(at("x2")), at("y2"), 1e-5);
  expect_close(name + " running_mean", again.running_mean, at("running_mean"), 1e-6);
  expect_close(name + " running_var", again.running_var, at("running_var"), 1e-6);
  long long steps = again.num_batches_tracked.item<int64_t>(), want = at("num_batches_tracked").item<int64_t>();
  std::printf("%s %-28s %lld (PyTorch %lld)\n", steps == want ? "ok  " : "FAIL", (name + " num_batches_tracked").c_str(),
              steps, want);
  failures += steps != want;
  expect_close(name + " y3 (inference)", automode(again)(at("x3")), at("y3"), 1e-5);
}

// PyTorch's state_dict file loads with load(): the same running statistics and inference output.
void check_state_file(const TensorMap& file, const std::string& state_path) {
  BatchNorm bn(3);
  load(state_path, bn);
  expect_close("state file running_mean", bn.running_mean, file.at("bn2d.running_mean"), 0);
  expect_close("state file running_var", bn.running_var, file.at("bn2d.running_var"), 0);
  bool ok = bn.num_batches_tracked.item<int64_t>() == 2;
  std::printf("%s %-28s %lld\n", ok ? "ok  " : "FAIL", "state file num_batches", (long long)bn.num_batches_tracked.item<int64_t>());
  failures += !ok;
  expect_close("state file y3 (inference)", bn(file.at("bn2d.x3")), file.at("bn2d.y3"), 1e-5);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: batchnorm_interop RESULTS_FILE STATE_FILE\n");
    return 2;
  }
  try {
    TensorMap file = load_state(argv[1]);
    check(file, "bn2d", 1e-5, 0.1);
    check(file, "bn1d", 1e-3, 0.3);
    check_state_file(file, argv[2]);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures ? "FAILED" : "all match PyTorch");
  return failures ? 1 : 0;
}
