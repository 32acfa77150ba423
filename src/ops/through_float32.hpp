// The low-precision pattern of the ops, written once: an op on Float16/BFloat16 operands computed in
// Float32 (or by the backend on the half storage), recorded as one autodiff node that keeps the half
// tensors, not Float32 copies of them.
#pragma once
#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "flux/tensor.hpp"
#include "src/ops/registry.hpp"

namespace flux::detail {

/// Whether x is Float16/BFloat16 on a backend whose kernels take that storage themselves
/// (Backend::reads_half_storage: reduce, softmax, pooling, normalisation, unary_half, binary_half).
/// The one place the ops ask the backend.
bool half_storage(const Tensor& x);
/// half_storage(x), and not while tracing (ONNX export): the trace keeps the cast, so that each traced
/// op's output dtype is its input's. Where true, the op hands x over as it is instead of a Float32 copy.
bool reads_half(const Tensor& x);

/// A Float32 copy of a Float16/BFloat16 tensor (unrecorded); any other tensor, and an undefined one,
/// as it is.
Tensor float32_of(const Tensor& t);

/// The op's backward: the kept tensors cast to the compute dtype (see through_float32), in the order
/// given, and the output gradient in that dtype; one gradient per input (undefined: none), of any
/// floating dtype (each is cast to its input's dtype).
using LowBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& kept, const Tensor& gy)>;

/// through_float32's compute for a backward that calls the backend's half kernels (reads_half): the
/// kept tensors and the output gradient as they are; it casts what else it needs (float32_of).
inline constexpr std::optional<DType> kAsStored = std::nullopt;

/// One op on low-precision operands:
///  1. forward() runs without recording (NoGrad) and returns the op's output, in the dtype the op
///     gives it; it may append to `kept` what its backward needs beyond `keep` (statistics, the
///     Float32 states of a recurrence).
///  2. When tracing and `op` is not null, trace::emit(*op, inputs, output, attrs).
///  3. When an input is tracked, one node on the tape for `inputs`, holding `keep` in their own dtype
///     (the Float16/BFloat16 tensors themselves): its backward gets them and the output gradient cast
///     to `compute` (Float32 by default; an op whose backward has half kernels passes its own dtype, or
///     kAsStored), and its gradients are cast back to each input's dtype, except a Float32 gradient of
///     an input whose bit is set in `float32_grads` (bit i: input i), handed on as it is (weights:
///     autocast's cast takes it to the Float32 master weight, the tape rounds a half parameter's once).
Tensor through_float32(const ops::Op* op, std::initializer_list<const Tensor*> inputs, std::vector<Tensor> keep,
                       const std::function<Tensor(std::vector<Tensor>& kept)>& forward, LowBackward backward,
                       std::vector<trace::Attr> attrs = {}, std::optional<DType> compute = DType::f32,
                       unsigned float32_grads = 0);

/// float32_grads of an op on inputs {x, weight, bias} (conv, conv_transpose, the low Dense): the
/// weight's and the bias's gradients may stay Float32 (computed in Float32 by the backend's kernels).
inline constexpr unsigned kFloat32ParameterGrads = 0b110;

}  // namespace flux::detail
