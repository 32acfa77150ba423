// Loss functions (Flux's definitions; classes along the last axis, observations along the first).
#include "flux/losses.hpp"

#include <limits>
#include <string>

#include "flux/nn/activations.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

namespace {
/// For the one-hot losses: when y looks like class labels for yhat (N, C) — an integer tensor, or
/// (N,) / (N, 1) — the hint that turns them into the (N, C) one-hot targets the loss expects.
std::string onehot_hint(const Tensor& yhat, const Tensor& y) {
  if (yhat.ndim() < 2 || y.ndim() == 0 || y.shape()[0] != yhat.shape()[0]) return "";
  const bool integer = !is_floating(y.dtype());
  const bool label_shape = y.ndim() == 1 || (y.ndim() == yhat.ndim() && y.shape()[y.ndim() - 1] == 1);
  if (!integer && !label_shape) return "";
  const int64_t n = yhat.shape()[yhat.ndim() - 1];
  std::string s = "; the target looks like class labels (" + std::string(dtype_name(y.dtype())) + " of shape " +
                  to_string(y.shape()) + "), and this loss takes one-hot targets: pass onehot(y, " + std::to_string(n) + ")";
  if (!integer) s += " (after y.cast(Int64) for labels stored as floats)";
  if (y.ndim() == 2) s += " on y.reshape({-1})";
  return s + ", of shape " + to_string(yhat.shape());
}

// Whether y broadcasts to yhat's shape (NumPy rules: trailing axes equal or 1; y may have fewer axes).
// Only this direction: a target that would enlarge the result ((N, 1) against (N,)) is an error, not an
// (N, N) loss.
bool broadcasts_to(const Shape& y, const Shape& yhat) {
  if (y.size() > yhat.size()) return false;
  for (int i = 1; i <= y.size(); ++i) {
    int64_t a = y[y.size() - i], b = yhat[yhat.size() - i];
    if (a != b && a != 1) return false;
  }
  return true;
}

// The target y may have yhat's shape or broadcast to it (a number, a row of classes, ...), as Flux's
// losses broadcast (ŷ .- y). For the one-hot losses the class (last) axis must match unless y is 0-d:
// a (N, 1) target there is class labels, not a broadcast.
void check_pair(const char* api, const Tensor& yhat, const Tensor& y, bool onehot_targets = false) {
  detail::check_defined(api, yhat);
  detail::check_defined(api, y);
  detail::check_same_device(api, yhat, y);
  bool ok = yhat.shape() == y.shape() || broadcasts_to(y.shape(), yhat.shape());
  if (ok && onehot_targets && y.ndim() > 0 && yhat.ndim() > 0)
    ok = y.shape()[y.ndim() - 1] == yhat.shape()[yhat.ndim() - 1];
  if (!ok) {
    std::string hint = onehot_targets ? onehot_hint(yhat, y) : std::string();
    if (hint.empty()) hint = " (the target must have the prediction's shape or broadcast to it, e.g. a number or one row)";
    detail::fail("[", api, "] prediction shape ", to_string(yhat.shape()), " and target shape ", to_string(y.shape()),
                 " differ", hint);
  }
  if (!is_floating(yhat.dtype())) detail::fail("[", api, "] needs floating-point predictions, got ", dtype_name(yhat.dtype()));
  if (yhat.numel() == 0) detail::fail("[", api, "] got empty tensors of shape ", to_string(yhat.shape()));
}
Tensor aggregate(const Tensor& l, Agg agg) {
  switch (agg) {
    case Agg::mean: return mean(l);
    case Agg::sum: return sum(l);
    case Agg::none: return l;
  }
  return l;
}
// Per-observation sums over the class (last) axis, then aggregated.
Tensor per_observation(const Tensor& elementwise, Agg agg) {
  Tensor l = elementwise.ndim() == 0 ? elementwise : sum(elementwise, -1);
  return aggregate(l, agg);
}
Tensor target_like(const Tensor& yhat, const Tensor& y) { return y.dtype() == yhat.dtype() ? y : y.cast(yhat.dtype()); }
// xlogy(x, y) = x log y with 0 where x == 0 (also for y = 0 or y = inf), as LogExpFunctions.xlogy.
// Gradients as Flux's (ChainRules through LogExpFunctions): d/dx = log y also where x == 0 (a one-hot
// target's zeros get log(yhat + eps)), d/dy = x / y. So the log reads y itself wherever log y is
// finite, and 1 only where x == 0 and log y is not (y <= 0 or y = inf): no NaN in the value, and a
// NaN y still gives NaN, as LogExpFunctions does.
Tensor xlogy(const Tensor& x, const Tensor& y) {
  Tensor zero = zeros(Shape{}, x.dtype(), x.device()), one = ones(Shape{}, x.dtype(), x.device());
  Tensor inf = full(Shape{}, std::numeric_limits<double>::infinity(), x.dtype(), x.device());
  Tensor y_where_x_is_zero = where(y <= zero, one, where(y == inf, one, y));
  return x * log(where(x == zero, y_where_x_is_zero, y));
}
double eps_or_default(const Tensor& yhat, std::optional<double> eps) { return eps ? *eps : epseltype(yhat.dtype()); }
}  // namespace

double epseltype(DType t) {
  switch (t) {
    case DType::f64: return 0x1p-52;
    case DType::f32: return 0x1p-23;
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: detail::fail("[epseltype] needs a floating-point dtype, got ", dtype_name(t));
  }
}

Tensor mse(const Tensor& yhat0, const Tensor& y0, LossOptions o) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("mse", yhat, y);
  return aggregate(square(yhat - target_like(yhat, y)), o.agg);
}

Tensor mae(const Tensor& yhat0, const Tensor& y0, LossOptions o) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("mae", yhat, y);
  return aggregate(abs(yhat - target_like(yhat, y)), o.agg);
}

Tensor crossentropy(const Tensor& yhat0, const Tensor& y0, LossOptions o, std::optional<double> eps) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("crossentropy", yhat, y, true);
  Tensor t = target_like(yhat, y);
  return per_observation(-xlogy(t, yhat + eps_or_default(yhat, eps)), o.agg);
}

Tensor logitcrossentropy(const Tensor& logits0, const Tensor& y0, LossOptions o) {
  // Autocast: losses in Float32.
  const Tensor logits = detail::autocast_f32(logits0), y = detail::autocast_f32(y0);
  check_pair("logitcrossentropy", logits, y, true);
  Tensor t = target_like(logits, y);
  return per_observation(-(t * detail::logsoftmax_op(logits, -1)), o.agg);
}

Tensor binarycrossentropy(const Tensor& yhat0, const Tensor& y0, LossOptions o, std::optional<double> eps) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("binarycrossentropy", yhat, y);
  Tensor t = target_like(yhat, y);
  double e = eps_or_default(yhat, eps);
  return aggregate(-xlogy(t, yhat + e) - xlogy(1.0 - t, 1.0 - yhat + e), o.agg);
}

Tensor logitbinarycrossentropy(const Tensor& logits0, const Tensor& y0, LossOptions o) {
  // Autocast: losses in Float32.
  const Tensor logits = detail::autocast_f32(logits0), y = detail::autocast_f32(y0);
  check_pair("logitbinarycrossentropy", logits, y);
  Tensor t = target_like(logits, y);
  // (1 - y) x - logσ(x), with logσ(x) = -softplus(-x)
  return aggregate((1.0 - t) * logits + softplus(-logits), o.agg);
}

Tensor huber(const Tensor& yhat0, const Tensor& y0, LossOptions o, double delta) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("huber", yhat, y);
  if (delta <= 0) detail::fail("[huber] delta must be positive, got ", delta);
  Tensor d = abs(yhat - target_like(yhat, y));
  Tensor quad = 0.5 * square(d);
  Tensor lin = delta * (d - 0.5 * delta);
  Tensor small = d < delta;
  return aggregate(where(small, quad, lin), o.agg);
}

Tensor kldivergence(const Tensor& yhat0, const Tensor& y0, LossOptions o, std::optional<double> eps) {
  // Autocast: losses in Float32.
  const Tensor yhat = detail::autocast_f32(yhat0), y = detail::autocast_f32(y0);
  check_pair("kldivergence", yhat, y, true);
  Tensor t = target_like(yhat, y);
  Tensor cross = -xlogy(t, yhat + eps_or_default(yhat, eps));
  if (t.shape() != yhat.shape()) {
    // Flux: agg(sum(xlogx.(y))) over y's own rows, plus the broadcast crossentropy. A 0-d target is
    // one row of C equal classes (the class axis always matches otherwise: check_pair).
    Tensor rows = t.ndim() == 0 && yhat.ndim() > 0 ? broadcast_to(t, Shape{yhat.shape()[yhat.ndim() - 1]}) : t;
    return per_observation(xlogy(rows, rows), o.agg) + per_observation(cross, o.agg);
  }
  return per_observation(xlogy(t, t) + cross, o.agg);  // xlogx(y): no eps
}

// A number as the target: a 0-d tensor of yhat's dtype on its device, broadcast by the loss.
namespace {
Tensor scalar_target(const char* api, const Tensor& yhat, double y) {
  detail::check_defined(api, yhat);
  return full(Shape{}, y, is_floating(yhat.dtype()) ? yhat.dtype() : DType::f32, yhat.device());
}
}  // namespace
Tensor mse(const Tensor& yhat, double y, LossOptions o) { return mse(yhat, scalar_target("mse", yhat, y), o); }
Tensor mae(const Tensor& yhat, double y, LossOptions o) { return mae(yhat, scalar_target("mae", yhat, y), o); }
Tensor crossentropy(const Tensor& yhat, double y, LossOptions o, std::optional<double> eps) {
  return crossentropy(yhat, scalar_target("crossentropy", yhat, y), o, eps);
}
Tensor logitcrossentropy(const Tensor& logits, double y, LossOptions o) {
  return logitcrossentropy(logits, scalar_target("logitcrossentropy", logits, y), o);
}
Tensor binarycrossentropy(const Tensor& yhat, double y, LossOptions o, std::optional<double> eps) {
  return binarycrossentropy(yhat, scalar_target("binarycrossentropy", yhat, y), o, eps);
}
Tensor logitbinarycrossentropy(const Tensor& logits, double y, LossOptions o) {
  return logitbinarycrossentropy(logits, scalar_target("logitbinarycrossentropy", logits, y), o);
}
Tensor huber(const Tensor& yhat, double y, LossOptions o, double delta) { return huber(yhat, scalar_target("huber", yhat, y), o, delta); }
Tensor kldivergence(const Tensor& yhat, double y, LossOptions o, std::optional<double> eps) {
  return kldivergence(yhat, scalar_target("kldivergence", yhat, y), o, eps);
}

}  // namespace flux
