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
// along m: rows of A and of C are dense and B is whole; a transposed A (a weight gradient dYᵀ x) has its
// piece's rows copied row-major into the call's scratch first, while that copy stays within
// kCopyBytes. A larger transposed piece is cut strided as before (along the longer of m and n): its
// strided copy ran at a fraction of memory speed and cost more than gemm:jit's packing, which at that
// size runs at brgemm's rate. Only a product with m under 32 is always cut along n.
#include "src/backends/cpu/matmul_kernels.hpp"

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <type_traits>
#include <vector>

#include "src/backends/cpu/onednn.hpp"

namespace flux::cpu_backend {

namespace {
// The largest transposed-A piece copied row-major for brgemm (bytes): the MNIST MLP's weight gradients'
// pieces are 64 KiB; the encoder's, 1-2 MiB, copied slower than gemm:jit ran them strided.
constexpr size_t kCopyBytes = size_t(256) << 10;

// rows [lo, hi) of op(A) = A^T, A stored (k, lda): out (hi - lo, k) row-major, by the backend's strided
// copy (reads along A's rows, writes down out's columns).
void transposed_rows(const uint16_t* a, int64_t lda, int64_t k, int64_t lo, int64_t hi, uint16_t* out) {
  backend::StridedCopy plan;
  plan.ndim = 2;
  plan.shape[0] = k, plan.src_stride[0] = lda, plan.dst_stride[0] = 1;
  plan.shape[1] = hi - lo, plan.src_stride[1] = 1, plan.dst_stride[1] = k;
  strided_copy(DType::bf16, a + lo, out, plan);
}

// C's elements: uint16_t (bf16) or float (the accumulation unrounded).
template <class C> bool cut_and_run(const uint16_t* a, const uint16_t* b, C* c, const backend::Gemm& g) {
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
  if (how == Cut::along_m && g.trans_a) {
    const Pieces rows(g.m, flops, kSplitFlops);
    const double copy = double(rows.hi(0) - rows.lo(0)) * double(g.k) * double(sizeof(uint16_t));
    how = copy <= double(kCopyBytes) ? Cut::along_m_copied : g.n >= g.m ? Cut::along_n : Cut::along_m_strided;
  }
  const Pieces cut(how == Cut::along_n ? g.n : g.m, flops, kSplitFlops);
  const bool whole = g.batch >= num_threads() || flops < kSplitFlops || cut.parts <= 1;
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
