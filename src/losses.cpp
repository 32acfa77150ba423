// Loss functions (Flux's definitions; classes along the last axis, observations along the first).
#include "flux/losses.hpp"

#include <string>

#include "flux/nn/activations.hpp"
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

void check_pair(const char* api, const Tensor& yhat, const Tensor& y, bool onehot_targets = false) {
  detail::check_defined(api, yhat);
  detail::check_defined(api, y);
  detail::check_same_device(api, yhat, y);
  if (yhat.shape() != y.shape())
    detail::fail("[", api, "] prediction shape ", to_string(yhat.shape()), " and target shape ", to_string(y.shape()),
                 " differ", onehot_targets ? onehot_hint(yhat, y) : std::string());
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
// The log reads 1 where x == 0, so no NaN or inf reaches the gradient through the unused branch.
Tensor xlogy(const Tensor& x, const Tensor& y) {
  Tensor zero = zeros(Shape{}, x.dtype(), x.device()), one = ones(Shape{}, x.dtype(), x.device());
  Tensor is_zero = x == zero;
  return where(is_zero, zero, x * log(where(is_zero, one, y)));
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

Tensor mse(const Tensor& yhat, const Tensor& y, LossOptions o) {
  check_pair("mse", yhat, y);
  return aggregate(square(yhat - target_like(yhat, y)), o.agg);
}

Tensor mae(const Tensor& yhat, const Tensor& y, LossOptions o) {
  check_pair("mae", yhat, y);
  return aggregate(abs(yhat - target_like(yhat, y)), o.agg);
}

Tensor crossentropy(const Tensor& yhat, const Tensor& y, LossOptions o, std::optional<double> eps) {
  check_pair("crossentropy", yhat, y, true);
  Tensor t = target_like(yhat, y);
  return per_observation(-xlogy(t, yhat + eps_or_default(yhat, eps)), o.agg);
}

Tensor logitcrossentropy(const Tensor& logits, const Tensor& y, LossOptions o) {
  check_pair("logitcrossentropy", logits, y, true);
  Tensor t = target_like(logits, y);
  return per_observation(-(t * logsoftmax_(logits, -1)), o.agg);
}

Tensor binarycrossentropy(const Tensor& yhat, const Tensor& y, LossOptions o, std::optional<double> eps) {
  check_pair("binarycrossentropy", yhat, y);
  Tensor t = target_like(yhat, y);
  double e = eps_or_default(yhat, eps);
  return aggregate(-xlogy(t, yhat + e) - xlogy(1.0 - t, 1.0 - yhat + e), o.agg);
}

Tensor logitbinarycrossentropy(const Tensor& logits, const Tensor& y, LossOptions o) {
  check_pair("logitbinarycrossentropy", logits, y);
  Tensor t = target_like(logits, y);
  // (1 - y) x - logσ(x), with logσ(x) = -softplus(-x)
  return aggregate((1.0 - t) * logits + softplus(-logits), o.agg);
}

Tensor huber(const Tensor& yhat, const Tensor& y, LossOptions o, double delta) {
  check_pair("huber", yhat, y);
  if (delta <= 0) detail::fail("[huber] delta must be positive, got ", delta);
  Tensor d = abs(yhat - target_like(yhat, y));
  Tensor quad = 0.5 * square(d);
  Tensor lin = delta * (d - 0.5 * delta);
  Tensor small = d < delta;
  return aggregate(where(small, quad, lin), o.agg);
}

Tensor kldivergence(const Tensor& yhat, const Tensor& y, LossOptions o, std::optional<double> eps) {
  check_pair("kldivergence", yhat, y, true);
  Tensor t = target_like(yhat, y);
  Tensor entropy = xlogy(t, t);  // xlogx(y): no eps
  Tensor cross = -xlogy(t, yhat + eps_or_default(yhat, eps));
  return per_observation(entropy + cross, o.agg);
}

}  // namespace flux
