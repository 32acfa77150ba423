// Subnormal floats in the CPU kernels (flux/denormals.hpp): each kernel family, called through the
// CPU backend as the ops call it, gets subnormal inputs (and moments, and a state), and must give
// zero where flushing is on (denormals-are-zero on its inputs, flush-to-zero on its results) and the
// IEEE value where it is off. Families: optimiser (fused Adam), elementwise, reduction, activations,
// softmax, recurrent cells, GEMM (OpenBLAS), flux's own GEMM panels (linear_forward) and Winograd.
// Also: float64 keeps IEEE subnormals unless asked, the caller's floating-point mode is the same after
// each call, and the pool's threads run a region in the mode of the thread that started it.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

// Not flux/flux.hpp: its flux::cpu (the mover) would hide the backend namespace flux::cpu_backend.
#include "flux/backend.hpp"
#include "flux/denormals.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/float_mode.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/denormals.hpp"

namespace {

using namespace flux;
using backend::Buffer;

constexpr float kSub = 1e-39f;  // a float32 subnormal (FLT_MIN is 1.18e-38)

bool subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }
bool subnormal(double x) { return std::fpclassify(x) == FP_SUBNORMAL; }

template <class T> Buffer buf(std::vector<T>& v) { return Buffer{v.data(), 0}; }
backend::Backend& cpu_be() { return cpu_backend::instance(); }

// Restores the process-wide policy and the kernels' choices at the end of a test.
struct PolicyGuard {
  bool f32 = flushes_denormals(DType::f32), f64 = flushes_denormals(DType::f64);
  cpu_backend::Isa isa = cpu_backend::active_isa();
  ~PolicyGuard() {
    flush_denormals(f32, f64);
    cpu_backend::force_isa(isa);
    cpu_backend::force_kernel(cpu_backend::Site::linear, std::nullopt);
    cpu_backend::force_kernel(cpu_backend::Site::conv_forward, std::nullopt);
  }
};

std::vector<cpu_backend::Isa> usable_isas() {
  std::vector<cpu_backend::Isa> v;
  for (cpu_backend::Isa i : {cpu_backend::Isa::baseline, cpu_backend::Isa::avx2, cpu_backend::Isa::avx512})
    if (int(i) <= int(cpu_backend::detected_isa())) v.push_back(i);
  return v;
}

// Runs `check(flush)` with flushing on (float32) and off, at every ISA level the CPU has.
template <class F> void both_modes(F check) {
  if (!detail::can_flush_denormals()) GTEST_SKIP() << "this CPU has no flush-to-zero mode flux can set";
  PolicyGuard guard;
  for (cpu_backend::Isa level : usable_isas())
    for (bool flush : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (flush ? "flushing" : "IEEE") << ", " << cpu_backend::isa_name(level));
      cpu_backend::force_isa(level);
      ASSERT_TRUE(flush_denormals(flush));
      ASSERT_EQ(flushes_denormals(DType::f32), flush);
      check(flush);
    }
}

backend::Broadcast elementwise(int64_t n) {
  backend::Broadcast p;
  p.ndim = 1;
  p.shape[0] = n;
  p.stride[0][0] = p.stride[1][0] = p.stride[2][0] = 1;
  return p;
}

TEST(Denormals, PolicyDefaultsAndSwitch) {
  PolicyGuard guard;
  if (const char* env = std::getenv("FLUX_FLUSH_DENORMALS"); (!env || !*env) && detail::can_flush_denormals()) {
    EXPECT_TRUE(flushes_denormals(DType::f32)) << "the default: float32 flushes";
    EXPECT_FALSE(flushes_denormals(DType::f64)) << "the default: float64 keeps IEEE subnormals";
  }
  if (detail::can_flush_denormals()) {
    EXPECT_TRUE(flush_denormals(true));
    EXPECT_TRUE(flushes_denormals(DType::f32));
    EXPECT_TRUE(flushes_denormals(DType::f16));
    EXPECT_TRUE(flushes_denormals(DType::bf16));
    EXPECT_FALSE(flushes_denormals(DType::f64)) << "float64 keeps IEEE subnormals unless asked";
    EXPECT_TRUE(flush_denormals(true, true));
    EXPECT_TRUE(flushes_denormals(DType::f64));
  } else {
    EXPECT_FALSE(flush_denormals(true));
    EXPECT_FALSE(flushes_denormals(DType::f32));
  }
  EXPECT_FALSE(flushes_denormals(DType::i32));
  EXPECT_FALSE(flushes_denormals(DType::i64));
  EXPECT_TRUE(flush_denormals(false));
  EXPECT_FALSE(flushes_denormals(DType::f32));
  EXPECT_FALSE(flushes_denormals(DType::f64));
}

// Fused Adam (optimiser.cpp) with a subnormal gradient and subnormal moments, as a converged run has
// them, and a subnormal x: flushed, the moments and x become exactly 0; IEEE, m = b1 m + (1 - b1) g and
// v stay subnormal and x moves by lr m / (sqrt(v) + eps), to about -3.7e-34. n: one piece on the
// caller, and a size the pool splits.
TEST(Denormals, AdamMomentsFlushToZero) {
  both_modes([](bool flush) {
    for (int64_t n : {int64_t(37), int64_t(1) << 17}) {
      std::vector<float> x(size_t(n), kSub), g(size_t(n), kSub), m(size_t(n), 4 * kSub), v(size_t(n), 2 * kSub);
      const backend::AdamStep s{1e-3, 0.9, 0.999, 1e-8, 0.0, 1 - std::pow(0.9, 900), 1 - std::pow(0.999, 900)};
      cpu_be().adam_step(0, DType::f32, buf(x), buf(g), buf(m), buf(v), n, s);
      const float m_ieee = 0.9f * (4 * kSub) + 0.1f * kSub;
      for (int64_t i = 0; i < n; i += 997) {
        if (flush) {
          ASSERT_EQ(m[size_t(i)], 0.f) << i;
          ASSERT_EQ(v[size_t(i)], 0.f) << i;
          ASSERT_EQ(x[size_t(i)], 0.f) << i;
        } else {
          ASSERT_TRUE(subnormal(m[size_t(i)])) << i;
          ASSERT_NEAR(m[size_t(i)], m_ieee, 2e-45) << i;
          ASSERT_TRUE(subnormal(v[size_t(i)])) << i;
          ASSERT_LT(x[size_t(i)], -1e-34f) << i;
        }
      }
    }
  });
}

// Elementwise (binary.cpp): subnormal inputs (DAZ) and a subnormal product of normal inputs (FTZ).
TEST(Denormals, ElementwiseFlushesInputsAndResults) {
  both_modes([](bool flush) {
    for (int64_t n : {int64_t(5), int64_t(1) << 20}) {
      std::vector<float> a(size_t(n), kSub), b(size_t(n), kSub), out(size_t(n), -1.f);
      cpu_be().binary(0, backend::BinaryOp::add, DType::f32, buf(a), buf(b), buf(out), elementwise(n));
      for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(out[size_t(i)], flush ? 0.f : 2 * kSub) << i;
      std::fill(a.begin(), a.end(), 1e-20f);
      std::fill(b.begin(), b.end(), 1e-20f);
      cpu_be().binary(0, backend::BinaryOp::mul, DType::f32, buf(a), buf(b), buf(out), elementwise(n));
      const float product = 1e-20f * 1e-20f;  // this thread keeps IEEE: the subnormal 1e-40
      ASSERT_TRUE(subnormal(product));
      for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(out[size_t(i)], flush ? 0.f : product) << i;
    }
  });
}

// Reduction (reduce.cpp): 1000 subnormals sum to a normal 1e-36 in IEEE arithmetic, to 0 when each
// input reads as zero.
TEST(Denormals, ReductionReadsSubnormalsAsZero) {
  both_modes([](bool flush) {
    std::vector<float> x(1000, kSub), sum(1, -1.f);
    cpu_be().reduce(0, backend::ReduceOp::sum, DType::f32, buf(x), buf(sum), 1, 1000, 1);
    if (flush) {
      EXPECT_EQ(sum[0], 0.f);
    } else {
      EXPECT_NEAR(sum[0], 1000 * double(kSub), 1e-3 * 1000 * double(kSub));
    }
  });
}

// Activations (unary.cpp, vector_math.hpp): tanh(subnormal) = subnormal, sigmoid(-100) = 3.7e-44,
// exp(-100) likewise; softmax (softmax.cpp) of [0, -100] has a subnormal second entry.
TEST(Denormals, ActivationsAndSoftmaxFlushSubnormalResults) {
  both_modes([](bool flush) {
    std::vector<float> x(40, kSub), y(40, -1.f);
    cpu_be().unary(0, backend::UnaryOp::tanh, DType::f32, buf(x), buf(y), 40, 0.0);
    for (float v : y) ASSERT_EQ(v, flush ? 0.f : kSub);
    std::fill(x.begin(), x.end(), -100.f);
    for (backend::UnaryOp op : {backend::UnaryOp::sigmoid, backend::UnaryOp::exp}) {
      cpu_be().unary(0, op, DType::f32, buf(x), buf(y), 40, 0.0);
      for (float v : y) {
        if (flush) {
          ASSERT_EQ(v, 0.f);
        } else {
          ASSERT_NEAR(v, std::exp(-100.0), 3e-45);  // 2 subnormal steps (1.4e-45)
        }
      }
    }
    std::vector<float> logits{0.f, -100.f, 0.f, -100.f}, p(4, -1.f);
    cpu_be().softmax(0, DType::f32, buf(logits), buf(p), 2, 2, 1, false);
    EXPECT_FLOAT_EQ(p[0], 1.f);
    if (flush) {
      EXPECT_EQ(p[1], 0.f);
    } else {
      EXPECT_NEAR(p[1], std::exp(-100.0), 3e-45);
    }
  });
}

// Recurrent cells (recurrent.cpp). LSTM with zero pre-activations: every gate 1/2, g = 0, so
// c = c_prev / 2 and h = tanh(c) / 2 stay subnormal in IEEE arithmetic. RNN (tanh): h = tanh(xg).
TEST(Denormals, RecurrentCellsFlushTheirState) {
  both_modes([](bool flush) {
    const int64_t n = 3, H = 5;
    std::vector<float> xg(size_t(n * 4 * H), 0.f), hg(size_t(n * 4 * H), 0.f), h_prev(size_t(n * H), 0.f),
        c_prev(size_t(n * H), 4 * kSub), h(size_t(n * H), -1.f), c(size_t(n * H), -1.f), saved(size_t(n * 4 * H));
    ASSERT_TRUE(cpu_be().recurrent_forward(0, backend::RecurrentCell::lstm, DType::f32, buf(xg), buf(hg), Buffer{},
                                           buf(h_prev), buf(c_prev), buf(h), buf(c), buf(saved), n, H));
    for (size_t i = 0; i < c.size(); ++i) {
      if (flush) {
        ASSERT_EQ(c[i], 0.f);
        ASSERT_EQ(h[i], 0.f);
      } else {
        ASSERT_EQ(c[i], 2 * kSub);
        ASSERT_TRUE(subnormal(h[i]));
        ASSERT_NEAR(h[i], kSub, 2e-45);
      }
    }
    std::vector<float> rnn_xg(size_t(n * H), kSub), rnn_hg(size_t(n * H), 0.f), rnn_h(size_t(n * H), -1.f);
    ASSERT_TRUE(cpu_be().recurrent_forward(0, backend::RecurrentCell::rnn_tanh, DType::f32, buf(rnn_xg), buf(rnn_hg),
                                           Buffer{}, buf(h_prev), Buffer{}, buf(rnn_h), Buffer{}, Buffer{}, n, H));
    for (float v : rnn_h) ASSERT_EQ(v, flush ? 0.f : kSub);
  });
}

// GEMM (matmul.cpp: OpenBLAS or oneDNN) and flux's own panels (linear_forward, forced): x (n, in)
// subnormal times w = 1: each output is in * x, a normal number for in = 64 in IEEE arithmetic.
TEST(Denormals, GemmAndPanelsReadSubnormalsAsZero) {
  both_modes([](bool flush) {
    const int64_t n = 16, in = 64, out = 24;
    std::vector<float> x(size_t(n * in), kSub), w(size_t(out * in), 1.f), y(size_t(n * out), -1.f);
    const float want = float(in * double(kSub));
    backend::Gemm g;
    g.m = n, g.n = out, g.k = in, g.trans_b = true;
    cpu_be().matmul(0, DType::f32, buf(x), buf(w), buf(y), g);
    for (float v : y) {
      if (flush) {
        ASSERT_EQ(v, 0.f);
      } else {
        ASSERT_NEAR(v, want, 1e-4 * want);
      }
    }
    cpu_backend::force_kernel(cpu_backend::Site::linear, cpu_backend::Kernel::panels);
    std::fill(y.begin(), y.end(), -1.f);
    ASSERT_TRUE(cpu_be().linear_forward(0, DType::f32, buf(x), buf(w), nullptr, Buffer{}, buf(y), n, in, out, false));
    for (float v : y) {
      if (flush) {
        ASSERT_EQ(v, 0.f);
      } else {
        ASSERT_NEAR(v, want, 1e-4 * want);
      }
    }
  });
}

// Winograd F(2x2, 3x3) (winograd.cpp, forced): x subnormal, w = 1; an interior output sums 9 C
// inputs, a normal number in IEEE arithmetic, 0 when inputs read as zero.
TEST(Denormals, WinogradReadsSubnormalsAsZero) {
  both_modes([](bool flush) {
    backend::ConvGeometry g;
    g.batch = 1, g.in_channels = 16, g.out_channels = 16;
    g.in[0] = g.in[1] = 6, g.kernel[0] = g.kernel[1] = 3, g.out[0] = g.out[1] = 4;
    ASSERT_TRUE(cpu_backend::winograd_fits(g));
    cpu_backend::force_kernel(cpu_backend::Site::conv_forward, cpu_backend::Kernel::winograd);
    std::vector<float> x(16 * 36, kSub), w(16 * 16 * 9, 1.f), y(16 * 16, -1.f);
    // Winograd runs at inference (here with a weight cache that keeps nothing).
    struct NoCache final : backend::PreparedCache {
      std::shared_ptr<const backend::Prepared> find(const backend::PreparedKey&) override { return nullptr; }
      void insert(const backend::PreparedKey&, std::shared_ptr<const backend::Prepared>) override {}
    } cache;
    g.weight_cache = &cache, g.inference = true;
    ASSERT_TRUE(cpu_be().conv_forward(0, DType::f32, buf(x), buf(w), Buffer{}, buf(y), g));
    const double want = 9 * 16 * double(kSub);
    for (float v : y) {
      if (flush) {
        ASSERT_EQ(v, 0.f);
      } else {
        ASSERT_NEAR(v, want, 1e-3 * want);
      }
    }
  });
}

// float64 keeps IEEE subnormals by default, even with float32 flushing, and flushes when asked.
TEST(Denormals, Float64KeepsSubnormalsUnlessAsked) {
  if (!detail::can_flush_denormals()) GTEST_SKIP() << "this CPU has no flush-to-zero mode flux can set";
  PolicyGuard guard;
  const double tiny = 1e-310;  // a float64 subnormal
  for (bool f64 : {false, true}) {
    ASSERT_TRUE(flush_denormals(true, f64));
    std::vector<double> a(1000, tiny), b(1000, 0.5), out(1000, -1.0), sum(1, -1.0);
    cpu_be().binary(0, backend::BinaryOp::mul, DType::f64, buf(a), buf(b), buf(out), elementwise(1000));
    cpu_be().reduce(0, backend::ReduceOp::sum, DType::f64, buf(a), buf(sum), 1, 1000, 1);
    for (double v : out) ASSERT_EQ(v, f64 ? 0.0 : tiny * 0.5);
    if (f64) {
      EXPECT_EQ(sum[0], 0.0);
    } else {
      EXPECT_NEAR(sum[0], 1000 * tiny, 1e-6 * 1000 * tiny);
    }
    ASSERT_TRUE(subnormal(tiny * 0.5)) << "this thread's own arithmetic is IEEE after the calls";
  }
}

// The caller's mode is the same after a kernel, flushing or not; a caller that flushes itself keeps
// flushing (also through a float64 kernel, which then runs in the caller's mode).
TEST(Denormals, CallersModeIsRestored) {
  if (!detail::can_flush_denormals()) GTEST_SKIP() << "this CPU has no flush-to-zero mode flux can set";
  PolicyGuard guard;
  ASSERT_TRUE(flush_denormals(true));
  const uint64_t before = cpu_backend::float_control();
  std::vector<float> a(64, kSub), out(64);
  cpu_be().unary(0, backend::UnaryOp::tanh, DType::f32, buf(a), buf(out), 64, 0.0);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(cpu_backend::float_control(), before);
  volatile float v = kSub;
  EXPECT_TRUE(subnormal(v * 0.5f)) << "the test thread's arithmetic stays IEEE";
  {
    cpu_backend::FloatModeScope scope(DType::f32);  // as a caller that set FTZ|DAZ itself
    const uint64_t flushing = cpu_backend::float_control();
    EXPECT_NE(flushing, before);
    EXPECT_EQ(float(v * 0.5f), 0.f);
    std::vector<double> d(8, 1e-310), dout(8, -1.0);
    cpu_be().unary(0, backend::UnaryOp::abs, DType::f64, buf(d), buf(dout), 8, 0.0);
    cpu_be().unary(0, backend::UnaryOp::tanh, DType::f32, buf(a), buf(out), 64, 0.0);
    EXPECT_EQ(cpu_backend::float_control(), flushing);
  }
  EXPECT_EQ(cpu_backend::float_control(), before);
}

// The pool's workers run each region in the mode of the thread that started it: flushing inside a
// FloatModeScope, IEEE outside, whichever thread takes which piece.
TEST(Denormals, PoolThreadsTakeTheCallersMode) {
  if (!detail::can_flush_denormals()) GTEST_SKIP() << "this CPU has no flush-to-zero mode flux can set";
  PolicyGuard guard;
  ASSERT_TRUE(flush_denormals(true));
  const int64_t n = 1 << 16;
  std::vector<float> in(size_t(n), kSub), out(size_t(n), 0.f);
  std::mutex m;
  for (int round = 0; round < 4; ++round) {
    const bool flush = round % 2 == 0;
    std::set<std::thread::id> threads;
    auto body = [&](int64_t b, int64_t e) {
      volatile float half = 0.5f;
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = in[size_t(i)] * half;
      std::lock_guard<std::mutex> lock(m);
      threads.insert(std::this_thread::get_id());
    };
    std::fill(out.begin(), out.end(), -1.f);
    if (flush) {
      cpu_backend::FloatModeScope scope(DType::f32);
      cpu_backend::parallel_for(n, 1, body);
    } else {
      cpu_backend::parallel_for(n, 1, body);
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], flush ? 0.f : kSub * 0.5f) << "round " << round << " i " << i;
    if (cpu_backend::num_threads() == 1) {
      EXPECT_EQ(threads.size(), 1u);
    }
  }
}

}  // namespace
