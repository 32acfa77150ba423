// The op vocabulary. Every op checks shapes, dtypes and devices, records itself on the tape when
// inside gradient(), and calls the backend of its inputs. Axes may be negative (from the end).
#pragma once
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "flux/tensor.hpp"

namespace flux {

// ---- elementwise with NumPy broadcasting ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);  // elementwise (use matmul for products)
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);
// comparisons give Bool tensors (not differentiable)
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, double b);
Tensor operator<(const Tensor& a, double b);
/// cond ? a : b with broadcasting; cond is Bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor log1p(const Tensor& x);
/// The error function, 2/sqrt(pi) times the integral of exp(-t^2) from 0 to x (ONNX Erf).
Tensor erf(const Tensor& x);
namespace detail {  // the ops behind the activations of flux/nn/activations.hpp (call those)
Tensor tanh_op(const Tensor& x);
Tensor sigmoid_op(const Tensor& x);
Tensor relu_op(const Tensor& x);
Tensor leakyrelu_op(const Tensor& x, double a);
Tensor elu_op(const Tensor& x, double a);
Tensor gelu_op(const Tensor& x);
Tensor gelu_erf_op(const Tensor& x);
Tensor softplus_op(const Tensor& x);
Tensor swish_op(const Tensor& x);
}  // namespace detail
Tensor clamp(const Tensor& x, double lo, double hi);

// ---- linear algebra ----
/// 2-D (m,k)x(k,n), batched (..., m, k)x(..., k, n) with broadcast batch axes, 1-D vectors as in NumPy.
/// trans_a / trans_b transpose the last two axes inside the GEMM (no copy).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// ---- reductions (keepdims keeps the reduced axis with length 1) ----
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, int axis, bool keepdims = false);
Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int axis, bool keepdims = false);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int axis, bool keepdims = false);
Tensor min(const Tensor& x);
Tensor min(const Tensor& x, int axis, bool keepdims = false);
Tensor argmax(const Tensor& x, int axis, bool keepdims = false);  // Int64
Tensor argmin(const Tensor& x, int axis, bool keepdims = false);  // Int64

// ---- softmax family (numerically stable) ----
namespace detail {
// The ops behind the layer values `flux::softmax(x, axis)` and `flux::logsoftmax(x, axis)` (call those).
Tensor softmax_op(const Tensor& x, int axis = -1);
Tensor logsoftmax_op(const Tensor& x, int axis = -1);
}  // namespace detail
Tensor logsumexp(const Tensor& x, int axis, bool keepdims = false);

// ---- shape and indexing ----
/// Copies `x` to `shape` under broadcasting rules.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// Sums `x` down to `shape` (the adjoint of broadcast_to).
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const std::vector<int>& axes);
Tensor concat(const std::vector<Tensor>& xs, int axis = 0);
Tensor stack(const std::vector<Tensor>& xs, int axis = 0);
/// Rows of x at `indices` (Int32/Int64) along `axis`.
Tensor index_select(const Tensor& x, int axis, const Tensor& indices);
/// out[..., j, ...] = x[..., indices[j], ...]; same as index_select (PyTorch's gather on one axis).
Tensor gather(const Tensor& x, int axis, const Tensor& indices);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop);
/// Flux's onehotbatch: integer labels of any shape S -> S + (nclasses,) Float32: (N,) -> (N, nclasses),
/// (N, T) -> (N, T, nclasses), observations along the first axis.
Tensor onehot(const Tensor& labels, int64_t nclasses, DType t = DType::f32);
/// Flux's onecold: the argmax along the last axis, as Int64.
Tensor onecold(const Tensor& scores);

// ---- convolution and pooling over (N, C, spatial...) with 1 to 3 spatial axes (src/ops/conv.cpp,
// src/ops/pooling.cpp). Cross-correlation as PyTorch's conv2d, so PyTorch weights load unchanged. ----

/// Per-axis sizes: one value for every spatial axis (`.stride = 2`) or one per axis (`{2, 1}`).
struct Dims {
  std::vector<int64_t> values;
  Dims(int64_t v = 1) : values{v} {}
  Dims(std::initializer_list<int64_t> v) : values(v) {}
  Dims(std::vector<int64_t> v) : values(std::move(v)) {}
};
/// Flux's SamePad(): a total pad of dilation * (k - 1) per axis, the odd pixel on the LOW side (Flux's
/// calc_padding; PyTorch's padding='same' puts it high), so out = ceil(input / stride).
struct SamePad {};
/// Padding: one value for every side (`1`), one per spatial axis (`{1, 2}`), a (lo, hi) pair per
/// axis in axis order (`{top, bottom, left, right}` for 2-D), or SamePad().
struct Padding {
  std::vector<int64_t> values{0};
  bool same = false;
  Padding(int64_t p = 0) : values{p} {}
  Padding(std::initializer_list<int64_t> v) : values(v) {}
  Padding(std::vector<int64_t> v) : values(std::move(v)) {}
  Padding(SamePad) : same(true) {}
};

struct ConvParams {
  Dims stride = 1;
  Padding pad = 0;
  Dims dilation = 1;
  int64_t groups = 1;
};
/// y = conv(x, w) + b: x (N, C, in...), w (O, C / groups, k...), optional bias (O,) ->
/// (N, O, out...), out = (in + pad_lo + pad_hi - dilation (k - 1) - 1) / stride + 1.
Tensor conv(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), const ConvParams& p = {});

struct ConvTransposeParams {
  Dims stride = 1;
  Padding pad = 0;
  Dims dilation = 1;
  int64_t groups = 1;
  Dims output_padding = 0;  // extra size on the high side of each output axis (PyTorch's output_padding)
};
/// The adjoint of conv (PyTorch's conv_transpose2d): x (N, C, in...), w (C, O / groups, k...),
/// optional bias (O,) -> (N, O, out...), out = (in - 1) stride - pad_lo - pad_hi + dilation (k - 1)
/// + output_padding + 1.
Tensor conv_transpose(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(),
                      const ConvTransposeParams& p = {});

struct PoolParams {
  std::optional<Dims> stride = std::nullopt;  // default: the window (non-overlapping), as Flux
  Padding pad = 0;
};
/// Max over each window (padding never wins): x (N, C, in...) -> (N, C, out...).
Tensor maxpool(const Tensor& x, const Dims& window, const PoolParams& p = {});
/// Mean over each window, dividing by the full window size (padding counts as 0, as NNlib/Flux).
Tensor meanpool(const Tensor& x, const Dims& window, const PoolParams& p = {});
/// Pools to a fixed output size (PyTorch's adaptive pooling windows): (N, C, in...) -> (N, C, out...).
Tensor adaptive_maxpool(const Tensor& x, const Dims& out);
Tensor adaptive_meanpool(const Tensor& x, const Dims& out);
/// Over all spatial axes: (N, C, in...) -> (N, C, 1...), as Flux's GlobalMaxPool/GlobalMeanPool.
Tensor global_maxpool(const Tensor& x);
Tensor global_meanpool(const Tensor& x);
/// (N, d1, d2, ...) -> (N, d1 * d2 * ...): Flux's flatten (observations stay on the first axis).
namespace detail {
Tensor flatten_op(const Tensor& x);  // the op behind the layer value `flux::flatten` (call that)
}  // namespace detail

// ---- normalisation (src/ops/normalisation.cpp) ----
/// Batch normalisation with the batch's statistics over axis 1 of x (N, C, ...):
/// y = (x - mean) / sqrt(var + eps) * weight + bias, mean and biased var over every axis but 1;
/// weight and bias (C,) may be undefined. One recorded op (closed-form backward for x, weight, bias).
/// `batch_mean`, `batch_var` (optional) receive the statistics, shape (C,), unrecorded.
Tensor batchnorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor* batch_mean = nullptr, Tensor* batch_var = nullptr);
/// Batch normalisation with given statistics (inference: the running mean and var, (C,)):
/// y = (x - mean) / sqrt(var + eps) * weight + bias; recorded for every tensor argument.
Tensor batchnorm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& var,
                 double eps);

// ---- recurrences (src/ops/recurrent.cpp), used by LSTM, GRU, RNN (flux/nn/recurrent.hpp) ----
/// The recurrent part of a whole sequence, time-major, with PyTorch's formulas (backend.hpp lists them):
/// xg (T, N, G) = x W_ihᵀ + b_ih for every step (G = 4H LSTM, 3H GRU, H RNN), w_hh (G, H), b_hh (G,)
/// or undefined, h0 and c0 (N, H). One recorded op each, backpropagation through time included.
/// LSTM: (T + 1, N, H), rows 0..T-1 the hidden states h_1..h_T and row T the final cell state c_T.
Tensor lstm_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0, const Tensor& c0);
/// GRU: (T, N, H), the hidden states h_1..h_T.
Tensor gru_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0);
/// Elman RNN with tanh (or relu): (T, N, H), the hidden states h_1..h_T.
Tensor rnn_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0, bool relu = false);

/// Layer normalisation over the LAST axis of x (..., D), as PyTorch's layer_norm with
/// normalized_shape (D,): y = (x - mean) / sqrt(var + eps) * weight + bias, mean and biased var over
/// that axis; weight and bias (D,) may be undefined. One recorded op (closed-form backward).
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
/// Group normalisation of x (N, C, spatial...): the C channels split into `groups` groups of C / groups,
/// each normalised over its channels and the spatial axes, then y = x̂ * weight + bias per channel
/// (weight, bias (C,) may be undefined), as PyTorch's group_norm. groups = C is instance normalisation.
Tensor groupnorm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// ---- attention (src/ops/attention.cpp) ----
/// A Bool (tq, tk) mask, true where query i may attend to key j <= i + (tk - tq) (NNlib's
/// make_causal_mask; the last query sees every key).
Tensor causal_mask(int64_t tq, int64_t tk, Device device = Device());
/// Scaled dot-product attention, batched over the leading axes (any number, broadcast):
/// q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv) -> (..., Tq, dv),
///   out = softmax(q kᵀ * scale + masked, axis -1) v,   scale = 1 / sqrt(d) by default (scale <= 0),
/// where `mask` (Bool, broadcastable to (..., Tq, Tk)) keeps scores where true and sets the others to
/// -inf (true = attend, NNlib's convention; PyTorch's Bool attn_mask means the opposite). Softmax
/// subtracts each row's maximum; a row with every key masked gives NaN, as PyTorch and NNlib.
/// `dropout` > 0 drops attention weights (p) as PyTorch's dropout_p; the caller decides when (training).
/// Composed from recorded ops (matmul, where, softmax): differentiable in q, k and v.
Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                             double scale = 0, double dropout = 0);
/// NNlib's dot_product_attention_scores: the attention weights p = softmax(q kᵀ * scale | mask)
/// (..., Tq, Tk) that dot_product_attention multiplies v by (after dropout, when `dropout` > 0).
Tensor dot_product_attention_scores(const Tensor& q, const Tensor& k, const Tensor& mask = Tensor(), double scale = 0,
                                    double dropout = 0);

// ---- random masks ----
/// Uniform [0, 1) values generated on x's device from the global seed (seed(n)) and a per-call
/// counter: the same values on every device for the same seed and call sequence.
Tensor rand_like(const Tensor& x);
/// Standard normal values of x's shape and dtype, drawn on x's device the same way (Box-Muller on two
/// rand_like draws), as Flux's / MLUtils' randn_like. zeros_like, ones_like, fill_like: tensor.hpp.
Tensor randn_like(const Tensor& x);
/// Dropout: x * mask / (1 - p), mask ~ Bernoulli(1 - p) drawn on x's device; p in [0, 1).
/// `dims` lists the axes the mask varies along (empty: all), as Flux's Dropout(p; dims).
Tensor dropout(const Tensor& x, double p, const std::vector<int>& dims = {});

// ---- in-place (not recorded; for optimisers and loading) ----
/// Copies src's values into dst's storage (same shape and device; dtype converted).
void copy_(Tensor& dst, const Tensor& src);
/// dst -= src (same shape, dtype and device).
void sub_(Tensor& dst, const Tensor& src);

}  // namespace flux
