// OpenBLAS in the CPU backend: its threading, and float32/float64 GEMMs cut over our thread pool,
// one single-threaded library call per piece. Float32 pieces run on the engine the kernel-choice
// seam picks (gemm_on_this_thread, matmul.cpp); GEMMs with one row or one column of C are GEMVs.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/matmul_kernels.hpp"

// OpenBLAS's (pthreads build) stop for its server threads; see single_threaded_blas.
extern "C" __attribute__((weak)) void blas_thread_shutdown_();

namespace flux::cpu_backend {

namespace {
// Float32 library calls per engine (gemm_engine_calls): relaxed counts, one per call of at least
// microseconds.
std::atomic<int64_t> g_f32_calls[2] = {0, 0};  // openblas, onednn
}  // namespace

void count_call(Kernel k) { g_f32_calls[k == Kernel::onednn ? 1 : 0].fetch_add(1, std::memory_order_relaxed); }

int64_t gemm_engine_calls(Kernel engine) {
  if (engine != Kernel::openblas && engine != Kernel::onednn) return 0;
  return g_f32_calls[engine == Kernel::onednn ? 1 : 0].load(std::memory_order_relaxed);
}

void blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc) {
  count_call(Kernel::openblas);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}
void blas_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
               int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}

void each_piece(int64_t parts, const std::function<void(int64_t)>& fn) {
  if (parts == 1) {
    fn(0);
    return;
  }
  parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p);
  });
}

namespace {
// One piece on the calling thread: float32 by the seam's engine, float64 by OpenBLAS.
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_on_this_thread(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// OpenBLAS runs on one thread: its own threads sched_yield()-spin between calls and fought our
// pool's (bench/results/2026-12-06-notes-from-comments.md). GEMMs large
// enough to split are cut over our pool instead (gemm_split below). Set once, when libflux loads.
// OpenBLAS (pthreads build) has started its server threads by then, and they sched_yield()-spin for
// its thread timeout (2^28 cycles, ~0.1 s of a core) before sleeping for good: they are stopped
// (blas_thread_shutdown_, its fork handler; OpenBLAS restarts them if someone later asks it for more
// threads). Weak: absent from other OpenBLAS builds (OpenMP), where nothing is spinning.
void single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
    return true;
  }();
  (void)once;
}
[[maybe_unused]] const bool blas_single_threaded_at_load = (single_threaded_blas(), true);

// ---- Products with one row or one column of C: BLAS GEMV ----
// OpenBLAS's sgemm packs both operands before its kernel runs; with one row (a batch-1 Dense
// forward: C (1, n) = x (1, k) W^T) the packing of W is as much memory traffic as the product, and
// sgemv streams the weights several times faster (bench/results/2026-12-06-notes-from-comments.md).
// matmul.cpp's gemm_loops is the reference these match.
void blas_gemv(bool trans, int rows, int cols, float alpha, const float* a, int lda, const float* x, int incx,
               float beta, float* y, int incy) {
  count_call(Kernel::openblas);
  cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, rows, cols, alpha, a, lda, x, incx, beta, y, incy);
}
void blas_gemv(bool trans, int rows, int cols, double alpha, const double* a, int lda, const double* x, int incx,
               double beta, double* y, int incy) {
  cblas_dgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, rows, cols, alpha, a, lda, x, incx, beta, y, incy);
}

// C = alpha op(A) op(B) + beta C when m == 1 or n == 1: the matrix operand is cut over the pool
// along C's length in multiples of 16 elements, one GEMV per piece.
template <class T>
void gemv_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  const bool row = m == 1;  // C (1, n) = op(A) (1, k) op(B); else C (m, 1) = op(A) op(B) (k, 1)
  const int64_t len = row ? n : m;
  const T* vec = row ? a : b;
  const int64_t inc = row ? (ta ? lda : 1) : (tb ? 1 : ldb);
  const int64_t incc = row ? 1 : ldc;
  // The matrix is op(B) (k, n) or op(A) (m, k); its rows or columns [lo, hi) make C's [lo, hi).
  auto piece = [&](int64_t lo, int64_t hi) {
    if (row) {
      if (tb)  // B stored (n, k): rows lo..hi, y = B x
        blas_gemv(false, int(hi - lo), int(k), alpha, b + lo * ldb, int(ldb), vec, int(inc), beta, c + lo, int(incc));
      else  // B stored (k, n): columns lo..hi, y = B^T x
        blas_gemv(true, int(k), int(hi - lo), alpha, b + lo, int(ldb), vec, int(inc), beta, c + lo, int(incc));
    } else {
      if (ta)  // A stored (k, m): columns lo..hi
        blas_gemv(true, int(k), int(hi - lo), alpha, a + lo, int(lda), vec, int(inc), beta, c + lo * ldc, int(incc));
      else  // A stored (m, k): rows lo..hi
        blas_gemv(false, int(hi - lo), int(k), alpha, a + lo * lda, int(lda), vec, int(inc), beta, c + lo * ldc,
                  int(incc));
    }
  };
  const Pieces cut(len, double(len) * double(k), kSplitGemvElements);
  if (cut.parts <= 1) {
    piece(0, len);
    return;
  }
  parallel_for(cut.parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      if (cut.lo(p) < cut.hi(p)) piece(cut.lo(p), cut.hi(p));
  });
}

// C (m, n) = alpha op(A) op(B) + beta C for one matrix, cut over the pool along the longer of m
// and n in pieces of multiples of 16 (the kernels' register blocks), each a library call on one thread.
// Float32 where OpenBLAS runs below the CPU: every product goes to the seam (piece_gemm), GEMVs and
// small products included, instead of straight to OpenBLAS.
template <class T> bool to_seam() {
  if constexpr (std::is_same_v<T, float>) return blas_below_cpu();
  return false;
}
// One whole product on the calling thread: OpenBLAS, or the seam's engine where to_seam().
template <class T>
void whole_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  if (to_seam<T>())
    piece_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

template <class T>
void gemm_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  if ((m == 1 || n == 1) && !to_seam<T>()) {
    gemv_split<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  double flops = 2.0 * double(m) * double(n) * double(k);
  if (flops < kSplitFlops) {
    whole_gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  bool split_n = n >= m;
  const Pieces cut(split_n ? n : m, flops, kSplitFlops);
  if (cut.parts <= 1) {
    piece_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  parallel_for(cut.parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = cut.lo(p), hi = cut.hi(p);
      if (lo >= hi) continue;
      if (split_n) {  // columns [lo, hi) of C and of op(B)
        const T* bp = tb ? b + lo * ldb : b + lo;
        piece_gemm(ta, tb, m, hi - lo, k, alpha, a, lda, bp, ldb, beta, c + lo, ldc);
      } else {  // rows [lo, hi) of C and of op(A)
        const T* ap = ta ? a + lo : a + lo * lda;
        piece_gemm(ta, tb, hi - lo, n, k, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc);
      }
    }
  });
}

template <class T> void batched_gemm(const T* a, const T* b, T* c, const backend::Gemm& g) {
  single_threaded_blas();
  int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
  double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  if (g.batch >= num_threads() && g.batch > 1 && flops * double(g.batch) >= kSplitFlops) {
    // Many matrices: one whole GEMM per task.
    parallel_for(g.batch, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        if ((g.m == 1 || g.n == 1) && !to_seam<T>())  // inside the region: one GEMV on this thread
          gemv_split<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, T(g.alpha), a + p * g.stride_a, lda, b + p * g.stride_b,
                        ldb, T(g.beta), c + p * g.stride_c, ldc);
        else
          whole_gemm<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, T(g.alpha), a + p * g.stride_a, lda, b + p * g.stride_b,
                        ldb, T(g.beta), c + p * g.stride_c, ldc);
    });
    return;
  }
  for (int64_t p = 0; p < g.batch; ++p)
    gemm_split<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, T(g.alpha), a + p * g.stride_a, lda, b + p * g.stride_b, ldb,
                  T(g.beta), c + p * g.stride_c, ldc);
}
}  // namespace

void gemm_blas(const float* a, const float* b, float* c, const backend::Gemm& g) { batched_gemm(a, b, c, g); }
void gemm_blas(const double* a, const double* b, double* c, const backend::Gemm& g) { batched_gemm(a, b, c, g); }

}  // namespace flux::cpu_backend
