// batchnorm with batch statistics: forward and its closed-form backward, through the backend's fused
// kernels (batchnorm_forward/backward) when it has them, else composed from public ops (the portable
// path, also taken with FLUX_LIBRARY_KERNELS=0).
// Shapes: x is viewed as (N, C, S), S = the product of the spatial axes (1 for (N, C) input);
// per-channel tensors are (1, C, 1) so that they broadcast; m = N * S values per channel.
// Backward (Ioffe & Szegedy 2015, as PyTorch's batch_norm_backward with training = true), with
// xc = x - mean, inv = 1 / sqrt(var + eps), a = weight * inv:
//   dbias = Σ dy,  dweight = inv Σ dy xc,  dx = a dy - a Σdy / m - xc a inv² Σ(dy xc) / m.
#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>

#include "flux/autodiff.hpp"
#include "src/autocast.hpp"
#include "src/internal.hpp"
#include "src/storage_cache.hpp"
#include "flux/ops.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"
#include "src/ops/through_float32.hpp"
#include "src/trace.hpp"

namespace flux {

namespace {
using Grads = std::vector<Tensor>;
// Σ over axes 0 and 2 of (N, C, S), kept as (1, C, 1).
Tensor channel_sum(const Tensor& t3) { return sum(sum(t3, 2, true), 0, true); }
backend::Buffer buffer_or_none(const Tensor& p) { return p.defined() ? flux::detail::buffer_of(p) : backend::Buffer{}; }

// The gradients of batchnorm with batch statistics from its input x, the batch's mean and biased var
// (C,) and the output gradient g: the backend's fused kernel when x, g and weight share a dtype it
// takes, else the formulas above from public ops.
Grads batchnorm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& var,
                         double eps, int64_t n, int64_t c, int64_t s, bool has_weight, bool has_bias) {
  const DType t = x.dtype();
  if (detail::library_kernels() && (t == DType::f32 || t == DType::f64) && g.dtype() == t && mean.dtype() == t &&
      (!has_weight || weight.dtype() == t)) {
    Tensor dx = Tensor::empty(x.shape(), t, g.device());
    Tensor dweight = has_weight ? Tensor::empty(Shape{c}, t, g.device()) : Tensor();
    Tensor dbias = has_bias ? Tensor::empty(Shape{c}, t, g.device()) : Tensor();
    if (g.backend().batchnorm_backward(g.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(g),
                                       buffer_or_none(weight), flux::detail::buffer_of(mean), flux::detail::buffer_of(var),
                                       flux::detail::buffer_of(dx), buffer_or_none(dweight), buffer_or_none(dbias), n, c, s, eps))
      return Grads{dx, dweight, dbias};
  }
  const Shape stat{1, c, 1};
  const double m = double(n * s);
  Tensor xc = x.reshape(Shape{n, c, s}) - mean.reshape(stat);
  Tensor inv = 1.0 / sqrt(var.reshape(stat) + eps);
  Tensor a = has_weight ? inv * weight.reshape(stat) : inv;
  Tensor dy = g.reshape(Shape{n, c, s});
  Tensor sum_dy = channel_sum(dy);
  Tensor sum_dy_xc = channel_sum(dy * xc);
  Tensor k = a * square(inv) * (sum_dy_xc / m);
  Tensor dx = (dy * a - xc * k - a * (sum_dy / m)).reshape(x.shape());
  Tensor dweight = has_weight ? (inv * sum_dy_xc).reshape(Shape{c}) : Tensor();
  Tensor dbias = has_bias ? sum_dy.reshape(Shape{c}) : Tensor();
  return Grads{dx, dweight, dbias};
}

// A parameter in Float32 (the backend's half kernels take Float32 per-channel arrays); undefined stays so.
Tensor f32_param(const Tensor& p) { return p.defined() && p.dtype() != DType::f32 ? detail::raw_cast(p, DType::f32) : p; }

}  // namespace

// Batch statistics: one recorded op (through_float32) keeping x and the batch's mean and var. Under
// autocast, x in Float16/BFloat16: statistics and arithmetic in Float32, the output in x's dtype; where
// the backend reads half storage (reads_half) its kernels read and write it directly, forward and
// backward (backend.hpp: x, y in the low dtype, the rest Float32); elsewhere x (and the gradient) are
// cast up, the Float32 kernels run and the result is cast down.
Tensor batchnorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor* batch_mean,
                 Tensor* batch_var) {
  detail::check_defined("batchnorm", x);
  if (x.ndim() < 2)
    detail::fail("[batchnorm] expects input (N, C, ...) with at least 2 dimensions; got shape ", to_string(x.shape()));
  if (!is_floating(x.dtype())) detail::fail("[batchnorm] needs a floating-point input; got ", summary(x));
  const int64_t n = x.shape()[0], c = x.shape()[1], s = x.numel() / std::max<int64_t>(1, n * c);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    if (p->shape() != Shape{c})
      detail::fail("[batchnorm] weight and bias must have shape (", c, ",) for input ", to_string(x.shape()), "; got ",
                   to_string(p->shape()));
    detail::check_same_device("batchnorm", x, *p);
  }
  const int64_t m = n * s;
  if (m < 2)
    detail::fail("[batchnorm] batch statistics need more than 1 value per channel; got input shape ", to_string(x.shape()));
  const bool low = detail::autocast_active() && detail::is_half(x.dtype());
  const DType dt = x.dtype(), t = low ? DType::f32 : dt;
  const bool has_weight = weight.defined(), has_bias = bias.defined();
  // The fused backend kernels take one dtype throughout (on half storage: x and y low, the rest Float32);
  // other mixes take the portable path.
  const bool fusable = detail::library_kernels() && (t == DType::f32 || t == DType::f64) &&
                       (!has_weight || weight.dtype() == t) && (!has_bias || bias.dtype() == t);
  const bool direct = low && detail::library_kernels() && detail::reads_half(x);
  const Shape stat{1, c, 1};
  Tensor mean, var;  // (C,)
  Tensor y = detail::through_float32(
      &ops::batchnorm_train, {&x, &weight, &bias}, {x, weight},
      [&](Grads& kept) {
        auto kernel = [&](DType k, const Tensor& xk, const Tensor& w, const Tensor& b, Tensor& out) {
          out = Tensor::empty(x.shape(), k, x.device());
          mean = Tensor::empty(Shape{c}, t, x.device()), var = Tensor::empty(Shape{c}, t, x.device());
          return xk.backend().batchnorm_forward(xk.device().index(), k, flux::detail::buffer_of(xk), buffer_or_none(w),
                                                buffer_or_none(b), flux::detail::buffer_of(out), flux::detail::buffer_of(mean),
                                                flux::detail::buffer_of(var), n, c, s, eps);
        };
        Tensor out;
        if (direct && kernel(dt, x, f32_param(weight), f32_param(bias), out)) {
          kept.push_back(mean), kept.push_back(var);
          return out;
        }
        const Tensor xt = low ? detail::raw_cast(x, t) : x;
        if (!(fusable && kernel(t, xt, weight, bias, out))) {
          Tensor x3 = xt.reshape(Shape{n, c, s});
          Tensor mean3 = channel_sum(x3) / double(m);
          Tensor xc = x3 - mean3;
          Tensor var3 = channel_sum(square(xc)) / double(m);
          Tensor inv = 1.0 / sqrt(var3 + eps);
          Tensor a = has_weight ? inv * weight.reshape(stat) : inv;
          out = xc * a;
          if (has_bias) out = out + bias.reshape(stat);
          out = out.reshape(x.shape());
          mean = mean3.reshape(Shape{c}), var = var3.reshape(Shape{c});
        }
        kept.push_back(mean), kept.push_back(var);
        return low ? detail::raw_cast(out, dt) : out;
      },
      [=](const Grads& k, const Tensor& g) {
        const Tensor &xk = k[0], w = low ? f32_param(k[1]) : k[1], &mk = k[2], &vk = k[3];
        if (direct && xk.dtype() == dt && g.dtype() == dt) {  // the backend's half kernel: dx in the low dtype
          Tensor dx = Tensor::empty(xk.shape(), dt, g.device());
          Tensor dweight = has_weight ? Tensor::empty(Shape{c}, DType::f32, g.device()) : Tensor();
          Tensor dbias = has_bias ? Tensor::empty(Shape{c}, DType::f32, g.device()) : Tensor();
          if (g.backend().batchnorm_backward(g.device().index(), dt, flux::detail::buffer_of(xk), flux::detail::buffer_of(g),
                                             buffer_or_none(w), flux::detail::buffer_of(mk), flux::detail::buffer_of(vk),
                                             flux::detail::buffer_of(dx), buffer_or_none(dweight), buffer_or_none(dbias), n,
                                             c, s, eps))
            return Grads{dx, dweight, dbias};
        }
        return batchnorm_backward(low ? detail::float32_of(xk) : xk, low ? detail::raw_cast(g, t) : g, w, mk, vk, eps, n,
                                  c, s, has_weight, has_bias);
      },
      {{"eps", {}, {eps}}}, direct || !low ? detail::kAsStored : std::optional<DType>(t));
  if (batch_mean) *batch_mean = mean;
  if (batch_var) *batch_var = var;
  return y;
}

namespace {
// y = x * scale + shift per channel of x viewed as (n, c, s); scale, shift (C,) of x's dtype.
Tensor channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, int64_t n, int64_t c, int64_t s) {
  const Shape stat{1, c, 1};
  const DType t = x.dtype();
  Tensor y;
  bool fused = false;
  if (detail::library_kernels() && (t == DType::f32 || t == DType::f64) && scale.dtype() == t && shift.dtype() == t) {
    y = Tensor::empty(x.shape(), t, x.device());
    fused = x.backend().channel_affine(x.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(scale), flux::detail::buffer_of(shift), flux::detail::buffer_of(y), n,
                                       c, s);
  }
  if (!fused) {
    autodiff::NoGrad no_grad;
    y = (x.reshape(Shape{n, c, s}) * scale.reshape(stat) + shift.reshape(stat)).reshape(x.shape());
  }
  autodiff::record(y, {&x, &scale, &shift}, [=](const Tensor& g) {
    Tensor dx = channel_affine(g, scale, zeros(Shape{c}, scale.dtype(), g.device()), n, c, s);
    Tensor g3 = g.reshape(Shape{n, c, s});
    Tensor dscale = channel_sum(g3 * x.reshape(Shape{n, c, s})).reshape(Shape{c});
    Tensor dshift = channel_sum(g3).reshape(Shape{c});
    return Grads{dx, dscale, dshift};
  });
  return y;
}
}  // namespace

namespace {
// A BatchNorm folded into (scale, shift), kept in a storage cache (fold_batchnorm).
struct FoldedBatchNorm final : backend::Prepared {
  Tensor scale, shift;
};
}  // namespace

std::pair<Tensor, Tensor> detail::fold_batchnorm(const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                                 const Tensor& var, double eps, const Tensor& conv_bias,
                                                 const Tensor& conv_weight) {
  auto fold = [&]() -> std::pair<Tensor, Tensor> {
    if (!var.defined()) {
      const int64_t c = conv_weight.shape()[0];
      return {ones(Shape{c}, conv_weight.dtype(), conv_weight.device()),
              conv_bias.defined() ? conv_bias : zeros(Shape{c}, conv_weight.dtype(), conv_weight.device())};
    }
    Tensor scale = 1.0 / sqrt(var + eps);
    if (weight.defined()) scale = scale * weight;
    Tensor shift = -(mean * scale);
    if (bias.defined()) shift = shift + bias;
    if (conv_bias.defined()) shift = shift + conv_bias * scale;
    return {scale, shift};
  };
  const Tensor* parts[] = {&var, &weight, &mean, &bias, &conv_bias};
  bool constant = !trace::active();  // else the trace records the small ops
  for (const Tensor* p : parts) constant = constant && !autodiff::tracked(*p);
  if (!constant) return fold();
  backend::PreparedKey key{};
  key[0] = int64_t(CoreEntry::folded_batchnorm);
  for (size_t i = 0; i < 5; ++i) {
    key[1 + 2 * i] = int64_t(content_version(*parts[i]));
    key[2 + 2 * i] = parts[i]->defined() ? int64_t(parts[i]->impl()->offset) : -1;
  }
  std::memcpy(&key[11], &eps, sizeof(double));
  key[12] = var.defined() ? var.numel() : conv_weight.shape()[0];
  StorageCache& cache = storage_cache(var.defined() ? var : conv_weight);
  if (auto kept = cache.find(key)) {
    const auto& f = static_cast<const FoldedBatchNorm&>(*kept);
    return {f.scale, f.shift};
  }
  auto f = std::make_shared<FoldedBatchNorm>();
  std::tie(f->scale, f->shift) = fold();
  cache.insert(key, f);
  return {f->scale, f->shift};
}

Tensor batchnorm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& var,
                 double eps) {
  detail::check_defined("batchnorm", x);
  if (detail::autocast_active() && detail::is_half(x.dtype())) {
    // Outside a tape, where the backend reads the half storage: its channel_affine on it, the statistics
    // folded in Float32; else through Float32 copies.
    const Tensor* operands[] = {&x, &weight, &bias, &mean, &var};
    bool plain = detail::reads_half(x) && detail::library_kernels() && x.ndim() >= 2 && mean.defined() && var.defined();
    for (const Tensor* p : operands) plain = plain && !autodiff::tracked(*p) && (!p->defined() || p->device() == x.device());
    const int64_t c = x.ndim() >= 2 ? x.shape()[1] : 0;
    for (const Tensor* p : {&weight, &bias, &mean, &var}) plain = plain && (!p->defined() || p->shape() == Shape{c});
    if (plain) {
      autodiff::NoGrad no_grad;
      const auto [scale, shift] =
          detail::fold_batchnorm(f32_param(weight), f32_param(bias), f32_param(mean), f32_param(var), eps);
      const int64_t n = x.shape()[0], s = x.numel() / std::max<int64_t>(1, n * c);
      Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
      if (x.backend().channel_affine(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(scale),
                                     flux::detail::buffer_of(shift), flux::detail::buffer_of(y), n, c, s))
        return y;
    }
    return batchnorm(x.cast(DType::f32), weight, bias, mean, var, eps).cast(x.dtype());
  }

  detail::check_defined("batchnorm", mean);
  detail::check_defined("batchnorm", var);
  if (x.ndim() < 2)
    detail::fail("[batchnorm] expects input (N, C, ...) with at least 2 dimensions; got shape ", to_string(x.shape()));
  if (!is_floating(x.dtype())) detail::fail("[batchnorm] needs a floating-point input; got ", summary(x));
  const int64_t n = x.shape()[0], c = x.shape()[1], s = x.numel() / std::max<int64_t>(1, n * c);
  for (const Tensor* p : {&weight, &bias, &mean, &var}) {
    if (!p->defined()) continue;
    if (p->shape() != Shape{c})
      detail::fail("[batchnorm] weight, bias, mean and var must have shape (", c, ",) for input ", to_string(x.shape()),
                   "; got ", to_string(p->shape()));
    detail::check_same_device("batchnorm", x, *p);
  }
  // The statistics folded into per-channel scale and shift, then one pass over x.
  auto [scale, shift] = detail::fold_batchnorm(weight, bias, mean, var, eps);
  if (scale.dtype() != x.dtype()) scale = scale.cast(x.dtype());
  if (shift.dtype() != x.dtype()) shift = shift.cast(x.dtype());
  Tensor y = channel_affine(x, scale, shift, n, c, s);
  if (trace::active()) trace::emit(ops::batchnorm, {x, weight, bias, mean, var}, y, {{"eps", {}, {eps}}});
  return y;
}

}  // namespace flux

// ---- layer and group normalisation ----
// Both normalise the rows of a (R, D) view: LayerNorm's rows are every position of x (..., D) with
// D = the last axis; GroupNorm's are the (N * G) groups of x (N, C, S) viewed as (N * G, C / G * S).
// With x̂ = (x - mean) / sqrt(var + eps) per row (biased var) and g = dy * weight (dy without weight),
// the backward (as PyTorch's layer_norm_backward and llm.c's layernorm_backward) is
//   dx = inv (g - mean(g) - x̂ mean(g x̂)),  dweight = Σ_rows dy x̂,  dbias = Σ_rows dy.
namespace flux {

namespace {
// The composed backward from x̂ (R, D), 1 / std (R, 1), the output gradient g and weight (D,) or undefined.
Grads rows_backward(const Tensor& xhat, const Tensor& rstd, const Tensor& g, const Tensor& weight, int64_t d, bool has_bias) {
  const Tensor gw = weight.defined() ? g * weight : g;
  return Grads{rstd * (gw - sum(gw, 1, true) / double(d) - xhat * (sum(gw * xhat, 1, true) / double(d))),
               weight.defined() ? sum(g * xhat, 0) : Tensor(), has_bias ? sum(g, 0) : Tensor()};
}

// Rows of x2 (R, D) normalised, then * weight + bias over D (each (D,) or undefined); one recorded op
// (through_float32) that keeps x2 and the rows' mean and 1 / std (R values each). The statistics and
// arithmetic are in the compute dtype t: x2's, or Float32 when `low` (autocast, x2 in Float16/BFloat16:
// the output in x2's dtype, weight and bias as their Float32 masters). Through the backend's fused
// kernels (rownorm_forward/backward) when it has them and the dtypes agree, on the half storage itself
// where it reads it (backend.hpp: x, y, dy, dx in the low dtype, the rest Float32); else (or with
// FLUX_LIBRARY_KERNELS=0) composed from public ops, the portable path.
// `offer` (LayerNorm of a Float32 x under autocast): y also in that low dtype, from the backend's kernel
// that writes both (rownorm_forward_cast), into *offered; undefined where the backend has none.
Tensor normalise_rows(const Tensor& x2, const Tensor& weight, const Tensor& bias, double eps, bool low,
                      std::optional<DType> offer = std::nullopt, Tensor* offered = nullptr) {
  const int64_t r = x2.shape()[0], d = x2.shape()[1];
  const DType dt = x2.dtype(), t = low ? DType::f32 : dt;
  const bool has_weight = weight.defined(), has_bias = bias.defined();
  auto params = [low](const Tensor& p) { return low ? f32_param(p) : p; };
  const bool fusable = detail::library_kernels() && (t == DType::f32 || t == DType::f64) &&
                       (!has_weight || weight.dtype() == t || low) && (!has_bias || bias.dtype() == t || low);
  const bool direct = low && fusable && detail::reads_half(x2);
  // The backend's backward kernel in dtype k (x, g, dx in k; the rest in t): false where it has none.
  auto fused = [=](DType k, const Tensor& x, const Tensor& g, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   Grads& grads) {
    grads = {Tensor::empty(x.shape(), k, x.device()), has_weight ? Tensor::empty(Shape{d}, t, x.device()) : Tensor(),
             has_bias ? Tensor::empty(Shape{d}, t, x.device()) : Tensor()};
    return fusable && x.backend().rownorm_backward(x.device().index(), k, flux::detail::buffer_of(x),
                                                   flux::detail::buffer_of(g), buffer_or_none(w),
                                                   flux::detail::buffer_of(mean), flux::detail::buffer_of(rstd),
                                                   flux::detail::buffer_of(grads[0]), buffer_or_none(grads[1]),
                                                   buffer_or_none(grads[2]), r, d);
  };
  return detail::through_float32(
      &ops::rownorm, {&x2, &weight, &bias}, {x2, weight},
      [&](Grads& kept) {
        const Tensor w = params(weight), b = params(bias);
        Tensor mean = Tensor::empty(Shape{r, 1}, t, x2.device()), rstd = Tensor::empty(Shape{r, 1}, t, x2.device());
        auto forward = [&](DType k, const Tensor& x, const Tensor& y) {
          return fusable && x.backend().rownorm_forward(x.device().index(), k, flux::detail::buffer_of(x),
                                                        buffer_or_none(w), buffer_or_none(b), flux::detail::buffer_of(y),
                                                        flux::detail::buffer_of(mean), flux::detail::buffer_of(rstd), r, d, eps);
        };
        Tensor y = direct ? Tensor::empty(x2.shape(), dt, x2.device()) : Tensor();
        if (offer && fusable && t == DType::f32 && dt == DType::f32) {
          y = Tensor::empty(x2.shape(), t, x2.device());
          Tensor y_low = Tensor::empty(x2.shape(), *offer, x2.device());
          if (x2.backend().rownorm_forward_cast(x2.device().index(), flux::detail::buffer_of(x2), buffer_or_none(w),
                                                buffer_or_none(b), flux::detail::buffer_of(y), *offer,
                                                flux::detail::buffer_of(y_low), flux::detail::buffer_of(mean),
                                                flux::detail::buffer_of(rstd), r, d, eps)) {
            *offered = y_low;
            kept.push_back(mean), kept.push_back(rstd);
            return y;
          }
        }
        if (!(direct && forward(dt, x2, y))) {
          const Tensor x = low ? detail::raw_cast(x2, t) : x2;
          y = Tensor::empty(x2.shape(), t, x2.device());
          if (!forward(t, x, y)) {
            mean = sum(x, 1, true) / double(d);
            Tensor xc = x - mean;
            rstd = 1.0 / sqrt(sum(square(xc), 1, true) / double(d) + eps);
            y = has_weight ? xc * rstd * w : xc * rstd;
            if (has_bias) y = y + b;
          }
          if (low) y = detail::raw_cast(y, dt);
        }
        kept.push_back(mean), kept.push_back(rstd);
        return y;
      },
      [=](const Grads& k, const Tensor& dy) {
        const Tensor &x = k[0], w = params(k[1]), &mean = k[2], &rstd = k[3];
        Grads grads;
        if (direct && x.dtype() == dt && dy.dtype() == dt && fused(dt, x, dy, w, mean, rstd, grads)) return grads;
        const Tensor xt = low ? detail::float32_of(x) : x, g = fusable && dy.dtype() != t ? detail::raw_cast(dy, t) : dy;
        if (fused(t, xt, g, w, mean, rstd, grads)) return grads;
        return rows_backward((xt - mean) * rstd, rstd, g, w, d, has_bias);
      },
      {{"eps", {}, {eps}}}, direct || !low ? detail::kAsStored : std::optional<DType>(DType::f32));
}

// y (N, C, S) in Float16/BFloat16 * weight + bias per channel (each (C,) or undefined) in Float32, the
// output in y's dtype: GroupNorm's affine under autocast, one recorded op that keeps y itself.
Tensor channel_affine_low(const Tensor& y, const Tensor& weight, const Tensor& bias) {
  const int64_t c = y.shape()[1];
  const Shape per_channel{1, c, 1};
  const bool has_weight = weight.defined(), has_bias = bias.defined();
  return detail::through_float32(
      nullptr, {&y, &weight, &bias}, {has_weight && autodiff::tracked(weight) ? y : Tensor(), weight},
      [&](Grads&) {
        Tensor o = detail::raw_cast(y, DType::f32);
        if (has_weight) o = o * detail::raw_cast(weight, DType::f32).reshape(per_channel);
        if (has_bias) o = o + detail::raw_cast(bias, DType::f32).reshape(per_channel);
        return detail::raw_cast(o, y.dtype());
      },
      [=](const Grads& k, const Tensor& g) {
        return Grads{has_weight ? g * k[1].reshape(per_channel) : g,
                     k[0].defined() ? channel_sum(g * k[0]).reshape(Shape{c}) : Tensor(),
                     has_bias ? channel_sum(g).reshape(Shape{c}) : Tensor()};
      });
}
}  // namespace

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  detail::check_defined("layernorm", x);
  // Autocast: statistics and arithmetic in Float32, the output in the input's low dtype.
  const bool low = detail::autocast_active() && detail::is_half(x.dtype());

  if (x.ndim() < 1) detail::fail("[layernorm] needs at least 1 dimension (features last); got a 0-dimensional tensor");
  if (!is_floating(x.dtype())) detail::fail("[layernorm] needs a floating-point input; got ", summary(x));
  if (!(eps > 0)) detail::fail("[layernorm] eps must be positive; got ", eps);
  const int64_t d = x.shape()[x.ndim() - 1];
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    if (p->shape() != Shape{d})
      detail::fail("[layernorm] weight and bias must have shape (", d, ",) (the last axis of input ", to_string(x.shape()),
                   "); got ", to_string(p->shape()));
    detail::check_same_device("layernorm", x, *p);
  }
  if (x.numel() == 0) return x;
  const Tensor rows = x.reshape(Shape{x.numel() / d, d});
  // A Float32 x under autocast: the output stays Float32 (statistics and arithmetic as without
  // autocast), and its cast to the low dtype, which the next op (a Dense, attention) reads, is written
  // by the same kernel while each row is in cache and kept in the output's cast cache.
  const std::optional<DType> offer =
      !low && x.dtype() == DType::f32 && !trace::active() ? detail::autocast_low({&x}) : std::nullopt;
  Tensor offered;
  Tensor y = normalise_rows(rows, weight, bias, eps, low, offer, &offered);
  if (offered.defined()) detail::offer_cast(y, offered);
  return y.reshape(x.shape());
}

Tensor groupnorm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps) {
  detail::check_defined("groupnorm", x);
  // Autocast: statistics and arithmetic in Float32 (the affine too), the output in the input's low dtype.
  const bool low = detail::autocast_active() && detail::is_half(x.dtype());

  if (x.ndim() < 2)
    detail::fail("[groupnorm] expects input (N, C, ...) with at least 2 dimensions, channels on axis 1; got shape ",
                 to_string(x.shape()));
  if (!is_floating(x.dtype())) detail::fail("[groupnorm] needs a floating-point input; got ", summary(x));
  if (!(eps > 0)) detail::fail("[groupnorm] eps must be positive; got ", eps);
  const int64_t n = x.shape()[0], c = x.shape()[1], s = x.numel() / std::max<int64_t>(1, n * c);
  if (groups <= 0 || c % groups != 0)
    detail::fail("[groupnorm] groups (", groups, ") must be positive and divide the channels (", c, ") of input ",
                 to_string(x.shape()));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    if (p->shape() != Shape{c})
      detail::fail("[groupnorm] weight and bias must have shape (", c, ",) (axis 1 of input ", to_string(x.shape()),
                   "); got ", to_string(p->shape()));
    detail::check_same_device("groupnorm", x, *p);
  }
  if (x.numel() == 0) return x;
  const int64_t per_group = c / groups * s;
  const Tensor rows = x.reshape(Shape{n * groups, per_group});
  Tensor y = normalise_rows(rows, Tensor(), Tensor(), eps, low).reshape(Shape{n, c, s});
  if (low) return (weight.defined() || bias.defined() ? channel_affine_low(y, weight, bias) : y).reshape(x.shape());
  if (weight.defined()) y = y * weight.reshape(Shape{1, c, 1});
  if (bias.defined()) y = y + bias.reshape(Shape{1, c, 1});
  return y.reshape(x.shape());
}

}  // namespace flux
