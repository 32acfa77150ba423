// Reductions and the softmax family; each backward sits beside its forward.
#include <algorithm>
#include <cmath>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/trace.hpp"

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
    trace::emit("reduce", {x}, out, {{"op", {int64_t(op)}, {}}, {"axis", {axis}, {}}, {"keepdims", {int64_t(keepdims)}, {}}});
  return out;
}
// bf16/f16 tensors on the CPU: its backend reads the half storage itself and writes Float32 (argmax and
// argmin Int64; src/backends/cpu/cpu_backend.hpp's reduce_half, softmax_half), one pass instead of a
// Float32 copy first. backend.hpp asks the other backends for f32/f64 only: they get that copy. Not
// while tracing (ONNX export): the trace keeps the cast, so that each op's output dtype is its input's.
bool reads_half(const Tensor& x) { return is_half(x.dtype()) && x.device().is_cpu() && !trace::active(); }
Tensor to_compute(const Tensor& x, bool for_sum) {
  DType t = x.dtype();
  if (is_half(t)) return x.cast(DType::f32);
  if (for_sum && (t == DType::boolean || t == DType::u8 || t == DType::i32)) return x.cast(DType::i64);
  return x;
}
}  // namespace

Tensor sum(const Tensor& x0, int axis, bool keepdims) {
  check_defined("sum", x0);
  int a = normalize_axis("sum", axis, x0.ndim());
  if (reads_half(x0)) {
    const DType t = x0.dtype();
    Tensor y = reduce_raw(ReduceOp::sum, x0, a, keepdims, DType::f32);
    Shape kept = split(x0.shape(), a).kept, full_shape = x0.shape();
    autodiff::record(y, {&x0}, [kept, full_shape, t](const Tensor& g) {
      return Grads{broadcast_to(g.reshape(kept), full_shape).cast(t)};
    });
    return autocast_active() ? y : y.cast(t);
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
Tensor extreme(const char* api, ReduceOp op, const Tensor& x0, int axis, bool keepdims) {
  check_defined(api, x0);
  int a = normalize_axis(api, axis, x0.ndim());
  if (x0.shape()[a] == 0) fail("[", api, "] cannot reduce an empty axis of shape ", to_string(x0.shape()));
  if (reads_half(x0)) {
    // The extreme is one of x's values: its cast back is exact, and the tape keeps x in its own dtype.
    const DType t = x0.dtype();
    Tensor y = raw_cast(reduce_raw(op, x0, a, keepdims, DType::f32), t);
    Shape kept = split(x0.shape(), a).kept;
    autodiff::record(y, {&x0}, [x0, y, kept, a, t](const Tensor& g) {
      Tensor mask = eq(x0, y.reshape(kept)).cast(DType::f32);
      Tensor count = sum(mask, a, true);
      return Grads{(g.cast(DType::f32).reshape(kept) * mask / count).cast(t)};
    });
    return y;
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

Tensor argmax(const Tensor& x0, int axis, bool keepdims) {
  check_defined("argmax", x0);
  int a = normalize_axis("argmax", axis, x0.ndim());
  if (x0.shape()[a] == 0) fail("[argmax] cannot reduce an empty axis of shape ", to_string(x0.shape()));
  Tensor x = reads_half(x0) ? x0 : to_compute(x0, false);
  return reduce_raw(ReduceOp::argmax, x, a, keepdims, DType::i64);
}
Tensor argmin(const Tensor& x0, int axis, bool keepdims) {
  check_defined("argmin", x0);
  int a = normalize_axis("argmin", axis, x0.ndim());
  if (x0.shape()[a] == 0) fail("[argmin] cannot reduce an empty axis of shape ", to_string(x0.shape()));
  Tensor x = reads_half(x0) ? x0 : to_compute(x0, false);
  return reduce_raw(ReduceOp::argmin, x, a, keepdims, DType::i64);
}

// ---------------- softmax family ----------------
namespace {
Tensor softmax_raw(const char* api, const Tensor& x0, int axis, bool log, Tensor& x_out) {
  check_defined(api, x0);
  if (x0.ndim() == 0) fail("[", api, "] needs at least one dimension");
  if (!is_floating(x0.dtype())) fail("[", api, "] needs a floating-point tensor, got ", dtype_name(x0.dtype()));
  int a = normalize_axis(api, axis, x0.ndim());
  // On the CPU a half x is read as it is (reads_half); x_out is then x0 itself, recorded as the input.
  Tensor x = is_half(x0.dtype()) && !reads_half(x0) ? x0.cast(DType::f32) : x0;
  Split p = split(x.shape(), a);
  Tensor y = Tensor::empty(x.shape(), is_half(x.dtype()) ? DType::f32 : x.dtype(), x.device());
  if (y.numel()) x.backend().softmax(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(y), p.outer, p.len, p.inner, log);
  if (trace::active()) trace::emit(log ? "logsoftmax" : "softmax", {x}, y, {{"axis", {a}, {}}});
  x_out = x;
  return y;
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

Tensor detail::softmax_op(const Tensor& x0, int axis) {
  Tensor x;
  Tensor y = softmax_raw("softmax", x0, axis, false, x);
  int a = normalize_axis("softmax", axis, x.ndim());
  autodiff::record(y, {&x}, [y, a, t = x.dtype()](const Tensor& g) {
    Tensor dx = fused_softmax_grad(y, g, a, false);
    if (!dx.defined()) dx = y * (g - sum(g * y, a, true));
    return Grads{dx.dtype() == t ? dx : dx.cast(t)};
  });
  return is_half(x0.dtype()) && !autocast_active() ? y.cast(x0.dtype()) : y;  // autocast: Float32
}

Tensor detail::logsoftmax_op(const Tensor& x0, int axis) {
  Tensor x;
  Tensor y = softmax_raw("logsoftmax", x0, axis, true, x);
  int a = normalize_axis("logsoftmax", axis, x.ndim());
  autodiff::record(y, {&x}, [y, a, t = x.dtype()](const Tensor& g) {
    Tensor dx = fused_softmax_grad(y, g, a, true);
    if (!dx.defined()) dx = g - exp(y) * sum(g, a, true);
    return Grads{dx.dtype() == t ? dx : dx.cast(t)};
  });
  return is_half(x0.dtype()) && !autocast_active() ? y.cast(x0.dtype()) : y;
}

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
