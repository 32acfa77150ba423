// Reductions and the softmax family; each backward sits beside its forward.
#include <algorithm>
#include <cmath>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/through_float32.hpp"
#include "src/ops/registry.hpp"

namespace flux {

using backend::ReduceOp;
using Grads = std::vector<Tensor>;
using namespace detail;

namespace detail {
int normalize_axis(const char* api, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) fail("[", api, "] axis ", axis, " is out of range for a ", ndim, "-dimensional tensor");
  return a;
}
}  // namespace detail

namespace {
struct Split {
  int64_t outer = 1, len = 1, inner = 1;
  Shape kept, dropped;  // result shape with keepdims / without
};
Split split(const Shape& s, int axis) {
  Split r;
  for (int i = 0; i < s.size(); ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.len = s[i];
    else r.inner *= s[i];
    r.kept.push_back(i == axis ? 1 : s[i]);
    if (i != axis) r.dropped.push_back(s[i]);
  }
  return r;
}
Tensor reduce_raw(ReduceOp op, const Tensor& x, int axis, bool keepdims, DType out_t) {
  Split p = split(x.shape(), axis);
  Tensor out = Tensor::empty(keepdims ? p.kept : p.dropped, out_t, x.device());
  if (out.numel()) x.backend().reduce(x.device().index(), op, x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(out), p.outer, p.len, p.inner);
  if (trace::active())
    trace::emit(ops::reduce, {x}, out, {{"op", {int64_t(op)}, {}}, {"axis", {axis}, {}}, {"keepdims", {int64_t(keepdims)}, {}}});
  return out;
}
// A Float16/BFloat16 operand as the reduce and softmax kernels take it: as it is where the backend reads
// half storage (reads_half, through_float32.hpp; one pass instead of a Float32 copy first), else a
// Float32 copy.
Tensor half_operand(const Tensor& x) { return reads_half(x) ? x : raw_cast(x, DType::f32); }
Tensor to_compute(const Tensor& x, bool for_sum) {
  DType t = x.dtype();
  if (is_half(t)) return x.cast(DType::f32);
  if (for_sum && (t == DType::boolean || t == DType::u8 || t == DType::i32)) return x.cast(DType::i64);
  return x;
}
}  // namespace

Tensor detail::float32_sum(const Tensor& x, int axis) {
  return reduce_raw(ReduceOp::sum, is_half(x.dtype()) ? half_operand(x) : x, normalize_axis("sum", axis, x.ndim()),
                    false, DType::f32);
}

Tensor sum(const Tensor& x0, int axis, bool keepdims) {
  check_defined("sum", x0);
  int a = normalize_axis("sum", axis, x0.ndim());
  if (is_half(x0.dtype()) && !trace::active()) {
    // Autocast keeps sums (and means) in Float32.
    const DType t = x0.dtype();
    const Shape kept = split(x0.shape(), a).kept, full_shape = x0.shape();
    return through_float32(
        nullptr, {&x0}, {},
        [&](std::vector<Tensor>&) {
          Tensor y = reduce_raw(ReduceOp::sum, half_operand(x0), a, keepdims, DType::f32);
          return autocast_active() ? y : raw_cast(y, t);
        },
        [kept, full_shape](const std::vector<Tensor>&, const Tensor& g) {
          return Grads{broadcast_to(g.reshape(kept), full_shape)};
        });
  }
  Tensor x = to_compute(x0, true);
  Tensor y = reduce_raw(ReduceOp::sum, x, a, keepdims, x.dtype());
  if (is_floating(x.dtype())) {
    Shape kept = split(x.shape(), a).kept, full_shape = x.shape();
    autodiff::record(y, {&x}, [kept, full_shape](const Tensor& g) { return Grads{broadcast_to(g.reshape(kept), full_shape)}; });
  }
  // Autocast keeps sums (and means) in Float32.
  return is_half(x0.dtype()) && !autocast_active() ? y.cast(x0.dtype()) : y;
}

Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  check_defined("sum", x);
  std::vector<int> norm;
  for (int a : axes) norm.push_back(normalize_axis("sum", a, x.ndim()));
  std::sort(norm.begin(), norm.end());
  if (std::adjacent_find(norm.begin(), norm.end()) != norm.end()) fail("[sum] repeated axis in the axis list");
  Tensor y = x;
  for (auto it = norm.rbegin(); it != norm.rend(); ++it) y = sum(y, *it, true);
  if (keepdims) return y;
  Shape s;
  for (int i = 0; i < x.ndim(); ++i)
    if (!std::binary_search(norm.begin(), norm.end(), i)) s.push_back(x.shape()[i]);
  return y.reshape(s);
}

Tensor sum(const Tensor& x) {
  check_defined("sum", x);
  return sum(x.reshape(Shape{x.numel()}), 0, false);
}

Tensor mean(const Tensor& x, int axis, bool keepdims) {
  check_defined("mean", x);
  int a = normalize_axis("mean", axis, x.ndim());
  if (x.shape()[a] == 0) fail("[mean] cannot take the mean over an empty axis of shape ", to_string(x.shape()));
  Tensor xf = is_floating(x.dtype()) ? x : x.cast(DType::f32);
  return sum(xf, a, keepdims) / double(x.shape()[a]);
}

Tensor mean(const Tensor& x) {
  check_defined("mean", x);
  if (x.numel() == 0) fail("[mean] cannot take the mean of an empty tensor");
  return mean(x.reshape(Shape{x.numel()}), 0, false);
}

namespace {
// max and min (recorded), argmax and argmin (indices).
Tensor extreme(const char* api, ReduceOp op, const Tensor& x0, int axis, bool keepdims) {
  check_defined(api, x0);
  int a = normalize_axis(api, axis, x0.ndim());
  if (x0.shape()[a] == 0) fail("[", api, "] cannot reduce an empty axis of shape ", to_string(x0.shape()));
  if (op == ReduceOp::argmax || op == ReduceOp::argmin)  // indices: no gradient
    return reduce_raw(op, reads_half(x0) ? x0 : to_compute(x0, false), a, keepdims, DType::i64);
  if (is_half(x0.dtype()) && !trace::active()) {
    // The extreme is one of x's values: its cast down is exact, and so is the kept y cast up.
    const DType t = x0.dtype();
    const Shape kept = split(x0.shape(), a).kept;
    return through_float32(
        nullptr, {&x0}, {x0},
        [&](std::vector<Tensor>& keep) {
          Tensor y = raw_cast(reduce_raw(op, half_operand(x0), a, keepdims, DType::f32), t);
          keep.push_back(y);
          return y;
        },
        [kept, a](const std::vector<Tensor>& k, const Tensor& g) {
          Tensor mask = eq(k[0], k[1].reshape(kept)).cast(DType::f32);
          Tensor count = sum(mask, a, true);
          return Grads{g.reshape(kept) * mask / count};
        });
  }
  Tensor x = to_compute(x0, false);
  Tensor y = reduce_raw(op, x, a, keepdims, x.dtype());
  if (is_floating(x.dtype())) {
    Shape kept = split(x.shape(), a).kept;
    autodiff::record(y, {&x}, [x, y, kept, a](const Tensor& g) {
      Tensor yk = y.reshape(kept);
      Tensor mask = eq(x, yk).cast(x.dtype());
      Tensor count = sum(mask, a, true);
      return Grads{g.reshape(kept) * mask / count};
    });
  }
  return is_half(x0.dtype()) ? y.cast(x0.dtype()) : y;
}
}  // namespace

Tensor max(const Tensor& x, int axis, bool keepdims) { return extreme("max", ReduceOp::max, x, axis, keepdims); }
Tensor min(const Tensor& x, int axis, bool keepdims) { return extreme("min", ReduceOp::min, x, axis, keepdims); }
Tensor max(const Tensor& x) { check_defined("max", x); return max(x.reshape(Shape{x.numel()}), 0, false); }
Tensor min(const Tensor& x) { check_defined("min", x); return min(x.reshape(Shape{x.numel()}), 0, false); }

Tensor argmax(const Tensor& x, int axis, bool keepdims) { return extreme("argmax", ReduceOp::argmax, x, axis, keepdims); }
Tensor argmin(const Tensor& x, int axis, bool keepdims) { return extreme("argmin", ReduceOp::argmin, x, axis, keepdims); }

// ---------------- softmax family ----------------
namespace {
// y = (log)softmax(x) over `axis` (normalised); y is Float32 for a Float16/BFloat16 x (read as it is).
Tensor softmax_raw(const Tensor& x, int a, bool log) {
  Split p = split(x.shape(), a);
  Tensor y = Tensor::empty(x.shape(), is_half(x.dtype()) ? DType::f32 : x.dtype(), x.device());
  if (y.numel()) x.backend().softmax(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(y), p.outer, p.len, p.inner, log);
  if (trace::active()) trace::emit(log ? ops::logsoftmax : ops::softmax, {x}, y, {{"axis", {a}, {}}});
  return y;
}

int softmax_axis(const char* api, const Tensor& x, int axis) {
  check_defined(api, x);
  if (x.ndim() == 0) fail("[", api, "] needs at least one dimension");
  if (!is_floating(x.dtype())) fail("[", api, "] needs a floating-point tensor, got ", dtype_name(x.dtype()));
  return normalize_axis(api, axis, x.ndim());
}


// The backend's fused (log)softmax adjoint (Backend::softmax_backward) for f32/f64, or undefined when it
// has none for this layout (or FLUX_LIBRARY_KERNELS=0): the callers then compose the formula from ops.
Tensor fused_softmax_grad(const Tensor& y, const Tensor& g, int axis, bool log) {
  const DType t = y.dtype();
  if (!library_kernels() || (t != DType::f32 && t != DType::f64) || g.dtype() != t || g.shape() != y.shape())
    return Tensor();
  Split p = split(y.shape(), axis);
  Tensor dx = Tensor::empty(y.shape(), t, y.device());
  if (y.numel() == 0) return dx;
  if (!y.backend().softmax_backward(y.device().index(), t, flux::detail::buffer_of(y), flux::detail::buffer_of(g), flux::detail::buffer_of(dx), p.outer, p.len, p.inner,
                                    log))
    return Tensor();
  return dx;
}
}  // namespace

namespace {
// dx of (log)softmax from its output y and the output gradient g, both of y's dtype.
Tensor softmax_grad(const Tensor& y, const Tensor& g, int a, bool log) {
  Tensor dx = fused_softmax_grad(y, g, a, log);
  if (!dx.defined()) dx = log ? g - exp(y) * sum(g, a, true) : y * (g - sum(g * y, a, true));
  return dx;
}

Tensor softmax_family(const char* api, const Tensor& x0, int axis, bool log) {
  const int a = softmax_axis(api, x0, axis);
  if (is_half(x0.dtype()) && !trace::active()) {
    // In Float32, the output too under autocast; the tape keeps the Float32 y the backward reads.
    const DType t = x0.dtype();
    return through_float32(
        nullptr, {&x0}, {},
        [&](std::vector<Tensor>& keep) {
          Tensor y = softmax_raw(half_operand(x0), a, log);
          keep.push_back(y);
          return autocast_active() ? y : raw_cast(y, t);
        },
        [a, log](const std::vector<Tensor>& k, const Tensor& g) { return Grads{softmax_grad(k[0], g, a, log)}; });
  }
  // (A half x while tracing: the trace keeps the casts.)
  const Tensor x = is_half(x0.dtype()) ? x0.cast(DType::f32) : x0;
  Tensor y = softmax_raw(x, a, log);
  autodiff::record(y, {&x}, [y, a, log](const Tensor& g) { return Grads{softmax_grad(y, g, a, log)}; });
  return is_half(x0.dtype()) && !autocast_active() ? y.cast(x0.dtype()) : y;  // autocast: Float32
}
}  // namespace

Tensor detail::softmax_op(const Tensor& x0, int axis) { return softmax_family("softmax", x0, axis, false); }
Tensor detail::logsoftmax_op(const Tensor& x0, int axis) { return softmax_family("logsoftmax", x0, axis, true); }

Tensor logsumexp(const Tensor& x, int axis, bool keepdims) {
  check_defined("logsumexp", x);
  if (!is_floating(x.dtype())) fail("[logsumexp] needs a floating-point tensor, got ", dtype_name(x.dtype()));
  int a = normalize_axis("logsumexp", axis, x.ndim());
  if (x.shape()[a] == 0) fail("[logsumexp] cannot reduce an empty axis of shape ", to_string(x.shape()));
  Tensor m;
  {
    autodiff::NoGrad no_grad;  // the shift is a constant: it cancels in the gradient
    m = max(x, a, true);
    m = where(eq(abs(m), full_like(m, INFINITY)), zeros_like(m), m);
  }
  Tensor r = log(sum(exp(x - m), a, true)) + m;
  if (keepdims) return r;
  return r.reshape(split(x.shape(), a).dropped);
}

}  // namespace flux
