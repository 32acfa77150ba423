// The control case of tests/compile_fail.cmake (it must compile): what may sit in a Chain without
// FLUX_LAYER because it holds no tensors, and a tensor-free user layer declared with FLUX_LAYER(Type).
#include <flux/flux.hpp>
using namespace flux;

namespace mine {
Tensor twice(const Tensor& x) { return x * 2.0; }
struct Halve {  // aggregate without tensors: looked at field by field, allowed
  double factor = 0.5;
  std::string label = "halve";
  Tensor operator()(const Tensor& x) const { return x * factor; }
};
class Clamp {  // a class with tensor-free state of its own: declares FLUX_LAYER(Clamp)
 public:
  explicit Clamp(double lo, double hi) : lo_(lo), hi_(hi), name_("clamp") {}
  Tensor operator()(const Tensor& x) const { return x * (hi_ - lo_) + lo_; }

 private:
  double lo_, hi_;
  std::string name_;
};
FLUX_LAYER(Clamp)
// Class templates declared with FLUX_LAYER (issue 32): type parameters, and value parameters.
template <class A> struct Block {
  LayerNorm norm;
  A inner;
  Tensor operator()(const Tensor& x) const { return x + inner(norm(x)); }
};
FLUX_LAYER(Block, norm, inner)
template <int N> struct Repeat {
  Dense layer;
  Tensor operator()(const Tensor& x) const {
    Tensor y = x;
    for (int i = 0; i < N; ++i) y = layer(y);
    return y;
  }
};
FLUX_LAYER(Repeat, layer)
}  // namespace mine

int main() {
  double k = 3.0;
  auto model = Chain(Dense(4, 4), relu, [](const Tensor& x) { return x + 1.0; },
                     [k](const Tensor& x) { return x * k; }, mine::twice, mine::Halve{}, mine::Clamp(0, 1),
                     MaxPool({1}), Dropout(0.1), mine::Block<mine::Block<Dense>>{LayerNorm(4), {LayerNorm(4), Dense(4, 4)}},
                     mine::Repeat<2>{Dense(4, 4)}, softmax);
  auto grads = gradient([&](auto& m) { return sum(m(ones({2, 4}))); }, model);
  auto moved = model | Device();
  auto state = optimisers::setup(optimisers::Adam(1e-3), moved);
  optimisers::update(state, moved, grads);
  return params(model).size() == 2 + 6 + 2 ? 0 : 1;
}
