// matmul: 2-D, batched with broadcast batch axes, and 1-D vectors as in NumPy; transposes are folded
// into the GEMM call. Backward: for C = op(A) op(B), dA and dB are again matmuls with folded transposes.
#include <algorithm>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/storage_cache.hpp"
#include "src/ops/registry.hpp"
#include "src/ops/through_float32.hpp"

namespace flux {

using Grads = std::vector<Tensor>;
using namespace detail;

namespace {

// a: (B..., ra, ca), b: (B..., rb, cb) with identical batch shapes.
Tensor matmul_core(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  int n = a.ndim();
  int64_t m = ta ? a.shape()[n - 1] : a.shape()[n - 2];
  int64_t k = ta ? a.shape()[n - 2] : a.shape()[n - 1];
  int64_t kb = tb ? b.shape()[n - 1] : b.shape()[n - 2];
  int64_t nn = tb ? b.shape()[n - 2] : b.shape()[n - 1];
  if (k != kb)
    fail("[matmul] shapes ", to_string(a.shape()), (ta ? "ᵀ" : ""), " and ", to_string(b.shape()), (tb ? "ᵀ" : ""),
         " do not compose (inner dimensions ", k, " and ", kb, ")");
  Shape out_shape;
  int64_t batch = 1;
  for (int i = 0; i < n - 2; ++i) out_shape.push_back(a.shape()[i]), batch *= a.shape()[i];
  out_shape.push_back(m);
  out_shape.push_back(nn);
  Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
  if (c.numel()) {
    backend::Gemm g;
    g.batch = batch;
    g.m = m;
    g.n = nn;
    g.k = k;
    g.trans_a = ta;
    g.trans_b = tb;
    g.stride_a = m * k;
    g.stride_b = k * nn;
    g.stride_c = m * nn;
    backend::Backend& be = a.backend();
    const int dev = a.device().index();
    if (!is_half(a.dtype())) {
      be.matmul(dev, a.dtype(), flux::detail::buffer_of(a), flux::detail::buffer_of(b), flux::detail::buffer_of(c), g);
    } else if (!be.matmul_low_precision(dev, a.dtype(), flux::detail::buffer_of(a), flux::detail::buffer_of(b),
                                        flux::detail::buffer_of(c), g)) {
      // No low-precision GEMM here: through float32 (b kept with it at inference: f32_weight).
      Tensor af = raw_cast(a, DType::f32), bf = f32_weight(b);
      Tensor cf = Tensor::empty(out_shape, DType::f32, a.device());
      be.matmul(dev, DType::f32, flux::detail::buffer_of(af), flux::detail::buffer_of(bf), flux::detail::buffer_of(cf), g);
      be.cast(dev, DType::f32, flux::detail::buffer_of(cf), a.dtype(), flux::detail::buffer_of(c), c.numel());
    }
  }
  if (trace::active()) trace::emit(ops::matmul, {a, b}, c, {{"trans", {int64_t(ta), int64_t(tb)}, {}}});
  if (is_floating(a.dtype())) {
    // Only the gradients of recorded inputs are computed: a Dense layer's input batch needs none.
    bool need_a = autodiff::tracked(a), need_b = autodiff::tracked(b);
    autodiff::record(c, {&a, &b}, [a, b, ta, tb, need_a, need_b](const Tensor& g0) {
      const Tensor g = g0.dtype() == a.dtype() ? g0 : g0.cast(a.dtype());
      Tensor da, db;
      if (!ta && !tb) {
        if (need_a) da = matmul(g, b, false, true);
        if (need_b) db = matmul(a, g, true, false);
      } else if (!ta && tb) {
        if (need_a) da = matmul(g, b, false, false);
        if (need_b) db = matmul(g, a, true, false);
      } else if (ta && !tb) {
        if (need_a) da = matmul(b, g, false, true);
        if (need_b) db = matmul(a, g, false, false);
      } else {
        if (need_a) da = matmul(b, g, true, true);
        if (need_b) db = matmul(g, a, true, true);
      }
      return Grads{da, db};
    });
  }
  return c;
}

/// op(a) op(b) of 2-D low tensors as Float32, the accumulation unrounded
/// (Backend::matmul_low_precision_float32); undefined where the backend declines.
Tensor low_product_float32(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  backend::Gemm g;
  g.m = ta ? a.shape()[1] : a.shape()[0], g.k = ta ? a.shape()[0] : a.shape()[1], g.n = tb ? b.shape()[0] : b.shape()[1];
  g.trans_a = ta, g.trans_b = tb;
  g.stride_a = a.numel(), g.stride_b = b.numel(), g.stride_c = g.m * g.n;
  if (!library_kernels() || g.m * g.n * g.k == 0) return Tensor();
  Tensor c = Tensor::empty(Shape{g.m, g.n}, DType::f32, a.device());
  if (!a.backend().matmul_low_precision_float32(a.device().index(), a.dtype(), flux::detail::buffer_of(a),
                                                flux::detail::buffer_of(b), flux::detail::buffer_of(c), g))
    return Tensor();
  return c;
}

/// Low-precision Dense in training (autocast's): the backend's GEMM with the bias and relu in its epilogue
/// writes y once, in place of three passes (GEMM, bias add, relu), accumulating in Float32 and rounding
/// once. No prepared weights: they change between steps. The backward is the composed ops': relu's
/// mask from y (y > 0 exactly where x wᵀ + b > 0; one pass with the backend's fused relu gradient),
/// then the two products in the low dtype, except the weight's gradient, which the backend may write
/// in Float32 unrounded, and the bias's row sum, kept in Float32: autocast's cast hands them to the
/// Float32 masters as they are (as conv's). Undefined where the backend declines (the caller composes
/// matmul, add and relu).
Tensor half_linear_training(const Tensor& x, const Tensor& w, const Tensor& b, Tensor y, bool relu, bool need_x,
                            bool need_w, bool need_b) {
  const DType t = x.dtype();
  const int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  if (!library_kernels() ||
      !x.backend().linear_forward(x.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(w), nullptr,
                                  flux::detail::buffer_of(b), flux::detail::buffer_of(y), n, in, out, relu))
    return Tensor();
  // One node keeping the low tensors (y for relu's mask), its backward in the low dtype t.
  return through_float32(
      &ops::linear, {&x, &w, &b}, {x, w, relu ? y : Tensor()}, [&](Grads&) { return y; },
      [need_x, need_w, need_b](const Grads& k, Tensor g) {
        const Tensor &x = k[0], &w = k[1], &kept_y = k[2];
        if (kept_y.defined()) g = relu_grad(kept_y, g);
        Tensor dx, dw, db;
        if (need_x) dx = matmul(g, w);  // (n, out) (out, in)
        if (need_w) {                   // (out, n) (n, in)
          dw = low_product_float32(g, x, true, false);
          if (!dw.defined()) dw = matmul(g, x, true, false);
        }
        if (need_b) db = float32_sum(g, 0);  // (out,)
        return Grads{dx, dw, db};
      },
      {{"relu", {int64_t(relu)}, {}}}, t, kFloat32ParameterGrads);
}

}  // namespace

Tensor detail::linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  DType t = x.dtype();
  if ((t != DType::f32 && t != DType::f64 && !is_half(t)) || w.dtype() != t || b.dtype() != t || x.ndim() != 2 || w.ndim() != 2 ||
      b.ndim() != 1 || x.device() != w.device() || b.device() != w.device())
    return Tensor();
  int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  if (w.shape()[1] != in || b.shape()[0] != out || n == 0) return Tensor();
  Tensor y = Tensor::empty(Shape{n, out}, t, x.device());
  bool need_x = autodiff::tracked(x), need_w = autodiff::tracked(w), need_b = autodiff::tracked(b);
  if (!need_x && !need_w && !need_b && library_kernels() &&
      x.backend().linear_forward(x.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(w), &detail::storage_cache(w), flux::detail::buffer_of(b),
                                 flux::detail::buffer_of(y), n, in, out, relu)) {
    if (trace::active()) trace::emit(ops::linear, {x, w, b}, y, {{"relu", {int64_t(relu)}, {}}});
    return y;
  }
  if (is_half(t)) return half_linear_training(x, w, b, y, relu, need_x, need_w, need_b);
  // y (n, out): every row a copy of b, then y += x W^T.
  backend::StridedCopy rows;
  rows.ndim = 2;
  rows.shape[0] = n, rows.shape[1] = out;
  rows.src_stride[0] = 0, rows.src_stride[1] = 1;
  rows.dst_stride[0] = out, rows.dst_stride[1] = 1;
  x.backend().strided_copy(x.device().index(), t, flux::detail::buffer_of(b), flux::detail::buffer_of(y), rows);
  backend::Gemm g;
  g.m = n, g.n = out, g.k = in;
  g.trans_b = true;
  g.stride_a = n * in, g.stride_b = out * in, g.stride_c = n * out;
  g.beta = 1.0;
  x.backend().matmul(x.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(w), flux::detail::buffer_of(y), g);
  autodiff::record(y, {&x, &w, &b}, [x, w, need_x, need_w, need_b](const Tensor& gy) {
    Tensor dx, dw, db;
    if (need_x) dx = matmul(gy, w);                 // (n, out) (out, in)
    if (need_w) dw = matmul(gy, x, true, false);    // (out, n) (n, in)
    if (need_b) db = sum(gy, 0);                    // (out,)
    return Grads{dx, dw, db};
  });
  Tensor result = y;
  if (relu) {  // the op Dense's relu activation runs (recorded), traced inside the one linear event below
    trace::Scope untraced(nullptr);
    result = relu_op(y);
  }
  // One traced event whichever kernel ran (the fused path's above): a trace must not depend on the batch
  // size, which picks the kernel (onnx::save compares the trace at two sizes).
  if (trace::active()) trace::emit(ops::linear, {x, w, b}, result, {{"relu", {int64_t(relu)}, {}}});
  return result;
}

Tensor matmul(const Tensor& a0, const Tensor& b0, bool ta, bool tb) {
  check_defined("matmul", a0);
  check_defined("matmul", b0);
  check_same_device("matmul", a0, b0);
  if (a0.ndim() == 0 || b0.ndim() == 0)
    fail("[matmul] needs tensors of at least 1 dimension; got shapes ", to_string(a0.shape()), " and ", to_string(b0.shape()));
  {  // checked on the shapes as given, so that the message names them (not the reshaped operands)
    const Shape &sa = a0.shape(), &sb = b0.shape();
    int na = sa.size(), nb = sb.size();
    bool fa = ta && na > 1, fb = tb && nb > 1;
    int64_t ka = na == 1 ? sa[0] : (ta ? sa[na - 2] : sa[na - 1]);
    int64_t kb = nb == 1 ? sb[0] : (tb ? sb[nb - 1] : sb[nb - 2]);
    if (ka != kb)
      fail("[matmul] shapes ", to_string(sa), (fa ? "ᵀ" : ""), " and ", to_string(sb), (fb ? "ᵀ" : ""),
           " do not compose (inner dimensions ", ka, " and ", kb, ")");
    for (int i = 3; i <= std::min(na, nb); ++i)
      if (sa[na - i] != sb[nb - i] && sa[na - i] != 1 && sb[nb - i] != 1)
        fail("[matmul] the batch dimensions of shapes ", to_string(sa), " and ", to_string(sb),
             " cannot be broadcast together");
  }
  if (auto low = autocast_low({&a0, &b0})) return matmul(autocast_to(a0, *low), autocast_to(b0, *low), ta, tb);
  DType t = promote(a0.dtype(), b0.dtype());
  if (t == DType::boolean || t == DType::u8) t = DType::i64;
  Tensor a = a0.cast(t), b = b0.cast(t);
  // 1-D operands: a vector (k,) is a row (1, k) on the left and a column (k, 1) on the right.
  if (a.ndim() == 1 || b.ndim() == 1) {
    bool va = a.ndim() == 1, vb = b.ndim() == 1;
    Tensor a2 = va ? a.reshape(Shape{1, a.shape()[0]}) : a;
    Tensor b2 = vb ? b.reshape(Shape{b.shape()[0], 1}) : b;
    Tensor c = matmul(a2, b2, va ? false : ta, vb ? false : tb);
    Shape s;
    for (int i = 0; i < c.ndim(); ++i) {
      if (va && i == c.ndim() - 2) continue;
      if (vb && i == c.ndim() - 1) continue;
      s.push_back(c.shape()[i]);
    }
    return c.reshape(s);
  }
  Tensor c;
  if (a.ndim() > 2 && b.ndim() == 2 && !ta) {
    // (B..., m, k) x (k, n): one GEMM with the batch folded into m.
    Shape s = a.shape();
    int64_t k = s[s.size() - 1];
    Tensor flat = matmul_core(a.reshape(Shape{-1, k}), b, false, tb);
    Shape out = s;
    out[out.size() - 1] = flat.shape()[1];
    c = flat.reshape(out);
  } else if (a.ndim() == 2 && b.ndim() == 2) {
    c = matmul_core(a, b, ta, tb);
  } else {
    // Broadcast the batch axes, then one batched GEMM.
    Shape ba, bb;
    for (int i = 0; i < a.ndim() - 2; ++i) ba.push_back(a.shape()[i]);
    for (int i = 0; i < b.ndim() - 2; ++i) bb.push_back(b.shape()[i]);
    Shape batch = broadcast_shapes("matmul", ba, bb);
    Shape fa = batch, fb = batch;
    fa.push_back(a.shape()[a.ndim() - 2]);
    fa.push_back(a.shape()[a.ndim() - 1]);
    fb.push_back(b.shape()[b.ndim() - 2]);
    fb.push_back(b.shape()[b.ndim() - 1]);
    c = matmul_core(broadcast_to(a, fa), broadcast_to(b, fb), ta, tb);
  }
  return c;
}

}  // namespace flux
