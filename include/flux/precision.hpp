// Flux's model-level casts: f16(m), bf16(m), f32(m), f64(m) convert every floating tensor of a model
// (trainable and non-trainable: BatchNorm's running statistics too) on whatever device it is;
// integer and boolean tensors are kept, and tied tensors stay tied. Layers then run in that dtype.
#pragma once
#include "flux/functor.hpp"
#include "flux/tensor.hpp"

namespace flux {

namespace detail {
template <class M> M cast_floats(const M& m, DType t) {
  return fmap([t](const Tensor& x) { return x.defined() && is_floating(x.dtype()) ? x.cast(t) : x; }, m);
}
}  // namespace detail

template <class M> M f16(const M& m) { return detail::cast_floats(m, DType::f16); }
template <class M> M bf16(const M& m) { return detail::cast_floats(m, DType::bf16); }
template <class M> M f32(const M& m) { return detail::cast_floats(m, DType::f32); }
template <class M> M f64(const M& m) { return detail::cast_floats(m, DType::f64); }

}  // namespace flux
