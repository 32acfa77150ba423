// GradScaler (flux/optimisers/grad_scaler.hpp), PyTorch's dynamic loss scaling, on every device: a
// step with an inf/NaN gradient is skipped (parameters and optimiser state bit for bit unchanged) and
// halves the scale, growth comes exactly after growth_interval finite steps, unscaled gradients equal
// the gradients of the unscaled loss (and a float64 reference), the backends' fused unscale-and-check
// kernel equals the portable path bit for bit, checkpoints keep the scaler's state, and misuse fails
// with messages that say what to do. The multi-rank decision: tests/mpi/test_mpi_grad_scaler.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unistd.h>

#include <gmock/gmock.h>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"
#include "src/internal.hpp"
#include "src/optimisers/grad_scaler_internal.hpp"
#include "test_devices.hpp"

using namespace flux;
using namespace flux::optimisers;
using flux::testing::max_rel_error;
using flux::testing::error_of;
using flux::testing::test_devices;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The raw bytes of a tensor (any device, any dtype).
std::string bytes_of(const Tensor& t) {
  Tensor host = to(t, Device());
  std::string out(host.nbytes(), '\0');
  if (host.nbytes()) std::memcpy(out.data(), host.buffer().handle, host.nbytes());
  return out;
}

Tensor on(const std::vector<double>& v, DType t, const Device& d) { return to(Tensor(v, Shape{int64_t(v.size())}).cast(t), d); }

/// Two parameters, so that a skip must leave both alone.
struct Pair {
  Tensor a, b;
};
FLUX_LAYER(Pair, a, b)

/// Parameters and optimiser state, as bytes: what a skipped step must leave unchanged.
std::string snapshot(const Pair& m, const State& s) {
  std::string out = bytes_of(m.a) + bytes_of(m.b);
  for (const LeafState& leaf : s.leaves) {
    out += std::to_string(leaf.t) + ";";
    for (const Tensor& b : leaf.buffers) out += bytes_of(b);
  }
  return out;
}

bool has_fp64(const Device& d) {
  try {
    (void)to(Tensor(std::vector<double>{1.0}, Shape{1}), d);
    return true;
  } catch (const Error&) {
    return false;
  }
}

class GradScalerDevices : public ::testing::TestWithParam<Device> {};

}  // namespace

TEST(GradScaler, PyTorchDefaults) {
  GradScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_TRUE(o.enabled);
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_FALSE(scaler.found_inf().has_value());
  Tensor loss = Tensor::scalar(0.75);
  EXPECT_EQ(scaler.scale(loss).item<double>(), 0.75 * 65536);
}

// For each gradient dtype: an inf, then a NaN, reaches the gradient through the scaled loss; both
// steps are skipped without touching the model or Adam's state, and each halves the scale. A finite
// step then updates exactly as an unscaled update would.
TEST_P(GradScalerDevices, InjectedInfOrNaNSkipsTheStepAndHalvesTheScale) {
  const Device d = GetParam();
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Pair model{on({1.0, -2.0, 3.0, 0.5}, t, d), on({0.25, 0.5}, t, d)};
    Pair twin = deepcopy(model);
    State opt = setup(Adam(0.01), model), twin_opt = setup(Adam(0.01), twin);
    GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
    auto loss_of = [&](const Pair& m, const std::vector<double>& xa) {
      Tensor la = sum(mul(m.a, on(xa, t, d))).f32();
      Tensor lb = sum(mul(m.b, on({-1.0, 2.0}, t, d))).f32();
      return add(la, lb);
    };
    double expected_scale = 1024;
    for (double bad : {kInf, kNaN, -kInf}) {
      SCOPED_TRACE(bad);
      auto [loss, grads] = withgradient([&](auto& m) { return scaler.scale(loss_of(m, {0.5, bad, 1.0, 2.0})); }, model);
      const std::string before = snapshot(model, opt);
      EXPECT_FALSE(scaler.step(opt, model, grads));
      EXPECT_EQ(scaler.found_inf(), std::optional<bool>(true));
      EXPECT_EQ(snapshot(model, opt), before) << "a skipped step changed the model or the optimiser state";
      scaler.update();
      expected_scale *= 0.5;
      EXPECT_EQ(scaler.get_scale(), expected_scale);
      EXPECT_EQ(scaler.growth_tracker(), 0);
    }
    // A finite step: the same update as plain Adam on the unscaled loss's gradient.
    const std::vector<double> xa = {0.5, -1.5, 1.0, 2.0};
    auto [loss, grads] = withgradient([&](auto& m) { return scaler.scale(loss_of(m, xa)); }, model);
    EXPECT_TRUE(scaler.step(opt, model, grads));
    EXPECT_EQ(scaler.found_inf(), std::optional<bool>(false));
    scaler.update();
    EXPECT_EQ(scaler.growth_tracker(), 1);
    update(twin_opt, twin, gradient([&](auto& m) { return loss_of(m, xa); }, twin));
    EXPECT_EQ(bytes_of(model.a), bytes_of(twin.a));
    EXPECT_EQ(bytes_of(model.b), bytes_of(twin.b));
    EXPECT_EQ(opt.leaves[0].t, 1);
  }
}

TEST(GradScaler, GrowthExactlyAfterTheIntervalAndTheTrackerResetsOnOverflow) {
  Pair model{Tensor(std::vector<float>{1, 2}, Shape{2}), Tensor(std::vector<float>{3}, Shape{1})};
  GradScaler scaler({.init_scale = 8, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 3});
  State opt = setup(Descent(0.1), model);
  auto iteration = [&](double xb) {
    auto g = gradient([&](auto& m) { return scaler.scale(add(sum(m.a), sum(mul(m.b, Tensor(std::vector<float>{float(xb)}, Shape{1}))))); },
                      model);
    bool stepped = scaler.step(opt, model, g);
    scaler.update();
    return stepped;
  };
  std::vector<std::pair<double, int64_t>> seen;  // (scale, tracker) after each update
  for (double xb : {1.0, 1.0, 1.0, 1.0, 1.0, kInf, 1.0, 1.0, 1.0}) {
    EXPECT_EQ(iteration(xb), std::isfinite(xb));
    seen.emplace_back(scaler.get_scale(), scaler.growth_tracker());
  }
  const std::vector<std::pair<double, int64_t>> want = {{8, 1}, {8, 2}, {32, 0}, {32, 1}, {32, 2},
                                                        {8, 0}, {8, 1}, {8, 2}, {32, 0}};
  EXPECT_EQ(seen, want);
}

TEST(GradScaler, GrowthStopsWhereTheScaleWouldOverflowFloat32) {
  Pair model{Tensor(std::vector<float>{1}, Shape{1}), Tensor(std::vector<float>{1}, Shape{1})};
  GradScaler scaler({.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  State opt = setup(Descent(0.0), model);
  auto g = gradient([&](auto& m) { return scaler.scale(mul(sum(add(m.a, m.b)), Tensor::scalar(0.0))); }, model);
  EXPECT_TRUE(scaler.step(opt, model, g));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 127));  // 2^128 is inf in float32: kept
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.update(3.0);  // PyTorch's update(new_scale)
  EXPECT_EQ(scaler.get_scale(), 3.0);
}

// Scaling by a power of two commutes with every rounding of backward (each op is linear in the
// incoming gradient), so the unscaled gradients are bit for bit the unscaled loss's; both match a
// float64 reference.
TEST_P(GradScalerDevices, UnscaledGradientsEqualTheUnscaledLossGradients) {
  const Device d = GetParam();
  seed(7);
  auto model64 = Chain(Dense(3, 5, flux::tanh), Dense(5, 2));
  model64 = fmap([](const Tensor& t) { return t.f64(); }, model64);
  Tensor x64 = randn({4, 3}).f64(), y64 = randn({4, 2}).f64();
  auto loss = [](const auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); };
  auto reference = gradient([&](auto& m) { return loss(m, x64, y64); }, model64);

  auto model = fmap([&](const Tensor& t) { return to(t.f32(), d); }, model64);
  Tensor x = to(x64.f32(), d), y = to(y64.f32(), d);
  auto plain = gradient([&](auto& m) { return loss(m, x, y); }, model);
  for (double s : {65536.0, 1024.0, 0.25}) {
    SCOPED_TRACE(s);
    GradScaler scaler({.init_scale = s});
    auto scaled = gradient([&](auto& m) { return scaler.scale(loss(m, x, y)); }, model);
    auto unscaled = scaler.unscale(scaled);
    EXPECT_EQ(scaler.found_inf(), std::optional<bool>(false));
    auto want = params(plain), got = params(unscaled), ref = params(reference);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].device(), d);
      EXPECT_EQ(got[i].dtype(), DType::f32);
      EXPECT_EQ(bytes_of(got[i]), bytes_of(want[i])) << "leaf " << i;
      EXPECT_LE(max_rel_error(got[i], ref[i].to_vector<double>()), 1e-5) << "leaf " << i;
    }
    scaler.update();
  }
}

// Why Float16 needs the scaler: a gradient of 1e-8 that passes through f16 activations flushes to
// zero unscaled, and survives, within f16's precision, into float32 master gradients when scaled.
TEST_P(GradScalerDevices, ScalingKeepsFloat16GradientsThatUnderflowUnscaled) {
  const Device d = GetParam();
  Pair model{on({1.0, -2.0, 3.0}, DType::f32, d), on({0.5}, DType::f32, d)};
  const std::vector<double> xa = {0.5, -1.25, 3.0};
  Tensor x16 = on(xa, DType::f16, d);
  auto loss = [&](const Pair& m) {  // f16 "activations", float32 loss and master weights
    Tensor h = mul(m.a.cast(DType::f16), x16);
    return mul(add(sum(h.f32()), sum(m.b)), to(Tensor::scalar(1e-8), d));
  };
  auto plain = gradient(loss, model);
  EXPECT_EQ(plain.a.to_vector<double>(), std::vector<double>(3, 0.0)) << "f16 should flush 1e-8 to zero";
  GradScaler scaler;
  auto grads = scaler.unscale(gradient([&](auto& m) { return scaler.scale(loss(m)); }, model));
  EXPECT_EQ(grads.a.dtype(), DType::f32);
  std::vector<double> want;
  for (double v : xa) want.push_back(1e-8 * v);
  std::vector<double> got = grads.a.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-3 * std::abs(want[i])) << i;
  EXPECT_NEAR(grads.b.item<double>(), 1e-8, 1e-14);
}

// Tied parameters share one gradient handle (divided once); two parameters that received the very
// same gradient tensor have distinct handles on one storage (each divided once, none twice).
TEST_P(GradScalerDevices, TiedAndAliasedGradientsAreDividedOnce) {
  const Device d = GetParam();
  Tensor w = on({1.0, 2.0}, DType::f32, d);
  Pair tied{w, w};
  GradScaler scaler({.init_scale = 8});
  auto g = gradient([&](auto& m) { return scaler.scale(sum(mul(m.a, on({3.0, -5.0}, DType::f32, d)))); }, tied);
  auto u = scaler.unscale(g);
  EXPECT_EQ(u.a.to_vector<double>(), (std::vector<double>{3.0, -5.0}));
  EXPECT_TRUE(u.a.same_storage(u.b));
  scaler.update();

  Pair two{on({1.0, 2.0}, DType::f32, d), on({4.0, 5.0}, DType::f32, d)};
  auto g2 = gradient([&](auto& m) { return scaler.scale(sum(add(m.a, m.b))); }, two);
  auto u2 = scaler.unscale(g2);
  EXPECT_EQ(u2.a.to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(u2.b.to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(g2.a.to_vector<double>(), (std::vector<double>{8.0, 8.0})) << "unscale must not change its input";
}

// NonTrainable state (BatchNorm's running statistics and its Int64 counter) is not unscaled.
TEST_P(GradScalerDevices, NonTrainableLeavesAreLeftAsTheyAre) {
  const Device d = GetParam();
  seed(3);
  auto model = Chain(Dense(3, 4), BatchNorm(4)) | d;
  Tensor x = to(randn({6, 3}), d);
  GradScaler scaler({.init_scale = 16});
  auto g = gradient([&](auto& m) { return scaler.scale(sum(m(x))); }, model);
  auto u = scaler.unscale(g);
  auto before = state(g), after = state(u);
  ASSERT_EQ(before.size(), after.size());
  std::vector<Tensor> nt = nontrainables(g);
  for (size_t i = 0; i < before.size(); ++i) {
    bool trainable = std::none_of(nt.begin(), nt.end(), [&](const Tensor& t) { return t.impl() == before[i].second.impl(); });
    SCOPED_TRACE(before[i].first);
    if (trainable)
      EXPECT_LE(max_rel_error(after[i].second, (before[i].second.f64() * (1.0 / 16)).to_vector<double>()), 0);
    else
      EXPECT_EQ(after[i].second.impl(), before[i].second.impl());
  }
  State opt = setup(Momentum(0.1), model);
  scaler.update();
  auto g2 = gradient([&](auto& m) { return scaler.scale(sum(m(x))); }, model);
  EXPECT_TRUE(scaler.step(opt, model, g2));
}

// The backends' fused kernel (Backend::unscale_and_check) and the portable path from public ops give
// the same bits and the same verdict, for every floating dtype, over values that round, underflow to
// subnormals or zero, overflow when unscaled, and inf/NaN at the edges of the parallel chunks.
TEST_P(GradScalerDevices, FusedKernelMatchesThePortablePath) {
  const Device d = GetParam();
  backend::Backend& be = flux::detail::backend_for(d);
  for (DType t : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    if (t == DType::f64 && !has_fp64(d)) continue;
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = 70001;  // more than two of the CPU's parallel chunks (1 << 15)
    std::vector<double> v(static_cast<size_t>(n));
    uint64_t z = 12345;
    for (auto& e : v) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      const double u = double(z >> 11) * 0x1.0p-53;
      // magnitudes 2^-21 .. 2^19 (2^-21 .. 2^9 for Float16, whose largest value is 65504)
      e = (u - 0.5) * std::ldexp(1.0, int(z % (t == DType::f16 ? 30 : 40)) - 20);
    }
    v[5] = 0.0;
    v[6] = -0.0;
    v[7] = 60000.0;  // near f16's largest
    Tensor g = on(v, t, d);
    // The kernel runs on the CPU and OpenCL (the point of this test there).
    if (d.is_cpu() || d.backend() == "OpenCL") {
      Tensor out = Tensor::empty(g.shape(), t, d), flag = zeros(Shape{}, DType::f32, d);
      EXPECT_TRUE(be.unscale_and_check(d.index(), t, flux::detail::buffer_of(g), flux::detail::buffer_of(out), n, 0.5,
                                       flux::detail::buffer_of(flag)));
    }
    for (double inv : {0x1.0p-16, 1.0 / 3.0, 0x1.0p-30}) {
      SCOPED_TRACE(inv);
      Tensor fused_flag = zeros(Shape{}, DType::f32, d), portable_flag = zeros(Shape{}, DType::f32, d);
      Tensor fused = optimisers::detail::unscale_tensor(g, inv, fused_flag, true);
      Tensor portable = optimisers::detail::unscale_tensor(g, inv, portable_flag, false);
      EXPECT_EQ(fused.dtype(), t);
      EXPECT_EQ(bytes_of(fused), bytes_of(portable));
      EXPECT_FALSE(optimisers::detail::flag_set(fused_flag));
      EXPECT_FALSE(optimisers::detail::flag_set(portable_flag));
      EXPECT_LE(max_rel_error(fused.f64(), (g.f64() * inv).to_vector<double>()),
                t == DType::f16 ? 1e-3 : t == DType::bf16 ? 8e-3 : t == DType::f32 ? 1e-7 : 1e-15);
    }
    // Non-finite values at the first element, at a chunk boundary, at the last; and a finite value
    // that overflows once unscaled (inv > 1).
    for (int64_t at : {int64_t(0), int64_t(1) << 15, n - 1}) {
      for (double bad : {kInf, -kInf, kNaN}) {
        std::vector<double> w = v;
        w[size_t(at)] = bad;
        Tensor gb = on(w, t, d);
        Tensor fused_flag = zeros(Shape{}, DType::f32, d), portable_flag = zeros(Shape{}, DType::f32, d);
        Tensor fused = optimisers::detail::unscale_tensor(gb, 0.125, fused_flag, true);
        Tensor portable = optimisers::detail::unscale_tensor(gb, 0.125, portable_flag, false);
        EXPECT_TRUE(optimisers::detail::flag_set(fused_flag)) << "at " << at << " value " << bad;
        EXPECT_TRUE(optimisers::detail::flag_set(portable_flag)) << "at " << at << " value " << bad;
        EXPECT_EQ(bytes_of(fused), bytes_of(portable));
      }
    }
    const double big = t == DType::f16 ? 60000.0 : t == DType::f64 ? 1e308 : 1e38;
    Tensor gb = on({1.0, big, -2.0}, t, d);
    Tensor fused_flag = zeros(Shape{}, DType::f32, d), portable_flag = zeros(Shape{}, DType::f32, d);
    (void)optimisers::detail::unscale_tensor(gb, 16.0, fused_flag, true);
    (void)optimisers::detail::unscale_tensor(gb, 16.0, portable_flag, false);
    EXPECT_TRUE(optimisers::detail::flag_set(fused_flag)) << "overflow when unscaling";
    EXPECT_TRUE(optimisers::detail::flag_set(portable_flag)) << "overflow when unscaling";
  }
}

// The CPU kernel on Float16/BFloat16 gradients at every ISA level this CPU allows (vector casts at
// AVX2, the scalar references below it), bitwise against half_bits' scalar arithmetic computed here:
// values that round, underflow, overflow once unscaled, and inf / NaN (signalling and quiet, with
// payloads) at the first element, around the 8-wide vectors' and the 2048-element blocks' tails,
// around the pool's chunk boundary and at the last element, in place and out of place.
TEST(GradScaler, CpuHalfUnscaleIsBitwiseTheScalarArithmeticAtEveryIsaLevel) {
  const cpu_backend::Isa old = cpu_backend::active_isa();
  const int64_t n = 70001;
  for (DType t : {DType::f16, DType::bf16}) {
    auto to_float = [t](uint16_t h) { return t == DType::f16 ? half_bits::to_float(h) : half_bits::bfloat16_to_float(h); };
    auto from_float = [t](float f) { return t == DType::f16 ? half_bits::from_float(f) : half_bits::bfloat16_from_float(f); };
    const uint16_t exponent = t == DType::f16 ? 0x7c00 : 0x7f80;
    std::vector<uint16_t> g(static_cast<size_t>(n));
    uint64_t z = 99;
    for (auto& h : g) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      h = uint16_t(z >> 48);
      if ((h & exponent) == exponent) h = uint16_t(h & ~0x4000);  // finite, whatever the exponent was
    }
    const uint16_t inf = exponent, quiet = uint16_t(exponent | (t == DType::f16 ? 0x200 : 0x40));
    const uint16_t signalling = uint16_t(exponent | 1), negative_nan = uint16_t(0x8000 | quiet | 5);
    const int64_t positions[] = {0, 7, 8, 9, 2047, 2048, (int64_t(1) << 15) - 1, int64_t(1) << 15, n - 9, n - 8, n - 2, n - 1};
    for (int level = 0; level <= int(cpu_backend::detected_isa()); ++level) {
      cpu_backend::force_isa(cpu_backend::Isa(level));
      SCOPED_TRACE(std::string(dtype_name(t)) + " at " + cpu_backend::isa_name(cpu_backend::active_isa()));
      for (float inv : {0x1.0p-16f, 1.f / 3.f, 4096.f}) {
        for (int64_t at : positions)
          for (uint16_t bad : {uint16_t(0), inf, uint16_t(0x8000 | inf), quiet, signalling, negative_nan}) {
            if (!bad && at != positions[0]) continue;  // the clean case once per inv
            std::vector<uint16_t> in = g;
            if (bad) in[size_t(at)] = bad;
            std::vector<uint16_t> want(in.size());
            bool want_found = false;
            for (size_t k = 0; k < in.size(); ++k) {
              want[k] = from_float(to_float(in[k]) * inv);
              want_found |= (want[k] & exponent) == exponent;
            }
            ASSERT_EQ(want_found, bad != 0 || inv > 1.f);  // the reference's verdict: x 4096 overflows some clean values
            std::vector<uint16_t> out(in.size(), 0x1234);
            float found = 0.f;
            ASSERT_TRUE(cpu_backend::unscale_and_check(t, in.data(), out.data(), n, double(inv), &found));
            ASSERT_EQ(out, want) << "inv " << inv << " at " << at << " value " << bad;
            ASSERT_EQ(found, want_found ? 1.f : 0.f) << "inv " << inv << " at " << at << " value " << bad;
            found = 0.f;
            ASSERT_TRUE(cpu_backend::unscale_and_check(t, in.data(), in.data(), n, double(inv), &found));  // in place
            ASSERT_EQ(in, want) << "in place, inv " << inv << " at " << at << " value " << bad;
            ASSERT_EQ(found, want_found ? 1.f : 0.f);
          }
      }
    }
  }
  cpu_backend::force_isa(old);
}

TEST(GradScaler, MisuseFailsWithClearMessages) {
  Pair model{Tensor(std::vector<float>{1, 2}, Shape{2}), Tensor(std::vector<float>{3}, Shape{1})};
  State opt = setup(Descent(0.1), model);
  GradScaler scaler;
  auto grads = gradient([&](auto& m) { return scaler.scale(add(sum(m.a), sum(m.b))); }, model);

  EXPECT_THAT(error_of([&] { scaler.update(); }), HasSubstr("[GradScaler::update] no gradients were unscaled since the last update()"));
  auto once = scaler.unscale(grads);
  EXPECT_THAT(error_of([&] { scaler.unscale(grads); }),
              HasSubstr("[GradScaler::unscale] the gradients were already unscaled since the last update()"));
  EXPECT_TRUE(scaler.step(opt, model, once));
  EXPECT_THAT(error_of([&] { scaler.step(opt, model, once); }),
              HasSubstr("[GradScaler::step] step() already ran since the last update(); call update()"));
  EXPECT_THAT(error_of([&] { scaler.unscale(grads); }),
              HasSubstr("[GradScaler::unscale] step() already ran in this iteration; call update()"));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);

  struct Counted {
    Tensor w, count;
  };
  Counted bad{Tensor(std::vector<float>{1}, Shape{1}), Tensor(std::vector<int64_t>{2}, Shape{1})};
  auto as_layer = [](Counted c) { return std::make_tuple(c.w, c.count); };
  EXPECT_THAT(error_of([&] { scaler.unscale(as_layer(bad)); }),
              HasSubstr("[GradScaler::unscale] gradient '1' is Int64 (1,); only Float16, BFloat16, Float32 and Float64"));
  EXPECT_THAT(error_of([&] { scaler.scale(Tensor(std::vector<int64_t>{1}, Shape{})); }),
              HasSubstr("[GradScaler::scale] the loss must be floating point, got Int64"));
  EXPECT_THAT(error_of([&] { GradScaler({.growth_factor = 1.0}); }),
              HasSubstr("[GradScaler] growth_factor must be finite and > 1, got 1"));
  EXPECT_THAT(error_of([&] { GradScaler({.backoff_factor = 1.0}); }), HasSubstr("[GradScaler] backoff_factor must be in (0, 1)"));
  EXPECT_THAT(error_of([&] { GradScaler({.growth_interval = 0}); }), HasSubstr("[GradScaler] growth_interval must be >= 1"));
  EXPECT_THAT(error_of([&] { GradScaler({.init_scale = kInf}); }), HasSubstr("[GradScaler] init_scale must be finite and positive"));
  EXPECT_THAT(error_of([&] { scaler.update(0.0); }), HasSubstr("[GradScaler::update] the new scale must be finite and positive"));
  // A saved state: the same check and message style, named after load_saved_state; nothing changes.
  GradScaler fresh({.init_scale = 8});
  using Saved = GradScaler::SavedState;
  const std::pair<Saved, std::string> bad_states[] = {
      {{kNaN, 2, 0.5, 0, 10}, "scale must be finite and positive, got nan"},
      {{0, 2, 0.5, 0, 10}, "scale must be finite and positive, got 0"},
      {{8, 1.0, 0.5, 0, 10}, "growth_factor must be finite and > 1, got 1"},
      {{8, kInf, 0.5, 0, 10}, "growth_factor must be finite and > 1, got inf"},
      {{8, 2, 1.5, 0, 10}, "backoff_factor must be in (0, 1), got 1.5"},
      {{8, 2, 0.5, 0, 0}, "growth_interval must be >= 1 (steps), got 0"},
      {{8, 2, 0.5, -1, 10}, "growth_tracker must be >= 0 (steps), got -1"},
  };
  for (const auto& bad : bad_states) {  // not a structured binding: clang 14 cannot capture one
    EXPECT_THAT(error_of([&] { fresh.load_saved_state(bad.first); }),
                HasSubstr("[GradScaler::load_saved_state] " + bad.second));
    EXPECT_EQ(fresh.get_scale(), 8.0);
    EXPECT_EQ(fresh.options().growth_interval, 2000);
  }
  EXPECT_THAT(error_of([&] { GradScaler({.init_scale = 0}); }),
              HasSubstr("[GradScaler] init_scale must be finite and positive, got 0"));
  EXPECT_THAT(error_of([&] { GradScaler({.growth_factor = kInf}); }),
              HasSubstr("[GradScaler] growth_factor must be finite and > 1, got inf"));
}

TEST(GradScaler, DisabledIsTransparent) {
  Pair model{Tensor(std::vector<float>{1, 2}, Shape{2}), Tensor(std::vector<float>{3}, Shape{1})};
  State opt = setup(Descent(0.5), model);
  GradScaler scaler({.enabled = false});
  EXPECT_EQ(scaler.get_scale(), 1.0);
  auto grads = gradient([&](auto& m) { return scaler.scale(add(sum(m.a), sum(m.b))); }, model);
  EXPECT_EQ(grads.a.to_vector<double>(), (std::vector<double>{1, 1}));
  auto same = scaler.unscale(grads);
  EXPECT_EQ(same.a.impl(), grads.a.impl());
  EXPECT_TRUE(scaler.step(opt, model, grads));
  scaler.update();
  EXPECT_EQ(model.a.to_vector<double>(), (std::vector<double>{0.5, 1.5}));
}

// The one-process communicator takes the same decisions as none (the multi-rank case: tests/mpi).
TEST(GradScaler, SingleProcessCommunicator) {
  Pair model{Tensor(std::vector<float>{1, 2}, Shape{2}), Tensor(std::vector<float>{3}, Shape{1})};
  State opt = setup(Descent(0.5), model);
  GradScaler scaler({.init_scale = 4, .comm = distributed::initialize()});
  auto grads = gradient([&](auto& m) { return scaler.scale(add(sum(m.a), mul(sum(m.b), Tensor::scalar(kNaN)))); }, model);
  EXPECT_FALSE(scaler.step(opt, model, grads));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

// The scaler's state rides in the checkpoint, and training resumes bit for bit.
TEST(GradScaler, CheckpointRoundTrip) {
  char pattern[] = "/tmp/flux-grad-scaler-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::string path = dir + "/ckpt.safetensors", plain_path = dir + "/plain.safetensors";
  seed(11);
  auto model = Chain(Dense(3, 4, relu), Dense(4, 2));
  Tensor x = randn({5, 3}), y = randn({5, 2});
  State opt = setup(Adam(1e-2), model);
  GradScaler scaler({.init_scale = 512, .growth_interval = 3});
  int64_t k = 0;
  auto iteration = [&](auto& m, State& s, GradScaler& sc) {
    const bool poison = ++k % 4 == 0;  // every fourth step overflows
    auto g = gradient([&](auto& mm) { return sc.scale(mul(mse(mm(x), y), Tensor::scalar(poison ? kInf : 1.0))); }, m);
    sc.step(s, m, g);
    sc.update();
  };
  // Steps 1..6: growth after step 3 (1024), an overflow at step 4 (512), two finite steps since.
  for (int i = 0; i < 6; ++i) iteration(model, opt, scaler);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  save_checkpoint(path, model, opt, scaler, {{"step", "6"}});
  save_checkpoint(plain_path, model, opt);

  seed(12);
  auto resumed = Chain(Dense(3, 4, relu), Dense(4, 2));
  State opt2 = setup(Adam(1e-2), resumed);
  GradScaler scaler2({.init_scale = 1, .growth_factor = 3, .backoff_factor = 0.125, .growth_interval = 50});
  EXPECT_EQ(load_checkpoint(path, resumed, opt2, scaler2).at("step"), "6");
  EXPECT_EQ(scaler2.get_scale(), 512.0);
  EXPECT_EQ(scaler2.growth_tracker(), 2);
  EXPECT_EQ(scaler2.options().growth_factor, 2.0);
  EXPECT_EQ(scaler2.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler2.options().growth_interval, 3);
  TensorMap file = load_state(path);
  EXPECT_EQ(file.at("grad_scaler.scale").item<double>(), 512.0);
  EXPECT_EQ(file.at("grad_scaler.growth_tracker").dtype(), DType::i64);

  const int64_t k_saved = k;
  for (int i = 0; i < 4; ++i) iteration(model, opt, scaler);  // steps 7..10: growth at 7, overflow at 8
  k = k_saved;
  for (int i = 0; i < 4; ++i) iteration(resumed, opt2, scaler2);
  EXPECT_EQ(scaler2.get_scale(), scaler.get_scale());
  EXPECT_EQ(scaler2.growth_tracker(), scaler.growth_tracker());
  auto p1 = params(model), p2 = params(resumed);
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(bytes_of(p1[i]), bytes_of(p2[i])) << "param " << i;

  EXPECT_THAT(error_of([&] { load_checkpoint(path, resumed, opt2); }),
              HasSubstr("the checkpoint holds a GradScaler's state (grad_scaler.*); pass the scaler"));
  EXPECT_THAT(error_of([&] { load_checkpoint(plain_path, resumed, opt2, scaler2); }),
              HasSubstr("the checkpoint holds no GradScaler state"));
  std::system(("rm -rf '" + dir + "'").c_str());
}

// A checkpoint whose GradScaler entries are out of range fails before anything is loaded: the model,
// the optimiser state and the scaler are left exactly as they were.
TEST(GradScaler, CorruptScalerEntryLeavesTheModelUntouched) {
  char pattern[] = "/tmp/flux-grad-scaler-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  const std::string path = dir + "/ckpt.safetensors", bad_path = dir + "/bad.safetensors";
  seed(21);
  auto model = Chain(Dense(3, 4, relu), Dense(4, 2));
  State opt = setup(Adam(1e-2), model);
  GradScaler scaler({.init_scale = 256});
  Tensor x = randn({5, 3}), y = randn({5, 2});
  auto g = gradient([&](auto& m) { return scaler.scale(mse(m(x), y)); }, model);
  scaler.step(opt, model, g);
  scaler.update();
  save_checkpoint(path, model, opt, scaler);
  const Metadata meta = load_metadata(path);

  seed(22);
  auto other = Chain(Dense(3, 4, relu), Dense(4, 2));
  State opt2 = setup(Adam(1e-2), other);
  auto g2 = gradient([&](auto& m) { return mse(m(x), y); }, other);
  update(opt2, other, g2);  // optimiser buffers and a step count of their own
  GradScaler scaler2({.init_scale = 4, .growth_interval = 7});
  auto bytes = [&] {
    std::string out;
    for (const Tensor& p : params(other)) out += bytes_of(p);
    for (const LeafState& leaf : opt2.leaves) {
      out += std::to_string(leaf.t) + ";";
      for (const Tensor& b : leaf.buffers) out += bytes_of(b);
    }
    return out;
  };
  const std::string before = bytes();
  const std::pair<const char*, Tensor> corruptions[] = {
      {"grad_scaler.scale", Tensor(std::vector<double>{kNaN}, Shape{})},
      {"grad_scaler.scale", Tensor(std::vector<double>{-1.0}, Shape{})},
      {"grad_scaler.backoff_factor", Tensor(std::vector<double>{2.0}, Shape{})},
      {"grad_scaler.growth_interval", Tensor(std::vector<int64_t>{0}, Shape{})},
      {"grad_scaler.growth_tracker", Tensor(std::vector<int64_t>{-3}, Shape{})},
  };
  for (const auto& [name, value] : corruptions) {
    TensorMap file = load_state(path);
    file.at(name) = value;
    save_state(bad_path, file, meta);
    EXPECT_THAT(error_of([&] { load_checkpoint(bad_path, other, opt2, scaler2); }),
                AllOf(HasSubstr("the checkpoint's GradScaler state is invalid (nothing was loaded)"),
                      HasSubstr("[GradScaler::load_saved_state] " + std::string(name + 12))))
        << name;
    EXPECT_EQ(bytes(), before) << name;
    EXPECT_EQ(scaler2.get_scale(), 4.0) << name;
    EXPECT_EQ(scaler2.options().growth_interval, 7) << name;
  }
  // The intact file still loads into the same objects.
  load_checkpoint(path, other, opt2, scaler2);
  EXPECT_EQ(scaler2.get_scale(), scaler.get_scale());
  auto p1 = params(model), p2 = params(other);
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(bytes_of(p1[i]), bytes_of(p2[i])) << "param " << i;
  std::system(("rm -rf '" + dir + "'").c_str());
}

FLUX_DEVICE_SUITE(GradScalerDevices);
