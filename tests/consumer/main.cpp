// Trains a tiny model through the installed headers and library; exits non-zero on a wrong result.
#include <cstdio>

#include <flux/flux.hpp>
using namespace flux;

int main() {
  seed(1);
  auto model = Chain(Dense(2, 8, relu), Dense(8, 1));
  Tensor x = rand({32, 2}), y = sum(x, 1, true);
  auto state = optimisers::setup(optimisers::Adam(1e-2), model);
  float first = 0, last = 0;
  for (int i = 0; i < 200; ++i) {
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
    optimisers::update(state, model, grads);
    if (i == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  std::printf("consumer: loss %g -> %g\n", first, last);
  return last < first * 0.1f ? 0 : 1;
}
