// The CPU backend's fast paths against their references: every ISA variant of the vectorised loops
// (src/backends/cpu/isa.hpp) against the baseline copy and a float64 formula, the thread pool
// (each index exactly once, errors, concurrent and nested callers), and the GEMM split over the pool
// against a float64 loop for every transpose and shape class.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

// Not flux/flux.hpp: its flux::cpu (the mover) would hide the backend namespace flux::cpu_backend.
#include "flux/backend.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/float_mode.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/matmul_kernels.hpp"

namespace {

using namespace flux;
using flux::cpu_backend::Isa;

std::vector<Isa> usable_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (int(i) <= int(cpu_backend::detected_isa())) v.push_back(i);
  return v;
}

// Restores the detected level at the end of a test.
struct IsaGuard {
  Isa old = cpu_backend::active_isa();
  ~IsaGuard() { cpu_backend::force_isa(old); }
};

std::vector<float> random_floats(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

double rel(double got, double want) { return std::abs(got - want) / std::max(1.0, std::abs(want)); }

TEST(CpuIsa, DetectedLevelIsNamedAndForcingClamps) {
  IsaGuard guard;
  EXPECT_NE(std::string(cpu_backend::isa_name(cpu_backend::detected_isa())), "");
  cpu_backend::force_isa(Isa::baseline);
  EXPECT_EQ(cpu_backend::active_isa(), Isa::baseline);
  cpu_backend::force_isa(Isa::avx512);
  EXPECT_EQ(cpu_backend::active_isa(), cpu_backend::detected_isa());  // never above what the CPU has
}

// n: odd tails and a size large enough for the pool's split.
TEST(CpuIsa, AdamVariantsMatchBaselineAndFloat64) {
  IsaGuard guard;
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(1000), int64_t(100003)}) {
    std::vector<float> x0 = random_floats(size_t(n), -1, 1, 1), g = random_floats(size_t(n), -2, 2, 2),
                       m0 = random_floats(size_t(n), -0.5f, 0.5f, 3), v0 = random_floats(size_t(n), 0, 1, 4);
    backend::AdamStep s{1e-2, 0.9, 0.999, 1e-8, 0.01, 1 - std::pow(0.9, 3), 1 - std::pow(0.999, 3)};
    std::vector<float> base_x;
    for (Isa level : usable_isas()) {
      cpu_backend::force_isa(level);
      std::vector<float> x = x0, m = m0, v = v0;
      cpu_backend::adam_step(DType::f32, x.data(), g.data(), m.data(), v.data(), n, s);
      if (level == Isa::baseline) base_x = x;
      double worst = 0, worst_base = 0;
      for (int64_t i = 0; i < n; ++i) {
        double mi = s.beta1 * m0[i] + (1 - s.beta1) * g[i], vi = s.beta2 * v0[i] + (1 - s.beta2) * double(g[i]) * g[i];
        double xi = x0[i] - s.lr * (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.eps) - s.lr * s.weight_decay * x0[i];
        worst = std::max({worst, rel(x[i], xi), rel(m[i], mi), rel(v[i], vi)});
        worst_base = std::max(worst_base, rel(x[i], base_x[i]));
      }
      EXPECT_LT(worst, 2e-6) << cpu_backend::isa_name(level) << " n=" << n;
      EXPECT_LT(worst_base, 2e-6) << cpu_backend::isa_name(level) << " n=" << n;
    }
  }
}

TEST(CpuIsa, AdamFloat64VariantsMatchFormula) {
  IsaGuard guard;
  const int64_t n = 4099;
  std::vector<double> x0(n), g(n), m0(n), v0(n);
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> d(0, 1);
  for (int64_t i = 0; i < n; ++i) x0[i] = d(gen) - 0.5, g[i] = 2 * d(gen) - 1, m0[i] = d(gen) - 0.5, v0[i] = d(gen);
  backend::AdamStep s{1e-3, 0.9, 0.999, 1e-8, 0, 0.1, 0.001};
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    std::vector<double> x = x0, m = m0, v = v0;
    cpu_backend::adam_step(DType::f64, x.data(), g.data(), m.data(), v.data(), n, s);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      double mi = s.beta1 * m0[i] + (1 - s.beta1) * g[i], vi = s.beta2 * v0[i] + (1 - s.beta2) * g[i] * g[i];
      worst = std::max(worst, rel(x[i], x0[i] - s.lr * (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.eps)));
    }
    EXPECT_LT(worst, 1e-14) << cpu_backend::isa_name(level);
  }
}

backend::Broadcast flat(int64_t n) {
  backend::Broadcast p;
  p.ndim = 1;
  p.shape[0] = n;
  p.stride[0][0] = p.stride[1][0] = p.stride[2][0] = 1;
  p.contiguous = true;
  return p;
}

TEST(CpuIsa, BinaryVariantsMatchFloat64) {
  IsaGuard guard;
  using backend::BinaryOp;
  const int64_t n = 70001;
  std::vector<float> a = random_floats(n, -3, 3, 11), b = random_floats(n, 0.5f, 2, 12);
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
      auto ref = [&](double x, double y) {
        return op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : x / y;
      };
      // Both dense; then b a single value broadcast (the fast path's scalar form).
      std::vector<float> out(n);
      cpu_backend::binary(op, DType::f32, a.data(), b.data(), out.data(), flat(n));
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, rel(out[i], ref(a[i], b[i])));
      EXPECT_LT(worst, 1e-7) << cpu_backend::isa_name(level) << " op " << int(op);
      backend::Broadcast p = flat(n);
      p.contiguous = false;
      p.stride[1][0] = 0;
      cpu_backend::binary(op, DType::f32, a.data(), b.data(), out.data(), p);
      worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, rel(out[i], ref(a[i], b[0])));
      EXPECT_LT(worst, 1e-7) << cpu_backend::isa_name(level) << " scalar op " << int(op);
    }
  }
}

// Broadcasts whose innermost axis is a run in both operands or a run against one value (binary.cpp's
// per-run path): (A, B, C) op (B, C) (a mask over heads), (A, B, C) op (A, B, 1) (a per-row value) and
// (B, C) op (A, B, C), each against float64 with the broadcast indices written out; C = 37 and 8.
TEST(CpuIsa, BinaryRowBroadcastsMatchFloat64) {
  IsaGuard guard;
  using backend::BinaryOp;
  for (int64_t C : {int64_t(37), int64_t(8)}) {
    const int64_t A = 3, B = 5, n = A * B * C;
    std::vector<float> big = random_floats(size_t(n), -3, 3, 13), small = random_floats(size_t(B * C), 0.5f, 2, 14),
                       col = random_floats(size_t(A * B), 0.5f, 2, 15);
    for (Isa level : usable_isas()) {
      cpu_backend::force_isa(level);
      for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
        auto ref = [&](double x, double y) {
          return op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : x / y;
        };
        for (int form = 0; form < 3; ++form) {
          backend::Broadcast p;
          p.ndim = 3;
          p.shape[0] = A, p.shape[1] = B, p.shape[2] = C;
          const int64_t dense[3] = {B * C, C, 1}, row[3] = {0, C, 1}, per_row[3] = {B, 1, 0};
          const float* x = form == 2 ? small.data() : big.data();
          const float* y = form == 0 ? small.data() : form == 1 ? col.data() : big.data();
          for (int i = 0; i < 3; ++i) {
            p.stride[0][i] = form == 2 ? row[i] : dense[i];
            p.stride[1][i] = form == 0 ? row[i] : form == 1 ? per_row[i] : dense[i];
            p.stride[2][i] = dense[i];
          }
          std::vector<float> out(big.size());
          cpu_backend::binary(op, DType::f32, x, y, out.data(), p);
          for (int64_t a = 0; a < A; ++a)
            for (int64_t b = 0; b < B; ++b)
              for (int64_t c = 0; c < C; ++c) {
                const int64_t o = (a * B + b) * C + c;
                const double xv = x[size_t(a * p.stride[0][0] + b * p.stride[0][1] + c * p.stride[0][2])];
                const double yv = y[size_t(a * p.stride[1][0] + b * p.stride[1][1] + c * p.stride[1][2])];
                ASSERT_LT(rel(out[size_t(o)], ref(xv, yv)), 1e-7)
                    << cpu_backend::isa_name(level) << " op " << int(op) << " form " << form << " at " << o;
              }
        }
      }
    }
  }
}

TEST(CpuIsa, UnaryVariantsMatchFloat64) {
  IsaGuard guard;
  using backend::UnaryOp;
  const int64_t n = 50003;
  std::vector<float> a = random_floats(n, -3, 3, 21);
  a[5] = 0.f;
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    for (UnaryOp op : {UnaryOp::relu, UnaryOp::neg, UnaryOp::square, UnaryOp::step}) {
      std::vector<float> out(n);
      cpu_backend::unary(op, DType::f32, a.data(), out.data(), n, 0);
      for (int64_t i = 0; i < n; ++i) {
        double x = a[i];
        double want = op == UnaryOp::relu ? (x > 0 ? x : 0) : op == UnaryOp::neg ? -x : op == UnaryOp::square ? x * x : (x > 0 ? 1 : 0);
        ASSERT_LT(rel(out[i], want), 1e-7) << cpu_backend::isa_name(level) << " op " << int(op) << " at " << i;
      }
    }
  }
}

// vector_math.hpp's exp, tanh and sigmoid (and gelu, swish built on sigmoid) in every ISA variant of
// the unary kernel against float64 libm: random values, then the edges (0, -0, tiny, the polynomial
// switch of tanh at 0.625, the under/overflow limits of exp, ±inf, NaN). Error bound: 4 ulp of the
// result (4 * 2^-23 relative) plus the effect of rounding exp's argument in float, plus 1e-37 absolute
// (below float's normal range exp flushes to 0).
TEST(CpuIsa, TranscendentalVariantsMatchFloat64) {
  IsaGuard guard;
  using backend::UnaryOp;
  std::vector<float> a = random_floats(40000, -12, 12, 22);
  std::vector<float> wide = random_floats(20000, -110, 95, 23);
  a.insert(a.end(), wide.begin(), wide.end());
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 0.625f, -0.625f, 0.62499997f, 0.62500006f, 9.f, -9.f,
                  20.f, -20.f, 88.7f, 88.72f, 88.7229f, 89.f, -87.3f, -100.f, -103.9f, -104.f, -104.1f, -200.f, inf,
                  -inf})
    a.push_back(v);
  const int64_t n = int64_t(a.size());
  auto ref = [](UnaryOp op, double x) {
    auto sig = [](double u) { return 1 / (1 + std::exp(-u)); };
    switch (op) {
      case UnaryOp::exp: return std::exp(x);
      case UnaryOp::tanh: return std::tanh(x);
      case UnaryOp::sigmoid: return sig(x);
      case UnaryOp::gelu: return x * sig(1.5957691216057308 * x * (1 + 0.044715 * x * x));
      default: return x * sig(x);  // swish
    }
  };
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    for (UnaryOp op : {UnaryOp::exp, UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::gelu, UnaryOp::swish}) {
      std::vector<float> out(a.size());
      cpu_backend::unary(op, DType::f32, a.data(), out.data(), n, 0);
      for (int64_t i = 0; i < n; ++i) {
        const double want = ref(op, a[i]);
        if (std::isinf(float(want)) || std::isinf(a[i])) {
          if (std::isnan(want)) continue;  // gelu/swish at -inf: -inf * 0 in the formula
          ASSERT_EQ(double(out[i]), double(float(want))) << cpu_backend::isa_name(level) << " op " << int(op) << " x " << a[i];
          continue;
        }
        if (double(float(want)) == 0) {
          ASSERT_LE(std::abs(out[i] - want), 1e-37) << cpu_backend::isa_name(level) << " op " << int(op) << " x " << a[i];
          continue;
        }
        // float's rounding of the argument of exp inside (gelu: u2 = c2 x (1 + k x^2), a few roundings)
        // moves the result by that much, relatively
        const double x = a[i], arg = op == UnaryOp::gelu ? 1.5957691216057308 * x * (1 + 0.044715 * x * x) : x;
        const double tol = 4.8e-7 + (op == UnaryOp::gelu ? 2.4e-7 : 6e-8) * std::abs(arg);
        ASSERT_LE(std::abs(out[i] - want), tol * std::abs(want) + 1e-37)
            << cpu_backend::isa_name(level) << " op " << int(op) << " x " << a[i] << " got " << out[i] << " want " << want;
      }
      float nan = std::numeric_limits<float>::quiet_NaN(), got = 0;
      cpu_backend::unary(op, DType::f32, &nan, &got, 1, 0);
      EXPECT_TRUE(std::isnan(got)) << cpu_backend::isa_name(level) << " op " << int(op);
    }
    // Sign and exact saturation: tanh is odd and reaches ±1 exactly, sigmoid reaches 1 exactly.
    std::vector<float> x = {0.3f, -0.3f, 2.5f, -2.5f, 50.f, -50.f}, y(x.size());
    cpu_backend::unary(UnaryOp::tanh, DType::f32, x.data(), y.data(), int64_t(x.size()), 0);
    EXPECT_EQ(y[0], -y[1]);
    EXPECT_EQ(y[2], -y[3]);
    EXPECT_EQ(y[4], 1.f);
    EXPECT_EQ(y[5], -1.f);
    cpu_backend::unary(UnaryOp::sigmoid, DType::f32, x.data(), y.data(), int64_t(x.size()), 0);
    EXPECT_EQ(y[4], 1.f);
    EXPECT_GT(y[5], 0.f);
  }
}

// The fused gelu and swish backward (Backend::unary_backward) against their float64 derivatives.
TEST(CpuIsa, ActivationBackwardVariantsMatchFloat64) {
  IsaGuard guard;
  using backend::UnaryOp;
  const int64_t n = 30011;
  std::vector<float> x = random_floats(size_t(n), -9, 9, 24), g = random_floats(size_t(n), -2, 2, 25);
  auto sig = [](double u) { return 1 / (1 + std::exp(-u)); };
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    for (UnaryOp op : {UnaryOp::gelu, UnaryOp::swish}) {
      std::vector<float> dx(x.size());
      ASSERT_TRUE(cpu_backend::unary_backward(op, DType::f32, x.data(), g.data(), dx.data(), n));
      // Relative to the size of the two terms of f' (they cancel where f' crosses 0, in float as in float64).
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        double first, second, arg;
        if (op == UnaryOp::gelu) {
          const double c2 = 1.5957691216057308, k = 0.044715, u = c2 * v * (1 + k * v * v);
          first = sig(u), second = v * sig(u) * sig(-u) * c2 * (1 + 3 * k * v * v), arg = u;
        } else {
          first = sig(v), second = v * sig(v) * sig(-v), arg = v;
        }
        const double want = g[i] * (first + second);
        // as above, float's rounding of exp's argument counts (relative 2.4e-7 |arg|)
        const double scale = std::abs(g[i]) * (first + std::abs(second)) * (1 + 0.1 * std::abs(arg)) + 1e-30;
        worst = std::max(worst, std::abs(dx[i] - want) / scale);
      }
      EXPECT_LT(worst, 3e-6) << cpu_backend::isa_name(level) << " op " << int(op);
    }
  }
  std::vector<float> dx(4);
  EXPECT_FALSE(cpu_backend::unary_backward(UnaryOp::tanh, DType::f32, x.data(), g.data(), dx.data(), 4));  // not fused
}

// The fused relu backward is bitwise the composition g * step(x) it replaces (NaN x, ±0, ±Inf g
// included), at every ISA level, Float32 and Float64.
TEST(CpuIsa, ReluBackwardIsBitwiseGTimesStep) {
  IsaGuard guard;
  using backend::UnaryOp;
  const int64_t n = 20011;
  std::vector<float> x = random_floats(size_t(n), -3, 3, 26), g = random_floats(size_t(n), -2, 2, 27);
  const float specials[] = {NAN, 0.f, -0.f, INFINITY, -INFINITY, 1e-40f, -1e-40f};
  for (size_t i = 0; i < std::size(specials); ++i)
    for (size_t j = 0; j < std::size(specials); ++j) x[i * 7 + j] = specials[i], g[i * 7 + j] = specials[j];
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    std::vector<float> dx(x.size()), step(x.size()), want(x.size());
    ASSERT_TRUE(cpu_backend::unary_backward(UnaryOp::relu, DType::f32, x.data(), g.data(), dx.data(), n));
    cpu_backend::unary(UnaryOp::step, DType::f32, x.data(), step.data(), n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      want[size_t(i)] = g[size_t(i)] * step[size_t(i)];
      uint32_t a, b;
      std::memcpy(&a, &dx[size_t(i)], 4), std::memcpy(&b, &want[size_t(i)], 4);
      if (!(std::isnan(dx[size_t(i)]) && std::isnan(want[size_t(i)]))) {
        ASSERT_EQ(a, b) << cpu_backend::isa_name(level) << " x " << x[size_t(i)] << " g " << g[size_t(i)];
      }
    }
    EXPECT_TRUE(std::isnan(dx[0])) << "x NaN";
    std::vector<double> xd(x.begin(), x.end()), gd(g.begin(), g.end()), dxd(x.size());
    ASSERT_TRUE(cpu_backend::unary_backward(UnaryOp::relu, DType::f64, xd.data(), gd.data(), dxd.data(), n));
    for (int64_t i = 100; i < n; ++i) ASSERT_EQ(dxd[size_t(i)], xd[size_t(i)] > 0 ? gd[size_t(i)] : 0.0 * gd[size_t(i)]);
  }
}

// Softmax and logsoftmax over contiguous rows, forward and the fused backward, in every ISA variant
// against float64; rows of lengths around the 16-lane blocks, with masked (-inf) entries.
TEST(CpuIsa, SoftmaxVariantsMatchFloat64) {
  IsaGuard guard;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t len : {int64_t(1), int64_t(7), int64_t(16), int64_t(33), int64_t(64), int64_t(1000)}) {
    const int64_t rows = 37;
    std::vector<float> x = random_floats(size_t(rows * len), -30, 30, 26), g = random_floats(size_t(rows * len), -1, 1, 27);
    for (int64_t r = 1; r < rows; r += 3)  // a causal-mask pattern: the tail of every third row masked
      for (int64_t j = r % len + 1; j < len; ++j) x[size_t(r * len + j)] = -inf;
    for (Isa level : usable_isas()) {
      cpu_backend::force_isa(level);
      for (bool log : {false, true}) {
        std::vector<float> y(x.size()), dx(x.size());
        cpu_backend::softmax(DType::f32, x.data(), y.data(), rows, len, 1, log);
        ASSERT_TRUE(cpu_backend::softmax_backward(DType::f32, y.data(), g.data(), dx.data(), rows, len, 1, log));
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x.data() + r * len;
          double m = -INFINITY, total = 0, gp = 0, gs = 0;
          for (int64_t j = 0; j < len; ++j) m = std::max(m, double(xr[j]));
          for (int64_t j = 0; j < len; ++j) total += std::exp(double(xr[j]) - m);
          std::vector<double> p(static_cast<size_t>(len));
          for (int64_t j = 0; j < len; ++j) {
            p[size_t(j)] = std::exp(double(xr[j]) - m) / total;
            gp += double(g[size_t(r * len + j)]) * p[size_t(j)];
            gs += g[size_t(r * len + j)];
          }
          for (int64_t j = 0; j < len; ++j) {
            const size_t k = size_t(r * len + j);
            if (log) {
              if (std::isinf(xr[j])) {
                ASSERT_EQ(y[k], -inf);
              } else {
                ASSERT_LE(std::abs(y[k] - (double(xr[j]) - m - std::log(total))), 2e-6 * (1 + std::abs(double(y[k]))))
                    << cpu_backend::isa_name(level) << " len " << len;
              }
              ASSERT_LE(std::abs(dx[k] - (g[k] - p[size_t(j)] * gs)), 1e-5 * (1 + std::abs(gs))) << cpu_backend::isa_name(level);
            } else {
              // float's x - max rounds by up to 2^-24 |x - max|: exp then moves by that much, relatively
              if (std::isinf(xr[j])) {
                ASSERT_EQ(y[k], 0.f);
                ASSERT_EQ(dx[k], 0.f);
                continue;
              }
              const double tol = 5e-7 + 6e-8 * std::abs(double(xr[j]) - m);
              ASSERT_LE(std::abs(y[k] - p[size_t(j)]), tol * p[size_t(j)] + 1e-37) << cpu_backend::isa_name(level) << " len " << len;
              ASSERT_LE(std::abs(dx[k] - p[size_t(j)] * (g[k] - gp)), 2 * tol * p[size_t(j)] * (std::abs(g[k]) + std::abs(gp)) + 1e-37)
                  << cpu_backend::isa_name(level) << " len " << len;
            }
          }
        }
      }
    }
  }
  std::vector<float> y(8), g(8), dx(8);
  EXPECT_FALSE(cpu_backend::softmax_backward(DType::f32, y.data(), g.data(), dx.data(), 2, 2, 2, false));  // inner > 1: not fused
}

// One fused LSTM and GRU step (forward and backward, recurrent.cpp) in every ISA variant against the
// formulas of backend.hpp in float64; H = 37 leaves vector tails; with and without bias.
TEST(CpuIsa, RecurrentStepVariantsMatchFloat64) {
  IsaGuard guard;
  using backend::RecurrentCell;
  const int64_t n = 5, H = 37;
  auto sig = [](double u) { return 1 / (1 + std::exp(-u)); };
  for (RecurrentCell cell : {RecurrentCell::lstm, RecurrentCell::gru, RecurrentCell::rnn_tanh}) {
    const int64_t G = cell == RecurrentCell::lstm ? 4 * H : cell == RecurrentCell::gru ? 3 * H : H;
    std::vector<float> xg = random_floats(size_t(n * G), -4, 4, 28), hg = random_floats(size_t(n * G), -4, 4, 29),
                       bias = random_floats(size_t(G), -1, 1, 30), hp = random_floats(size_t(n * H), -1, 1, 31),
                       cp = random_floats(size_t(n * H), -2, 2, 32), dy = random_floats(size_t(n * H), -1, 1, 33),
                       dh0 = random_floats(size_t(n * H), -1, 1, 34), dc0 = random_floats(size_t(n * H), -1, 1, 35);
    for (bool with_bias : {true, false}) {
      // float64 reference of the forward (h, c, saved) and the backward (dxg, dhg, dh_next, dc)
      std::vector<double> h(size_t(n * H)), c(size_t(n * H)), dxg(size_t(n * G)), dhg(size_t(n * G)),
          dhn(size_t(n * H)), dcn(size_t(n * H));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < H; ++j) {
          auto pre = [&](int64_t gate) {
            const int64_t k = r * G + gate * H + j;
            return double(xg[size_t(k)]) + hg[size_t(k)] + (with_bias ? bias[size_t(gate * H + j)] : 0.f);
          };
          const size_t k = size_t(r * H + j);
          const double dh = double(dy[k]) + dh0[k];
          auto dx = [&](int64_t gate) -> double& { return dxg[size_t(r * G + gate * H + j)]; };
          if (cell == RecurrentCell::lstm) {
            const double i = sig(pre(0)), f = sig(pre(1)), g = std::tanh(pre(2)), o = sig(pre(3));
            c[k] = f * cp[k] + i * g;
            h[k] = o * std::tanh(c[k]);
            const double tc = std::tanh(c[k]), d_c = dc0[k] + dh * o * (1 - tc * tc);
            dx(0) = d_c * g * i * (1 - i), dx(1) = d_c * cp[k] * f * (1 - f), dx(2) = d_c * i * (1 - g * g);
            dx(3) = dh * tc * o * (1 - o);
            dcn[k] = d_c * f, dhn[k] = 0;
          } else if (cell == RecurrentCell::gru) {
            const double rg = sig(pre(0)), z = sig(pre(1));
            const double hn = double(hg[size_t(r * G + 2 * H + j)]) + (with_bias ? bias[size_t(2 * H + j)] : 0.f);
            const double nn = std::tanh(double(xg[size_t(r * G + 2 * H + j)]) + rg * hn);
            h[k] = (1 - z) * nn + z * hp[k];
            const double dn = dh * (1 - z) * (1 - nn * nn), dz = dh * (hp[k] - nn) * z * (1 - z),
                         dr = dn * hn * rg * (1 - rg);
            dx(0) = dr, dx(1) = dz, dx(2) = dn;
            dhg[size_t(r * G + j)] = dr, dhg[size_t(r * G + H + j)] = dz, dhg[size_t(r * G + 2 * H + j)] = dn * rg;
            dhn[k] = dh * z;
          } else {
            h[k] = std::tanh(pre(0));
            dx(0) = dh * (1 - h[k] * h[k]);
            dhn[k] = 0;
          }
        }
      for (Isa level : usable_isas()) {
        cpu_backend::force_isa(level);
        std::vector<float> hf(size_t(n * H)), cf(size_t(n * H)), saved(size_t(n * 4 * H)), dxf(size_t(n * G)),
            dhf(size_t(n * G)), dh_next = dh0, dc = dc0;
        const bool lstm = cell == RecurrentCell::lstm, gru = cell == RecurrentCell::gru;
        ASSERT_TRUE(cpu_backend::recurrent_forward(cell, DType::f32, xg.data(), hg.data(), with_bias ? bias.data() : nullptr,
                                           hp.data(), lstm ? cp.data() : nullptr, hf.data(), lstm ? cf.data() : nullptr,
                                           lstm || gru ? saved.data() : nullptr, n, H));
        ASSERT_TRUE(cpu_backend::recurrent_backward(cell, DType::f32, dy.data(), dh_next.data(), lstm ? dc.data() : nullptr,
                                            saved.data(), lstm ? cp.data() : nullptr, lstm ? cf.data() : nullptr,
                                            hp.data(), hf.data(), dxf.data(), gru ? dhf.data() : nullptr, n, H));
        const char* name = cpu_backend::isa_name(level);
        for (size_t k = 0; k < h.size(); ++k) {
          ASSERT_LE(std::abs(hf[k] - h[k]), 1e-6) << name << " cell " << int(cell) << " h at " << k;
          ASSERT_LE(std::abs(dh_next[k] - dhn[k]), 1e-6) << name << " cell " << int(cell) << " dh_next at " << k;
          if (lstm) {
            ASSERT_LE(std::abs(cf[k] - c[k]), 2e-6) << name << " c at " << k;
            ASSERT_LE(std::abs(dc[k] - dcn[k]), 4e-6) << name << " dc at " << k;
          }
        }
        for (size_t k = 0; k < dxg.size(); ++k) {
          ASSERT_LE(std::abs(dxf[k] - dxg[k]), 4e-6) << name << " cell " << int(cell) << " dxg at " << k;
          if (gru) {
            ASSERT_LE(std::abs(dhf[k] - dhg[k]), 4e-6) << name << " dhg at " << k;
          }
        }
      }
    }
  }
}

TEST(CpuIsa, SumOverRowsVariantsMatchFloat64) {
  IsaGuard guard;
  const int64_t len = 129, inner = 515;  // (len, inner) summed over len: the bias gradient's shape
  std::vector<float> a = random_floats(size_t(len * inner), -1, 1, 31);
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    std::vector<float> out(inner);
    cpu_backend::reduce(backend::ReduceOp::sum, DType::f32, a.data(), out.data(), 1, len, inner);
    for (int64_t i = 0; i < inner; ++i) {
      double want = 0;
      for (int64_t j = 0; j < len; ++j) want += a[size_t(j * inner + i)];
      ASSERT_LT(rel(out[i], want), 1e-6) << cpu_backend::isa_name(level) << " at " << i;
    }
  }
}

TEST(CpuPool, EveryIndexRunsExactlyOnce) {
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(3), int64_t(17), int64_t(100000)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    cpu_backend::parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(CpuPool, ManySmallRegionsInARow) {
  // Back-to-back regions, as the ops of a training step: the workers' hand-off must lose none.
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 20000; ++r)
    cpu_backend::parallel_for(4, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 80000);
}

TEST(CpuPool, ErrorInAPieceReachesTheCaller) {
  for (int rep = 0; rep < 50; ++rep)
    EXPECT_THROW(cpu_backend::parallel_for(1000, 1,
                                   [&](int64_t, int64_t e) {  // the last piece, whichever thread has it
                                     if (e == 1000) throw std::runtime_error("piece failed");
                                   }),
                 std::runtime_error);
  std::atomic<int64_t> total{0};  // the pool still works afterwards
  cpu_backend::parallel_for(1000, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 1000);
}

TEST(CpuPool, ConcurrentAndNestedCallers) {
  // Two user threads at once (one region at a time holds the pool; the other runs its loop inline),
  // each region nesting another (run inline on the thread that reaches it).
  auto job = [](int64_t* out) {
    std::atomic<int64_t> total{0};
    for (int r = 0; r < 2000; ++r)
      cpu_backend::parallel_for(8, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          cpu_backend::parallel_for(3, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
      });
    *out = total.load();
  };
  int64_t r1 = 0, r2 = 0;
  std::thread t1(job, &r1), t2(job, &r2);
  t1.join();
  t2.join();
  EXPECT_EQ(r1, 2000 * 8 * 3);
  EXPECT_EQ(r2, 2000 * 8 * 3);
}

// C = alpha op(A) op(B) + beta C against a float64 loop, for shapes that stay whole, split along
// n, split along m, and batched; every transpose pair; f32 and f64.
template <class T>
void check_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, double alpha = 1.5, double beta = 0.5) {
  std::mt19937 gen(unsigned(m * 131 + n * 7 + k + ta * 2 + tb));
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<T> a(size_t(batch * m * k)), b(size_t(batch * k * n)), c(size_t(batch * m * n));
  for (T& x : a) x = T(d(gen));
  for (T& x : b) x = T(d(gen));
  for (T& x : c) x = T(d(gen));
  std::vector<T> c0 = c;
  backend::Gemm g;
  g.batch = batch, g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  g.alpha = alpha, g.beta = beta;
  cpu_backend::matmul(std::is_same_v<T, float> ? DType::f32 : DType::f64, a.data(), b.data(), c.data(), g);
  double worst = 0;
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l) {
          double x = ta ? a[size_t(p * m * k + l * m + i)] : a[size_t(p * m * k + i * k + l)];
          double y = tb ? b[size_t(p * k * n + j * k + l)] : b[size_t(p * k * n + l * n + j)];
          acc += x * y;
        }
        double want = alpha * acc + (beta != 0 ? beta * double(c0[size_t(p * m * n + i * n + j)]) : 0.0);
        worst = std::max(worst, std::abs(double(c[size_t(p * m * n + i * n + j)]) - want) / std::sqrt(double(k)));
      }
  EXPECT_LT(worst, (std::is_same_v<T, float> ? 1e-5 : 1e-13))
      << "alpha " << alpha << " beta " << beta << " batch " << batch << " m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb;
}

TEST(CpuGemm, SplitOverThePoolMatchesFloat64) {
  struct Case {
    int64_t batch, m, n, k;
  };
  // whole (small), split along n (n >= m), split along m with a ragged tail, batched.
  for (Case s : {Case{1, 5, 7, 3}, Case{1, 64, 203, 150}, Case{1, 517, 96, 70}, Case{6, 33, 40, 300}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm<float>(s.batch, s.m, s.n, s.k, ta, tb);
        check_gemm<double>(s.batch, s.m, s.n, s.k, ta, tb);
      }
}

// One row or one column of C runs as GEMV (matmul_blas.cpp's gemv_split): a batch-1 Dense forward
// (1, n) = (1, k) W^T, its transposes, a column (m, 1), a 1x1 dot; whole and cut over the pool
// (600 x 500 elements), batched; alpha/beta as Dense (1, 1), a fresh product (1, 0) and general.
TEST(CpuGemm, VectorProductsMatchFloat64) {
  struct Case {
    int64_t batch, m, n, k;
  };
  for (Case s : {Case{1, 1, 10, 512}, Case{1, 1, 600, 500}, Case{1, 37, 1, 64}, Case{1, 600, 1, 500},
                 Case{1, 1, 1, 300}, Case{5, 1, 70, 33}, Case{4, 90, 1, 20}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0, 1.0}, std::pair{1.0, 0.0}, std::pair{1.5, 0.5}}) {
          check_gemm<float>(s.batch, s.m, s.n, s.k, ta, tb, alpha, beta);
          check_gemm<double>(s.batch, s.m, s.n, s.k, ta, tb, alpha, beta);
        }
}

// Every float32 engine the seam can pick, forced in turn, then the seam's own choice; alpha/beta as
// Dense's forward (1, 1: C holds the bias), a weight gradient (1, 0) and general.
struct ForceGuard {
  ~ForceGuard() {
    for (int s = 0; s < cpu_backend::kSites; ++s) cpu_backend::force_kernel(cpu_backend::Site(s), std::nullopt);
  }
};

TEST(CpuGemm, EveryEngineMatchesFloat64) {
  struct Case {
    int64_t m, n, k;
  };
  ForceGuard guard;
  for (std::optional<cpu_backend::Kernel> e :
       {std::optional(cpu_backend::Kernel::openblas), std::optional(cpu_backend::Kernel::onednn),
        std::optional<cpu_backend::Kernel>()}) {
    cpu_backend::force_kernel(cpu_backend::Site::gemm, e);
    for (Case s : {Case{128, 10, 512}, Case{128, 203, 150}, Case{300, 96, 70}, Case{64, 64, 10}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto [alpha, beta] : {std::pair{1.0, 1.0}, std::pair{1.0, 0.0}, std::pair{1.5, 0.5}})
            check_gemm<float>(1, s.m, s.n, s.k, ta, tb, alpha, beta);
  }
}

// The seam decides by rules (no tuned table in the tests' environment): the same query, the same
// answer, equal to rule(); the same product twice is bitwise the same, thin shapes included.
TEST(CpuGemm, ChoiceIsTheRuleAndEveryCallGivesTheSameBits) {
  using cpu_backend::Kernel;
  const cpu_backend::Candidates both = cpu_backend::bit(Kernel::openblas) | cpu_backend::bit(Kernel::onednn);
  cpu_backend::Query q;
  q.site = cpu_backend::Site::gemm;
  q.threads = 1;
  for (auto [m, n, k] : {std::tuple{128, 10, 512}, std::tuple{96, 160, 200}, std::tuple{512, 512, 128}}) {
    q.dims = {m, n, k, 0, 1, k, k, n, 0};
    EXPECT_EQ(cpu_backend::choose(q, both), cpu_backend::rule(q, both));
    EXPECT_EQ(cpu_backend::choose(q, both), cpu_backend::choose(q, both));
  }
  q.dims = {128, 10, 512, 0, 1, 512, 512, 10, 0};
  if (FLUX_TEST_HAVE_ONEDNN) {
    EXPECT_EQ(cpu_backend::rule(q, both), Kernel::onednn) << "a thin product: oneDNN";
  }
  q.dims = {512, 512, 512, 0, 1, 512, 512, 512, 0};
  // OpenBLAS, unless it runs kernels below this CPU (dependency_check.hpp; tests/blas_below_cpu.cmake).
  EXPECT_EQ(cpu_backend::rule(q, both), cpu_backend::blas_below_cpu() ? Kernel::onednn : Kernel::openblas);
  // A Dense layer's batch of 128 against its 784 x 512 weights: oneDNN with AVX-512 (brgemm), else
  // OpenBLAS; a small product of that kind stays on OpenBLAS.
  if (FLUX_TEST_HAVE_ONEDNN && !cpu_backend::blas_below_cpu() && !cpu_backend::onednn_below_cpu()) {
    q.dims = {128, 512, 784, 0, 1, 784, 784, 512, 0};
    EXPECT_EQ(cpu_backend::rule(q, both), cpu_backend::active_isa() == Isa::avx512 ? Kernel::onednn : Kernel::openblas);
    q.dims = {64, 64, 64, 0, 1, 64, 64, 64, 0};
    EXPECT_EQ(cpu_backend::rule(q, both), Kernel::openblas);
  }
  EXPECT_EQ(cpu_backend::rule(q, cpu_backend::bit(Kernel::onednn)), Kernel::onednn) << "only candidates are chosen";
  const int64_t m = 96, n = 160, k = 200;
  std::vector<float> a = random_floats(size_t(m * k), -1, 1, 41), b = random_floats(size_t(k * n), -1, 1, 42);
  backend::Gemm g;
  g.m = m, g.n = n, g.k = k, g.trans_b = true;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  for (int rep = 0; rep < 20; ++rep) {
    g.k = k - rep, g.n = rep % 2 ? n : 10;
    std::vector<float> c1(size_t(m * n)), c2(size_t(m * n));
    cpu_backend::matmul(DType::f32, a.data(), b.data(), c1.data(), g);
    cpu_backend::matmul(DType::f32, a.data(), b.data(), c2.data(), g);
    ASSERT_EQ(c1, c2) << "k = " << g.k;
  }
}

// The forced choice wins over the rules only where it is a candidate; kernel names round-trip.
TEST(CpuKernelChoice, ForcedNamedAndRecorded) {
  using cpu_backend::Kernel;
  ForceGuard guard;
  cpu_backend::Query q;
  q.site = cpu_backend::Site::linear;
  q.dims = {32, 784, 512, 1, 1};
  const cpu_backend::Candidates panels_only = cpu_backend::bit(Kernel::panels);
  cpu_backend::force_kernel(cpu_backend::Site::linear, Kernel::onednn);
  EXPECT_EQ(cpu_backend::choose(q, panels_only | cpu_backend::bit(Kernel::onednn)), Kernel::onednn);
  EXPECT_EQ(cpu_backend::choose(q, panels_only), Kernel::panels);
  EXPECT_EQ(cpu_backend::force_kernel(cpu_backend::Site::linear, std::nullopt), Kernel::onednn);
  for (int k = 0; k < cpu_backend::kKernels; ++k)
    EXPECT_EQ(cpu_backend::kernel_from_name(cpu_backend::kernel_name(Kernel(k))), Kernel(k));
  EXPECT_FALSE(cpu_backend::kernel_from_name("fastest").has_value());
  // Every site registered its tuner's timer (static initialisers in other files run in any order).
  for (cpu_backend::Site s : {cpu_backend::Site::gemm, cpu_backend::Site::linear, cpu_backend::Site::conv_forward})
    EXPECT_TRUE(cpu_backend::timer_of(s) != nullptr) << cpu_backend::site_name(s);
  for (cpu_backend::Site s : {cpu_backend::Site::linear_weights, cpu_backend::Site::bf16_transposed_a}) {
    EXPECT_EQ(cpu_backend::timer_of(s) != nullptr, bool(FLUX_TEST_HAVE_ONEDNN)) << cpu_backend::site_name(s);
  }
  for (int s = 0; s < cpu_backend::kSites; ++s)
    EXPECT_EQ(cpu_backend::site_from_name(cpu_backend::site_name(cpu_backend::Site(s))), cpu_backend::Site(s));
  // A timer answers +infinity for a kernel that cannot run the query (Winograd on a 1x1 conv).
  cpu_backend::Query conv1x1;
  conv1x1.site = cpu_backend::Site::conv_forward;
  conv1x1.dims = {2, 1, 16, 16, 1, 8, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  EXPECT_GT(cpu_backend::timer_of(cpu_backend::Site::conv_forward)(conv1x1, Kernel::winograd, 1), 1e300);
  cpu_backend::record_queries(true);
  cpu_backend::choose(q, panels_only);
  cpu_backend::choose(q, panels_only);
  cpu_backend::record_queries(false);
  cpu_backend::choose(q, panels_only);  // not recorded
  const auto recorded = cpu_backend::recorded_queries();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].first, q);
  EXPECT_EQ(recorded[0].second, panels_only);
}

}  // namespace

namespace {

std::vector<double> linear_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b,
                               int64_t n, int64_t in, int64_t out, bool relu) {
  std::vector<double> y(size_t(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b ? double((*b)[size_t(o)]) : 0.0;
      for (int64_t l = 0; l < in; ++l) acc += double(x[size_t(i * in + l)]) * double(w[size_t(o * in + l)]);
      y[size_t(i * out + o)] = relu ? std::max(acc, 0.0) : acc;
    }
  return y;
}

double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = got.size() == want.size() ? 0.0 : 1e300;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  return worst;
}

/// A weight tensor's prepared-data cache as the core keeps one (src/storage_cache.cpp), counting inserts.
struct TestCache final : backend::PreparedCache {
  std::vector<std::pair<backend::PreparedKey, std::shared_ptr<const backend::Prepared>>> kept;
  int inserts = 0;
  std::shared_ptr<const backend::Prepared> find(const backend::PreparedKey& k) override {
    for (auto& [key, p] : kept)
      if (key == k) return p;
    return nullptr;
  }
  void insert(const backend::PreparedKey& k, std::shared_ptr<const backend::Prepared> p) override {
    ++inserts;
    for (auto& [key, old] : kept)
      if (key == k) {
        old = std::move(p);
        return;
      }
    kept.emplace_back(k, std::move(p));
  }
};

// Each kernel linear_forward can run, forced in turn (flux's panels at every ISA level, oneDNN), then
// the seam's choice, against a float64 loop. With a cache: the prepared weights are read (so a change
// made behind the cache's back does not show: that is what proves they are kept); a fresh (emptied)
// cache: prepared again from the new weights. Shapes: MNIST's, rows not a multiple of any register
// block (13, 127), outputs not a multiple of the 16-wide panel (1, 10, 33, 47, 70), pieces over the
// pool (128 x 784 x 512 at 2+ threads).
TEST(CpuLinear, PreparedWeightsMatchReferenceAndFollowTheCache) {
  struct Case {
    int64_t n, in, out;
  };
  IsaGuard isa_guard;
  ForceGuard force_guard;
  struct Run {
    std::optional<cpu_backend::Kernel> kernel;
    Isa isa;
  };
  std::vector<Run> runs;
  for (Isa level : usable_isas()) runs.push_back({cpu_backend::Kernel::panels, level});
  runs.push_back({cpu_backend::Kernel::onednn, cpu_backend::detected_isa()});
  runs.push_back({std::nullopt, cpu_backend::detected_isa()});
  for (const Run& run : runs)
    for (Case s : {Case{128, 784, 512}, Case{13, 50, 33}, Case{127, 64, 10}, Case{8, 20, 1}, Case{40, 300, 47},
                   Case{9, 16, 70}, Case{2, 50, 33}, Case{3, 64, 10}, Case{4, 128, 70}, Case{7, 20, 1}})
      for (bool bias : {false, true})
        for (bool relu : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "kernel " << (run.kernel ? cpu_backend::kernel_name(*run.kernel) : "seam")
                                            << " isa " << cpu_backend::isa_name(run.isa) << " n " << s.n << " in "
                                            << s.in << " out " << s.out << " bias " << bias << " relu " << relu);
          cpu_backend::force_isa(run.isa);
          cpu_backend::force_kernel(cpu_backend::Site::linear, run.kernel);
          std::vector<float> x = random_floats(size_t(s.n * s.in), -1, 1, 11);
          std::vector<float> w = random_floats(size_t(s.out * s.in), -1, 1, 12);
          std::vector<float> b = random_floats(size_t(s.out), -1, 1, 13);
          std::vector<float> y(size_t(s.n * s.out), -7.f);
          TestCache cache;
          ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, bias ? b.data() : nullptr,
                                                  y.data(), s.n, s.in, s.out, relu));
          const std::vector<double> want = linear_ref(x, w, bias ? &b : nullptr, s.n, s.in, s.out, relu);
          EXPECT_LT(max_abs_diff(y, want), 1e-4);
          const std::vector<float> first = y;
          // Without a cache: prepared for the call only, the same bits.
          std::vector<float> uncached(y.size());
          ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), nullptr, bias ? b.data() : nullptr,
                                                  uncached.data(), s.n, s.in, s.out, relu));
          EXPECT_EQ(uncached, first);
          // Behind the cache's back: a kernel that prepared its weights still answers with the old ones.
          const bool prepared = !cache.kept.empty();
          for (float& v : w) v = -v;
          ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, bias ? b.data() : nullptr,
                                                  y.data(), s.n, s.in, s.out, relu));
          if (prepared) {
            EXPECT_EQ(y, first) << "the prepared weights are read";
          }
          if (run.kernel == cpu_backend::Kernel::panels) {
            EXPECT_TRUE(prepared) << "the panels are always prepared";
          }
          EXPECT_EQ(cache.inserts, prepared ? 1 : 0) << "prepared once";
          // An emptied cache (what the core does on a write): the new weights.
          TestCache fresh;
          ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &fresh, bias ? b.data() : nullptr,
                                                  y.data(), s.n, s.in, s.out, relu));
          EXPECT_LT(max_abs_diff(y, linear_ref(x, w, bias ? &b : nullptr, s.n, s.in, s.out, relu)), 1e-4);
        }
}

// The seam's choice is the rule; the panels at every ISA level agree with each other to float
// rounding and are deterministic (the same bits twice, whatever the pieces).
TEST(CpuLinear, ChoiceIsTheRuleAndEveryCallGivesTheSameBits) {
  IsaGuard isa_guard;
  ForceGuard force_guard;
  const int64_t n = 64, in = 200, out = 96;
  const cpu_backend::Kernel chosen = cpu_backend::linear_kernel(n, in, out, true, true);
  if (!FLUX_TEST_HAVE_ONEDNN) {
    EXPECT_EQ(chosen, cpu_backend::Kernel::panels);
  }
  std::vector<float> x = random_floats(size_t(n * in), -1, 1, 21), w = random_floats(size_t(out * in), -1, 1, 22);
  std::vector<float> b = random_floats(size_t(out), -1, 1, 23), y1(size_t(n * out)), y2(size_t(n * out));
  TestCache cache;
  ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, b.data(), y1.data(), n, in, out, true));
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, b.data(), y2.data(), n, in, out, true));
    ASSERT_EQ(y1, y2);
    EXPECT_EQ(cpu_backend::linear_kernel(n, in, out, true, true), chosen);
  }
  cpu_backend::force_kernel(cpu_backend::Site::linear, cpu_backend::Kernel::panels);
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    TestCache c1, c2;
    ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &c1, b.data(), y1.data(), n, in, out, true));
    ASSERT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &c2, b.data(), y2.data(), n, in, out, true));
    EXPECT_EQ(y1, y2) << cpu_backend::isa_name(level);
  }
}

TEST(CpuLinear, DeclinesWhatItCannotRun) {
  const int64_t in = 30, out = 20;
  std::vector<float> x(size_t(8 * in), 1.f), w(size_t(out * in), 1.f), y(size_t(8 * out));
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), yd(y.size());
  TestCache cache;
  // Not for it: float64, one row (a GEMV streams w once; unless OpenBLAS runs below the CPU, where one row
  // runs on kept weights too: BlasFallbackEnv); nothing prepared for them. 2+ rows run.
  EXPECT_FALSE(cpu_backend::linear_forward(DType::f64, xd.data(), wd.data(), &cache, nullptr, yd.data(), 8, in, out, false));
  if (!cpu_backend::blas_below_cpu()) {
    EXPECT_FALSE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, nullptr, y.data(), 1, in, out, false));
  }
  EXPECT_TRUE(cache.kept.empty());
  EXPECT_TRUE(cpu_backend::linear_forward(DType::f32, x.data(), w.data(), &cache, nullptr, y.data(), 2, in, out, false));
  EXPECT_FALSE(cache.kept.empty());
  for (size_t i = 0; i < size_t(2 * out); ++i) ASSERT_EQ(y[i], float(in));
}

// A Dense of one row streams w once: it is cut over the pool by w's elements, as a GEMV, where many
// rows are cut by multiply-adds (the MNIST MLP's 784 x 512 layer at one row: 0.8 M multiply-adds, under
// the GEMM threshold, 401 k elements, over the GEMV one).
TEST(CpuLinear, OneRowIsCutAsAGemv) {
  const int64_t threads = cpu_backend::num_threads();
  EXPECT_EQ(cpu_backend::dense_pieces(1, 784, 512).parts, std::min<int64_t>(threads, 3));
  EXPECT_EQ(cpu_backend::dense_pieces(1, 512, 10).parts, 1) << "a small one stays whole";
  EXPECT_EQ(cpu_backend::dense_pieces(2, 784, 512).parts, 1) << "two rows: 1.6 M multiply-adds, whole";
  EXPECT_EQ(cpu_backend::dense_pieces(128, 784, 512).parts, std::min<int64_t>(threads, 32));
}

// The rule for a Dense inference with AVX-512 and oneDNN: flux's panels at 4-7 rows, oneDNN's kept
// weights at 2-3 and 8+ rows (kernel_choice.cpp's measurements); the panels below AVX-512.
TEST(CpuLinear, RowCountPicksTheKernel) {
  if (!FLUX_TEST_HAVE_ONEDNN) GTEST_SKIP() << "built without oneDNN";
  IsaGuard isa_guard;
  ForceGuard force_guard;
  using cpu_backend::Kernel;
  if (cpu_backend::active_isa() == Isa::avx512 && !cpu_backend::blas_below_cpu()) {
    for (int64_t n : {2, 3, 8, 64}) EXPECT_EQ(cpu_backend::linear_kernel(n, 128, 512, false, false), Kernel::onednn) << n;
    for (int64_t n : {4, 5, 7}) EXPECT_EQ(cpu_backend::linear_kernel(n, 128, 512, false, false), Kernel::panels) << n;
  }
  cpu_backend::force_isa(Isa::avx2);
  if (cpu_backend::active_isa() == Isa::avx2) {
    for (int64_t n : {2, 5, 64}) EXPECT_EQ(cpu_backend::linear_kernel(n, 128, 512, false, false), Kernel::panels) << n;
  }
}

}  // namespace

namespace {

// Forward convs through oneDNN keep their weights reordered into its blocked layout in the weight
// tensor's cache: the same cache reads the prepared copy (a change behind its back does not show),
// an emptied one reorders anew; results equal the uncached call's bit for bit. Batch 1 splits output
// channels over the pool (one prepared set per chunk), batch 3 the samples.
TEST(CpuConv, ForwardKeepsPreparedWeightsInTheCache) {
  if (!FLUX_TEST_HAVE_ONEDNN) GTEST_SKIP() << "built without oneDNN";
  ForceGuard force_guard;
  cpu_backend::force_kernel(cpu_backend::Site::conv_forward, cpu_backend::Kernel::onednn);
  for (int64_t batch : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    backend::ConvGeometry g;
    g.batch = batch, g.in_channels = 32, g.out_channels = 64;
    g.in[0] = g.in[1] = 9, g.kernel[0] = g.kernel[1] = 3, g.pad_lo[0] = g.pad_lo[1] = g.pad_hi[0] = g.pad_hi[1] = 1;
    g.out[0] = g.out[1] = 9;
    std::vector<float> x = random_floats(size_t(batch * 32 * 81), -1, 1, 61);
    std::vector<float> w1 = random_floats(size_t(64 * 32 * 9), -1, 1, 62), w2 = random_floats(w1.size(), -1, 1, 63);
    std::vector<float> b = random_floats(64, -1, 1, 64);
    auto run = [&](std::vector<float>& w, backend::PreparedCache* cache) {
      backend::ConvGeometry gs = g;
      gs.weight_cache = cache, gs.inference = cache != nullptr;
      std::vector<float> y(size_t(batch * 64 * 81), -7.f);
      EXPECT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), y.data(), gs));
      return y;
    };
    const std::vector<float> y1 = run(w1, nullptr), y2 = run(w2, nullptr);
    TestCache cache;
    EXPECT_EQ(run(w1, &cache), y1);
    EXPECT_EQ(cache.inserts, 1);
    w1 = w2;  // behind the cache's back (the same buffer): the prepared copy of the old w1 still answers
    EXPECT_EQ(run(w1, &cache), y1);
    TestCache fresh;
    EXPECT_EQ(run(w1, &fresh), y2) << "an emptied cache: reordered from what the buffer holds now";
  }
}

struct WinogradCase {
  int64_t n, c, o, h, w, pad_lo_h, pad_hi_h, pad_lo_w, pad_hi_w;
};

backend::ConvGeometry winograd_geometry(const WinogradCase& s) {
  backend::ConvGeometry g;
  g.batch = s.n, g.in_channels = s.c, g.out_channels = s.o;
  g.in[0] = s.h, g.in[1] = s.w, g.kernel[0] = g.kernel[1] = 3;
  g.pad_lo[0] = s.pad_lo_h, g.pad_hi[0] = s.pad_hi_h, g.pad_lo[1] = s.pad_lo_w, g.pad_hi[1] = s.pad_hi_w;
  g.out[0] = s.h + s.pad_lo_h + s.pad_hi_h - 2, g.out[1] = s.w + s.pad_lo_w + s.pad_hi_w - 2;
  return g;
}

/// relu_after?(relu?(conv(x, w) * scale + shift) + residual), float64; null scale 1, null shift 0.
std::vector<double> conv3x3_ref(const backend::ConvGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                                const float* scale, const float* shift, bool relu, const float* residual,
                                bool relu_after) {
  const int64_t OH = g.out[0], OW = g.out[1], H = g.in[0], W = g.in[1];
  std::vector<double> y(size_t(g.batch * g.out_channels * OH * OW));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < g.in_channels; ++c)
            for (int64_t ki = 0; ki < 3; ++ki)
              for (int64_t kj = 0; kj < 3; ++kj) {
                const int64_t r = i + ki - g.pad_lo[0], q = j + kj - g.pad_lo[1];
                if (r < 0 || r >= H || q < 0 || q >= W) continue;
                acc += double(x[size_t(((n * g.in_channels + c) * H + r) * W + q)]) *
                       double(w[size_t(((o * g.in_channels + c) * 3 + ki) * 3 + kj)]);
              }
          const size_t at = size_t(((n * g.out_channels + o) * OH + i) * OW + j);
          double v = acc * (scale ? scale[o] : 1.0) + (shift ? shift[o] : 0.0);
          if (relu) v = std::max(v, 0.0);
          if (residual) v += residual[at];
          if (relu_after) v = std::max(v, 0.0);
          y[at] = v;
        }
  return y;
}

// Winograd (forced where it fits; inference only: it needs the weight cache) against float64. Its
// work split depends on the batch and the pool: whole images per thread, rows of tiles per thread
// (a batch of 1 on 2 threads; rows of two images in one piece on the pool of 4 that
// cpu.winograd_pool_of_4 runs), or each step split (one row of tiles: the 1x1 output).
TEST(CpuConv, WinogradMatchesFloat64ForEveryEpilogue) {
  IsaGuard isa_guard;
  ForceGuard force_guard;
  cpu_backend::force_kernel(cpu_backend::Site::conv_forward, cpu_backend::Kernel::winograd);
  for (WinogradCase s : {WinogradCase{2, 16, 24, 7, 7, 1, 1, 1, 1}, WinogradCase{3, 8 * 2, 16, 5, 6, 0, 0, 0, 0},
                         WinogradCase{1, 32, 16, 4, 4, 1, 1, 1, 1}, WinogradCase{5, 16, 32, 9, 4, 2, 0, 1, 2},
                         WinogradCase{40, 16, 16, 3, 3, 1, 1, 1, 1}, WinogradCase{2, 16, 16, 14, 17, 1, 1, 1, 1},
                         WinogradCase{1, 24, 16, 10, 12, 0, 0, 1, 1}, WinogradCase{1, 16, 16, 3, 3, 0, 0, 0, 0},
                         WinogradCase{2, 16, 16, 10, 10, 1, 1, 1, 1}})
    for (Isa level : usable_isas()) {
      cpu_backend::force_isa(level);
      backend::ConvGeometry g0 = winograd_geometry(s);
      ASSERT_TRUE(cpu_backend::winograd_fits(g0));
      const size_t ny = size_t(s.n * s.o * g0.out[0] * g0.out[1]);
      std::vector<float> x = random_floats(size_t(s.n * s.c * s.h * s.w), -1, 1, 81);
      std::vector<float> w = random_floats(size_t(s.o * s.c * 9), -1, 1, 82);
      std::vector<float> b = random_floats(size_t(s.o), -1, 1, 83), scale = random_floats(size_t(s.o), 0.5, 1.5, 84);
      std::vector<float> residual = random_floats(ny, -1, 1, 85);
      for (int variant = 0; variant < 5; ++variant) {
        SCOPED_TRACE(::testing::Message() << "n " << s.n << " c " << s.c << " o " << s.o << " " << s.h << "x" << s.w
                                          << " pads " << s.pad_lo_h << s.pad_hi_h << s.pad_lo_w << s.pad_hi_w
                                          << " isa " << cpu_backend::isa_name(level) << " variant " << variant);
        backend::ConvGeometry g = g0;
        TestCache cache;
        g.weight_cache = &cache, g.inference = true;
        std::vector<float> y(ny, -7.f);
        std::vector<double> want;
        switch (variant) {
          case 0:  // no bias
            ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), nullptr, y.data(), g, false));
            want = conv3x3_ref(g, x, w, nullptr, nullptr, false, nullptr, false);
            break;
          case 1:  // bias
            ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), y.data(), g, false));
            want = conv3x3_ref(g, x, w, nullptr, b.data(), false, nullptr, false);
            break;
          case 2:  // bias, relu
            ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), y.data(), g, true));
            want = conv3x3_ref(g, x, w, nullptr, b.data(), true, nullptr, false);
            break;
          case 3:  // folded BatchNorm, relu
            ASSERT_TRUE(cpu_backend::conv_forward_affine(DType::f32, x.data(), w.data(), scale.data(), b.data(), nullptr,
                                                         y.data(), g, true, false));
            want = conv3x3_ref(g, x, w, scale.data(), b.data(), true, nullptr, false);
            break;
          default:  // folded BatchNorm, residual, relu after (a ResNet block's second conv)
            ASSERT_TRUE(cpu_backend::conv_forward_affine(DType::f32, x.data(), w.data(), scale.data(), b.data(),
                                                         residual.data(), y.data(), g, false, true));
            want = conv3x3_ref(g, x, w, scale.data(), b.data(), false, residual.data(), true);
            break;
        }
        EXPECT_EQ(cache.inserts, 1) << "the transformed weights are kept";
        EXPECT_LT(max_abs_diff(y, want), 2e-5);
      }
    }
}

// A 3x3 stride-1 conv's data gradient is a forward of dy with the flipped kernel: it runs on Winograd
// where the seam takes Winograd for that forward (forced here), else on oneDNN; both against float64,
// for paddings 0-2 a side (the data gradient's own padding is 2 minus each).
TEST(CpuConv, DataGradientOnWinogradMatchesFloat64) {
  ForceGuard force_guard;
  for (WinogradCase s : {WinogradCase{2, 16, 24, 7, 7, 1, 1, 1, 1}, WinogradCase{1, 24, 16, 9, 6, 0, 0, 0, 0},
                         WinogradCase{3, 16, 16, 5, 8, 2, 0, 1, 2}, WinogradCase{1, 32, 16, 4, 4, 1, 1, 1, 1}})
    for (cpu_backend::Kernel k : {cpu_backend::Kernel::winograd, cpu_backend::Kernel::onednn}) {
      if (k == cpu_backend::Kernel::onednn && !FLUX_TEST_HAVE_ONEDNN) continue;
      cpu_backend::force_kernel(cpu_backend::Site::conv_forward, k);
      const backend::ConvGeometry g = winograd_geometry(s);
      SCOPED_TRACE(::testing::Message() << "n " << s.n << " c " << s.c << " o " << s.o << " " << s.h << "x" << s.w
                                        << " pads " << s.pad_lo_h << s.pad_hi_h << s.pad_lo_w << s.pad_hi_w << " kernel "
                                        << cpu_backend::kernel_name(k));
      const int64_t oh = g.out[0], ow = g.out[1];
      std::vector<float> dy = random_floats(size_t(s.n * s.o * oh * ow), -1, 1, 86);
      std::vector<float> w = random_floats(size_t(s.o * s.c * 9), -1, 1, 87);
      std::vector<float> dx(size_t(s.n * s.c * s.h * s.w), -7.f);
      ASSERT_TRUE(cpu_backend::conv_backward_data(DType::f32, dy.data(), w.data(), dx.data(), g));
      std::vector<double> want(dx.size(), 0.0);
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t o = 0; o < s.o; ++o)
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t i = 0; i < oh; ++i)
              for (int64_t j = 0; j < ow; ++j)
                for (int64_t a = 0; a < 3; ++a)
                  for (int64_t b = 0; b < 3; ++b) {
                    const int64_t r = i + a - s.pad_lo_h, q = j + b - s.pad_lo_w;  // y[i][j] read x[r][q]
                    if (r < 0 || r >= s.h || q < 0 || q >= s.w) continue;
                    want[size_t(((n * s.c + c) * s.h + r) * s.w + q)] +=
                        double(w[size_t((o * s.c + c) * 9 + a * 3 + b)]) * dy[size_t(((n * s.o + o) * oh + i) * ow + j)];
                  }
      EXPECT_LT(max_abs_diff(dx, want), 2e-5);
    }
}

// The seam's choice for a conv forward is the rule, made without timing anything: every call gives
// the same bits; Winograd from 48 output pixels over the batch (128 with AVX-512), in training only
// with small transformed weights; the few-pixel kernel where it fits.
TEST(CpuConv, ForwardChoiceIsTheRuleAndKeepsItsBits) {
  const WinogradCase s{4, 32, 32, 14, 14, 1, 1, 1, 1};
  backend::ConvGeometry g = winograd_geometry(s);
  const size_t ny = size_t(s.n * s.o * g.out[0] * g.out[1]);
  std::vector<float> x = random_floats(size_t(s.n * s.c * s.h * s.w), -1, 1, 91);
  std::vector<float> w = random_floats(size_t(s.o * s.c * 9), -1, 1, 92), b = random_floats(size_t(s.o), -1, 1, 93);
  const std::vector<double> want = conv3x3_ref(g, x, w, nullptr, b.data(), true, nullptr, false);
  TestCache cache;
  backend::ConvGeometry inference = g;
  inference.weight_cache = &cache, inference.inference = true;
  const cpu_backend::Kernel chosen = cpu_backend::conv_forward_kernel(inference, false);
  if (!FLUX_TEST_HAVE_ONEDNN) {
    EXPECT_EQ(chosen, cpu_backend::Kernel::winograd) << "the only candidate";
  }
  {
    // At every ISA level: 4 x 14 x 14 output pixels take Winograd; ResNet-18's 7x7 stage at batch 1
    // (49 pixels, 256 channels) takes it below AVX-512 only, where oneDNN's direct kernel is weaker.
    IsaGuard isa_guard;
    backend::ConvGeometry seven = winograd_geometry(WinogradCase{1, 256, 256, 7, 7, 1, 1, 1, 1});
    seven.weight_cache = &cache, seven.inference = true;
    for (Isa level : usable_isas()) {
      cpu_backend::force_isa(level);
      SCOPED_TRACE(cpu_backend::isa_name(level));
      EXPECT_EQ(cpu_backend::conv_forward_kernel(inference, false), cpu_backend::Kernel::winograd);
      const cpu_backend::Kernel at_seven = cpu_backend::conv_forward_kernel(seven, false);
      if (level != Isa::avx512 || !FLUX_TEST_HAVE_ONEDNN) {
        EXPECT_EQ(at_seven, cpu_backend::Kernel::winograd);
      } else {
        EXPECT_EQ(at_seven, cpu_backend::Kernel::onednn);
      }
    }
  }
  {
    // Training (no weight cache: the transformed weights are made for the call): Winograd only where
    // they are small (16 C O floats, at most 1 MiB): here 64 KiB; 256 -> 256 channels take 4 MiB.
    EXPECT_EQ(cpu_backend::conv_forward_kernel(g, false), cpu_backend::Kernel::winograd) << "training, small weights";
    std::vector<float> trained(ny, -7.f);
    ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), trained.data(), g, true));
    EXPECT_LT(max_abs_diff(trained, want), 2e-5);
    backend::ConvGeometry wide = winograd_geometry(WinogradCase{4, 256, 256, 14, 14, 1, 1, 1, 1});
    backend::ConvGeometry wide_inference = wide;
    wide_inference.weight_cache = &cache, wide_inference.inference = true;
    EXPECT_EQ(cpu_backend::conv_forward_kernel(wide_inference, false), cpu_backend::Kernel::winograd);
    if (FLUX_TEST_HAVE_ONEDNN) {
      EXPECT_NE(cpu_backend::conv_forward_kernel(wide, false), cpu_backend::Kernel::winograd) << "training, 4 MiB";
    }
  }
  std::vector<float> first(ny, -7.f);
  ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), first.data(), inference, true));
  EXPECT_LT(max_abs_diff(first, want), 2e-5);
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> y(ny, -7.f);
    ASSERT_TRUE(cpu_backend::conv_forward(DType::f32, x.data(), w.data(), b.data(), y.data(), inference, true));
    EXPECT_EQ(y, first) << "later calls run the same kernel";
  }
  // ResNet-18's last stage at batch 1: 512 -> 512 on 4x4, 16 output pixels.
  backend::ConvGeometry last;
  last.batch = 1, last.in_channels = last.out_channels = 512;
  last.in[0] = last.in[1] = last.out[0] = last.out[1] = 4, last.kernel[0] = last.kernel[1] = 3;
  last.pad_lo[0] = last.pad_lo[1] = last.pad_hi[0] = last.pad_hi[1] = 1;
  EXPECT_EQ(cpu_backend::conv_forward_kernel(last, false), cpu_backend::Kernel::few_pixel);
}

}  // namespace

namespace {

// A relu that ends a oneDNN kernel runs after it (relu_rows; onednn_relu.hpp says why): NaN kept,
// ±0 -> +0, ±Inf, subnormals, at every ISA level, rows `ld` apart with the gaps untouched.
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// The same value, or both NaN (a kernel may quiet a NaN's payload).
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b); }

// The backend's float mode (flushing subnormals, as its kernels run by default) for a scope, or nothing.
struct FlushScope {
  std::optional<cpu_backend::FloatModeScope> mode;
  explicit FlushScope(bool flush) {
    if (flush) mode.emplace(DType::f32);
  }
};

TEST(CpuReluAfterKernel, RowsMatchTheScalarReluBitwiseAtEveryIsa) {
  IsaGuard guard;
  const float specials[] = {NAN, -NAN, 0.f, -0.f, INFINITY, -INFINITY, 1e-40f, -1e-40f, 1.f, -1.f,
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::denorm_min()};
  std::vector<float> f32 = random_floats(4000, -2, 2, 71);
  for (size_t i = 0; i < std::size(specials); ++i) f32[i * 37] = specials[i];
  std::vector<uint16_t> bf16(65536);  // every bf16 pattern
  for (uint32_t i = 0; i < 65536; ++i) bf16[i] = uint16_t(i);
  for (Isa level : usable_isas()) {
    cpu_backend::force_isa(level);
    SCOPED_TRACE(cpu_backend::isa_name(level));
    for (int64_t cols : {int64_t(1), int64_t(31), int64_t(100)}) {  // rows 40 apart: the gaps stay as they are
      const int64_t ld = 40, rows = int64_t(f32.size()) / ld;
      std::vector<float> y = f32;
      cpu_backend::relu_rows(DType::f32, y.data(), rows, cols > ld ? ld : cols, ld);
      for (size_t i = 0; i < y.size(); ++i) {
        const bool inside = int64_t(i) % ld < std::min(cols, ld);
        const float want = inside ? (f32[i] <= 0.f ? 0.f : f32[i]) : f32[i];
        ASSERT_TRUE(same_value(y[i], want)) << "f32 " << f32[i] << " at " << i << " cols " << cols;
        if (inside && !std::isnan(f32[i]) && f32[i] <= 0.f) {
          ASSERT_EQ(float_bits(y[i]), 0u) << "+0, not -0";
        }
      }
    }
    // bf16 on the bits: every pattern, also under denormals-are-zero (the backend's flushing mode),
    // where the comparison sees a positive subnormal as 0.
    for (bool flush : {false, true}) {
      const FlushScope scope(flush);
      std::vector<uint16_t> h = bf16;
      cpu_backend::relu_rows(DType::bf16, h.data(), 256, 250, 256);
      for (uint32_t i = 0; i < 65536; ++i) {
        volatile float x = bits_float(i << 16);  // compared in the scope's mode
        const uint16_t want = i % 256 >= 250 ? uint16_t(i) : (x <= 0.f ? uint16_t(0) : uint16_t(i));
        ASSERT_EQ(h[i], want) << "bf16 pattern " << i << (flush ? " flushing" : "");
      }
    }
  }
  try {
    cpu_backend::relu_rows(DType::f64, f32.data(), 1, 1, 1);
    ADD_FAILURE() << "Float64 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[relu_rows] takes Float32 or BFloat16; got Float64"), std::string::npos) << e.what();
  }
}

// Dense and conv with a fused relu on oneDNN's kernels give relu of the same kernel's output, value
// for value (NaN stays NaN): Float32 and, where the CPU runs them, bf16; the inputs carry NaN, ±Inf,
// ±0 and subnormals at pixels that the identity weights pass through unchanged.
TEST(CpuReluAfterKernel, FusedReluIsReluOfTheKernelOutput) {
  ForceGuard force_guard;
  const float specials[] = {NAN, -INFINITY, INFINITY, -0.f, 0.f, 1e-40f, -1e-40f, -3.f, 2.5f};
  auto relu_of = [](std::vector<float> v) {
    for (float& x : v) x = x <= 0.f ? 0.f : x;
    return v;
  };
  auto check = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    int nans = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(same_value(got[i], want[i])) << what << " at " << i << ": " << got[i] << " against " << want[i];
      nans += std::isnan(got[i]);
    }
    EXPECT_GT(nans, 0) << what << ": the NaN inputs reach the output";
  };
  const bool bf16 = cpu_backend::bf16_kernels_enabled();
  for (DType t : {DType::f32, DType::bf16}) {
    if (t == DType::bf16 && !bf16) continue;
    SCOPED_TRACE(dtype_name(t));
    const size_t es = t == DType::f32 ? 4 : 2;
    auto store = [&](const std::vector<float>& v) {  // v in t's storage (bf16: rounded by the reference cast)
      std::vector<char> out(v.size() * es);
      if (t == DType::f32) std::memcpy(out.data(), v.data(), out.size());
      else cpu_backend::float_to_half_storage_reference(t, v.data(), reinterpret_cast<uint16_t*>(out.data()), int64_t(v.size()));
      return out;
    };
    auto load = [&](const std::vector<char>& s) {
      std::vector<float> v(s.size() / es);
      if (t == DType::f32) std::memcpy(v.data(), s.data(), s.size());
      else cpu_backend::half_storage_to_float_reference(t, reinterpret_cast<const uint16_t*>(s.data()), v.data(), int64_t(v.size()));
      return v;
    };
    // Dense: x (n, 32) with one special per row in column 0, w = identity, oneDNN's kernel forced.
    {
      const int64_t n = 37, k = 32;
      std::vector<float> x = random_floats(size_t(n * k), -1, 1, 72), w(size_t(k * k), 0.f), b = random_floats(size_t(k), -0.5f, 0.5f, 73);
      for (int64_t i = 0; i < k; ++i) w[size_t(i * k + i)] = 1.f;
      for (int64_t r = 0; r < n; ++r) x[size_t(r * k)] = specials[size_t(r) % std::size(specials)];
      std::vector<float> zero_bias(size_t(k), 0.f);
      for (const std::vector<float>* bias : {&zero_bias, &b}) {
        cpu_backend::force_kernel(cpu_backend::Site::linear, cpu_backend::Kernel::onednn);
        std::vector<char> xs = store(x), ws = store(w), bs = store(*bias), y1(size_t(n * k) * es), y0(y1.size());
        TestCache c0, c1;
        ASSERT_TRUE(cpu_backend::linear_forward(t, xs.data(), ws.data(), &c0, bs.data(), y0.data(), n, k, k, false));
        ASSERT_TRUE(cpu_backend::linear_forward(t, xs.data(), ws.data(), &c1, bs.data(), y1.data(), n, k, k, true));
        check(load(y1), relu_of(load(y0)), "Dense");
      }
    }
    // Conv 3x3 (pad 1), weights passing the centre pixel through; specials spread over the image.
    {
      const WinogradCase s{2, 16, 16, 9, 9, 1, 1, 1, 1};
      backend::ConvGeometry g = winograd_geometry(s);
      const size_t nx = size_t(s.n * s.c * s.h * s.w), ny = size_t(s.n * s.o * g.out[0] * g.out[1]);
      std::vector<float> x = random_floats(nx, -1, 1, 74), w(size_t(s.o * s.c * 9), 0.f);
      for (int64_t o = 0; o < s.o; ++o) w[size_t((o * s.c + o) * 9 + 4)] = 1.f;
      for (size_t i = 0; i < nx; i += 23) x[i] = specials[(i / 23) % std::size(specials)];
      std::vector<float> bias = random_floats(size_t(s.o), -0.5f, 0.5f, 75), scale = random_floats(size_t(s.o), 0.5f, 1.5f, 76);
      std::vector<float> residual = random_floats(ny, -1, 1, 77);
      cpu_backend::force_kernel(cpu_backend::Site::conv_forward, cpu_backend::Kernel::onednn);
      std::vector<char> xs = store(x), ws = store(w), bs = store(bias), rs = store(residual);
      for (bool inference : {false, true}) {
        TestCache cache;
        backend::ConvGeometry gi = g;
        if (inference) gi.weight_cache = &cache, gi.inference = true;
        std::vector<char> y0(ny * es), y1(ny * es);
        ASSERT_TRUE(cpu_backend::conv_forward(t, xs.data(), ws.data(), bs.data(), y0.data(), gi, false));
        ASSERT_TRUE(cpu_backend::conv_forward(t, xs.data(), ws.data(), bs.data(), y1.data(), gi, true));
        check(load(y1), relu_of(load(y0)), "Conv(relu)");
      }
      if (t == DType::f32) {  // the fused inference conv + BatchNorm (scale, shift Float32), Float32 only
        TestCache cache;
        backend::ConvGeometry gi = g;
        gi.weight_cache = &cache, gi.inference = true;
        std::vector<float> y0(ny), y1(ny);
        ASSERT_TRUE(cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), nullptr, y0.data(), gi, false, false));
        ASSERT_TRUE(cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), nullptr, y1.data(), gi, true, false));
        check(y1, relu_of(y0), "Conv + BatchNorm(relu)");
        ASSERT_TRUE(cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), residual.data(), y0.data(), gi, false, false));
        ASSERT_TRUE(cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), residual.data(), y1.data(), gi, false, true));
        check(y1, relu_of(y0), "relu(Conv + BatchNorm + residual)");
        // A relu before the residual stays oneDNN's post-op (elu 0 + linear), where oneDNN takes an
        // eltwise before the sum (its AVX-512 kernels here decline, and the core composes the block).
        ASSERT_TRUE(cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), nullptr, y0.data(), gi, true, false));
        if (cpu_backend::conv_forward_affine(t, x.data(), w.data(), scale.data(), bias.data(), residual.data(), y1.data(), gi, true, true)) {
          std::vector<float> want(ny);
          for (size_t i = 0; i < ny; ++i) want[i] = y0[i] + residual[i];
          check(y1, relu_of(want), "relu(relu(Conv + BatchNorm) + residual)");
        }
      }
    }
  }
}

}  // namespace

namespace {

// LayerNorm's Float32 row kernels (normalisation.cpp) at every ISA level against a float64 formula:
// y, dx, dweight, dbias (the levels sum in the same order; FMA contraction differs in the last bits).
TEST(CpuRowNorm, EveryIsaMatchesFloat64) {
  IsaGuard guard;
  for (int64_t d : {int64_t(1), int64_t(7), int64_t(256), int64_t(300)})
    for (bool affine : {false, true}) {
      const int64_t r = 45;
      std::vector<float> x = random_floats(size_t(r * d), -2, 2, 91), dy = random_floats(size_t(r * d), -1, 1, 92);
      std::vector<float> w = random_floats(size_t(d), 0.5f, 1.5f, 93), b = random_floats(size_t(d), -1, 1, 94);
      const float* wp = affine ? w.data() : nullptr;
      const float* bp = affine ? b.data() : nullptr;
      for (Isa level : usable_isas()) {
        cpu_backend::force_isa(level);
        SCOPED_TRACE(::testing::Message() << cpu_backend::isa_name(level) << " d " << d << " affine " << affine);
        const size_t rows = size_t(r), cols = size_t(d);
        std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(cols), db(cols);
        ASSERT_TRUE(cpu_backend::rownorm_forward(DType::f32, x.data(), wp, bp, y.data(), mean.data(), rstd.data(), r, d, 1e-5));
        ASSERT_TRUE(cpu_backend::rownorm_backward(DType::f32, x.data(), dy.data(), wp, mean.data(), rstd.data(), dx.data(),
                                                  affine ? dw.data() : nullptr, affine ? db.data() : nullptr, r, d));
        std::vector<double> want_dw(size_t(d), 0.0), want_db(size_t(d), 0.0);
        for (int64_t i = 0; i < r; ++i) {
          const float* xi = x.data() + i * d;
          double mu = 0, var = 0;
          for (int64_t j = 0; j < d; ++j) mu += xi[j];
          mu /= double(d);
          for (int64_t j = 0; j < d; ++j) var += (xi[j] - mu) * (xi[j] - mu);
          const double s = 1.0 / std::sqrt(var / double(d) + 1e-5);
          double mg = 0, mgx = 0;
          for (int64_t j = 0; j < d; ++j) {
            const double g = double(dy[size_t(i * d + j)]) * (affine ? double(w[size_t(j)]) : 1.0);
            mg += g / double(d), mgx += g * (xi[j] - mu) * s / double(d);
          }
          for (int64_t j = 0; j < d; ++j) {
            const double xh = (xi[j] - mu) * s, g = double(dy[size_t(i * d + j)]) * (affine ? double(w[size_t(j)]) : 1.0);
            const double want_y = affine ? xh * w[size_t(j)] + b[size_t(j)] : xh;
            ASSERT_NEAR(y[size_t(i * d + j)], want_y, 1e-5 * std::max(1.0, std::abs(want_y)));
            const double want_dx = s * (g - mg - xh * mgx);
            ASSERT_NEAR(dx[size_t(i * d + j)], want_dx, 1e-4 * std::max(1.0, std::abs(want_dx)));
            want_dw[size_t(j)] += dy[size_t(i * d + j)] * xh, want_db[size_t(j)] += dy[size_t(i * d + j)];
          }
        }
        for (int64_t j = 0; affine && j < d; ++j) {
          EXPECT_NEAR(dw[size_t(j)], want_dw[size_t(j)], 1e-4 * std::max(1.0, std::abs(want_dw[size_t(j)])));
          EXPECT_NEAR(db[size_t(j)], want_db[size_t(j)], 1e-4 * std::max(1.0, std::abs(want_db[size_t(j)])));
        }
      }
    }
}

}  // namespace
