// The op vocabulary. Every op checks shapes, dtypes and devices, records itself on the tape when
// inside gradient(), and calls the backend of its inputs. Axes may be negative (from the end).
#pragma once
#include <optional>
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
Tensor tanh_(const Tensor& x);  // also available as the activation value `flux::tanh`
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
Tensor softmax_(const Tensor& x, int axis = -1);     // also the layer value `flux::softmax`
Tensor logsoftmax_(const Tensor& x, int axis = -1);  // also the layer value `flux::logsoftmax`
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
/// Flux's onehotbatch: labels (Int) -> (n, nclasses) Float32 with observations along the first axis.
Tensor onehot(const Tensor& labels, int64_t nclasses, DType t = DType::f32);
/// Flux's onecold: the argmax along the last axis, as Int64.
Tensor onecold(const Tensor& scores);

// ---- in-place (not recorded; for optimisers and loading) ----
/// Copies src's values into dst's storage (same shape and device; dtype converted).
void copy_(Tensor& dst, const Tensor& src);
/// dst -= src (same shape, dtype and device).
void sub_(Tensor& dst, const Tensor& src);

}  // namespace flux
