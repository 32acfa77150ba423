// Scaled dot-product attention (Vaswani et al. 2017; NNlib.dot_product_attention and PyTorch's
// scaled_dot_product_attention), batched over leading axes:
//   q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv):  s = q kᵀ * scale  (..., Tq, Tk),
//   s = where(mask, s, -inf) (applied as s + (mask ? 0 : -inf)),  p = softmax(s, -1),  out = p v  (..., Tq, dv).
// Composed from recorded ops (batched matmul with kᵀ inside the GEMM, where, the backend's softmax,
// which subtracts each row's maximum), so its backward is theirs.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

Tensor causal_mask(int64_t tq, int64_t tk, Device device) {
  if (tq <= 0 || tk <= 0) detail::fail("[causal_mask] lengths must be positive; got (", tq, ", ", tk, ")");
  Tensor rows = arange(double(tk - tq), double(tk), 1, DType::i64, device).reshape(Shape{tq, 1});
  Tensor cols = arange(tk, DType::i64, device).reshape(Shape{1, tk});
  return le(cols, rows);
}

namespace {
void check_attention_inputs(const char* api, const Tensor& q, const Tensor& k, const Tensor* v) {
  std::vector<const Tensor*> inputs{&q, &k};
  if (v) inputs.push_back(v);
  for (const Tensor* t : inputs) detail::check_defined(api, *t);
  detail::check_same_device(api, q, k);
  if (v) detail::check_same_device(api, q, *v);
  for (const Tensor* t : inputs)
    if (!is_floating(t->dtype()) || t->ndim() < 2)
      detail::fail("[", api, "] q, k", v ? " and v" : "", " must be floating-point with at least 2 dimensions (..., T, d); got q ",
                   summary(q), ", k ", summary(k), v ? ", v " + summary(*v) : std::string());
  const int64_t d = q.shape()[q.ndim() - 1];
  const int64_t tk = k.shape()[k.ndim() - 2];
  if (k.shape()[k.ndim() - 1] != d || (v && v->shape()[v->ndim() - 2] != tk))
    detail::fail("[", api, "] shapes do not compose: q ", to_string(q.shape()), " (..., Tq, d), k ", to_string(k.shape()),
                 " (..., Tk, d)", v ? ", v " + to_string(v->shape()) + " (..., Tk, dv)" : std::string());
}

Tensor attention_scores(const char* api, const Tensor& q, const Tensor& k, const Tensor& mask, double scale,
                        double dropout_p) {
  const int64_t d = q.shape()[q.ndim() - 1];
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(double(d));
  // (q s) kᵀ rather than (q kᵀ) s: the scale touches Tq d values per head instead of Tq Tk.
  Tensor scores = matmul(q * s, k, false, true);  // (..., Tq, Tk)
  if (mask.defined()) {
    detail::check_same_device(api, q, mask);
    if (mask.dtype() != DType::boolean) detail::fail("[", api, "] mask must be Bool (true = attend); got ", summary(mask));
    Shape joined;
    try {
      joined = detail::broadcast_shapes(api, scores.shape(), mask.shape());
    } catch (const Error&) {
      joined = Shape{};
    }
    if (joined != scores.shape())
      detail::fail("[", api, "] mask of shape ", to_string(mask.shape()), " does not broadcast to the scores (..., Tq, Tk) = ",
                   to_string(scores.shape()), " of q ", to_string(q.shape()), " and k ", to_string(k.shape()));
    // As an additive bias (0 where attended, -inf where masked), built on the mask's own (small) shape:
    // the same scores as where(mask, scores, -inf) for finite scores, and the backward of the add
    // passes the gradient through untouched (where's backward costs a full pass over the scores).
    Tensor bias;
    {
      autodiff::NoGrad constant;
      Tensor zero = Tensor::scalar(0.0, scores.dtype(), scores.device());
      Tensor neg_inf = Tensor::scalar(-std::numeric_limits<double>::infinity(), scores.dtype(), scores.device());
      bias = where(mask, zero, neg_inf);
    }
    scores = scores + bias;
  }
  Tensor p = detail::softmax_op(scores, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p);
  return p;
}
}  // namespace

Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                             double dropout_p) {
  check_attention_inputs("dot_product_attention", q, k, &v);
  return matmul(attention_scores("dot_product_attention", q, k, mask, scale, dropout_p), v);
}

Tensor dot_product_attention_scores(const Tensor& q, const Tensor& k, const Tensor& mask, double scale, double dropout_p) {
  check_attention_inputs("dot_product_attention_scores", q, k, nullptr);
  return attention_scores("dot_product_attention_scores", q, k, mask, scale, dropout_p);
}

}  // namespace flux
