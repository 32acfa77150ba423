// GEMM on the CPU: OpenBLAS sgemm/dgemm or oneDNN's matmul for floats (transposes folded into the
// call), loops for integers. Large GEMMs are cut over our thread pool, one single-threaded library
// call per piece (gemm_split). Which library runs a float32 piece is measured at run time, once per
// piece shape (choose_engine): OpenBLAS unless oneDNN ran that shape at least 10% faster (oneDNN is
// tried on pieces of up to 2^20 operand elements: its buffers cost peak RSS above). Measured on
// 2 AVX2 (Zen) cores, 1 thread (GFLOP/s by thread CPU time, /work/notes/cpuspeed.md): OpenBLAS's ZEN
// kernels and oneDNN are within ~10% on the MNIST and wide MLPs' shapes (OpenBLAS ahead on 512x512x128
// and the wide shapes), while on thin ones (a side of 10) oneDNN runs 1.3-2x faster; where OpenBLAS
// does not recognise a CPU and runs a generic kernel, oneDNN (which detects the ISA itself) wins.
#include <cblas.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/onednn_relu.hpp"
#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kept_floats.hpp"
#if FLUX_HAVE_ONEDNN
#include "src/backends/cpu/kept_weights.hpp"
#endif

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
// One single-threaded BLAS call, row-major.
void blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}
void blas_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
               int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
}

// OpenBLAS runs on one thread: its own threads sched_yield()-spin between calls and fought our
// pool's (futex + sched_yield ~80% of a 2-thread MNIST run's time in strace -c -f). GEMMs large
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
std::atomic<int> g_forced_engine{-1};  // force_gemm_engine(): tests and benchmarks

#if FLUX_HAVE_ONEDNN
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, float, float, int64_t>;
struct Matmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratch_desc;
  size_t scratch = 0;
};
struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<Key, std::unique_ptr<Matmul>> cache;
  void (*omp_set_num_threads)(int) =
      reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
};
OneDnn& onednn() {
  static OneDnn* d = new OneDnn();  // never destroyed, as the backend
  return *d;
}

// A matmul entry (Matmul, Linear below) takes its primitive and scratchpad size from `pd`.
template <class Entry> void set_primitive(Entry& e, const dnnl::matmul::primitive_desc& pd) {
  e.scratch_desc = pd.scratchpad_desc();
  e.scratch = e.scratch_desc.get_size();
  e.primitive = dnnl::matmul(pd);
}

// Stores `e` under `key` (null: remembered as unavailable), emptying the cache first when it holds
// `bound` entries (a bound for programs that sweep many shapes); returns the stored entry.
template <class Cache, class Key, class Entry>
Entry* remember(Cache& cache, const Key& key, std::unique_ptr<Entry> e, size_t bound) {
  if (cache.size() >= bound) cache.clear();
  return cache.emplace(key, std::move(e)).first->second.get();
}

// The primitive for one piece shape; `slot` (the piece's index) keeps concurrently running pieces
// on distinct primitives. Null when oneDNN has no implementation.
Matmul* onednn_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb,
                      float beta, int64_t ldc, int64_t slot) {
  OneDnn& s = onednn();
  Key key{m, n, k, ta, tb, lda, ldb, ldc, alpha, beta, slot};
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.cache.find(key);
  if (it != s.cache.end()) return it->second.get();
  std::unique_ptr<Matmul> e;
  if (s.omp_set_num_threads) s.omp_set_num_threads(1);  // sizes the primitive's team: see linear_forward
  try {
    using dims = dnnl::memory::dims;
    auto f32 = dnnl::memory::data_type::f32;
    e = std::make_unique<Matmul>();
    e->a = dnnl::memory::desc(dims{m, k}, f32, ta ? dims{1, lda} : dims{lda, 1});
    e->b = dnnl::memory::desc(dims{k, n}, f32, tb ? dims{1, ldb} : dims{ldb, 1});
    e->c = dnnl::memory::desc(dims{m, n}, f32, dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    set_primitive(*e, dnnl::matmul::primitive_desc(dnnl::matmul::desc(e->a, e->b, e->c), attr, s.engine));
  } catch (const dnnl::error&) {
    e = nullptr;
  }
  return remember(s.cache, key, std::move(e), 1024);
}

bool onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int64_t slot) {
  Matmul* e = onednn_matmul(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, slot);
  if (!e) return false;
  OneDnn& s = onednn();
  thread_local dnnl::stream stream(s.engine);
  thread_local std::vector<char> scratch;
  if (scratch.size() < e->scratch) scratch.resize(e->scratch);
  if (s.omp_set_num_threads) s.omp_set_num_threads(1);  // this pool thread's team: itself alone
  dnnl::memory am(e->a, s.engine, const_cast<float*>(a)), bm(e->b, s.engine, const_cast<float*>(b)),
      cm(e->c, s.engine, c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (e->scratch)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e->scratch_desc, s.engine, scratch.data()));
  e->primitive.execute(stream, args);
  stream.wait();
  return true;
}
#endif

constexpr size_t kMaxOnednnScratch = size_t(4) << 20;
constexpr double kMaxOnednnElements = double(1 << 20);

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The engine for one f32 piece shape, measured the first time the shape is seen: each engine runs
// the piece into a scratch copy of C, alternately, 3 times; oneDNN is kept only when its best time
// is at least 10% below OpenBLAS's (a margin that noise on loaded cores rarely crosses, so close
// calls stay with OpenBLAS from run to run). The choice then holds for the process.
GemmEngine choose_engine(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, const float* c, int64_t ldc, int64_t slot) {
#if FLUX_HAVE_ONEDNN
  int forced = g_forced_engine.load(std::memory_order_relaxed);
  if (forced >= 0) return GemmEngine(forced);
  using ShapeKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, bool>;
  static std::mutex mutex;
  static std::map<ShapeKey, GemmEngine> chosen;
  ShapeKey key{m, n, k, ta, tb, lda, ldb, ldc, beta != 0.f};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = chosen.find(key);
    if (it != chosen.end()) return it->second;
  }
  // oneDNN is a candidate only for operands of up to 2^20 elements (A + B + C) and a small
  // scratchpad: on the wide MLP's pieces (e.g. 256 x 2048 x 1024) its buffers raised the peak RSS from
  // 440 to 489-532 MB at 2 threads, and OpenBLAS measured as fast or faster on those shapes anyway.
  Matmul* candidate = double(m) * double(k) + double(k) * double(n) + double(m) * double(n) > kMaxOnednnElements
                          ? nullptr
                          : onednn_matmul(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, slot);
  if (!candidate || candidate->scratch > kMaxOnednnScratch) {
    std::lock_guard<std::mutex> lock(mutex);
    return chosen.emplace(key, GemmEngine::openblas).first->second;
  }
  // C holds (m - 1) * ldc + n elements from c: its last row ends at column n, not at ldc (a column
  // piece of a wider C ends where the buffer does; found by scripts/test --asan, heap-buffer-overflow).
  std::vector<float> scratch(m > 0 ? size_t(m - 1) * size_t(ldc) + size_t(n) : 0);
  double best_blas = 1e30, best_dnnl = 1e30;
  bool dnnl_ok = true;
  for (int rep = 0; rep < 3 && dnnl_ok; ++rep) {
    std::copy(c, c + scratch.size(), scratch.begin());
    double t0 = thread_seconds();
    blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, scratch.data(), int(ldc));
    double t1 = thread_seconds();
    std::copy(c, c + scratch.size(), scratch.begin());
    dnnl_ok = onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, scratch.data(), ldc, slot);
    double t2 = thread_seconds();
    best_blas = std::min(best_blas, t1 - t0);
    best_dnnl = std::min(best_dnnl, t2 - t1);
  }
  GemmEngine e = dnnl_ok && best_dnnl < 0.9 * best_blas ? GemmEngine::onednn : GemmEngine::openblas;
  std::lock_guard<std::mutex> lock(mutex);
  if (chosen.size() >= 4096) chosen.clear();
  // Two pieces of one shape may measure at once on two threads: the first decision stored is the
  // one both use, so a GEMM's pieces never mix engines between one call and the next.
  return chosen.emplace(key, e).first->second;
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta,
      (void)c, (void)ldc, (void)slot;
  return GemmEngine::openblas;
#endif
}

// One piece on the calling thread, by the engine chosen for its shape (f32) or OpenBLAS (f64).
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int64_t slot) {
#if FLUX_HAVE_ONEDNN
  if (choose_engine(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, slot) == GemmEngine::onednn &&
      onednn_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, slot))
    return;
#else
  (void)slot;
#endif
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void piece_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                const double* b, int64_t ldb, double beta, double* c, int64_t ldc, int64_t) {
  blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// ---- Products with one row or one column of C: BLAS GEMV ----
// OpenBLAS's sgemm packs both operands before its kernel runs; with one row (a batch-1 Dense
// forward: C (1, n) = x (1, k) W^T) the packing of W is as much memory traffic as the product, and
// sgemm ran at ~11 GB/s of weights where sgemv streams them at ~40 (784x512 + 512x512 + 512x10 MLP at
// batch 1, 1 AVX2 core: 248 -> see bench/README.md). gemm_loops above is the reference these match.
void blas_gemv(bool trans, int rows, int cols, float alpha, const float* a, int lda, const float* x, int incx,
               float beta, float* y, int incy) {
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
template <class T>
void gemm_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 1 || n == 1) {
    gemv_split<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  double flops = 2.0 * double(m) * double(n) * double(k);
  if (flops < kSplitFlops) {
    blas_gemm(ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
  bool split_n = n >= m;
  const Pieces cut(split_n ? n : m, flops, kSplitFlops);
  if (cut.parts <= 1) {
    piece_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 0);
    return;
  }
  parallel_for(cut.parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = cut.lo(p), hi = cut.hi(p);
      if (lo >= hi) continue;
      if (split_n) {  // columns [lo, hi) of C and of op(B)
        const T* bp = tb ? b + lo * ldb : b + lo;
        piece_gemm(ta, tb, m, hi - lo, k, alpha, a, lda, bp, ldb, beta, c + lo, ldc, p);
      } else {  // rows [lo, hi) of C and of op(A)
        const T* ap = ta ? a + lo : a + lo * lda;
        piece_gemm(ta, tb, hi - lo, n, k, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc, p);
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
        if (g.m == 1 || g.n == 1)  // inside the region: one GEMV on this thread
          gemv_split<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, T(g.alpha), a + p * g.stride_a, lda, b + p * g.stride_b,
                        ldb, T(g.beta), c + p * g.stride_c, ldc);
        else
          blas_gemm(g.trans_a, g.trans_b, int(g.m), int(g.n), int(g.k), T(g.alpha), a + p * g.stride_a, int(lda),
                    b + p * g.stride_b, int(ldb), T(g.beta), c + p * g.stride_c, int(ldc));
    });
    return;
  }
  for (int64_t p = 0; p < g.batch; ++p)
    gemm_split<T>(g.trans_a, g.trans_b, g.m, g.n, g.k, T(g.alpha), a + p * g.stride_a, lda, b + p * g.stride_b, ldb,
                  T(g.beta), c + p * g.stride_c, ldc);
}

// ---- Dense inference on panels of our own (linear_forward's other kernel) ----
// w (out, in) is packed once per content stamp into panels of 16 outputs, each (in, 16): the 16
// weights of one input for 16 outputs side by side. A kernel call holds R rows of y by 16 columns in
// registers and runs once over the whole of `in` (no blocking of in: the MNIST shapes measured best
// unblocked, 128 x 784 -> 512 at 112 GFLOP/s against 109 blocked by 256), each x value broadcast
// against the panel's vectors, then adds the bias, applies relu and stores (broadcast_rows.hpp, the
// kernel of conv.cpp's few-pixel forwards too). x is read in place, its R rows `in` apart. On one core of this AMD EPYC (AVX-512, 117
// GFLOP/s peak), 1 thread, /tmp/mb/lin2.cpp: 120 x 784 -> 512 AVX2 (R 6, two 8-float vectors) 114.5
// GFLOP/s, AVX-512 (R 12, one 16-float vector) 116.3, baseline x86-64 (R 3, four 4-float vectors, no
// FMA) 40.2; OpenBLAS's Haswell sgemm on the same product 104, oneDNN 2.6's gemm:jit 105 (AVX2 has no
// brgemm in 2.6), ONNX Runtime's MLAS ~109 (it packs constant weights too). gemm_loops is the reference.
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
    // function's target, and its kernel was baseline code (6.4 ms instead of 1.5 for MNIST at batch 128).
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

std::atomic<int> g_forced_linear{-1};  // force_linear_kernel()

// ---- Dense inference with its weights kept packed (Backend::linear_forward) ----
// OpenBLAS packs both operands on every call (its packing routines were ~4% of the MNIST MLP's
// batch-128 inference). At inference the weights do not change between calls: oneDNN's matmul takes
// them in its kernel's own blocked layout (weights format `any`), packed once per content stamp and
// read in place afterwards (ONNX Runtime's MLAS does the same with constant weights); bias and relu
// run as the kernel's epilogue. Output columns are cut over the pool as in gemm_split; each piece is
// its own rows of w (contiguous) with its own kept copy. gemm_loops is the reference (tests).
#if FLUX_HAVE_ONEDNN
struct Linear;
#endif
using LinearKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t>;  // n in cols ldy bias relu piece
// Fewer rows: one row is a GEMV (gemv_split streams w once); a few rows cannot repay a kernel call.
constexpr int64_t kLinearMinRows = 8;
struct Linears {
  std::mutex mutex;  // held for a whole call (pieces touch only their own entries)
#if FLUX_HAVE_ONEDNN
  std::map<LinearKey, std::unique_ptr<Linear>> cache;
#endif
  // The kernel of a call shape (choice_key), measured on its first call (automatic: not yet).
  std::map<LinearKey, LinearKernel> choice;
  KeptFloats panels{64, size_t(512) << 20};  // packed w per weight buffer (kept_floats.hpp)
};
Linears& linears() {
  static Linears* l = new Linears();  // never destroyed, as the backend
  return *l;
}
/// Linears::choice's key: n in out 0 bias relu pieces (the pieces at the present thread count).
LinearKey choice_key(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  return LinearKey{n, in, out, 0, bias, relu, Pieces(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops).parts};
}
/// w's panels, packed now unless kept. Under Linears::mutex.
const float* kept_panels(Linears& l, const float* w, uint64_t stamp, int64_t in, int64_t out) {
  return l.panels.get(w, stamp, in, out, panel_floats(in, out), [&](float* to) { panel_pack(w, in, out, to); });
}
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
struct Linear {
  dnnl::matmul primitive;
  dnnl::memory::desc src, plain, packed, bias, dst, scratch_desc;
  dnnl::reorder pack;
  bool packs = false;  // false: the kernel reads w as it is (no copy kept)
  size_t scratch = 0;
  // While `timing`: `direct`, the kernel that reads w as it is, is still to be chosen or not over
  // `primitive`, which reads the kept copy (linear_entry); linear_piece's first call times both
  // (seconds: best of 3) and linear_forward decides for all pieces of the call at once.
  bool timing = false;
  dnnl::matmul direct;
  dnnl::memory::desc direct_scratch_desc;
  double packed_seconds = 0, direct_seconds = 0;
  int64_t ldy = 0;         // y's row stride: > the piece's columns when it is one piece of y's columns
  bool own_output = false;  // the kernel writes a dense output of the piece's own, copied into y's rows
  KeptWeights kept;  // layers of one shape share the entry: one copy each
};

// The entry for one piece shape, created on first use; null when oneDNN offers only its reference
// kernel or refuses. Called under Linears::mutex.
Linear* linear_entry(int64_t n, int64_t in, int64_t cols, int64_t ldy, bool bias, bool relu, int64_t piece) {
  Linears& l = linears();
  LinearKey key{n, in, cols, ldy, bias, relu, piece};
  auto it = l.cache.find(key);
  if (it != l.cache.end()) return it->second.get();
  std::unique_ptr<Linear> e;
  try {
    using dims = dnnl::memory::dims;
    const auto f32 = dnnl::memory::data_type::f32;
    const dnnl::engine& engine = onednn().engine;
    e = std::make_unique<Linear>();
    e->src = dnnl::memory::desc(dims{n, in}, f32, dims{in, 1});
    e->plain = dnnl::memory::desc(dims{in, cols}, f32, dims{1, in});  // rows of w (cols, in) as B (in, cols)
    if (bias) e->bias = dnnl::memory::desc(dims{1, cols}, f32, dims{cols, 1});
    dnnl::memory::desc any(dims{in, cols}, f32, dnnl::memory::format_tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (relu) {
      dnnl::post_ops po;
      append_relu_keeping_nan(po);
      attr.set_post_ops(po);
    }
    auto make = [&](int64_t stride, const dnnl::memory::desc& weights = dnnl::memory::desc()) {
      dnnl::memory::desc dst(dims{n, cols}, f32, dims{stride, 1});
      const dnnl::memory::desc& w = weights ? weights : any;
      auto desc = bias ? dnnl::matmul::desc(e->src, w, e->bias, dst) : dnnl::matmul::desc(e->src, w, dst);
      return dnnl::matmul::primitive_desc(desc, attr, engine);
    };
    auto starts = [](const dnnl::matmul::primitive_desc& p, const char* prefix) {
      return std::string(p.impl_info_str()).rfind(prefix, 0) == 0;
    };
    // One piece of y's columns writes into y's rows (stride ldy) where oneDNN's brgemm kernel takes
    // that; where only its gemm:jit kernel does (oneDNN 2.6 with AVX-512: it repacks the weights on
    // every call, and a 16 x 4608 x 256 piece ran slower than the whole 16 x 4608 x 512 product on
    // one thread), into a dense output of its own that brgemm takes, copied into y's rows after.
    // Dense 4608 -> 512 at 16 rows, 2 threads, weights streamed from memory: 633 -> 463-476 us.
    dnnl::matmul::primitive_desc pd = make(ldy);
    if (ldy != cols && !starts(pd, "brg")) {
      dnnl::matmul::primitive_desc dense = make(cols);
      if (starts(dense, "brg")) pd = dense, e->own_output = true;
    }
    if (starts(pd, "ref")) {
      e = nullptr;
    } else {
      e->dst = pd.dst_desc();
      e->ldy = ldy;
      e->packed = pd.weights_desc();
      e->packs = e->packed != e->plain;
      if (e->packs) e->pack = dnnl::reorder(dnnl::reorder::primitive_desc(engine, e->plain, engine, e->packed));
      set_primitive(*e, pd);
      // Without brgemm (oneDNN 2.6 below AVX-512) `any` gets gemm:jit with w transposed, a copy that
      // is no kernel's packed layout and was slower than w read as it is on most shapes (AVX2, 1
      // thread, 32 x 256 -> 1024: 338 vs 174 us; 128 x 784 -> 512: 1399 vs 959 us; 32 x 256 -> 62:
      // 10.5 vs 12.0 us). Both are kept until the first call times them on its data.
      if (e->packs && !starts(pd, "brg")) {
        dnnl::matmul::primitive_desc direct = make(e->own_output ? cols : ldy, e->plain);
        if (!starts(direct, "ref") && direct.dst_desc() == e->dst) {
          e->timing = true;
          e->direct = dnnl::matmul(direct);
          e->direct_scratch_desc = direct.scratchpad_desc();
          e->scratch = std::max(e->scratch, e->direct_scratch_desc.get_size());
        }
      }
    }
  } catch (const dnnl::error&) {
    e = nullptr;
  }
  return remember(l.cache, key, std::move(e), 256);
}

// One piece on the calling thread: w's packed copy for (w, stamp), packed now unless kept. The
// first call of an entry that is `timing` runs both kernels alternately, 3 times each (thread CPU
// time, as choose_engine), before its result from the kept copy.
void linear_piece(Linear& e, const float* x, const float* w, uint64_t stamp, const float* bias, float* y) {
  OneDnn& s = onednn();
  thread_local dnnl::stream stream(s.engine);
  thread_local std::vector<char> scratch;
  if (scratch.size() < e.scratch) scratch.resize(e.scratch);
  if (s.omp_set_num_threads) s.omp_set_num_threads(1);  // this pool thread's team: itself alone
  dnnl::memory plain(e.plain, s.engine, const_cast<float*>(w));
  auto weights = [&]() -> dnnl::memory {
    if (!e.packs) return plain;
    return e.kept.get(w, stamp, nullptr, 0, e.packed, s.engine,
                      [&](dnnl::memory& to) { e.pack.execute(stream, plain, to); });
  };
  const dnnl::memory::dims dims = e.dst.dims();
  const int64_t rows = dims[0], cols = dims[1];
  thread_local std::vector<float> piece;  // the dense output of one piece of y's columns
  float* out = y;
  if (e.own_output) {
    if (piece.size() < size_t(rows * cols)) piece.resize(size_t(rows * cols));
    out = piece.data();
  }
  auto run = [&](const dnnl::matmul& primitive, const dnnl::memory& wm, const dnnl::memory::desc& scratch_desc) {
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(e.src, s.engine, const_cast<float*>(x))},
                                               {DNNL_ARG_WEIGHTS, wm},
                                               {DNNL_ARG_DST, dnnl::memory(e.dst, s.engine, out)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bias, s.engine, const_cast<float*>(bias)));
    if (scratch_desc.get_size())
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_desc, s.engine, scratch.data()));
    primitive.execute(stream, args);
    stream.wait();
  };
  if (e.timing) {
    const dnnl::memory packed = weights();
    double best_packed = 1e30, best_direct = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = thread_seconds();
      run(e.primitive, packed, e.scratch_desc);
      const double t1 = thread_seconds();
      run(e.direct, plain, e.direct_scratch_desc);
      const double t2 = thread_seconds();
      best_packed = std::min(best_packed, t1 - t0);
      best_direct = std::min(best_direct, t2 - t1);
    }
    e.packed_seconds = best_packed;
    e.direct_seconds = best_direct;
  }
  run(e.primitive, weights(), e.scratch_desc);
  if (out != y)
    for (int64_t r = 0; r < rows; ++r) std::copy(out + r * cols, out + (r + 1) * cols, y + r * e.ldy);
}
#endif
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

// Which kernel runs a call shape: our panels where oneDNN has no fast kernel for it (or is not built
// in); otherwise the first call times both on its own pieces (3 runs each, alternately, thread CPU
// time, as choose_engine), keeps the faster for the process and writes y with it (so that every
// call of a shape gives the same bits). On this AVX-512 core at 1 thread the panels measured
// 112 GFLOP/s under AVX2 against oneDNN 2.6's 105 (gemm:jit; no brgemm below AVX-512).
bool linear_forward(DType t, const void* x, const void* w, uint64_t w_stamp, const void* bias, void* y, int64_t n,
                    int64_t in, int64_t out, bool relu) {
  if (t != DType::f32 || w_stamp == 0 || n < kLinearMinRows || in == 0 || out == 0) return false;
  if (g_forced_engine.load(std::memory_order_relaxed) == int(GemmEngine::openblas)) return false;
  const Pieces cut(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops);  // output columns
  const int64_t parts = cut.parts;
  const float* xf = static_cast<const float*>(x);
  const float* wf = static_cast<const float*>(w);
  const float* bf = static_cast<const float*>(bias);
  float* yf = static_cast<float*>(y);
  Linears& l = linears();
  std::lock_guard<std::mutex> lock(l.mutex);
  LinearKernel& choice =
      l.choice.try_emplace(choice_key(n, in, out, bias != nullptr, relu), LinearKernel::automatic).first->second;
  const int forced = g_forced_linear.load(std::memory_order_relaxed);
  const LinearKernel use = forced >= 0 ? LinearKernel(forced) : choice;
  const float* panels = nullptr;
  auto panel_part = [&](int64_t p) {
    if (cut.lo(p) < cut.hi(p)) panel_piece(xf, n, in, panels, cut.lo(p), cut.hi(p), out, bf, relu, yf);
  };
  auto run_panels = [&] {
    panels = kept_panels(l, wf, w_stamp, in, out);
    each_piece(parts, panel_part);
  };
  if (use == LinearKernel::panels) {
    run_panels();
    return true;
  }
#if FLUX_HAVE_ONEDNN
  // oneDNN sizes a primitive's thread team when it is created: one thread, as each piece runs on one
  // (a reorder created in a two-thread team woke a second OpenMP thread, which then spun on a core).
  if (onednn().omp_set_num_threads) onednn().omp_set_num_threads(1);
  std::vector<Linear*> entries(size_t(parts), nullptr);
  bool have_onednn = true;
  for (int64_t p = 0; p < parts && have_onednn; ++p) {
    if (cut.lo(p) >= cut.hi(p)) continue;
    entries[size_t(p)] = linear_entry(n, in, cut.hi(p) - cut.lo(p), out, bias != nullptr, relu, parts > 1 ? p : -1);
    have_onednn = entries[size_t(p)] != nullptr;
  }
  if (!have_onednn) {  // oneDNN offers only its reference kernel here, or declines
    if (use == LinearKernel::onednn) return false;
    choice = LinearKernel::panels;
    run_panels();
    return true;
  }
  auto run = [&](int64_t p) {
    if (entries[size_t(p)])
      linear_piece(*entries[size_t(p)], xf, wf + cut.lo(p) * in, w_stamp, bf ? bf + cut.lo(p) : nullptr,
                   yf + cut.lo(p));
  };
  each_piece(parts, run);
  // Pieces just timed: all read w as it is, or all the kept copy, by their summed times (so that
  // one call never mixes the two).
  double packed = 0, direct = 0;
  bool timed = false;
  for (Linear* e : entries)
    if (e && e->timing) timed = true, packed += e->packed_seconds, direct += e->direct_seconds;
  if (timed)
    for (Linear* e : entries) {
      if (!e || !e->timing) continue;
      if (direct <= packed) {  // from now on: w as it is, no copy kept
        e->primitive = e->direct;
        e->scratch_desc = e->direct_scratch_desc;
        e->packs = false;
        e->packed = e->plain;
        e->kept = KeptWeights();
      }
      e->timing = false;
      e->direct = dnnl::matmul();
    }
  if (use == LinearKernel::automatic) {
    // The first call of this shape: oneDNN's kernel (as just settled) against the panels, piece by piece.
    panels = kept_panels(l, wf, w_stamp, in, out);
    std::vector<double> own(size_t(parts), 0.0), theirs(size_t(parts), 0.0);
    auto time_part = [&](int64_t p) {
      if (cut.lo(p) >= cut.hi(p)) return;
      double best_own = 1e30, best_theirs = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const double t0 = thread_seconds();
        panel_part(p);
        const double t1 = thread_seconds();
        run(p);
        const double t2 = thread_seconds();
        best_own = std::min(best_own, t1 - t0);
        best_theirs = std::min(best_theirs, t2 - t1);
      }
      own[size_t(p)] = best_own, theirs[size_t(p)] = best_theirs;
    };
    each_piece(parts, time_part);
    double sum_own = 0, sum_theirs = 0;
    for (int64_t p = 0; p < parts; ++p) sum_own += own[size_t(p)], sum_theirs += theirs[size_t(p)];
    choice = sum_own <= sum_theirs ? LinearKernel::panels : LinearKernel::onednn;
    // The loser's copy of w goes (other layers of the shape will not make one: the choice is per shape).
    if (choice == LinearKernel::panels) {
      for (Linear* e : entries)
        if (e) e->kept = KeptWeights();
      run_panels();  // y last written by oneDNN: now by the kernel kept
    } else {
      l.panels.forget(wf);
    }
  }
  return true;
#else
  if (use == LinearKernel::onednn) return false;
  choice = LinearKernel::panels;
  run_panels();
  return true;
#endif
}

std::optional<bool> linear_reads_kept_copy(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  const Pieces cut(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops);
  Linears& l = linears();
  std::lock_guard<std::mutex> lock(l.mutex);
  auto chosen = l.choice.find(choice_key(n, in, out, bias, relu));
  if (chosen != l.choice.end() && chosen->second == LinearKernel::panels) return true;  // the panels are kept
#if FLUX_HAVE_ONEDNN
  bool kept = true;
  for (int64_t p = 0; p < cut.parts; ++p) {
    if (cut.lo(p) >= cut.hi(p)) continue;
    auto it = l.cache.find(LinearKey{n, in, cut.hi(p) - cut.lo(p), out, bias, relu, cut.parts > 1 ? p : -1});
    if (it == l.cache.end() || !it->second || it->second->timing) return std::nullopt;
    kept = kept && it->second->packs;
  }
  return kept;
#else
  return std::nullopt;
#endif
}

std::optional<LinearKernel> linear_kernel_of(int64_t n, int64_t in, int64_t out, bool bias, bool relu) {
  Linears& l = linears();
  std::lock_guard<std::mutex> lock(l.mutex);
  auto it = l.choice.find(choice_key(n, in, out, bias, relu));
  if (it == l.choice.end() || it->second == LinearKernel::automatic) return std::nullopt;
  return it->second;
}

LinearKernel force_linear_kernel(LinearKernel k) {
  int old = g_forced_linear.exchange(int(k));
  return old < 0 ? LinearKernel::automatic : LinearKernel(old);
}

GemmEngine force_gemm_engine(GemmEngine e) {
  int old = g_forced_engine.exchange(int(e));
  return old < 0 ? GemmEngine::automatic : GemmEngine(old);
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

}  // namespace flux::cpu_backend

namespace flux::detail {
// For bench/flux_bench.cpp (which cannot see flux::cpu: flux.hpp's flux::cpu is the mover):
// -1 automatic, 0 OpenBLAS, 1 oneDNN; returns the previous setting.
int cpu_force_gemm_engine(int engine) { return int(cpu_backend::force_gemm_engine(cpu_backend::GemmEngine(engine))); }
// -1 automatic, 0 oneDNN, 1 flux's panels (linear_forward); returns the previous setting.
int cpu_force_linear_kernel(int kernel) { return int(cpu_backend::force_linear_kernel(cpu_backend::LinearKernel(kernel))); }
// -1 timed per geometry, 0 never, 1 always where it fits (conv.cpp's Winograd forwards); returns the previous setting.
int cpu_force_conv_winograd(int mode) { return cpu_backend::force_conv_winograd(mode); }
}  // namespace flux::detail
