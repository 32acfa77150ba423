// GradScaler: PyTorch's dynamic loss scaling (torch/amp/grad_scaler.py, _amp_update_scale_). The scale
// lives on the host: the skip decision reads one flag per device per step anyway (PyTorch's step()
// synchronises there too).
#include "flux/optimisers/grad_scaler.hpp"

#include <cmath>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/optimisers/grad_scaler_internal.hpp"

namespace flux::optimisers {

namespace detail {

Tensor unscale_tensor(const Tensor& g, double inv_scale, Tensor& flag, bool use_kernel) {
  const DType t = g.dtype();
  if (use_kernel) {
    Tensor out = Tensor::empty(g.shape(), t, g.device());
    if (g.backend().unscale_and_check(g.device().index(), t, flux::detail::buffer_of(g), flux::detail::buffer_of(out),
                                      g.numel(), inv_scale, flux::detail::buffer_of(flag)))
      return out;
  }
  // The same arithmetic from public ops: the product in float32 (float64 for Float64) rounded to t.
  const DType compute = t == DType::f64 ? DType::f64 : DType::f32;
  const double inv = compute == DType::f32 ? double(float(inv_scale)) : inv_scale;
  Tensor wide = t == compute ? g : g.cast(compute);
  Tensor product = mul(wide, full(Shape{}, inv, compute, g.device()));
  Tensor out = t == compute ? product : product.cast(t);
  // x - x is NaN exactly where x is inf or NaN, else 0; the sum is NaN when any element is.
  Tensor stored = t == compute ? out : out.cast(compute);
  Tensor probe = sum(sub(stored, stored));
  flag = add(flag, compute == DType::f32 ? probe : probe.cast(DType::f32));
  return out;
}

bool flag_set(const Tensor& flag) {
  const double v = flag.item<double>();
  return v != 0;  // 1 from a kernel, NaN from the portable path (NaN != 0)
}

void check_settings(const char* api, const char* scale_name, const GradScaler::SavedState& s) {
  auto bad = [&](const char* name, const char* rule, auto value) {
    flux::detail::fail("[", api, "] ", name, " must be ", rule, ", got ", value);
  };
  if (!(std::isfinite(s.scale) && s.scale > 0)) bad(scale_name, "finite and positive", s.scale);
  if (!(std::isfinite(s.growth_factor) && s.growth_factor > 1)) bad("growth_factor", "finite and > 1", s.growth_factor);
  if (!(s.backoff_factor > 0 && s.backoff_factor < 1)) bad("backoff_factor", "in (0, 1)", s.backoff_factor);
  if (s.growth_interval < 1) bad("growth_interval", ">= 1 (steps)", s.growth_interval);
  if (s.growth_tracker < 0) bad("growth_tracker", ">= 0 (steps)", s.growth_tracker);
}

}  // namespace detail

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)), scale_(options_.init_scale) {
  const GradScalerOptions& o = options_;
  detail::check_settings("GradScaler", "init_scale", {o.init_scale, o.growth_factor, o.backoff_factor, 0, o.growth_interval});
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) flux::detail::fail("[GradScaler::scale] the loss is an undefined tensor");
  if (!is_floating(loss.dtype()))
    flux::detail::fail("[GradScaler::scale] the loss must be floating point, got ", dtype_name(loss.dtype()), " ",
                       to_string(loss.shape()));
  if (!options_.enabled) return loss;
  return mul(loss, full(Shape{}, scale_, loss.dtype(), loss.device()));
}

std::vector<Tensor> GradScaler::unscale_leaves(const std::vector<std::string>& names, const std::vector<Tensor>& grads) {
  if (!options_.enabled) return grads;
  if (stage_ == Stage::unscaled)
    flux::detail::fail("[GradScaler::unscale] the gradients were already unscaled since the last update(); unscale "
                       "once per iteration, then step() and update()");
  if (stage_ == Stage::stepped)
    flux::detail::fail("[GradScaler::unscale] step() already ran in this iteration; call update() before unscaling "
                       "the next gradients");
  for (size_t i = 0; i < grads.size(); ++i)
    if (!is_floating(grads[i].dtype()))
      flux::detail::fail("[GradScaler::unscale] gradient '", names[i], "' is ", dtype_name(grads[i].dtype()), " ",
                         to_string(grads[i].shape()), "; only Float16, BFloat16, Float32 and Float64 gradients can be ",
                         "unscaled (an integer array is not trainable: make it NonTrainable)");
  autodiff::NoGrad no_grad;
  const double inv_scale = 1.0 / scale_;  // PyTorch: the reciprocal in double, then the kernel's precision
  // One flag per device, read once after every gradient was launched.
  std::vector<std::pair<Device, Tensor>> flags;
  auto flag_for = [&](const Device& d) -> Tensor& {
    for (auto& [device, flag] : flags)
      if (device == d) return flag;
    flags.emplace_back(d, zeros(Shape{}, DType::f32, d));
    return flags.back().second;
  };
  std::vector<Tensor> out;
  out.reserve(grads.size());
  for (const Tensor& g : grads) out.push_back(detail::unscale_tensor(g, inv_scale, flag_for(g.device())));
  bool found = false;
  for (auto& [device, flag] : flags) found = detail::flag_set(flag) || found;
  if (options_.comm && options_.comm->size() > 1) {
    // Every rank takes the same decision: the flags summed over the ranks.
    Tensor mine = Tensor::scalar(found ? 1.0 : 0.0, DType::f32);
    found = distributed::allreduce(*options_.comm, mine, distributed::ReduceOp::sum).item<double>() > 0;
  }
  found_inf_ = found;
  stage_ = Stage::unscaled;
  return out;
}

void GradScaler::begin_step() {
  if (stage_ == Stage::stepped)
    flux::detail::fail("[GradScaler::step] step() already ran since the last update(); call update() once per ",
                       "iteration, after step()");
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (!found_inf_)
    flux::detail::fail("[GradScaler::update] no gradients were unscaled since the last update(); call step() (or ",
                       "unscale()) with this iteration's gradients first");
  if (*found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    // As PyTorch's float32 scale: growth stops where the scale would overflow float32.
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(float(grown))) scale_ = grown;
    growth_tracker_ = 0;
  }
  stage_ = Stage::ready;
  found_inf_.reset();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  if (!(std::isfinite(new_scale) && new_scale > 0))
    flux::detail::fail("[GradScaler::update] the new scale must be finite and positive, got ", new_scale);
  scale_ = new_scale;
  stage_ = Stage::ready;
  found_inf_.reset();
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

GradScaler::SavedState GradScaler::saved_state() const {
  return {scale_, options_.growth_factor, options_.backoff_factor, growth_tracker_, options_.growth_interval};
}

void GradScaler::load_saved_state(const SavedState& s) {
  detail::check_settings("GradScaler::load_saved_state", "scale", s);
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  options_.growth_factor = s.growth_factor;
  options_.backoff_factor = s.backoff_factor;
  options_.growth_interval = s.growth_interval;
  stage_ = Stage::ready;
  found_inf_.reset();
}

}  // namespace flux::optimisers
