// What OpenBLAS and oneDNN run against the CPU (src/backends/cpu/dependency_check.hpp), and the GEMM
// engine the kernel rules then choose. BlasDependencyCheck.* runs as the environment has it (the
// as-detected path); BlasFallbackEnv.* runs through ctest's cpu.blas_below_cpu entry with
// OPENBLAS_CORETYPE=Prescott (set before OpenBLAS loads), and skips without it.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"

using namespace flux;
namespace cb = flux::cpu_backend;

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct IsaGuard {
  cb::Isa old = cb::active_isa();
  ~IsaGuard() { cb::force_isa(old); }
};

cb::Query gemm_query(int64_t m, int64_t n, int64_t k) {
  cb::Query q;
  q.site = cb::Site::gemm;
  q.threads = 1;
  q.dims = {m, n, k, 0, 1, k, k, n, 0};
  return q;
}
constexpr cb::Candidates kBoth = cb::bit(cb::Kernel::openblas) | cb::bit(cb::Kernel::onednn);

// C = op(A) op(B) (alpha 1, beta 0) through the CPU backend, batched, against a float64 loop.
void check_matmul(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> a(size_t(batch * m * k)), b(size_t(batch * k * n)), c(size_t(batch * m * n), 7.f);
  for (float& v : a) v = d(gen);
  for (float& v : b) v = d(gen);
  backend::Gemm g;
  g.batch = batch, g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  cb::matmul(DType::f32, a.data(), b.data(), c.data(), g);
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = ta ? a[size_t(p * m * k + l * m + i)] : a[size_t(p * m * k + i * k + l)];
          const double y = tb ? b[size_t(p * k * n + j * k + l)] : b[size_t(p * k * n + l * n + j)];
          acc += x * y;
        }
        ASSERT_NEAR(c[size_t(p * m * n + i * n + j)], acc, 1e-4 * (1 + std::abs(acc)) + 1e-4 * double(k) / 64)
            << "batch " << batch << " m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb;
      }
}

// The shapes of every GEMM path: a large piece (above oneDNN's 2^20-element cap), a small product
// (below the split threshold), a GEMV row and column, and a batch of whole matrices.
void check_every_path() {
  check_matmul(1, 600, 700, 300, false, true, 1);
  check_matmul(1, 20, 30, 40, true, false, 2);
  check_matmul(1, 1, 300, 200, false, true, 3);
  check_matmul(1, 300, 1, 200, true, false, 4);
  check_matmul(6, 64, 48, 32, false, false, 5);
}
}  // namespace

TEST(BlasDependencyCheck, CoreNamesMapToIsaLevels) {
  std::string simd;
  EXPECT_EQ(cb::openblas_core_level("Prescott", &simd), cb::Isa::baseline);
  EXPECT_EQ(simd, "SSE3");
  EXPECT_EQ(cb::openblas_core_level("PRESCOTT"), cb::Isa::baseline);
  EXPECT_EQ(cb::openblas_core_level("Sandybridge"), cb::Isa::baseline);
  EXPECT_EQ(cb::openblas_core_level("Haswell"), cb::Isa::avx2);
  EXPECT_EQ(cb::openblas_core_level("Zen"), cb::Isa::avx2);
  EXPECT_EQ(cb::openblas_core_level("SkylakeX", &simd), cb::Isa::avx512);
  EXPECT_EQ(simd, "AVX-512");
  EXPECT_EQ(cb::openblas_core_level("cooperlake"), cb::Isa::avx512);
  EXPECT_FALSE(cb::openblas_core_level("NeoverseN1", &simd).has_value()) << "an unknown core is trusted";
  EXPECT_EQ(simd, "");
}

// As the environment has it: the facts are read, the rule follows them, and the engine counted for a
// large product is the rule's; versioninfo's Libraries line says the same.
TEST(BlasDependencyCheck, AsDetectedTheRuleFollowsTheFacts) {
  IsaGuard guard;
  const cb::DependencyFacts& f = cb::dependency_facts();
  EXPECT_EQ(f.cpu, cb::detected_isa());
  EXPECT_FALSE(f.blas_core.empty());
  EXPECT_EQ(f.blas_version.rfind("OpenBLAS", 0), 0u) << f.blas_version;
  EXPECT_EQ(f.onednn, bool(FLUX_TEST_HAVE_ONEDNN));
  if (f.onednn) {
    ASSERT_TRUE(f.onednn_level.has_value()) << f.onednn_isa;
    // oneDNN detects the CPU itself (CPUID), so without a cap it runs at flux's level.
    if (!std::getenv("ONEDNN_MAX_CPU_ISA") && !std::getenv("DNNL_MAX_CPU_ISA")) {
      EXPECT_EQ(*f.onednn_level, f.cpu) << f.onednn_isa;
    }
  }
  const bool below = f.onednn && f.blas_level && int(*f.blas_level) < int(cb::active_isa()) &&
                     (!f.onednn_level || int(*f.onednn_level) >= int(cb::active_isa()));
  EXPECT_EQ(cb::blas_below_cpu(), below);
  if (!std::getenv("OPENBLAS_CORETYPE") && f.cpu != cb::Isa::baseline && f.blas_level) {
    // This machine's OpenBLAS knows its CPU (the AMD Zen and Intel CPUs CI runs on): not below.
    EXPECT_FALSE(below) << f.blas_core << " on " << cb::isa_name(f.cpu);
  }
  const cb::Kernel large = cb::rule(gemm_query(512, 512, 512), kBoth);
  EXPECT_EQ(large, below ? cb::Kernel::onednn : cb::Kernel::openblas);
  const int64_t before = cb::gemm_engine_calls(large);
  check_matmul(1, 512, 512, 512, false, true, 9);
  EXPECT_GT(cb::gemm_engine_calls(large), before);
  std::ostringstream os;
  versioninfo(os);
  EXPECT_NE(os.str().find("Libraries: " + cb::dependency_line()), std::string::npos) << os.str();
  EXPECT_NE(cb::dependency_line().find(below ? "below this CPU" : f.blas_core), std::string::npos) << cb::dependency_line();
  check_every_path();
}

// A weight's prepared-data cache that keeps one entry (the core's is src/storage_cache.cpp).
struct FirstCache final : flux::backend::PreparedCache {
  flux::backend::PreparedKey key{};
  std::shared_ptr<const flux::backend::Prepared> kept;
  std::shared_ptr<const flux::backend::Prepared> find(const flux::backend::PreparedKey& k) override {
    return kept && k == key ? kept : nullptr;
  }
  void insert(const flux::backend::PreparedKey& k, std::shared_ptr<const flux::backend::Prepared> p) override {
    key = k, kept = std::move(p);
  }
};

// OPENBLAS_CORETYPE=Prescott: OpenBLAS's SSE3 kernels on a CPU with AVX2 or AVX-512. Every float32
// GEMM path runs on oneDNN (no OpenBLAS call at all), the results match float64, and the line says so.
TEST(BlasFallbackEnv, PrescottKernelsAreRoutedAround) {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  if (!core || lower(core) != "prescott") GTEST_SKIP() << "runs through ctest's cpu.blas_below_cpu (OPENBLAS_CORETYPE=Prescott)";
  if (!FLUX_TEST_HAVE_ONEDNN) GTEST_SKIP() << "no oneDNN in this build: nothing to route to";
  if (cb::detected_isa() == cb::Isa::baseline) GTEST_SKIP() << "a CPU without AVX2: Prescott's kernels are not below it";
  IsaGuard guard;
  const cb::DependencyFacts& f = cb::dependency_facts();
  EXPECT_EQ(lower(f.blas_core), "prescott");
  EXPECT_EQ(f.blas_level, cb::Isa::baseline);
  ASSERT_TRUE(cb::blas_below_cpu());
  const std::string line = cb::dependency_line();
  EXPECT_NE(line.find("runs Prescott kernels (SSE3) below this CPU (" + std::string(cb::isa_name(cb::active_isa())) +
                      "): float32 GEMMs use oneDNN"),
            std::string::npos)
      << line;
  std::ostringstream os;
  versioninfo(os);
  EXPECT_NE(os.str().find("Libraries: " + line), std::string::npos) << os.str();
  for (auto [m, n, k] : {std::tuple{512, 512, 128}, std::tuple{128, 10, 512}, std::tuple{2048, 1024, 256}})
    EXPECT_EQ(cb::rule(gemm_query(m, n, k), kBoth), cb::Kernel::onednn) << m << " " << n << " " << k;
  EXPECT_EQ(cb::rule(gemm_query(512, 512, 128), cb::bit(cb::Kernel::openblas)), cb::Kernel::openblas)
      << "only candidates are chosen";

  const int64_t blas0 = cb::gemm_engine_calls(cb::Kernel::openblas), dnn0 = cb::gemm_engine_calls(cb::Kernel::onednn);
  check_every_path();
  // A Dense layer's training step (forward GEMM with the bias, both gradient GEMMs).
  auto model = Chain(Dense(784, 64, relu), Dense(64, 10));
  Tensor x = rand({32, 784}), y = rand({32, 10});
  auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
  EXPECT_TRUE(std::isfinite(item<float>(loss)));
  EXPECT_EQ(params(grads).size(), 4u);
  EXPECT_EQ(cb::gemm_engine_calls(cb::Kernel::openblas), blas0) << "no float32 product may run on Prescott's kernels";
  EXPECT_GT(cb::gemm_engine_calls(cb::Kernel::onednn), dnn0 + 5);
  // One row (batch-1 inference): on kept weights, not Prescott's GEMV nor an unprepared GEMM; float64 values;
  // small, and large enough to be cut over the pool as a GEMV is (w of 2^17 elements or more).
  for (auto [in, out] : {std::pair<int64_t, int64_t>{40, 24}, std::pair<int64_t, int64_t>{600, 500}}) {
    const size_t nin = size_t(in), nw = size_t(out * in), nout = size_t(out);
    std::vector<float> xv(nin), wv(nw), yv(nout, -7.f);
    for (int64_t i = 0; i < in; ++i) xv[size_t(i)] = 0.01f * float(i) - 0.2f;
    for (int64_t i = 0; i < out * in; ++i) wv[size_t(i)] = 0.003f * float(i % 97) - 0.1f;
    FirstCache cache;
    const int64_t blas1 = cb::gemm_engine_calls(cb::Kernel::openblas);
    ASSERT_TRUE(cb::linear_forward(DType::f32, xv.data(), wv.data(), &cache, nullptr, yv.data(), 1, in, out, false));
    EXPECT_TRUE(cache.kept) << "the weights are prepared and kept";
    EXPECT_EQ(cb::gemm_engine_calls(cb::Kernel::openblas), blas1);
    for (int64_t o = 0; o < out; ++o) {
      double want = 0;
      for (int64_t i = 0; i < in; ++i) want += double(xv[size_t(i)]) * double(wv[size_t(o * in + i)]);
      EXPECT_NEAR(yv[size_t(o)], want, 1e-5 * std::sqrt(double(in) / 40.0)) << in << " x " << out << ": " << o;
    }
  }

  // Run at a level the Prescott kernels do not fall short of (force_isa: the bench's emulation of an
  // older CPU), and the rules trust OpenBLAS again.
  cb::force_isa(cb::Isa::baseline);
  EXPECT_FALSE(cb::blas_below_cpu());
  EXPECT_EQ(cb::rule(gemm_query(512, 512, 128), kBoth), cb::Kernel::openblas);
}
