// bf16 products on the CPU (Backend::matmul_low_precision, linear_forward's bf16 case): oneDNN's bf16
// matmul with float32 accumulation, where the CPU has bf16 units (isa.hpp, bf16_kernels_enabled). A
// GEMM is cut as the f32 path cuts it (matmul_blas.cpp): whole matrices over the pool when there are
// at least as many as threads, else each matrix along the longer of m and n in multiples of 16
// (Pieces), one single-threaded oneDNN call per piece. Every piece's primitive is found before any
// runs, so a shape oneDNN declines leaves C untouched for the core's float32 path.
#include "src/backends/cpu/matmul_kernels.hpp"

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <vector>

namespace flux::cpu_backend {

namespace {
bool cut_and_run(const uint16_t* a, const uint16_t* b, uint16_t* c, const backend::Gemm& g) {
  const int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
  const float alpha = float(g.alpha), beta = float(g.beta);
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  struct Piece {
    const OnednnMatmul* e;
    const uint16_t *a, *b;
    uint16_t* c;
  };
  std::vector<Piece> pieces;
  auto add = [&](int64_t m, int64_t n, const uint16_t* ap, const uint16_t* bp, uint16_t* cp) {
    const OnednnMatmul* e = onednn_matmul(g.trans_a, g.trans_b, m, n, g.k, alpha, lda, ldb, beta, ldc, DType::bf16);
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
    onednn_matmul_run(*pieces[0].e, pieces[0].a, pieces[0].b, pieces[0].c);
    return true;
  }
  parallel_for(int64_t(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      onednn_matmul_run(*pieces[size_t(p)].e, pieces[size_t(p)].a, pieces[size_t(p)].b, pieces[size_t(p)].c);
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
bool linear_bf16(const void*, const void*, backend::PreparedCache*, const void*, void*, int64_t, int64_t, int64_t,
                 bool) {
  return false;
}
}  // namespace flux::cpu_backend

#endif  // FLUX_HAVE_ONEDNN
