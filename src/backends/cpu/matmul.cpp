// GEMM and Dense inference on the CPU: which kernel runs a call. Float32 and float64 GEMMs go through
// OpenBLAS, cut over our thread pool (matmul_blas.cpp); each float32 piece runs on the engine the
// kernel-choice seam picks for its shape (kernel_choice.hpp, Site::gemm): OpenBLAS or oneDNN's matmul
// (matmul_onednn.cpp). Dense inference (linear_forward) runs on weights prepared once per content,
// by flux's panels (matmul_own.cpp) or oneDNN (Site::linear). bf16 runs on oneDNN (matmul_bf16.cpp);
// integers on the loops below, which are also the reference the kernels match.
#include <time.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "flux/error.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/matmul_kernels.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/prepared.hpp"

namespace flux::cpu_backend {

namespace {
template <class T> void gemm_loops(const T* a, const T* b, T* c, const backend::Gemm& g) {
  for (int64_t p = 0; p < g.batch; ++p) {
    const T* A = a + p * g.stride_a;
    const T* B = b + p * g.stride_b;
    T* C = c + p * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        T acc = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          T x = g.trans_a ? A[l * g.m + i] : A[i * g.k + l];
          T y = g.trans_b ? B[j * g.k + l] : B[l * g.n + j];
          acc += x * y;
        }
        C[i * g.n + j] = T(g.alpha) * acc + (g.beta != 0 ? T(g.beta) * C[i * g.n + j] : T(0));
      }
  }
}

// oneDNN is a candidate only for operands of up to 2^20 elements (A + B + C) (and a scratchpad of at
// most 4 MiB: matmul_onednn.cpp): on larger pieces its buffers raised the peak RSS and OpenBLAS was as
// fast or faster. Where OpenBLAS runs below the CPU (blas_below_cpu) every size is: its kernels then
// lag oneDNN's (figures in bench/results/2026-12-06-blas-below-cpu.md).
constexpr double kMaxOnednnElements = double(1 << 20);
bool onednn_sized(int64_t m, int64_t n, int64_t k) {
  return double(m) * double(k) + double(k) * double(n) + double(m) * double(n) <= kMaxOnednnElements;
}

// One piece on the calling thread, by the engine the seam chooses for its shape (or `forced`, the tuner's).
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, Kernel forced) {
  if (FLUX_HAVE_ONEDNN) {
    const bool any_size = blas_below_cpu();
    const bool small = any_size || onednn_sized(m, n, k);
    const Candidates candidates = bit(Kernel::openblas) | (small ? bit(Kernel::onednn) : 0);
    const Query q = GemmQuery{m, n, k, ta, tb, lda, ldb, ldc, beta != 0.f}.query(num_threads());
    const Kernel use = int(forced) >= 0 ? forced : choose(q, candidates);
    if (use == Kernel::onednn && small && onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, any_size))
      return;
  }
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// The tuner's timer for Site::gemm: the piece on operands of its shape (thread CPU time, best of reps).
double time_gemm(const Query& q, Kernel kernel, int reps) {
  const GemmQuery g = GemmQuery::from(q);
  const int64_t m = g.m, n = g.n, k = g.k, lda = g.lda, ldb = g.ldb, ldc = g.ldc;
  const bool ta = g.trans_a, tb = g.trans_b;
  const float beta = g.accumulate ? 1.f : 0.f;
  // piece_gemm would run OpenBLAS in oneDNN's place
  if (kernel == Kernel::onednn && !(onednn_sized(m, n, k) && onednn_gemm_takes(ta, tb, m, n, k, lda, ldb, ldc, beta)))
    return std::numeric_limits<double>::infinity();
  std::vector<float> a(size_t((ta ? k : m) * lda), 0.5f), b(size_t((tb ? n : k) * ldb), 0.25f), c(size_t(m * ldc), 0.f);
  double best = 1e30;
  for (int r = 0; r < std::max(1, reps); ++r) {
    const double t0 = thread_seconds();
    piece_gemm(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, kernel);
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}
[[maybe_unused]] const bool gemm_timer_registered = (register_timer(Site::gemm, time_gemm), true);

// Dense inference (Backend::linear_forward): one row runs as OpenBLAS's GEMV, which streams w once (the
// MNIST MLP at batch 1: 38 us against 42 on oneDNN's kept weights), unless OpenBLAS runs below the CPU
// (its Prescott GEMV, or oneDNN on unprepared weights: 98 us). From 2 rows the kept weights: a GEMM
// call (OpenBLAS) packs w again at every call, twice the time at 2-7 rows, and every step of a
// recurrence at a small batch (the LSTM's W_hh: ops/recurrent.cpp).
constexpr int64_t kLinearMinRows = 2;
int64_t linear_min_rows() { return blas_below_cpu() ? 1 : kLinearMinRows; }

/// The seam's question for a Dense inference (kernel_choice.hpp: Site::linear).
Query linear_query(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  return LinearQuery{n, in, out, bias, relu}.query(num_threads());
}
Candidates linear_candidates() { return bit(Kernel::panels) | (FLUX_HAVE_ONEDNN ? bit(Kernel::onednn) : 0); }

/// The Dense inference by `use` (oneDNN: where it declines a piece, the panels run instead); false
/// only when `strict` and oneDNN declined.
bool run_linear(const float* x, const float* w, backend::PreparedCache* cache, const float* bias, float* y, int64_t n,
                int64_t in, int64_t out, bool relu, Kernel use, bool strict = false) {
  const Pieces cut = dense_pieces(n, in, out);  // output columns; each piece is its own rows of w
  if (use == Kernel::onednn) {
    if (linear_onednn(DType::f32, x, w, cache, bias, y, n, in, out, relu, cut)) return true;
    if (strict) return false;
  }
  linear_panels(x, w, cache, bias, y, n, in, out, relu, cut);
  return true;
}

/// The tuner's timer for Site::linear: the Dense inference on operands of its shape (wall time, as
/// its pieces run on the pool; best of reps, weights prepared before the first timed run).
double time_linear(const Query& q, Kernel kernel, int reps) {
  const LinearQuery l = LinearQuery::from(q);
  const int64_t n = l.n, in = l.in, out = l.out;
  const bool bias = l.bias, relu = l.relu;
  std::vector<float> x(size_t(n * in), 0.5f), w(size_t(out * in), 0.25f), b(size_t(out), 0.1f), y(size_t(n * out), 0.f);
  LocalPreparedCache cache;
  if (!run_linear(x.data(), w.data(), &cache, bias ? b.data() : nullptr, y.data(), n, in, out, relu, kernel, true))
    return std::numeric_limits<double>::infinity();
  return best_wall_seconds(
      reps, [&] { run_linear(x.data(), w.data(), &cache, bias ? b.data() : nullptr, y.data(), n, in, out, relu, kernel); });
}
[[maybe_unused]] const bool linear_timer_registered = (register_timer(Site::linear, time_linear), true);
}  // namespace

void gemm_on_this_thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  piece_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, Kernel(-1));
}

void matmul(DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    fill(t, c, g.batch * g.m * g.n, 0.0);
    return;
  }
  switch (t) {
    case DType::f32: gemm_blas(static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c), g); break;
    case DType::f64: gemm_blas(static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c), g); break;
    case DType::i32: gemm_loops(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), static_cast<int32_t*>(c), g); break;
    case DType::i64: gemm_loops(static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), static_cast<int64_t*>(c), g); break;
    default: detail::fail("[matmul] CPU kernel does not support ", dtype_name(t));
  }
}

bool matmul_low_precision(DType t, const void* a, const void* b, void* c, const backend::Gemm& g, bool float32_c) {
  if (t != DType::bf16 || !bf16_kernels_enabled() || g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return false;
  // Outputs that overlap (a zero C stride over several matrices) are left to the core.
  if (g.batch > 1 && g.stride_c < g.m * g.n) return false;
  const auto* a16 = static_cast<const uint16_t*>(a);
  const auto* b16 = static_cast<const uint16_t*>(b);
  return float32_c ? gemm_bf16(a16, b16, static_cast<float*>(c), g) : gemm_bf16(a16, b16, static_cast<uint16_t*>(c), g);
}

bool linear_forward(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                    int64_t n, int64_t in, int64_t out, bool relu) {
  if (t == DType::bf16) {
    // oneDNN's bf16 matmul is the one kernel (the panels are float32 only): nothing to choose.
    if (!bf16_kernels_enabled() || n < 1 || in == 0 || out == 0) return false;
    return linear_bf16(x, w, cache, bias, y, n, in, out, relu);
  }
  if (t != DType::f32 || n < linear_min_rows() || in == 0 || out == 0) return false;
  const Kernel use = choose(linear_query(n, in, out, bias != nullptr, relu), linear_candidates());
  return run_linear(static_cast<const float*>(x), static_cast<const float*>(w), cache, static_cast<const float*>(bias),
                    static_cast<float*>(y), n, in, out, relu, use);
}

Kernel linear_kernel(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  return choose(linear_query(n, in, out, bias, relu), linear_candidates());
}

}  // namespace flux::cpu_backend

namespace flux::detail {
// For bench/flux_bench.cpp and tools (which cannot include the backend's headers): forces the kernel
// of a site by the names kernel_choice.hpp spells ("gemm", "linear", "conv_forward", "linear_weights",
// "bf16_transposed_a"; "openblas", "onednn", "panels", "in_place", ...; an empty kernel: choose as
// usual). False for an unknown name.
bool cpu_force_kernel(const std::string& site, const std::string& kernel) {
  const auto s = cpu_backend::site_from_name(site);
  const auto k = cpu_backend::kernel_from_name(kernel);
  if (!s || (!kernel.empty() && !k)) return false;
  cpu_backend::force_kernel(*s, kernel.empty() ? std::nullopt : k);
  return true;
}
// For bench/flux_bench.cpp: float32 GEMM/GEMV calls run so far by "openblas" or "onednn".
int64_t cpu_gemm_engine_calls(const std::string& engine) {
  const auto k = cpu_backend::kernel_from_name(engine);
  return k ? cpu_backend::gemm_engine_calls(*k) : 0;
}
}  // namespace flux::detail
