// What the ops call to follow autocast (flux/autocast.hpp), and the cast cache they share.
#pragma once
#include <optional>

#include "flux/tensor.hpp"

namespace flux::detail {

/// For a low-precision-list op on these operands: the dtype to run it in (the scope's, when a scope
/// is active, some operand is Float32 and its device computes the dtype; see autocast.hpp), or nullopt.
std::optional<DType> autocast_low(std::initializer_list<const Tensor*> operands);
/// x cast to `low` when x is Float32 (a cast kept with x's storage until x is written: weights are
/// cast once per step, not once per use); x itself otherwise (undefined, Float64, integer, or low).
Tensor autocast_to(const Tensor& x, DType low);
/// For a Float32-list op: x cast to Float32 when a scope is active and x is Float16/BFloat16.
Tensor autocast_f32(const Tensor& x);
/// Tests: show the no-units warnings again.
void reset_autocast_warnings();
/// True while a scope is active on this thread (whatever the device decides).
bool autocast_active();

/// w cast to t (unrecorded), kept in w's storage cache until w is written.
Tensor cached_raw_cast(const Tensor& w, DType t);
/// cast (w's values in cast's dtype, made by a kernel that wrote w: LayerNorm's under autocast) kept in
/// w's storage cache as cached_raw_cast would keep it, so that the next low-precision op reads it.
void offer_cast(const Tensor& w, const Tensor& cast);
/// The same, recorded the same way; recorded on the tape as Tensor::cast is (its gradient is cast back to w's dtype).
Tensor cached_cast(const Tensor& w, DType t);
/// w in float32 for a half-precision fallback through float32: kept with w at inference
/// (cached_raw_cast), made per call in training, whose steps write the weights.
Tensor f32_weight(const Tensor& w);

}  // namespace flux::detail
