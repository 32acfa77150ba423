// Random ops on any device: rand_like, randn_like and dropout. Values come from the backend's counter-based
// random_uniform (backend.hpp): a global seed (seed(n)) and a global counter that advances by the
// number of values drawn, so the same seed and call sequence give the same values on every device.
#include <atomic>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"

namespace flux {

namespace {
std::atomic<uint64_t> g_seed{0x5eed};
std::atomic<uint64_t> g_counter{0};

// n uniforms of dtype t (f32 or f64) on d; advances the counter by n.
Tensor uniform_raw(const Shape& shape, DType t, const Device& d) {
  Tensor out = Tensor::empty(shape, t, d);
  uint64_t n = uint64_t(out.numel());
  uint64_t offset = g_counter.fetch_add(n);
  if (n) out.backend().random_uniform(d.index(), t, flux::detail::buffer_of(out), int64_t(n), g_seed.load(), offset);
  return out;
}
DType generator_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace

namespace detail {
void reset_random_stream(uint64_t seed) {
  g_seed.store(seed);
  g_counter.store(0);
}
std::pair<uint64_t, uint64_t> random_stream() { return {g_seed.load(), g_counter.load()}; }
void set_random_stream(uint64_t seed, uint64_t counter) {
  g_seed.store(seed);
  g_counter.store(counter);
}
}  // namespace detail

Tensor rand_like(const Tensor& x) {
  detail::check_defined("rand_like", x);
  if (!is_floating(x.dtype()))
    detail::fail("[rand_like] needs a floating-point tensor; got ", summary(x));
  Tensor u = uniform_raw(x.shape(), generator_dtype(x.dtype()), x.device());
  u = u.dtype() == x.dtype() ? u : detail::raw_cast(u, x.dtype());
  if (trace::active()) trace::emit(ops::rand_like, {x}, u);
  return u;
}

// Box-Muller on x's device from two uniform draws: z = sqrt(-2 log(1 - u1)) cos(2 pi u2); 1 - u1 lies in
// (0, 1], so the log is finite. Not recorded: fresh draws are never tracked.
Tensor randn_like(const Tensor& x) {
  detail::check_defined("randn_like", x);
  if (!is_floating(x.dtype()))
    detail::fail("[randn_like] needs a floating-point tensor; got ", summary(x));
  const DType g = generator_dtype(x.dtype());
  Tensor u1 = uniform_raw(x.shape(), g, x.device()), u2 = uniform_raw(x.shape(), g, x.device());
  Tensor z = sqrt(log(1.0 - u1) * -2.0) * cos(u2 * 6.283185307179586);
  return z.dtype() == x.dtype() ? z : detail::raw_cast(z, x.dtype());
}

// y = x * mask / (1 - p) with mask = (u < 1 - p); recorded through mul, so the backward multiplies the
// incoming gradient by the same scaled mask.
Tensor dropout(const Tensor& x, double p, const std::vector<int>& dims) {
  detail::check_defined("dropout", x);
  if (!(p >= 0.0 && p < 1.0)) detail::fail("[dropout] p must be in [0, 1); got ", p);
  if (!is_floating(x.dtype())) detail::fail("[dropout] needs a floating-point tensor; got ", summary(x));
  if (p == 0.0) return x;
  Shape mask_shape = x.shape();
  if (!dims.empty()) {
    std::vector<bool> varies(size_t(x.ndim()), false);
    for (int d : dims) varies[size_t(detail::normalize_axis("dropout", d, x.ndim()))] = true;
    for (int a = 0; a < x.ndim(); ++a)
      if (!varies[size_t(a)]) mask_shape[a] = 1;
  }
  DType t = generator_dtype(x.dtype());
  Tensor mask;
  {
    autodiff::NoGrad no_grad;
    Tensor u = uniform_raw(mask_shape, t, x.device());
    // keep = u < 1 - p, computed as step((1 - p) - u): the rounded difference of two floats has the
    // sign of the exact one, so this is the same comparison, with contiguous kernels only.
    Tensor keep = detail::step_raw(full(Shape{}, 1.0 - p, t, x.device()) - u);
    mask = keep * (1.0 / (1.0 - p));
    if (mask.dtype() != x.dtype()) mask = detail::raw_cast(mask, x.dtype());  // f16/bf16 keep their dtype
  }
  Tensor y = mul(x, mask);
  if (trace::active()) trace::emit(ops::dropout, {x}, y, {{"p", {}, {p}}});
  return y;
}

}  // namespace flux
