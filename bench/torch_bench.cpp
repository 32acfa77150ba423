// The same cases as flux_bench.cpp, written as a LibTorch C++ user would write them.
// Usage: torch_bench CASE THREADS   CASE: seed | mnist | wide | overhead | infer
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_common.hpp"

namespace {

namespace nn = torch::nn;

template <class Model, class Loss>
double train_steps_per_s(Model& model, const torch::Tensor& x, const torch::Tensor& y, Loss loss, int warmup,
                         double seconds) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto step = [&] {
    opt.zero_grad();
    torch::Tensor l = loss(model->forward(x), y);
    l.backward();
    opt.step();
    return l.item<float>();
  };
  for (int i = 0; i < warmup; ++i) step();
  return bench::rate(step, seconds);
}

void seed_case() {
  nn::Sequential model(nn::Linear(10, 64), nn::ReLU(), nn::Linear(64, 1));
  torch::Tensor x = torch::rand({64, 10}), y = torch::rand({64, 1});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::mse_loss(a, b); }, 50, 1.0);
  std::printf("seed_steps_per_s %.6g\n", r);
}

void mnist_case() {
  nn::Sequential model(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
  torch::Tensor x = torch::rand({128, 784});
  torch::Tensor y = (torch::arange(128, torch::kLong) * 7) % 10;  // class indices, as flux's one-hot
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               5, 1.5);
  std::printf("mnist_steps_per_s %.6g\n", r);
}

void wide_case() {
  nn::Sequential model(nn::Linear(1024, 4096), nn::ReLU(), nn::Linear(4096, 4096), nn::ReLU(), nn::Linear(4096, 1024));
  torch::Tensor x = torch::rand({256, 1024}), y = torch::rand({256, 1024});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::mse_loss(a, b); }, 1, 2.5);
  std::printf("wide_steps_per_s %.6g\nwide_gflops %.6g\n", r, r * bench::wide_step_flops() * 1e-9);
  std::printf("peak_rss_mb %.6g\n", bench::peak_rss_mb());
}

void overhead_case() {
  torch::Tensor a = torch::rand({16}), b = torch::rand({16}), c;
  double per_add = 1e6 / bench::rate_cpu([&] { c = torch::add(a, b); return 0.f; }, 0.5, 1000);
  std::printf("add16_us %.6g\n", per_add);
  nn::Linear d(16, 16);
  torch::Tensor x = torch::rand({16, 16});
  auto fwd_bwd = [&] {
    d->forward(x).sum().backward();
    return 0.f;
  };
  for (int i = 0; i < 100; ++i) fwd_bwd();
  std::printf("dense16_us %.6g\n", 1e6 / bench::rate_cpu(fwd_bwd, 0.5, 100));
}

void infer_case() {
  nn::Sequential model(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
  torch::NoGradGuard no_grad;
  for (int64_t batch : {1, 128}) {
    torch::Tensor x = torch::rand({batch, 784});
    auto run = [&] {
      torch::Tensor y = model->forward(x);
      return 0.f;
    };
    for (int i = 0; i < 20; ++i) run();
    std::printf("infer%lld_us %.6g\n", (long long)batch, 1e6 / bench::rate(run, 0.7));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: torch_bench seed|mnist|wide|overhead|infer [threads]\n");
    return 2;
  }
  std::string which = argv[1];
  if (argc > 2) torch::set_num_threads(std::atoi(argv[2]));
  torch::manual_seed(1);
  if (which == "seed") seed_case();
  else if (which == "mnist") mnist_case();
  else if (which == "wide") wide_case();
  else if (which == "overhead") overhead_case();
  else if (which == "infer") infer_case();
  else {
    std::fprintf(stderr, "torch_bench: unknown case %s\n", which.c_str());
    return 2;
  }
  return 0;
}
