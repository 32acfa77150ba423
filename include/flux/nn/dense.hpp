// Dense(in, out, act = identity; bias = true): y = act(x Wᵀ + b) with x (N, in), W (out, in), b (out,).
// Weights are Glorot-uniform as in Flux (another initialiser with `.init`, see init.hpp); the layout
// matches PyTorch's nn.Linear.
#pragma once
#include <memory>
#include <ostream>
#include <string>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"
#include "flux/nn/init.hpp"

namespace flux {

struct DenseOptions {
  bool bias = true;
  DType dtype = DType::f32;
  Initialiser init = glorot_uniform;  // called as init(Shape{out, in}, dtype)
};

/// The input size left open, as Flux's `_` inside @autosize: Dense(_, 10) is sized by autosize()
/// (flux/nn/autosize.hpp) from what precedes it. `flux::infer` is the same value with a longer name.
struct InferSize {};
inline constexpr InferSize _{};
inline constexpr InferSize infer{};

struct Dense {
  Tensor weight;  // (out, in)
  Tensor bias;    // (out,), undefined when bias = false
  Activation activation;
  /// Dense(_, out): the output size and options until autosize() gives the input size; else null.
  struct Pending {
    int64_t out;
    DenseOptions options;
  };
  std::shared_ptr<const Pending> pending;

  Dense() = default;
  /// Dense(_, out, act): sized later by autosize(input_shape, model); calling it before is an error.
  Dense(InferSize, int64_t out, Activation act = Activation(), DenseOptions options = {});
  Dense(InferSize, int64_t out, DenseOptions options) : Dense(InferSize{}, out, Activation(), options) {}
  Dense(int64_t in, int64_t out, Activation act = Activation(), DenseOptions options = {});
  Dense(int64_t in, int64_t out, DenseOptions options) : Dense(in, out, Activation(), options) {}
  /// From existing arrays (weight (out, in), optional bias (out,)).
  Dense(Tensor weight, Tensor bias, Activation act = Activation());

  /// x: (N, in) or (in,) -> (N, out) or (out,).
  Tensor operator()(const Tensor& x) const;
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
};
FLUX_LAYER(Dense, weight, bias)

/// "Dense(10 => 5, sigmoid)" (no parameter comment).
std::string layer_string(const Dense& d);
/// Flux's display: "Dense(10 => 5, sigmoid)  # 55 parameters".
std::ostream& operator<<(std::ostream& os, const Dense& d);

// glorot_uniform(out, in, dtype) and the other initialisers live in flux/nn/init.hpp.

}  // namespace flux
