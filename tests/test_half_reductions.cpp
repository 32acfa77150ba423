// Reductions and (log)softmax on Float16/BFloat16 tensors (issue 36):
//   - the public ops (sum, mean, max, min, argmax, argmin, softmax, logsoftmax) on every test device,
//     values and gradients against a float64 reference computed here from the same (already rounded)
//     inputs: one rounding of the result to the tensor's dtype, or Float32 under autocast (where sum,
//     mean and the softmax family answer in Float32); rows (the reduced axis last) and columns (an
//     axis with more than one inner element), lengths over the CPU kernels' block sizes, NaN and inf.
//   - while tracing (what ONNX export records) the ops keep the cast through Float32, so that each
//     reduce/softmax event's output has its input's dtype as the ONNX operators require.
//   - the CPU backend's kernels reading half storage (cpu_backend::reduce_half, softmax_half) at each
//     ISA level this CPU allows (the baseline level runs the scalar conversions): bitwise the float32
//     kernels on the converted values where promised, sum within float64 accumulation of the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"
#include "src/ops/registry.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {

const DType kLow[] = {DType::f16, DType::bf16};

double round_to(DType t, double v) {
  const float f = float(v);
  return t == DType::bf16 ? half_bits::bfloat16_to_float(half_bits::bfloat16_from_float(f))
                          : half_bits::to_float(half_bits::from_float(f));
}

// n values uniform in [-scale, scale], rounded to t.
std::vector<double> values(size_t n, uint64_t seed, DType t, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (double& x : v) x = round_to(t, u(rng));
  return v;
}

// One rounding to t of a result relative to max(1, |reference|), with the float32 arithmetic before it.
double tolerance(DType t) { return t == DType::bf16 ? 8e-3 : t == DType::f16 ? 1e-3 : 1e-5; }

struct Layout {
  int64_t outer, len, inner;
};
// Rows longer than the CPU kernels' 2048-element blocks, columns wider than them, and small ones.
const Layout kLayouts[] = {{5, 3001, 1}, {3, 7, 2100}, {4, 33, 5}, {1, 1, 1}};

size_t at(const Layout& l, int64_t o, int64_t j, int64_t i) { return size_t((o * l.len + j) * l.inner + i); }

Tensor place(const std::vector<double>& v, DType t, const Layout& l, const Device& d) {
  return to(Tensor(v, Shape{l.outer, l.len, l.inner}).cast(t), d);
}

enum class Red { sum, max, min, argmax, argmin };

// Reference over the middle axis: sum in float64; extremes and their first index with NaN winning.
std::vector<double> reduce_reference(Red op, const std::vector<double>& x, const Layout& l) {
  std::vector<double> out;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) {
      double acc = 0, best = x[at(l, o, 0, i)];
      int64_t where = 0;
      for (int64_t j = 0; j < l.len; ++j) {
        const double v = x[at(l, o, j, i)];
        acc += v;
        if (j == 0 || std::isnan(best)) continue;
        const bool better = op == Red::max || op == Red::argmax ? v > best : v < best;
        if (std::isnan(v) || better) best = v, where = j;
      }
      out.push_back(op == Red::sum ? acc : op == Red::argmax || op == Red::argmin ? double(where) : best);
    }
  return out;
}

std::vector<double> softmax_reference(const std::vector<double>& x, const Layout& l, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) {
      double m = -INFINITY, total = 0;
      for (int64_t j = 0; j < l.len; ++j) m = std::max(m, x[at(l, o, j, i)]);
      for (int64_t j = 0; j < l.len; ++j) total += std::exp(x[at(l, o, j, i)] - m);
      for (int64_t j = 0; j < l.len; ++j) {
        const double z = x[at(l, o, j, i)] - m;
        y[at(l, o, j, i)] = log ? z - std::log(total) : std::exp(z) / total;
      }
    }
  return y;
}

// Equal as doubles, NaN equal to NaN.
void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    if (!(std::isnan(got[k]) && std::isnan(want[k]))) {
      ASSERT_EQ(got[k], want[k]) << what << " at " << k;
    }
}

class HalfReductions : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
};

TEST_P(HalfReductions, ValuesMatchFloat64) {
  uint64_t seed = 4100;
  for (DType t : kLow)
    for (const Layout& l : kLayouts) {
      const std::string what = to_string(dev()) + " " + dtype_name(t) + " [" + std::to_string(l.outer) + ", " +
                               std::to_string(l.len) + ", " + std::to_string(l.inner) + "]";
      const std::vector<double> x = values(size_t(l.outer * l.len * l.inner), seed++, t);
      const Tensor xt = place(x, t, l, dev());
      const Tensor s = sum(xt, 1), m = mean(xt, 1, true);
      ASSERT_EQ(s.dtype(), t) << what;
      ASSERT_EQ(s.shape(), (Shape{l.outer, l.inner})) << what;
      ASSERT_EQ(m.shape(), (Shape{l.outer, 1, l.inner})) << what;
      std::vector<double> want = reduce_reference(Red::sum, x, l);
      EXPECT_LE(flux::testing::max_rel_error(s, want), tolerance(t)) << what;
      for (double& w : want) w /= double(l.len);
      EXPECT_LE(flux::testing::max_rel_error(m, want), 2 * tolerance(t)) << what;  // sum, then / len, rounded
      // Under autocast the sum and mean are Float32: only float32 rounding is left.
      const Tensor s32 = autocast(DType::bf16, [&] { return sum(xt, 1); });
      ASSERT_EQ(s32.dtype(), DType::f32) << what;
      EXPECT_LE(flux::testing::max_rel_error(s32, reduce_reference(Red::sum, x, l)), 1e-5) << what;
      // Extremes are values of x: exact, and so are the indices (the first of equal values).
      expect_same(max(xt, 1).to_vector<double>(), reduce_reference(Red::max, x, l), what + " max");
      expect_same(min(xt, 1).to_vector<double>(), reduce_reference(Red::min, x, l), what + " min");
      ASSERT_EQ(max(xt, 1).dtype(), t) << what;
      expect_same(argmax(xt, 1).to_vector<double>(), reduce_reference(Red::argmax, x, l), what + " argmax");
      expect_same(argmin(xt, 1).to_vector<double>(), reduce_reference(Red::argmin, x, l), what + " argmin");
      for (bool log : {false, true}) {
        const Tensor y = log ? logsoftmax(xt, 1) : softmax(xt, 1);
        ASSERT_EQ(y.dtype(), t) << what;
        EXPECT_LE(flux::testing::max_rel_error(y, softmax_reference(x, l, log)), tolerance(t)) << what << " log " << log;
        const Tensor y32 = autocast(DType::bf16, [&] { return log ? logsoftmax(xt, 1) : softmax(xt, 1); });
        ASSERT_EQ(y32.dtype(), DType::f32) << what;
        EXPECT_LE(flux::testing::max_rel_error(y32, softmax_reference(x, l, log)), 1e-5) << what << " log " << log;
      }
    }
}

TEST_P(HalfReductions, NaNAndInfinityFollowTheFloat32Rules) {
  for (DType t : kLow)
    for (const Layout& l : {Layout{3, 2500, 1}, Layout{2, 6, 2100}}) {
      std::vector<double> x = values(size_t(l.outer * l.len * l.inner), 77, t);
      // Row/column 0: a NaN late (after a block boundary where there is one) and an inf before it;
      // row/column 1: +inf and -inf; the rest finite.
      x[at(l, 0, l.len - 2, 0)] = std::numeric_limits<double>::quiet_NaN();
      x[at(l, 0, 1, 0)] = INFINITY;
      x[at(l, 1, 3, 0)] = INFINITY;
      x[at(l, 1, l.len - 1, 0)] = -INFINITY;
      const std::string what = to_string(dev()) + " " + dtype_name(t) + " len " + std::to_string(l.len);
      const Tensor xt = place(x, t, l, dev());
      expect_same(max(xt, 1).to_vector<double>(), reduce_reference(Red::max, x, l), what + " max");
      expect_same(min(xt, 1).to_vector<double>(), reduce_reference(Red::min, x, l), what + " min");
      expect_same(argmax(xt, 1).to_vector<double>(), reduce_reference(Red::argmax, x, l), what + " argmax");
      expect_same(argmin(xt, 1).to_vector<double>(), reduce_reference(Red::argmin, x, l), what + " argmin");
      const std::vector<double> s = sum(xt, 1).to_vector<double>();
      EXPECT_TRUE(std::isnan(s[0])) << what;
      EXPECT_TRUE(std::isnan(s[size_t(l.inner)])) << what;  // inf + -inf
      const std::vector<double> y = softmax(xt, 1).to_vector<double>();
      EXPECT_TRUE(std::isnan(y[at(l, 0, 0, 0)])) << what;
    }
}

TEST_P(HalfReductions, GradientsMatchFloat64) {
  uint64_t seed = 4200;
  for (DType t : kLow)
    for (const Layout& l : {Layout{3, 2200, 1}, Layout{2, 9, 2100}, Layout{4, 33, 5}}) {
      const std::string what = to_string(dev()) + " " + dtype_name(t) + " [" + std::to_string(l.outer) + ", " +
                               std::to_string(l.len) + ", " + std::to_string(l.inner) + "]";
      const size_t n = size_t(l.outer * l.len * l.inner);
      const std::vector<double> x = values(n, seed++, t, 3.0), w = values(n, seed++, DType::f16);
      const Tensor xt = place(x, t, l, dev()), wt = to(Tensor(w, Shape{l.outer, l.len, l.inner}), dev());
      for (bool autocasting : {false, true})
        for (bool log : {false, true}) {
          // d/dx Σ w softmax(x) = y (w - Σ_j w y); d/dx Σ w logsoftmax(x) = w - softmax(x) Σ_j w.
          auto loss = [&](const Tensor& v) {
            auto f = [&] { return sum((log ? logsoftmax(v, 1) : softmax(v, 1)).cast(DType::f64) * wt); };
            return autocasting ? autocast(DType::bf16, f) : f();
          };
          const Tensor g = gradient(loss, xt);
          ASSERT_EQ(g.dtype(), t) << what;
          const std::vector<double> y = softmax_reference(x, l, false);
          std::vector<double> want(n);
          for (int64_t o = 0; o < l.outer; ++o)
            for (int64_t i = 0; i < l.inner; ++i) {
              double wy = 0, ws = 0;
              for (int64_t j = 0; j < l.len; ++j) wy += w[at(l, o, j, i)] * y[at(l, o, j, i)], ws += w[at(l, o, j, i)];
              for (int64_t j = 0; j < l.len; ++j) {
                const size_t k = at(l, o, j, i);
                want[k] = log ? w[k] - y[k] * ws : y[k] * (w[k] - wy);
              }
            }
          // The tape holds the output in the half dtype without autocast: a rounding more inside.
          EXPECT_LE(flux::testing::max_rel_error(g, want), 2 * tolerance(t))
              << what << " log " << log << " autocast " << autocasting;
        }
      // sum: w's broadcast; max: w at the maximum, shared among equal maxima; mean: w / len.
      const Tensor wr = to(Tensor(values(size_t(l.outer * l.inner), seed++, DType::f16), Shape{l.outer, l.inner}), dev());
      const std::vector<double> wv = wr.to_vector<double>();
      const Tensor gs = gradient([&](const Tensor& v) { return sum(sum(v, 1).cast(DType::f64) * wr); }, xt);
      const Tensor gm = gradient([&](const Tensor& v) { return sum(max(v, 1).cast(DType::f64) * wr); }, xt);
      const Tensor gmean = gradient([&](const Tensor& v) {
        return autocast(DType::bf16, [&] { return sum(mean(v, 1).cast(DType::f64) * wr); });
      }, xt);
      ASSERT_EQ(gs.dtype(), t) << what;
      ASSERT_EQ(gm.dtype(), t) << what;
      ASSERT_EQ(gmean.dtype(), t) << what;
      const std::vector<double> mx = reduce_reference(Red::max, x, l);
      std::vector<double> want_s(n), want_m(n), want_mean(n);
      for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t i = 0; i < l.inner; ++i) {
          const size_t r = size_t(o * l.inner + i);
          int ties = 0;
          for (int64_t j = 0; j < l.len; ++j) ties += x[at(l, o, j, i)] == mx[r];
          for (int64_t j = 0; j < l.len; ++j) {
            const size_t k = at(l, o, j, i);
            want_s[k] = wv[r];
            want_m[k] = x[k] == mx[r] ? wv[r] / ties : 0.0;
            want_mean[k] = wv[r] / double(l.len);
          }
        }
      EXPECT_LE(flux::testing::max_rel_error(gs, want_s), tolerance(t)) << what << " sum";
      EXPECT_LE(flux::testing::max_rel_error(gm, want_m), tolerance(t)) << what << " max";
      EXPECT_LE(flux::testing::max_rel_error(gmean, want_mean), tolerance(t)) << what << " mean";
    }
}

FLUX_DEVICE_SUITE(HalfReductions);

struct Events final : trace::Recorder {
  std::vector<trace::Event> events;
  void record(trace::Event e) override { events.push_back(std::move(e)); }
};

TEST(HalfReductionsTrace, EventsKeepTheirInputsDtype) {
  for (DType t : kLow) {
    const Layout l{2, 9, 3};
    const Tensor x = place(values(54, 5, t), t, l, Device());
    Events rec;
    Tensor outs[4];
    {
      trace::Scope scope(&rec);
      outs[0] = sum(x, 1);
      outs[1] = max(x, 2);
      outs[2] = softmax(x, 1);
      outs[3] = autocast(DType::bf16, [&] { return logsoftmax(x, -1); });
    }
    EXPECT_EQ(outs[0].dtype(), t);
    EXPECT_EQ(outs[3].dtype(), DType::f32);
    int seen = 0;
    for (const trace::Event& e : rec.events)
      if (e.op == &ops::reduce || e.op == &ops::softmax || e.op == &ops::logsoftmax) {
        ++seen;
        ASSERT_FALSE(e.inputs.empty());
        EXPECT_EQ(e.inputs[0].dtype(), DType::f32) << e.op->name;
        EXPECT_EQ(e.output.dtype(), DType::f32) << e.op->name;
      }
    EXPECT_EQ(seen, 4) << dtype_name(t);
  }
}

// ---- the CPU kernels reading half storage ----

struct IsaGuard {
  cpu_backend::Isa old = cpu_backend::active_isa();
  ~IsaGuard() { cpu_backend::force_isa(old); }
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class HalfReduceKernels : public ::testing::TestWithParam<DType> {};

TEST_P(HalfReduceKernels, EveryIsaLevelMatchesTheFloat32KernelsOnTheConvertedValues) {
  using backend::ReduceOp;
  const DType t = GetParam();
  IsaGuard guard;
  const Layout layouts[] = {{3, 4500, 1}, {2, 5, 2100}, {3, 17, 3}, {2, 1, 1}, {1, 40, 1}};
  for (int level = 0; level <= int(cpu_backend::detected_isa()); ++level) {
    cpu_backend::force_isa(cpu_backend::Isa(level));
    uint64_t seed = 4300;
    for (const Layout& l : layouts) {
      const std::string what = std::string(dtype_name(t)) + " isa " + cpu_backend::isa_name(cpu_backend::active_isa()) +
                               " [" + std::to_string(l.outer) + ", " + std::to_string(l.len) + ", " +
                               std::to_string(l.inner) + "]";
      const size_t n = size_t(l.outer * l.len * l.inner), r = size_t(l.outer * l.inner);
      std::vector<double> x = values(n, seed++, t, 4.0);
      if (n > 40) x[n / 2] = std::numeric_limits<double>::quiet_NaN(), x[n / 3] = -INFINITY;
      std::vector<float> xf(n);
      for (size_t k = 0; k < n; ++k) xf[k] = float(x[k]);
      std::vector<uint16_t> h(n);
      cpu_backend::float_to_half_storage_reference(t, xf.data(), h.data(), int64_t(n));
      // Bitwise promises: max/min/argmax/argmin of columns, sums of columns, (log)softmax everywhere.
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::argmax, ReduceOp::argmin}) {
        const bool index = op == ReduceOp::argmax || op == ReduceOp::argmin;
        std::vector<float> want(r), got(r, -1.f);
        std::vector<int64_t> want_i(r), got_i(r, -1);
        cpu_backend::reduce(op, DType::f32, xf.data(), index ? static_cast<void*>(want_i.data()) : want.data(), l.outer,
                            l.len, l.inner);
        ASSERT_TRUE(cpu_backend::reduce_half(op, t, h.data(), index ? static_cast<void*>(got_i.data()) : got.data(),
                                             l.outer, l.len, l.inner));
        if (index) {
          ASSERT_EQ(got_i, want_i) << what << " op " << int(op);
          continue;
        }
        for (size_t k = 0; k < r; ++k) {
          if (std::isnan(want[k])) {
            EXPECT_TRUE(std::isnan(got[k])) << what << " op " << int(op) << " at " << k;
          } else if (op == ReduceOp::sum && l.inner == 1 && !std::isinf(want[k])) {
            // Lanes of float64 accumulators: the same float64 sum to within its rounding.
            EXPECT_NEAR(got[k], want[k], 1e-6 * std::max(1.f, std::abs(want[k]))) << what << " at " << k;
          } else if (l.inner == 1) {
            EXPECT_EQ(got[k], want[k]) << what << " op " << int(op) << " at " << k;  // up to the sign of a zero
          } else {
            EXPECT_EQ(bits(got[k]), bits(want[k])) << what << " op " << int(op) << " at " << k;
          }
        }
      }
      for (bool log : {false, true}) {
        std::vector<float> want(n), got(n, -1.f);
        cpu_backend::softmax(DType::f32, xf.data(), want.data(), l.outer, l.len, l.inner, log);
        ASSERT_TRUE(cpu_backend::softmax_half(t, h.data(), got.data(), l.outer, l.len, l.inner, log));
        for (size_t k = 0; k < n; ++k)
          ASSERT_EQ(bits(got[k]), bits(want[k])) << what << " log " << log << " at " << k;
      }
    }
  }
  // Another dtype: declined, nothing written.
  float out = 7.f;
  const uint16_t one = 0x3c00;
  EXPECT_FALSE(cpu_backend::reduce_half(backend::ReduceOp::sum, DType::f32, &one, &out, 1, 1, 1));
  EXPECT_FALSE(cpu_backend::softmax_half(DType::f64, &one, &out, 1, 1, 1, false));
  EXPECT_EQ(out, 7.f);
}

INSTANTIATE_TEST_SUITE_P(Cpu, HalfReduceKernels, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
