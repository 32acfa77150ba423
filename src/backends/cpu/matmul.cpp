// GEMM on the CPU: OpenBLAS sgemm/dgemm or oneDNN's matmul for floats (transposes folded into the
// call), loops for integers. Large GEMMs are cut over our thread pool, one single-threaded library
// call per piece (gemm_split); which library runs a float32 piece is the kernel-choice seam's decision
// (kernel_choice.hpp, Site::gemm). Dense inference (linear_forward) runs on weights prepared once per
// content, by flux's panels or oneDNN (Site::linear).
#include <cblas.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/onednn_relu.hpp"
#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/dependency_check.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/onednn.hpp"
#include "src/backends/cpu/prepared.hpp"
#include "src/backends/cpu/read_mostly.hpp"

// OpenBLAS's (pthreads build) stop for its server threads; see single_threaded_blas.
extern "C" __attribute__((weak)) void blas_thread_shutdown_();

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
}  // namespace

namespace {
// Float32 library calls per engine (gemm_engine_calls): relaxed counts, one per call of at least
// microseconds.
std::atomic<int64_t> g_f32_calls[2] = {0, 0};  // openblas, onednn
void count_call(Kernel k) { g_f32_calls[k == Kernel::onednn ? 1 : 0].fetch_add(1, std::memory_order_relaxed); }

// One single-threaded BLAS call, row-major.
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

// ---- oneDNN's matmul as a GEMM engine (f32) ----
#if FLUX_HAVE_ONEDNN
// The piece's shape, alpha, beta and data type (f32, or bf16 for matmul_low_precision).
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, float, float, int>;

dnnl::memory::data_type onednn_type(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}
struct Matmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratch_desc;
  size_t scratch = 0;
};
/// Primitives by piece shape, created once and then only read (any number of threads run one at
/// once, each with its own scratchpad); null: oneDNN has no kernel for the shape.
ReadMostly<Key, Matmul>& matmuls() {
  static auto* d = new ReadMostly<Key, Matmul>(1024);  // never destroyed, as the backend
  return *d;
}

// A matmul entry (Matmul, Linear below) takes its primitive and scratchpad size from `pd`.
template <class Entry> void set_primitive(Entry& e, const dnnl::matmul::primitive_desc& pd) {
  e.scratch_desc = pd.scratchpad_desc();
  e.scratch = e.scratch_desc.get_size();
  e.primitive = dnnl::matmul(pd);
}

/// The primitive for one piece shape of A, B, C of dtype t (f32; bf16 accumulates in f32); null when
/// oneDNN has no implementation (for bf16 also where it offers only its reference kernel).
const Matmul* onednn_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb,
                            float beta, int64_t ldc, DType t = DType::f32) {
  return matmuls().get(Key{m, n, k, ta, tb, lda, ldb, ldc, alpha, beta, int(t)}, [&]() -> std::unique_ptr<const Matmul> {
                  onednn::set_team(1);  // sizes the primitive's team: one pool thread runs it
                  try {
                    using dims = dnnl::memory::dims;
                    auto f32 = onednn_type(t);
                    auto e = std::make_unique<Matmul>();
                    e->a = dnnl::memory::desc(dims{m, k}, f32, ta ? dims{1, lda} : dims{lda, 1});
                    e->b = dnnl::memory::desc(dims{k, n}, f32, tb ? dims{1, ldb} : dims{ldb, 1});
                    e->c = dnnl::memory::desc(dims{m, n}, f32, dims{ldc, 1});
                    dnnl::primitive_attr attr = onednn::user_scratchpad();
                    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
                    if (beta != 0.f) {
                      dnnl::post_ops po;
                      po.append_sum(beta);
                      attr.set_post_ops(po);
                    }
                    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->a, e->b, e->c), attr, onednn::engine());
                    if (t != DType::f32 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return nullptr;
                    set_primitive(*e, pd);
                    return e;
                  } catch (const dnnl::error&) {
                    return nullptr;
                  }
                });
}

void onednn_gemm(const Matmul& e, const void* a, const void* b, void* c) {
  const dnnl::engine& engine = onednn::engine();
  onednn::set_team(1);  // this pool thread's team: itself alone
  dnnl::memory am(e.a, engine, const_cast<void*>(a)), bm(e.b, engine, const_cast<void*>(b)), cm(e.c, engine, c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  onednn::CallScratch scratch;
  if (e.scratch)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e.scratch_desc, engine, scratch.get(onednn::Scratch::scratchpad, e.scratch)));
  e.primitive.execute(onednn::stream(), args);
  onednn::stream().wait();
}
#endif

// oneDNN is a candidate only for operands of up to 2^20 elements (A + B + C) and a scratchpad of at
// most 4 MiB: on larger pieces its buffers raised the peak RSS and OpenBLAS was as fast or faster.
// Where OpenBLAS runs below the CPU (blas_below_cpu) every size is: its kernels then lag oneDNN's
// (figures in bench/results/2026-12-06-blas-below-cpu.md).
constexpr size_t kMaxOnednnScratch = size_t(4) << 20;
constexpr double kMaxOnednnElements = double(1 << 20);

/// The seam's question for one f32 piece (kernel_choice.hpp: Site::gemm).
Query gemm_query(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, float beta) {
  Query q;
  q.site = Site::gemm;
  q.threads = num_threads();
  q.dims = {m, n, k, ta, tb, lda, ldb, ldc, beta != 0.f};
  return q;
}

// One piece on the calling thread, by the engine the seam chooses for its shape (f32) or OpenBLAS (f64).
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, Kernel forced = Kernel(-1)) {
#if FLUX_HAVE_ONEDNN
  const bool any_size = blas_below_cpu();
  const bool small =
      any_size || double(m) * double(k) + double(k) * double(n) + double(m) * double(n) <= kMaxOnednnElements;
  const Candidates candidates = bit(Kernel::openblas) | (small ? bit(Kernel::onednn) : 0);
  const Kernel use = int(forced) >= 0 ? forced : choose(gemm_query(ta, tb, m, n, k, lda, ldb, ldc, beta), candidates);
  if (use == Kernel::onednn && small) {
    const Matmul* e = onednn_matmul(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc);
    if (e && (any_size || e->scratch <= kMaxOnednnScratch)) {
      count_call(Kernel::onednn);
      return onednn_gemm(*e, a, b, c);
    }
  }
#else
  (void)forced;
#endif
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// The tuner's timer for Site::gemm: the piece on operands of its shape (thread CPU time, best of reps).
double time_gemm(const Query& q, Kernel kernel, int reps) {
  const int64_t m = q.dims[0], n = q.dims[1], k = q.dims[2], lda = q.dims[5], ldb = q.dims[6], ldc = q.dims[7];
  const bool ta = q.dims[3] != 0, tb = q.dims[4] != 0;
  const float beta = q.dims[8] ? 1.f : 0.f;
#if FLUX_HAVE_ONEDNN
  if (kernel == Kernel::onednn) {  // piece_gemm would run OpenBLAS in its place
    const Matmul* e = double(m) * double(k) + double(k) * double(n) + double(m) * double(n) <= kMaxOnednnElements
                          ? onednn_matmul(ta, tb, m, n, k, 1.f, lda, ldb, beta, ldc)
                          : nullptr;
    if (!e || e->scratch > kMaxOnednnScratch) return std::numeric_limits<double>::infinity();
  }
#endif
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

// ---- Products with one row or one column of C: BLAS GEMV ----
// OpenBLAS's sgemm packs both operands before its kernel runs; with one row (a batch-1 Dense
// forward: C (1, n) = x (1, k) W^T) the packing of W is as much memory traffic as the product, and
// sgemv streams the weights several times faster (bench/results/2026-12-06-notes-from-comments.md).
// gemm_loops above is the reference these match.
void blas_gemv(bool trans, int rows, int cols, float alpha, const float* a, int lda, const float* x, int incx,
               float beta, float* y, int incy) {
  count_call(Kernel::openblas);
  cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, rows, cols, alpha, a, lda, x, incx, beta, y, incy);
}
void blas_gemv(bool trans, int rows, int cols, double alpha, const double* a, int lda, const double* x, int incx,
               double beta, double* y, int incy) {
  cblas_dgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, rows, cols, alpha, a, lda, x, incx, beta, y, incy);
}

// `len` elements (rows or columns of C) cut over the pool into `parts` pieces of whole 16-element
// blocks (the kernels' register blocks): at most one per thread and per block, and no more than
// work / unit, so that each piece is worth its hand-off.
struct Pieces {
  int64_t len, blocks, parts;
  Pieces(int64_t n, double work, double unit)
      : len(n), blocks((n + 15) / 16),
        parts(std::min<int64_t>({int64_t(num_threads()), blocks, std::max<int64_t>(1, int64_t(work / unit))})) {}
  int64_t lo(int64_t p) const { return std::min(len, blocks * p / parts * 16); }
  int64_t hi(int64_t p) const { return std::min(len, blocks * (p + 1) / parts * 16); }
};

// Matrix elements below which a GEMV stays on the calling thread: it streams its matrix once, so
// the work is the bytes read; 2^17 floats (512 KiB) take ~10 us from L3 on one core.
constexpr double kSplitGemvElements = double(1 << 17);

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

// Work below which a GEMM stays on the calling thread (~10-20 us at tens of GFLOP/s) and on
// OpenBLAS (a library call's own overhead matters there; the seed MLP's GEMMs are such).
constexpr double kSplitFlops = double(1 << 20);

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

template <class T> void gemm_blas(const T* a, const T* b, T* c, const backend::Gemm& g) {
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

// ---- bf16 GEMM (matmul_low_precision): oneDNN's bf16 matmul, float32 accumulation ----
// The same cut as the f32 path: whole matrices over the pool when there are at least as many as
// threads, else each matrix along the longer of m and n in multiples of 16 (Pieces), one
// single-threaded oneDNN call per piece. Every piece's primitive is found before any runs, so a
// shape oneDNN declines leaves C untouched for the core's float32 path.
#if FLUX_HAVE_ONEDNN
bool gemm_bf16(const uint16_t* a, const uint16_t* b, uint16_t* c, const backend::Gemm& g) {
  const int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
  const float alpha = float(g.alpha), beta = float(g.beta);
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  struct Piece {
    const Matmul* e;
    const uint16_t *a, *b;
    uint16_t* c;
  };
  std::vector<Piece> pieces;
  auto add = [&](int64_t m, int64_t n, const uint16_t* ap, const uint16_t* bp, uint16_t* cp) {
    const Matmul* e = onednn_matmul(g.trans_a, g.trans_b, m, n, g.k, alpha, lda, ldb, beta, ldc, DType::bf16);
    pieces.push_back({e, ap, bp, cp});
    return e != nullptr;
  };
  const bool whole = g.batch >= num_threads() || flops < kSplitFlops;
  for (int64_t p = 0; p < g.batch; ++p) {
    const uint16_t* A = a + p * g.stride_a;
    const uint16_t* B = b + p * g.stride_b;
    uint16_t* C = c + p * g.stride_c;
    if (whole) {
      if (!add(g.m, g.n, A, B, C)) return false;
      continue;
    }
    const bool split_n = g.n >= g.m;
    const Pieces cut(split_n ? g.n : g.m, flops, kSplitFlops);
    for (int64_t q = 0; q < cut.parts; ++q) {
      const int64_t lo = cut.lo(q), hi = cut.hi(q);
      if (lo >= hi) continue;
      const bool ok = split_n ? add(g.m, hi - lo, A, g.trans_b ? B + lo * ldb : B + lo, C + lo)
                              : add(hi - lo, g.n, g.trans_a ? A + lo : A + lo * lda, B, C + lo * ldc);
      if (!ok) return false;
    }
  }
  if (pieces.size() == 1) {
    onednn_gemm(*pieces[0].e, pieces[0].a, pieces[0].b, pieces[0].c);
    return true;
  }
  parallel_for(int64_t(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) onednn_gemm(*pieces[size_t(p)].e, pieces[size_t(p)].a, pieces[size_t(p)].b, pieces[size_t(p)].c);
  });
  return true;
}
#endif

// ---- Dense inference on panels of our own (linear_forward's other kernel) ----
// w (out, in) is packed once per content into panels of 16 outputs, each (in, 16): the 16 weights of
// one input for 16 outputs side by side. A kernel call holds R rows of y by 16 columns in registers and
// runs once over the whole of `in` (no blocking of in: the MNIST shapes measured best unblocked), each
// x value broadcast against the panel's vectors, then adds the bias, applies relu and stores
// (broadcast_rows.hpp, the kernel of conv_own.cpp's few-pixel forwards too). x is read in place, its R
// rows `in` apart. gemm_loops is the reference; figures: bench/results/2026-12-05-cpu-backend-comment-measurements.md.
constexpr int64_t kPanel = 16;

/// Rows [r0, r0 + rows) of y's columns [c, c + cols) from one panel; a partial panel (cols < 16) through `tile`.
template <class Vec, int R, int V>
FLUX_CPU_INLINE void panel_tile(const float* x, int64_t in, const float* panel, const float* bias, bool relu, int64_t r0,
                                int64_t rows, int64_t cols, float* y, int64_t out, int64_t c, float* tile) {
  if (cols == kPanel) {
    broadcast_block<Vec, R, V>(rows, x + r0 * in, in, panel, in, bias, relu, y + r0 * out + c, out);
    return;
  }
  broadcast_block<Vec, R, V>(rows, x + r0 * in, in, panel, in, bias, relu, tile, kPanel);
  for (int64_t r = 0; r < rows; ++r) std::copy(tile + r * kPanel, tile + r * kPanel + cols, y + (r0 + r) * out + c);
}

/// Columns [lo, hi) of y (n, out) (lo a multiple of 16) from the panels of the whole w. Rows go in
/// blocks of R; a remainder shares the last two blocks evenly (128 rows, R 6: 20 x 6 + 4 + 4, not 21 x 6
/// + 2: a 2-row block has 4 accumulator chains, too few to hide the FMA latency). A last partial panel
/// is computed into a tile and its valid columns copied out; its bias is read from a padded copy.
template <class Vec, int R, int V>
FLUX_CPU_INLINE void panel_columns(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi,
                                   int64_t out, const float* bias, bool relu, float* y) {
  static_assert(V * sizeof(Vec) == kPanel * sizeof(float), "a block row is one panel row");
  for (int64_t c = lo; c < hi; c += kPanel) {
    const float* panel = panels + c * in;  // panel c / 16
    const int64_t cols = std::min(kPanel, out - c);
    float bias16[kPanel] = {};
    float tile[R * kPanel];
    const float* b = bias ? bias + c : nullptr;
    if (bias && cols < kPanel) {
      std::copy(bias + c, bias + c + cols, bias16);
      b = bias16;
    }
    // One call site (each inlines every block size) and no lambda: a lambda does not inherit this
    // function's target, and its kernel was baseline code (bench/results/2026-12-06-notes-from-comments.md).
    for (int64_t r0 = 0; r0 < n;) {
      const int64_t left = n - r0, rows = left >= 2 * R ? R : left > R ? (left + 1) / 2 : left;
      panel_tile<Vec, R, V>(x, in, panel, b, relu, r0, rows, cols, y, out, c, tile);
      r0 += rows;
    }
  }
}

FLUX_CPU_TARGET_AVX512 void panel_columns_avx512(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo,
                                                 int64_t hi, int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec16, 12, 1>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
FLUX_CPU_TARGET_AVX2 void panel_columns_avx2(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo,
                                             int64_t hi, int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec8, 6, 2>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
void panel_columns_baseline(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi,
                            int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec4, 3, 4>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
void panel_piece(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi, int64_t out,
                 const float* bias, bool relu, float* y) {
  switch (active_isa()) {
    case Isa::avx512: return panel_columns_avx512(x, n, in, panels, lo, hi, out, bias, relu, y);
    case Isa::avx2: return panel_columns_avx2(x, n, in, panels, lo, hi, out, bias, relu, y);
    default: return panel_columns_baseline(x, n, in, panels, lo, hi, out, bias, relu, y);
  }
}

// ---- Dense inference with its weights prepared (Backend::linear_forward) ----
// OpenBLAS packs both operands on every call (its packing routines were ~4% of the MNIST MLP's
// batch-128 inference). At inference the weights do not change between calls: they are prepared once
// in the kernel's layout and kept in the weight tensor's cache (prepared.hpp), which the core empties
// on any write. The kernel is the seam's choice (Site::linear): flux's panels, or oneDNN's matmul on
// weights in its kernel's blocked layout (weights format `any`), bias and relu as its epilogue.
// Output columns are cut over the pool as in gemm_split; each piece is its own rows of w.
// Fewer rows: one row is a GEMV (gemv_split streams w once); a few rows cannot repay a kernel call.
constexpr int64_t kLinearMinRows = 8;

/// fn(p) for every piece p: on this thread for one, over the pool otherwise.
void each_piece(int64_t parts, const std::function<void(int64_t)>& fn) {
  if (parts == 1) {
    fn(0);
    return;
  }
  parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p);
  });
}

#if FLUX_HAVE_ONEDNN
using LinearKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int>;  // n in cols ldy bias relu dtype
/// One piece shape's primitive: immutable once made (run by any number of threads at once).
struct Linear {
  dnnl::matmul primitive;
  dnnl::memory::desc src, plain, packed, bias, dst, scratch_desc;
  dnnl::reorder pack;
  bool packs = false;       // false: the kernel reads w as it is (nothing prepared)
  size_t scratch = 0;
  int64_t ldy = 0;          // y's row stride: > the piece's columns when it is one piece of y's columns
  bool own_output = false;  // the kernel writes a dense output of the piece's own, copied into y's rows
};
ReadMostly<LinearKey, Linear>& linears() {
  static auto* l = new ReadMostly<LinearKey, Linear>(256);  // never destroyed, as the backend
  return *l;
}

// The entry for one piece shape of dtype t (f32, or bf16: x, w, bias, y all bf16, float32 accumulation),
// created on first use; null when oneDNN offers only its reference kernel or refuses.
const Linear* linear_entry(int64_t n, int64_t in, int64_t cols, int64_t ldy, bool bias, bool relu, DType t) {
  return linears().get(LinearKey{n, in, cols, ldy, bias, relu, int(t)}, [&]() -> std::unique_ptr<const Linear> {
    onednn::set_team(1);  // the primitive's team: one pool thread runs each piece
    try {
      using dims = dnnl::memory::dims;
      const auto f32 = onednn_type(t);
      const dnnl::engine& engine = onednn::engine();
      auto e = std::make_unique<Linear>();
      e->src = dnnl::memory::desc(dims{n, in}, f32, dims{in, 1});
      e->plain = dnnl::memory::desc(dims{in, cols}, f32, dims{1, in});  // rows of w (cols, in) as B (in, cols)
      if (bias) e->bias = dnnl::memory::desc(dims{1, cols}, f32, dims{cols, 1});
      dnnl::memory::desc any(dims{in, cols}, f32, dnnl::memory::format_tag::any);
      dnnl::primitive_attr attr = onednn::user_scratchpad();
      if (relu) {
        dnnl::post_ops po;
        append_relu_keeping_nan(po);
        attr.set_post_ops(po);
      }
      auto make = [&](int64_t stride, const dnnl::memory::desc& weights) {
        dnnl::memory::desc dst(dims{n, cols}, f32, dims{stride, 1});
        auto desc = bias ? dnnl::matmul::desc(e->src, weights, e->bias, dst) : dnnl::matmul::desc(e->src, weights, dst);
        return dnnl::matmul::primitive_desc(desc, attr, engine);
      };
      auto starts = [](const dnnl::matmul::primitive_desc& p, const char* prefix) {
        return std::string(p.impl_info_str()).rfind(prefix, 0) == 0;
      };
      // One piece of y's columns writes into y's rows (stride ldy) where oneDNN's brgemm kernel takes
      // that; where only its gemm:jit kernel does (it repacks the weights on every call), into a dense
      // output of its own that brgemm takes, copied into y's rows after.
      dnnl::matmul::primitive_desc pd = make(ldy, any);
      if (ldy != cols && !starts(pd, "brg")) {
        dnnl::matmul::primitive_desc dense = make(cols, any);
        if (starts(dense, "brg")) pd = dense, e->own_output = true;
      }
      if (starts(pd, "ref")) return nullptr;
      // Without brgemm (oneDNN 2.6 below AVX-512) `any` gets gemm:jit on a transposed copy of w, which
      // is no kernel's packed layout and was slower than w read as it is on the Dense shapes measured:
      // there the kernel reads w in place and nothing is prepared.
      if (pd.weights_desc() != e->plain && !starts(pd, "brg")) {
        dnnl::matmul::primitive_desc direct = make(e->own_output ? cols : ldy, e->plain);
        if (!starts(direct, "ref")) pd = direct;
      }
      e->dst = pd.dst_desc();
      e->ldy = ldy;
      e->packed = pd.weights_desc();
      e->packs = e->packed != e->plain;
      if (e->packs) e->pack = dnnl::reorder(dnnl::reorder::primitive_desc(engine, e->plain, engine, e->packed));
      set_primitive(*e, pd);
      return e;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  });
}

/// The pieces' weights in their kernels' layouts (null memory for a piece that reads w in place).
struct LinearWeights final : backend::Prepared {
  std::vector<dnnl::memory> pieces;
};

/// One piece on the calling thread, its weights `wm` (prepared or plain); elements of `size` bytes.
void linear_piece(const Linear& e, const void* x, const dnnl::memory& wm, const void* bias, void* y, size_t size) {
  const dnnl::engine& engine = onednn::engine();
  onednn::set_team(1);  // this pool thread's team: itself alone
  const dnnl::memory::dims dims = e.dst.dims();
  const int64_t rows = dims[0], cols = dims[1];
  onednn::CallScratch scratch;
  void* out = e.own_output ? scratch.get(onednn::Scratch::output, size_t(rows * cols) * size) : y;
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(e.src, engine, const_cast<void*>(x))},
                                             {DNNL_ARG_WEIGHTS, wm},
                                             {DNNL_ARG_DST, dnnl::memory(e.dst, engine, out)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bias, engine, const_cast<void*>(bias)));
  if (e.scratch)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e.scratch_desc, engine, scratch.get(onednn::Scratch::scratchpad, e.scratch)));
  e.primitive.execute(onednn::stream(), args);
  onednn::stream().wait();
  if (out != y)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(y) + size_t(r * e.ldy) * size, static_cast<const char*>(out) + size_t(r * cols) * size,
                  size_t(cols) * size);
}
#endif

/// The seam's question for a Dense inference (kernel_choice.hpp: Site::linear).
Query linear_query(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  Query q;
  q.site = Site::linear;
  q.threads = num_threads();
  q.dims = {n, in, out, bias, relu};
  return q;
}

#if FLUX_HAVE_ONEDNN
/// The Dense inference on oneDNN's matmul for dtype t (f32 or bf16), output columns cut as `cut`;
/// false (nothing written) where oneDNN declines a piece. The weights are prepared in the kernels'
/// layouts and kept in `cache` under their own PreparedKind per dtype.
bool linear_onednn(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                   int64_t n, int64_t in, int64_t out, bool relu, const Pieces& cut) {
  const int64_t parts = cut.parts;
  const size_t size = dtype_size(t);
  auto at = [size](const void* p, int64_t elements) {
    return p ? static_cast<const char*>(p) + size_t(elements) * size : nullptr;
  };
  std::vector<const Linear*> entries(size_t(parts), nullptr);
  for (int64_t p = 0; p < parts; ++p) {
    if (cut.lo(p) >= cut.hi(p)) continue;
    entries[size_t(p)] = linear_entry(n, in, cut.hi(p) - cut.lo(p), out, bias != nullptr, relu, t);
    if (!entries[size_t(p)]) return false;
  }
  // Prepared only where a piece's kernel reads w in its own layout (brgemm); else w in place.
  bool packs = false;
  for (const Linear* e : entries) packs = packs || (e && e->packs);
  std::shared_ptr<const LinearWeights> weights;
  if (packs) {
    const PreparedKind kind = t == DType::bf16 ? PreparedKind::onednn_linear_bf16 : PreparedKind::onednn_linear;
    const auto key = prepared_key(kind, reinterpret_cast<intptr_t>(w), n, in, out, parts, bias != nullptr, relu);
    weights = prepared<LinearWeights>(cache, key, [&] {
      auto lw = std::make_shared<LinearWeights>();
      lw->pieces.resize(size_t(parts));
      onednn::set_team(1);
      for (int64_t p = 0; p < parts; ++p) {
        const Linear* e = entries[size_t(p)];
        if (!e || !e->packs) continue;
        dnnl::memory plain(e->plain, onednn::engine(), const_cast<char*>(at(w, cut.lo(p) * in)));
        lw->pieces[size_t(p)] = dnnl::memory(e->packed, onednn::engine());
        e->pack.execute(onednn::stream(), plain, lw->pieces[size_t(p)]);
      }
      onednn::stream().wait();
      return lw;
    });
  }
  each_piece(parts, [&](int64_t p) {
    const Linear* e = entries[size_t(p)];
    if (!e) return;
    const dnnl::memory wm = e->packs ? weights->pieces[size_t(p)]
                                     : dnnl::memory(e->plain, onednn::engine(), const_cast<char*>(at(w, cut.lo(p) * in)));
    linear_piece(*e, x, wm, at(bias, cut.lo(p)), const_cast<char*>(at(y, cut.lo(p))), size);
  });
  return true;
}
#endif

/// The Dense inference by `use` (oneDNN: where it declines a piece, the panels run instead); false
/// only when `strict` and oneDNN declined.
bool run_linear(const float* x, const float* w, backend::PreparedCache* cache, const float* bias, float* y, int64_t n,
                int64_t in, int64_t out, bool relu, Kernel use, bool strict = false) {
  const Pieces cut(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops);  // output columns
  const int64_t parts = cut.parts;
#if FLUX_HAVE_ONEDNN
  if (use == Kernel::onednn) {
    if (linear_onednn(DType::f32, x, w, cache, bias, y, n, in, out, relu, cut)) return true;
    if (strict) return false;
  }
#else
  if (strict && use == Kernel::onednn) return false;
#endif
  // flux's panels (or oneDNN declined the shape).
  const auto key = prepared_key(PreparedKind::panels, reinterpret_cast<intptr_t>(w), in, out);
  auto panels = prepared<PreparedFloats>(cache, key, [&] {
    auto f = std::make_shared<PreparedFloats>(panel_floats(in, out));
    panel_pack(w, in, out, f->data);
    return f;
  });
  each_piece(parts, [&](int64_t p) {
    if (cut.lo(p) < cut.hi(p)) panel_piece(x, n, in, panels->data, cut.lo(p), cut.hi(p), out, bias, relu, y);
  });
  return true;
}

/// The tuner's timer for Site::linear: the Dense inference on operands of its shape (wall time, as
/// its pieces run on the pool; best of reps, weights prepared before the first timed run).
double time_linear(const Query& q, Kernel kernel, int reps) {
  const int64_t n = q.dims[0], in = q.dims[1], out = q.dims[2];
  const bool bias = q.dims[3] != 0, relu = q.dims[4] != 0;
  std::vector<float> x(size_t(n * in), 0.5f), w(size_t(out * in), 0.25f), b(size_t(out), 0.1f), y(size_t(n * out), 0.f);
  LocalPreparedCache cache;
  if (!run_linear(x.data(), w.data(), &cache, bias ? b.data() : nullptr, y.data(), n, in, out, relu, kernel, true))
    return std::numeric_limits<double>::infinity();
  return best_wall_seconds(
      reps, [&] { run_linear(x.data(), w.data(), &cache, bias ? b.data() : nullptr, y.data(), n, in, out, relu, kernel); });
}
[[maybe_unused]] const bool linear_timer_registered = (register_timer(Site::linear, time_linear), true);
}  // namespace

size_t panel_floats(int64_t in, int64_t out) { return size_t((out + kPanel - 1) / kPanel * kPanel) * size_t(in); }
/// to[(p * in + i) * 16 + j] = w[p * 16 + j][i] for the ceil(out / 16) panels p, 0 past out.
void panel_pack(const float* w, int64_t in, int64_t out, float* to) {
  for (int64_t p = 0; p * kPanel < out; ++p) {
    const int64_t cols = std::min(kPanel, out - p * kPanel);
    float* panel = to + p * in * kPanel;
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = 0; j < cols; ++j) panel[i * kPanel + j] = w[(p * kPanel + j) * in + i];
      for (int64_t j = cols; j < kPanel; ++j) panel[i * kPanel + j] = 0.f;
    }
  }
}
void panel_product(const float* x, int64_t n, int64_t in, const float* panels, int64_t out, float* y) {
  panel_piece(x, n, in, panels, 0, out, out, nullptr, false, y);
}

bool linear_forward(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                    int64_t n, int64_t in, int64_t out, bool relu) {
  if (t == DType::bf16) {
    // oneDNN's bf16 matmul is the one kernel (the panels are float32 only): nothing to choose.
    if (!bf16_kernels_enabled() || n < 1 || in == 0 || out == 0) return false;
#if FLUX_HAVE_ONEDNN
    try {
      return linear_onednn(t, x, w, cache, bias, y, n, in, out, relu,
                           Pieces(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops));
    } catch (const dnnl::error&) {
      return false;
    }
#else
    return false;
#endif
  }
  if (t != DType::f32 || n < kLinearMinRows || in == 0 || out == 0) return false;
  const Candidates candidates = bit(Kernel::panels) | (FLUX_HAVE_ONEDNN ? bit(Kernel::onednn) : 0);
  const Kernel use = choose(linear_query(n, in, out, bias != nullptr, relu), candidates);
  return run_linear(static_cast<const float*>(x), static_cast<const float*>(w), cache, static_cast<const float*>(bias),
                    static_cast<float*>(y), n, in, out, relu, use);
}

int64_t gemm_engine_calls(Kernel engine) {
  if (engine != Kernel::openblas && engine != Kernel::onednn) return 0;
  return g_f32_calls[engine == Kernel::onednn ? 1 : 0].load(std::memory_order_relaxed);
}

Kernel linear_kernel(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  const Candidates candidates = bit(Kernel::panels) | (FLUX_HAVE_ONEDNN ? bit(Kernel::onednn) : 0);
  return choose(linear_query(n, in, out, bias, relu), candidates);
}

bool matmul_low_precision(DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  if (t != DType::bf16 || !bf16_kernels_enabled() || g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return false;
  // Outputs that overlap (a zero C stride over several matrices) are left to the core.
  if (g.batch > 1 && g.stride_c < g.m * g.n) return false;
#if FLUX_HAVE_ONEDNN
  try {
    return gemm_bf16(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), static_cast<uint16_t*>(c), g);
  } catch (const dnnl::error&) {
    return false;
  }
#else
  (void)a, (void)b, (void)c;
  return false;
#endif
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

void gemm_on_this_thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  piece_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace flux::cpu_backend

namespace flux::detail {
// For bench/flux_bench.cpp and tools (which cannot include the backend's headers): forces the kernel
// of a site by the names kernel_choice.hpp spells ("gemm", "linear", "conv_forward"; "openblas",
// "onednn", "panels", "winograd", "few_pixel"; an empty kernel: choose as usual). False for an unknown name.
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
