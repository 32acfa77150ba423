// bf16 products on the CPU (Backend::matmul_low_precision, linear_forward's bf16 case): oneDNN's bf16
// matmul with float32 accumulation, where the CPU has bf16 units (isa.hpp, bf16_kernels_enabled). A
// GEMM runs whole per matrix when there are at least as many matrices as threads, else each matrix is
// cut over the pool in multiples of 16 (Pieces), one single-threaded oneDNN call per piece. Every
// piece's primitive is found before any runs, so a shape oneDNN declines leaves C untouched for the
// core's float32 path.
//
// The cut keeps a piece's operands dense where that pays: oneDNN 2.6 runs its brgemm kernels only on
// dense memory, and a strided piece (a block of B's or C's columns, or of a transposed A's) goes to its
// gemm:jit kernel, whose packing buffers are malloc'd at every call; on the small products of a
// training step the heap grew and was trimmed again at every step (page faults and brk calls;
// bench/results/2026-12-07-mnist-bf16-dense-pieces.md). So a matrix with m of two blocks or more is cut
// along m: rows of A and of C are dense and B is whole. A transposed A (a weight gradient dYᵀ x) either
// has its piece's rows copied row-major into the call's scratch first, or is cut strided (along the
// longer of m and n), as the kernel-choice seam says (Site::bf16_transposed_a: small pieces copied; a
// large piece's strided copy ran at a fraction of memory speed and cost more than gemm:jit's packing,
// which at that size runs at brgemm's rate). Only a product with m under 32 is always cut along n.
#include "src/backends/cpu/matmul_kernels.hpp"

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <limits>
#include <type_traits>
#include <vector>

#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/onednn.hpp"

namespace flux::cpu_backend {

namespace {
// rows [lo, hi) of op(A) = A^T, A stored (k, lda): out (hi - lo, k) row-major, by the backend's strided
// copy (reads along A's rows, writes down out's columns).
void transposed_rows(const uint16_t* a, int64_t lda, int64_t k, int64_t lo, int64_t hi, uint16_t* out) {
  backend::StridedCopy plan;
  plan.ndim = 2;
  plan.shape[0] = k, plan.src_stride[0] = lda, plan.dst_stride[0] = 1;
  plan.shape[1] = hi - lo, plan.src_stride[1] = 1, plan.dst_stride[1] = k;
  strided_copy(DType::bf16, a + lo, out, plan);
}

// C's elements: uint16_t (bf16) or float (the accumulation unrounded). `forced`: the transposed A's
// cut where the seam would choose it (the tuner's timer).
template <class C>
bool cut_and_run(const uint16_t* a, const uint16_t* b, C* c, const backend::Gemm& g, Kernel forced = Kernel(-1)) {
  constexpr bool float32_c = std::is_same_v<C, float>;
  const int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
  const float alpha = float(g.alpha), beta = float(g.beta);
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  struct Piece {
    const OnednnMatmul* e;
    const uint16_t *a, *b;
    C* c;
    int64_t lo = 0, hi = 0;  // rows of a transposed A to copy first (lo < hi), else nothing to copy
  };
  std::vector<Piece> pieces;
  auto add = [&](bool ta, int64_t m, int64_t n, int64_t lda_p, const uint16_t* ap, const uint16_t* bp, C* cp,
                 int64_t lo = 0, int64_t hi = 0) {
    const OnednnMatmul* e = onednn_matmul(ta, g.trans_b, m, n, g.k, alpha, lda_p, ldb, beta, ldc, DType::bf16, float32_c);
    pieces.push_back({e, ap, bp, cp, lo, hi});
    return e != nullptr;
  };
  enum class Cut { along_m, along_m_copied, along_m_strided, along_n };
  Cut how = g.m < 32 ? Cut::along_n : Cut::along_m;
  const bool cuts = g.batch < num_threads() && flops >= kSplitFlops;
  if (how == Cut::along_m && g.trans_a && cuts) {
    const Pieces rows(g.m, flops, kSplitFlops);
    const Candidates both = bit(Kernel::copied) | bit(Kernel::strided);
    const Query q = TransposedAQuery{g.m, g.n, g.k, rows.hi(0) - rows.lo(0), g.trans_b, float32_c}.query(num_threads());
    const Kernel use = forced == Kernel::copied || forced == Kernel::strided ? forced : choose(q, both);
    how = use == Kernel::copied ? Cut::along_m_copied : g.n >= g.m ? Cut::along_n : Cut::along_m_strided;
  }
  const Pieces cut(how == Cut::along_n ? g.n : g.m, flops, kSplitFlops);
  const bool whole = !cuts || cut.parts <= 1;
  for (int64_t p = 0; p < g.batch; ++p) {
    const uint16_t* A = a + p * g.stride_a;
    const uint16_t* B = b + p * g.stride_b;
    C* out = c + p * g.stride_c;
    if (whole) {
      if (!add(g.trans_a, g.m, g.n, lda, A, B, out)) return false;
      continue;
    }
    for (int64_t q = 0; q < cut.parts; ++q) {
      const int64_t lo = cut.lo(q), hi = cut.hi(q);
      if (lo >= hi) continue;
      bool ok = false;
      switch (how) {
        case Cut::along_n: ok = add(g.trans_a, g.m, hi - lo, lda, A, g.trans_b ? B + lo * ldb : B + lo, out + lo); break;
        case Cut::along_m: ok = add(false, hi - lo, g.n, lda, A + lo * lda, B, out + lo * ldc); break;
        case Cut::along_m_strided: ok = add(true, hi - lo, g.n, lda, A + lo, B, out + lo * ldc); break;
        // A's rows lo..hi copied row-major (lda = k) before the call
        case Cut::along_m_copied: ok = add(false, hi - lo, g.n, g.k, A, B, out + lo * ldc, lo, hi); break;
      }
      if (!ok) return false;
    }
  }
  auto run = [&](const Piece& q) {
    if (q.lo >= q.hi) {
      onednn_matmul_run(*q.e, q.a, q.b, q.c);
      return;
    }
    onednn::CallScratch scratch;
    auto* rows = static_cast<uint16_t*>(
        scratch.get(onednn::Scratch::src, size_t(q.hi - q.lo) * size_t(g.k) * sizeof(uint16_t)));
    transposed_rows(q.a, lda, g.k, q.lo, q.hi, rows);
    onednn_matmul_run(*q.e, rows, q.b, q.c);
  };
  if (pieces.size() == 1) {
    run(pieces[0]);
    return true;
  }
  parallel_for(int64_t(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) run(pieces[size_t(p)]);
  });
  return true;
}

/// The tuner's timer for Site::bf16_transposed_a: the whole product C = A^T op(B) on operands of the
/// query's shape, its transposed A copied or cut strided (wall time: its pieces run on the pool; best of
/// reps); +infinity where the CPU has no bf16 kernels or oneDNN declines.
double time_transposed_a(const Query& q, Kernel kernel, int reps) {
  const TransposedAQuery t = TransposedAQuery::from(q);
  constexpr double kCannot = std::numeric_limits<double>::infinity();
  if (!bf16_kernels_enabled()) return kCannot;
  backend::Gemm g;
  g.m = t.m, g.n = t.n, g.k = t.k, g.trans_a = true, g.trans_b = t.trans_b;
  g.stride_a = t.m * t.k, g.stride_b = t.k * t.n, g.stride_c = t.m * t.n;
  const std::vector<uint16_t> a(size_t(t.m * t.k), 0x3f00), b(size_t(t.k * t.n), 0x3e80);  // 0.5, 0.25
  auto timed = [&](auto* c) {
    if (!cut_and_run(a.data(), b.data(), c, g, kernel)) return kCannot;
    return best_wall_seconds(reps, [&] { cut_and_run(a.data(), b.data(), c, g, kernel); });
  };
  try {
    if (t.float32_c) {
      std::vector<float> c(size_t(t.m * t.n));
      return timed(c.data());
    }
    std::vector<uint16_t> c(size_t(t.m * t.n));
    return timed(c.data());
  } catch (const dnnl::error&) {
    return kCannot;
  }
}
[[maybe_unused]] const bool transposed_a_timer_registered =
    (register_timer(Site::bf16_transposed_a, time_transposed_a), true);
}  // namespace

bool gemm_bf16(const uint16_t* a, const uint16_t* b, uint16_t* c, const backend::Gemm& g) {
  try {
    return cut_and_run(a, b, c, g);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool gemm_bf16(const uint16_t* a, const uint16_t* b, float* c, const backend::Gemm& g) {
  try {
    return cut_and_run(a, b, c, g);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool linear_bf16(const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y, int64_t n,
                 int64_t in, int64_t out, bool relu) {
  try {
    return linear_onednn(DType::bf16, x, w, cache, bias, y, n, in, out, relu, dense_pieces(n, in, out));
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace flux::cpu_backend

#else  // built without oneDNN: the core computes bf16 through float32

namespace flux::cpu_backend {
bool gemm_bf16(const uint16_t*, const uint16_t*, uint16_t*, const backend::Gemm&) { return false; }
bool gemm_bf16(const uint16_t*, const uint16_t*, float*, const backend::Gemm&) { return false; }
bool linear_bf16(const void*, const void*, backend::PreparedCache*, const void*, void*, int64_t, int64_t, int64_t,
                 bool) {
  return false;
}
}  // namespace flux::cpu_backend

#endif  // FLUX_HAVE_ONEDNN
