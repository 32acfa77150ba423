// Sizes from shapes, as Flux's outputsize and @autosize: outputsize(model, input_shape) is the shape
// a model gives for an input shape, and autosize(input_shape, model) fills in every Dense(_, out)
// from the shape that reaches it, so nobody hard-codes a flatten width:
//   auto lenet = autosize({1, 1, 28, 28}, Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}),
//                                              Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
//                                              Dense(_, 120, relu), Dense(_, 84, relu), Dense(_, 10)));
// Both run the layers once on zeros of that shape (use batch 1 to keep it cheap; Flux propagates
// shapes without arithmetic), outside gradient, on a deepcopy for outputsize so BatchNorm's running
// statistics never change. Shapes include the batch axis: (N, C, H, W), (N, features).
#pragma once
#include <tuple>
#include <utility>

#include "flux/autodiff.hpp"
#include "flux/functor.hpp"
#include "flux/move.hpp"
#include "flux/nn/chain.hpp"
#include "flux/nn/dense.hpp"

namespace flux {

struct SizeOptions {
  DType dtype = DType::f32;  // of the zeros fed in (Int64 for a model that starts with Embedding)
};

namespace detail {
/// The device of a model's first tensor (the CPU for a model without tensors).
template <class M> Device model_device(const M& m) {
  for (const Tensor& t : params(m)) return t.device();
  for (const Tensor& t : nontrainables(m)) return t.device();
  return Device();
}

// autosize's walk: resolves each Dense(_, out) with the last axis of the shape reaching it, recursing
// into nested Chains; any other layer runs once on zeros to find the next shape.
template <class L> L autosize_layer(const L& layer, Tensor& x) {
  if constexpr (std::is_same_v<L, Dense>) {
    Dense d = layer;
    if (!d.weight.defined() && d.pending) {
      if (x.ndim() == 0) fail("[autosize] Dense(_ => ", d.pending->out, ") gets a 0-dimensional input");
      d = to(Dense(x.shape()[x.ndim() - 1], d.pending->out, d.activation, d.pending->options), x.device());
    }
    x = d(x);
    return d;
  } else if constexpr (is_chain<L>::value) {
    // braces: the layers are sized left to right
    return std::apply([&](const auto&... ls) { return L{autosize_layer(ls, x)...}; }, layer.layers);
  } else {
    x = layer(x);
    return layer;
  }
}
}  // namespace detail

/// The output shape of model(x) for x of `input_shape` (batch axis included), e.g.
/// outputsize(Chain(Conv({5, 5}, 1, 6), flatten), {1, 1, 28, 28}) == (1, 3456).
template <class M> Shape outputsize(const M& model, const Shape& input_shape, SizeOptions o = {}) {
  autodiff::NoGrad no_grad;
  M copy = deepcopy(model);
  return copy(zeros(input_shape, o.dtype, detail::model_device(model))).shape();
}

/// `model` with every Dense(_, out) given its input size from the layers before it, for input of
/// `input_shape` (batch axis included). A Dense(_, out) not reached this way (inside another
/// container) stays open and says so when called.
template <class M> M autosize(const Shape& input_shape, const M& model, SizeOptions o = {}) {
  autodiff::NoGrad no_grad;
  Tensor x = zeros(input_shape, o.dtype, detail::model_device(model));
  return detail::autosize_layer(model, x);
}

}  // namespace flux
