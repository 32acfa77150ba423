// The flux-cpp half of the convolutional PyTorch interop tests (driven by resnet_interop.py):
//   resnet_interop resnet DIR   loads DIR/resnet18.safetensors (torchvision's resnet18 state_dict,
//                               unchanged) into models::ResNet18 on every test device, in testmode,
//                               and checks its logits for DIR/resnet18_io.safetensors' batch against
//                               PyTorch's: max abs diff <= 1e-4 (also reported against float64).
//   resnet_interop cnn DIR      trains a small CNN for a few Adam steps on the CPU, saves it as
//                               DIR/flux_cnn.safetensors and its eval outputs on a fixed batch as
//                               DIR/flux_cnn_io.safetensors, for PyTorch to load and check.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "flux/flux.hpp"
#include "flux/models/resnet.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {

double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - want[i]));
  return err;
}

int check_resnet(const std::string& dir) {
  TensorMap io = load_state(dir + "/resnet18_io.safetensors");
  const Tensor x = io.at("x");
  const std::vector<double> want32 = io.at("logits").to_vector<double>(), want64 = io.at("logits64").to_vector<double>();
  double worst = 0;
  for (const Device& d : flux::testing::test_devices()) {
    auto net = models::ResNet18() | d;
    if (d == flux::testing::test_devices().front())
      std::printf("flux ResNet18: %zu state tensors, %lld parameters\n", state(net).size(),
                  (long long)parameter_count(net));
    load(dir + "/resnet18.safetensors", net);
    testmode(net);
    std::vector<float> got = net(to(x, d)).to_vector<float>();
    double err32 = max_abs_diff(got, want32), err64 = max_abs_diff(got, want64);
    std::printf("torch -> flux ResNet-18 on %s: logits %s, max |flux - torch f32| = %.3g, |flux - torch f64| = %.3g\n",
                to_string(d).c_str(), to_string(net(to(x, d)).shape()).c_str(), err32, err64);
    worst = std::max(worst, err32);
  }
  if (!(worst <= 1e-4)) {
    std::fprintf(stderr, "FAIL: flux's ResNet-18 logits differ from torchvision's by %.3g (> 1e-4)\n", worst);
    return 1;
  }
  return 0;
}

/// The flux twin of resnet_interop.py's small_cnn(): relu stands alone so the indices match nn.Sequential's.
auto small_cnn() {
  return Chain(Conv({3, 3}, 3, 8, {.pad = 1}), BatchNorm(8), relu, MaxPool({2, 2}),            // (N, 8, 8, 8)
               Conv({3, 3}, 8, 16, {.stride = 2, .pad = 1}), BatchNorm(16), relu,             // (N, 16, 4, 4)
               AdaptiveMeanPool({2, 2}), flatten, Dropout(0.5), Dense(64, 5));                // (N, 5)
}

int write_cnn(const std::string& dir) {
  seed(7);
  auto model = small_cnn();
  std::vector<int64_t> labels(32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 5);
  Tensor X = randn({32, 3, 16, 16}), y = onehot(Tensor(labels, Shape{32}), 5);
  auto opt_state = optimisers::setup(optimisers::Adam(1e-2), model);
  float first = 0, last = 0;
  constexpr int steps = 8;
  for (int step = 0; step < steps; ++step) {
    Tensor xb = X.slice((step % 4) * 8, (step % 4) * 8 + 8), yb = y.slice((step % 4) * 8, (step % 4) * 8 + 8);
    auto [loss, grads] = withgradient([&](auto& m) { return logitcrossentropy(m(xb), yb); }, model);
    optimisers::update(opt_state, model, grads);
    (step == 0 ? first : last) = loss.item<float>();
  }
  std::printf("flux small CNN: %d Adam steps, loss %.4f -> %.4f\n", steps, first, last);
  Tensor x = randn({4, 3, 16, 16});
  save(dir + "/flux_cnn.safetensors", model, {{"written_by", "flux-cpp"}});
  save_state(dir + "/flux_cnn_io.safetensors", {{"x", x}, {"y", model(x)}});  // inference: running statistics
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "resnet" && mode != "cnn") {
    std::fprintf(stderr, "usage: %s resnet|cnn DIR\n", argv[0]);
    return 2;
  }
  try {
    return mode == "resnet" ? check_resnet(argv[2]) : write_cnn(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
