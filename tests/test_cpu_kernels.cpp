// The CPU backend's fast paths against their references: every ISA variant of the vectorised loops
// (src/backends/cpu/isa.hpp) against the baseline copy and a float64 formula, the thread pool
// (each index exactly once, errors, concurrent and nested callers), and the GEMM split over the pool
// against a float64 loop for every transpose and shape class.
#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

// Not flux/flux.hpp: its flux::cpu (the mover) would hide the backend namespace flux::cpu.
#include "flux/backend.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace {

using namespace flux;
using flux::cpu::Isa;

std::vector<Isa> usable_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (int(i) <= int(cpu::detected_isa())) v.push_back(i);
  return v;
}

// Restores the detected level at the end of a test.
struct IsaGuard {
  Isa old = cpu::active_isa();
  ~IsaGuard() { cpu::force_isa(old); }
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
  EXPECT_NE(std::string(cpu::isa_name(cpu::detected_isa())), "");
  cpu::force_isa(Isa::baseline);
  EXPECT_EQ(cpu::active_isa(), Isa::baseline);
  cpu::force_isa(Isa::avx512);
  EXPECT_EQ(cpu::active_isa(), cpu::detected_isa());  // never above what the CPU has
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
      cpu::force_isa(level);
      std::vector<float> x = x0, m = m0, v = v0;
      cpu::adam_step(DType::f32, x.data(), g.data(), m.data(), v.data(), n, s);
      if (level == Isa::baseline) base_x = x;
      double worst = 0, worst_base = 0;
      for (int64_t i = 0; i < n; ++i) {
        double mi = s.beta1 * m0[i] + (1 - s.beta1) * g[i], vi = s.beta2 * v0[i] + (1 - s.beta2) * double(g[i]) * g[i];
        double xi = x0[i] - s.lr * (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.eps) - s.lr * s.weight_decay * x0[i];
        worst = std::max({worst, rel(x[i], xi), rel(m[i], mi), rel(v[i], vi)});
        worst_base = std::max(worst_base, rel(x[i], base_x[i]));
      }
      EXPECT_LT(worst, 2e-6) << cpu::isa_name(level) << " n=" << n;
      EXPECT_LT(worst_base, 2e-6) << cpu::isa_name(level) << " n=" << n;
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
    cpu::force_isa(level);
    std::vector<double> x = x0, m = m0, v = v0;
    cpu::adam_step(DType::f64, x.data(), g.data(), m.data(), v.data(), n, s);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      double mi = s.beta1 * m0[i] + (1 - s.beta1) * g[i], vi = s.beta2 * v0[i] + (1 - s.beta2) * g[i] * g[i];
      worst = std::max(worst, rel(x[i], x0[i] - s.lr * (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.eps)));
    }
    EXPECT_LT(worst, 1e-14) << cpu::isa_name(level);
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
    cpu::force_isa(level);
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
      auto ref = [&](double x, double y) {
        return op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : x / y;
      };
      // Both dense; then b a single value broadcast (the fast path's scalar form).
      std::vector<float> out(n);
      cpu::binary(op, DType::f32, a.data(), b.data(), out.data(), flat(n));
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, rel(out[i], ref(a[i], b[i])));
      EXPECT_LT(worst, 1e-7) << cpu::isa_name(level) << " op " << int(op);
      backend::Broadcast p = flat(n);
      p.contiguous = false;
      p.stride[1][0] = 0;
      cpu::binary(op, DType::f32, a.data(), b.data(), out.data(), p);
      worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, rel(out[i], ref(a[i], b[0])));
      EXPECT_LT(worst, 1e-7) << cpu::isa_name(level) << " scalar op " << int(op);
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
    cpu::force_isa(level);
    for (UnaryOp op : {UnaryOp::relu, UnaryOp::neg, UnaryOp::square, UnaryOp::step}) {
      std::vector<float> out(n);
      cpu::unary(op, DType::f32, a.data(), out.data(), n, 0);
      for (int64_t i = 0; i < n; ++i) {
        double x = a[i];
        double want = op == UnaryOp::relu ? (x > 0 ? x : 0) : op == UnaryOp::neg ? -x : op == UnaryOp::square ? x * x : (x > 0 ? 1 : 0);
        ASSERT_LT(rel(out[i], want), 1e-7) << cpu::isa_name(level) << " op " << int(op) << " at " << i;
      }
    }
  }
}

TEST(CpuIsa, SumOverRowsVariantsMatchFloat64) {
  IsaGuard guard;
  const int64_t len = 129, inner = 515;  // (len, inner) summed over len: the bias gradient's shape
  std::vector<float> a = random_floats(size_t(len * inner), -1, 1, 31);
  for (Isa level : usable_isas()) {
    cpu::force_isa(level);
    std::vector<float> out(inner);
    cpu::reduce(backend::ReduceOp::sum, DType::f32, a.data(), out.data(), 1, len, inner);
    for (int64_t i = 0; i < inner; ++i) {
      double want = 0;
      for (int64_t j = 0; j < len; ++j) want += a[size_t(j * inner + i)];
      ASSERT_LT(rel(out[i], want), 1e-6) << cpu::isa_name(level) << " at " << i;
    }
  }
}

TEST(CpuPool, EveryIndexRunsExactlyOnce) {
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(3), int64_t(17), int64_t(100000)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    cpu::parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(CpuPool, ManySmallRegionsInARow) {
  // Back-to-back regions, as the ops of a training step: the workers' hand-off must lose none.
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 20000; ++r)
    cpu::parallel_for(4, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 80000);
}

TEST(CpuPool, ErrorInAPieceReachesTheCaller) {
  for (int rep = 0; rep < 50; ++rep)
    EXPECT_THROW(cpu::parallel_for(1000, 1,
                                   [&](int64_t, int64_t e) {  // the last piece, whichever thread has it
                                     if (e == 1000) throw std::runtime_error("piece failed");
                                   }),
                 std::runtime_error);
  std::atomic<int64_t> total{0};  // the pool still works afterwards
  cpu::parallel_for(1000, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 1000);
}

TEST(CpuPool, ConcurrentAndNestedCallers) {
  // Two user threads at once (one region at a time holds the pool; the other runs its loop inline),
  // each region nesting another (run inline on the thread that reaches it).
  auto job = [](int64_t* out) {
    std::atomic<int64_t> total{0};
    for (int r = 0; r < 2000; ++r)
      cpu::parallel_for(8, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          cpu::parallel_for(3, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
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
  cpu::matmul(std::is_same_v<T, float> ? DType::f32 : DType::f64, a.data(), b.data(), c.data(), g);
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

// One row or one column of C runs as GEMV (matmul.cpp's gemv_split): a batch-1 Dense forward
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

// Every float32 engine the run-time choice can pick, forced in turn, then the measured choice;
// alpha/beta as Dense's forward (1, 1: C holds the bias), a weight gradient (1, 0) and general.
TEST(CpuGemm, EveryEngineMatchesFloat64) {
  struct Case {
    int64_t m, n, k;
  };
  struct Restore {
    ~Restore() { cpu::force_gemm_engine(cpu::GemmEngine::automatic); }
  } restore;
  for (cpu::GemmEngine e : {cpu::GemmEngine::openblas, cpu::GemmEngine::onednn, cpu::GemmEngine::automatic}) {
    cpu::force_gemm_engine(e);
    for (Case s : {Case{128, 10, 512}, Case{128, 203, 150}, Case{300, 96, 70}, Case{64, 64, 10}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto [alpha, beta] : {std::pair{1.0, 1.0}, std::pair{1.0, 0.0}, std::pair{1.5, 0.5}})
            check_gemm<float>(1, s.m, s.n, s.k, ta, tb, alpha, beta);
  }
}

TEST(CpuGemm, MeasuredChoiceIsStableWithinAProcess) {
  // Once measured, a shape keeps its engine: the same product twice is bitwise the same.
  const int64_t m = 96, n = 160, k = 200;
  std::vector<float> a = random_floats(size_t(m * k), -1, 1, 41), b = random_floats(size_t(k * n), -1, 1, 42);
  backend::Gemm g;
  g.m = m, g.n = n, g.k = k, g.trans_b = true;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  // At 2+ threads the two pieces have one shape and measure it at the same time, on two threads.
  for (int rep = 0; rep < 20; ++rep) {
    g.k = k - rep;  // a shape not yet measured each time
    std::vector<float> c1(size_t(m * n)), c2(size_t(m * n));
    cpu::matmul(DType::f32, a.data(), b.data(), c1.data(), g);
    cpu::matmul(DType::f32, a.data(), b.data(), c2.data(), g);
    ASSERT_EQ(c1, c2) << "k = " << g.k;
  }
}

}  // namespace
