// The seeds' training loop: a 10 -> 64 -> 1 MLP on random data, mean loss per epoch.
// Usage: seed_training_loop [epochs]
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <flux/flux.hpp>

#include "example_models.hpp"

using namespace flux;

int main(int argc, char** argv) {
  int epochs = argc > 1 ? std::atoi(argv[1]) : 10;
  seed(42);
  Device dev = get_device({.verbose = true});
  auto model = examples::seed_mlp() | dev;
  std::cout << model << "\n";

  Tensor X = rand({1000, 10}), Y = rand({1000, 1});  // observations along the FIRST axis
  auto loader = DataLoader({X, Y}, {.batchsize = 64, .shuffle = true}) | dev;  // batches arrive on dev
  auto opt_state = optimisers::setup(optimisers::Adam(1e-3), model);

  double first = 0, last = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double epoch_loss = 0;
    int batches = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
      optimisers::update(opt_state, model, grads);
      epoch_loss += loss.item<float>();
      ++batches;
    }
    double mean_loss = epoch_loss / batches;
    if (epoch == 1) first = mean_loss;
    last = mean_loss;
    std::printf("epoch %d, mean loss %g\n", epoch, mean_loss);
  }
  if (!(last < first)) {
    std::fprintf(stderr, "loss did not decrease: %g -> %g\n", first, last);
    return 1;
  }
  return 0;
}
