// Helpers shared by the op implementation files (not installed).
#pragma once
#include <initializer_list>
#include <utility>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "flux/tensor.hpp"
#include "src/internal.hpp"

namespace flux::detail {

void check_defined(const char* api, const Tensor& t);
void check_same_device(const char* api, const Tensor& a, const Tensor& b);
Shape broadcast_shapes(const char* api, const Shape& a, const Shape& b);
backend::Broadcast make_plan(const Shape& out, std::initializer_list<const Shape*> operands);
bool is_half(DType t);
/// A cast that is never recorded (and not checked: see check_integer_cast).
Tensor raw_cast(const Tensor& x, DType t);
/// To an integer dtype: a flux::Error "[api] cannot convert ..." when a value of x has no value in t
/// (NaN, ±Inf, out of range); the rule of Tensor::cast and copy_ (src/ops/elementwise.cpp).
void check_integer_cast(const char* api, const Tensor& x, DType t);
/// Normalises a possibly negative axis for an ndim-dimensional tensor; errors name the API.
int normalize_axis(const char* api, int axis, int ndim);

Tensor step_raw(const Tensor& x);
/// The sum of a Float32 or half x along `axis` (dropped) in Float32, unrecorded and not rounded to x's
/// dtype (a half bias gradient on its way to a Float32 master).
Tensor float32_sum(const Tensor& x, int axis);
/// relu's gradient g step(x) (x: relu's input or its output, whose signs agree), unrecorded, in x's
/// dtype: the backend's fused pass where it has one (half storage too), else the step and the product.
Tensor relu_grad(const Tensor& x, const Tensor& g);
/// Dense's affine map x W^T + b for 2-D x (N, in), W (out, in), b (out,) of one float dtype: b is
/// broadcast into the output and the GEMM accumulates onto it (beta = 1), so no separate add runs.
/// relu: then relu(y) (fused there). Outside gradients (nothing tracked) the backend's linear_forward
/// runs first: it may keep W packed under its content stamp. Returns an undefined tensor when the
/// operands do not fit that case (the caller falls back).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu = false);

/// relu(conv(x, w, bias, p)) as one op: the backend's fused kernel where it has one (oneDNN post-op on
/// the CPU), else conv then relu in place. The backward masks the output gradient with y > 0.
Tensor conv_relu(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p);

/// Whether conv/conv_transpose (and the pools) may call the backend's library fast paths (oneDNN,
/// cuDNN); false forces the portable im2col + GEMM path. Default true; FLUX_LIBRARY_KERNELS=0 disables.
void set_library_kernels(bool enabled);
bool library_kernels();

/// Inference only: relu?(relu?(conv(x, w) * scale + shift) + residual) as one backend kernel
/// (Backend::conv_forward_affine; scale, shift (O,), residual of y's shape or undefined). An undefined
/// tensor when it cannot run fused: recording a tape, library kernels off, operands that do not fit,
/// or a backend without the kernel; the caller then composes the ops. Shapes are checked as conv's.
Tensor conv_affine(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& shift, const Tensor& residual,
                   const ConvParams& p, bool relu, bool relu_after);

/// BatchNorm on running statistics as y = x * scale + shift per channel, with the bias of a conv before
/// it folded in: scale = weight / sqrt(var + eps), shift = bias - mean * scale + conv_bias * scale
/// (weight, bias, conv_bias may be undefined). Without statistics (var undefined): scale 1, shift
/// conv_bias or 0, in conv_weight's dtype, device and out channels. Recorded ops while a part is tracked
/// or a trace runs; else made once and kept in the storage cache of var (or conv_weight) under
/// CoreEntry::folded_batchnorm and the parts' content versions, so that any write makes a new one.
std::pair<Tensor, Tensor> fold_batchnorm(const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& var,
                                         double eps, const Tensor& conv_bias = Tensor(), const Tensor& conv_weight = Tensor());

/// One operand of fused_attention: base's elements from `offset`, at element strides `stride` over its
/// (b0, b1, row) axes, each row of the op's width contiguous (src/ops/attention.cpp).
struct AttentionView {
  Tensor base;
  int64_t offset = 0;
  int64_t stride[3] = {};
};
/// softmax(q kᵀ scale | mask, causal) v by the backend's fused kernel (backend::Attention; the strides
/// of `a` are taken from the views), recorded with its backward into the views' bases (each once): out
/// is a fresh tensor of out_shape holding (b0, b1, tq, dv) at a.o_stride. mask: Bool at a.mask_stride,
/// undefined for none. Under autocast the operands run in its low dtype. Undefined when it cannot run
/// fused (library kernels or fused attention off (flux/nn/attention.hpp), an ONNX trace, dtypes other
/// than one of f32/bf16/f16, or a backend without the kernel); the caller then composes the ops.
Tensor fused_attention(const AttentionView& q, const AttentionView& k, const AttentionView& v, const Tensor& mask,
                       backend::Attention a, const Shape& out_shape);

}  // namespace flux::detail
