// Scaled dot-product attention (Vaswani et al. 2017; NNlib.dot_product_attention and PyTorch's
// scaled_dot_product_attention), batched over leading axes:
//   q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv):  s = q kᵀ * scale  (..., Tq, Tk),
//   s = where(mask, s, -inf) (applied as s + (mask ? 0 : -inf)),  p = softmax(s, -1),  out = p v  (..., Tq, dv).
// Where the backend has a fused kernel (Backend::attention_forward/backward; the CPU's) and the case
// fits (fused_attention below), one recorded op without the (Tq, Tk) scores in memory; otherwise,
// and as the reference the fused kernels are tested against, composed from recorded ops (batched
// matmul with kᵀ inside the GEMM, where, the backend's softmax, which subtracts each row's maximum),
// so its backward is theirs.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flux/autodiff.hpp"
#include "flux/nn/attention.hpp"
#include "flux/ops.hpp"
#include "src/environment.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/trace.hpp"

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

namespace {
// Strides of a mask (Bool, shape broadcastable to (..., Tq, Tk) over the `lead` axes of q) as
// (b0, b1, row, column) when the lead axes are cut into b0 = lead[0 .. split), b1 = lead[split ..);
// false where a group of axes has no single stride (part broadcast inside a group).
bool mask_strides(const Shape& mask, const std::vector<int64_t>& lead, int split, int64_t tq, int64_t tk,
                  int64_t out[4]) {
  const int nl = int(lead.size()), nd = nl + 2;
  if (mask.size() > nd) return false;
  std::vector<int64_t> shape(size_t(nd), 1), stride(size_t(nd), 0);
  for (int i = 0; i < mask.size(); ++i) shape[size_t(nd - mask.size() + i)] = mask[i];
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; --i) {
    stride[size_t(i)] = shape[size_t(i)] == 1 ? 0 : st;
    st *= shape[size_t(i)];
  }
  if ((shape[size_t(nl)] != 1 && shape[size_t(nl)] != tq) || (shape[size_t(nl + 1)] != 1 && shape[size_t(nl + 1)] != tk))
    return false;
  out[2] = stride[size_t(nl)], out[3] = stride[size_t(nl + 1)];
  // A group [lo, hi) of lead axes collapses into one stride when the mask broadcasts over all of its
  // axes (stride 0) or has every one in full (contiguous: the innermost one's stride).
  auto group = [&](int lo, int hi, int64_t& g) {
    bool present = false, broadcast = false;
    g = 0;
    for (int i = lo; i < hi; ++i) {
      const int64_t m = shape[size_t(i)], l = lead[size_t(i)];
      if (m != 1 && m != l) return false;
      if (l == 1) continue;
      (m == 1 ? broadcast : present) = true;
      if (m != 1) g = stride[size_t(i)];
    }
    return !(present && broadcast);
  };
  return group(0, split, out[0]) && group(split, nl, out[1]);
}

// The functional op's fused path: q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv) of one lead shape,
// contiguous, as (b0, b1) = (all lead axes but the last, the last).
Tensor fused_functional(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale) {
  const int nd = q.ndim();
  if (k.ndim() != nd || v.ndim() != nd) return Tensor();
  std::vector<int64_t> lead(q.shape().begin(), q.shape().end() - 2);
  if (std::vector<int64_t>(k.shape().begin(), k.shape().end() - 2) != lead ||
      std::vector<int64_t>(v.shape().begin(), v.shape().end() - 2) != lead)
    return Tensor();
  backend::Attention a;
  a.tq = q.shape()[nd - 2], a.tk = k.shape()[nd - 2], a.d = q.shape()[nd - 1], a.dv = v.shape()[nd - 1];
  const int split = lead.empty() ? 0 : int(lead.size()) - 1;
  for (int i = 0; i < split; ++i) a.b0 *= lead[size_t(i)];
  a.b1 = lead.empty() ? 1 : lead.back();
  a.scale = scale > 0 ? scale : 1.0 / std::sqrt(double(a.d));
  if (mask.defined() && (mask.dtype() != DType::boolean || mask.device() != q.device() ||
                         !mask_strides(mask.shape(), lead, split, a.tq, a.tk, a.mask_stride)))
    return Tensor();
  auto view = [&](const Tensor& t, int64_t rows, int64_t width) {
    detail::AttentionView w{t, 0, {a.b1 * rows * width, rows * width, width}};
    return w;
  };
  a.o_stride[0] = a.b1 * a.tq * a.dv, a.o_stride[1] = a.tq * a.dv, a.o_stride[2] = a.dv;
  std::vector<int64_t> out_dims = lead;
  out_dims.push_back(a.tq), out_dims.push_back(a.dv);
  const Shape out_shape(out_dims);
  return detail::fused_attention(view(q, a.tq, a.d), view(k, a.tk, a.d), view(v, a.tk, a.dv), mask, a, out_shape);
}
}  // namespace

namespace detail {
namespace {
std::atomic<int> g_fused_attention{-1};  // -1: not yet read from FLUX_FUSED_ATTENTION
}  // namespace
void set_fused_attention(bool enabled) { g_fused_attention = enabled ? 1 : 0; }
bool fused_attention_enabled() {
  int v = g_fused_attention.load();
  if (v < 0) {
    int expected = -1;
    g_fused_attention.compare_exchange_strong(expected, environment::flag("FLUX_FUSED_ATTENTION") ? 1 : 0);
    v = g_fused_attention.load();
  }
  return v == 1;
}

Tensor fused_attention(const AttentionView& q_in, const AttentionView& k_in, const AttentionView& v_in,
                       const Tensor& mask, backend::Attention a, const Shape& out_shape) {
  if (!library_kernels() || !fused_attention_enabled() || trace::active()) return Tensor();
  AttentionView views[3] = {q_in, k_in, v_in};
  if (auto low = autocast_low({&views[0].base, &views[1].base, &views[2].base}))
    for (AttentionView& w : views) w.base = autocast_to(w.base, *low);
  const DType t = views[0].base.dtype();
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) return Tensor();
  for (const AttentionView& w : views)
    if (w.base.dtype() != t || w.base.device() != views[0].base.device()) return Tensor();
  const Device dev = views[0].base.device();
  int64_t* strides[3] = {a.q_stride, a.k_stride, a.v_stride};
  for (int i = 0; i < 3; ++i) std::copy(views[i].stride, views[i].stride + 3, strides[i]);
  const size_t es = dtype_size(t);
  auto at = [es](const AttentionView& w) {  // by value: the backward calls it too
    backend::Buffer b = buffer_of(w.base);
    b.offset += size_t(w.offset) * es;
    return b;
  };
  backend::Buffer mask_buffer = mask.defined() ? buffer_of(mask) : backend::Buffer{};
  Tensor out = Tensor::empty(out_shape, t, dev);
  Tensor lse = Tensor::empty(Shape{a.b0 * a.b1 * a.tq}, DType::f32, dev);
  if (!out.backend().attention_forward(dev.index(), t, at(views[0]), at(views[1]), at(views[2]), mask_buffer,
                                       buffer_of(out), buffer_of(lse), a))
    return Tensor();
  // The bases, each once (self-attention's q, k and v are views of one projection).
  std::vector<Tensor> bases;
  int which[3];
  for (int i = 0; i < 3; ++i) {
    which[i] = -1;
    for (size_t j = 0; j < bases.size(); ++j)
      if (bases[j].impl() == views[i].base.impl()) which[i] = int(j);
    if (which[i] < 0) which[i] = int(bases.size()), bases.push_back(views[i].base);
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& b : bases) inputs.push_back(&b);
  autodiff::record(out, inputs, [=](const Tensor& dy) {
    Tensor g = dy.dtype() == t ? dy : raw_cast(dy, t);
    std::vector<Tensor> grads;
    for (const Tensor& b : bases) grads.push_back(Tensor::empty(b.shape(), t, b.device()));
    auto grad_at = [&](int i) {
      backend::Buffer b = buffer_of(grads[size_t(which[i])]);
      b.offset += size_t(views[i].offset) * es;
      return b;
    };
    // The closure holds mask (not only its buffer): a mask made for the call lives as long as the tape.
    const backend::Buffer mask_at = mask.defined() ? buffer_of(mask) : backend::Buffer{};
    if (!g.backend().attention_backward(dev.index(), t, at(views[0]), at(views[1]), at(views[2]), mask_at,
                                        buffer_of(out), buffer_of(g), buffer_of(lse), grad_at(0), grad_at(1),
                                        grad_at(2), a))
      fail("[attention] the backend ran the fused forward but has no fused backward for ", dtype_name(t));
    return grads;
  });
  return out;
}
}  // namespace detail

Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                             double dropout_p) {
  check_attention_inputs("dot_product_attention", q, k, &v);
  if (dropout_p <= 0) {  // dropout on the weights: composed (the fused kernels draw no mask)
    if (mask.defined()) {  // the composed path's checks name a bad mask
      detail::check_same_device("dot_product_attention", q, mask);
      if (mask.dtype() != DType::boolean)
        detail::fail("[dot_product_attention] mask must be Bool (true = attend); got ", summary(mask));
    }
    Tensor fused = fused_functional(q, k, v, mask, scale);
    if (fused.defined()) return fused;
  }
  return matmul(attention_scores("dot_product_attention", q, k, mask, scale, dropout_p), v);
}

Tensor dot_product_attention_scores(const Tensor& q, const Tensor& k, const Tensor& mask, double scale, double dropout_p) {
  check_attention_inputs("dot_product_attention_scores", q, k, nullptr);
  return attention_scores("dot_product_attention_scores", q, k, mask, scale, dropout_p);
}

}  // namespace flux
