// The parts of the CPU matmul family, for its files: matmul.cpp (which kernel runs a call),
// matmul_blas.cpp (OpenBLAS, and how a GEMM is cut over the pool), matmul_onednn.cpp (oneDNN's f32
// matmul, and Dense inference on weights in its layouts), matmul_bf16.cpp (oneDNN's bf16 matmul) and
// matmul_own.cpp (flux's 16-output panels for Dense inference). The oneDNN files compile to
// `return false` without oneDNN.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

// Work below which a GEMM stays on the calling thread (~10-20 us at tens of GFLOP/s) and on
// OpenBLAS (a library call's own overhead matters there; the seed MLP's GEMMs are such).
constexpr double kSplitFlops = double(1 << 20);

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
/// Matrix elements below which a GEMV stays on the calling thread: it streams its matrix once, so
/// the work is the bytes read; 2^17 floats (512 KiB) take ~10 us from L3 on one core.
constexpr double kSplitGemvElements = double(1 << 17);
/// A Dense inference's output columns cut over the pool (y (n, out) = x (n, in) w^T). One row streams
/// w once: cut by w's elements, as a GEMV (gemv_split); its multiply-adds alone would keep a layer that
/// is worth cutting on one thread.
inline Pieces dense_pieces(int64_t n, int64_t in, int64_t out) {
  if (n == 1) return Pieces(out, double(in) * double(out), kSplitGemvElements);
  return Pieces(out, 2.0 * double(n) * double(in) * double(out), kSplitFlops);
}

/// fn(p) for every piece p: on this thread for one, over the pool otherwise (matmul_blas.cpp).
void each_piece(int64_t parts, const std::function<void(int64_t)>& fn);

// ---- matmul_blas.cpp ----
/// A float32 or float64 GEMM (Backend::matmul) through OpenBLAS on one thread per piece, cut over
/// the pool; float32 pieces go to gemm_on_this_thread (the seam's engine).
void gemm_blas(const float* a, const float* b, float* c, const backend::Gemm& g);
void gemm_blas(const double* a, const double* b, double* c, const backend::Gemm& g);
/// One single-threaded OpenBLAS sgemm (counted as an openblas call) or dgemm, row-major.
void blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc);
void blas_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
               int ldb, double beta, double* c, int ldc);
/// Counts one float32 library call of `engine` (gemm_engine_calls).
void count_call(Kernel engine);

// ---- matmul_onednn.cpp ----
/// One f32 piece C (m, n) = alpha op(A) op(B) + beta C on oneDNN on the calling thread; false
/// (nothing written) where oneDNN has no kernel for the shape or, unless `any_size`, its scratchpad
/// would exceed 4 MiB.
bool onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool any_size);
/// Whether onednn_gemm (alpha 1, not any_size) takes the shape: what the tuner may time.
bool onednn_gemm_takes(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                       float beta);
/// oneDNN's primitive for one piece shape of dtype t (f32, or bf16 with float32 accumulation; C of
/// dtype t, or Float32 where float32_c), made once; null where oneDNN has no kernel (for bf16 also
/// where it offers only its reference kernel). Defined where oneDNN is built in.
struct OnednnMatmul;
const OnednnMatmul* onednn_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda,
                                  int64_t ldb, float beta, int64_t ldc, DType t, bool float32_c = false);
/// Runs e on the calling thread, C from A and B.
void onednn_matmul_run(const OnednnMatmul& e, const void* a, const void* b, void* c);
/// Dense inference y (n, out) = relu?(x (n, in) w^T + bias) on oneDNN's matmul for dtype t (f32, or bf16:
/// every array bf16, float32 accumulation), output columns cut as `cut`; the weights prepared in its
/// kernels' layouts are kept in `cache`; without one, each piece reads w as it is or packs it into its
/// scratch as Site::linear_weights says (`forced`, where a candidate: the tuner's timer). false (nothing
/// written) where oneDNN declines a piece.
bool linear_onednn(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                   int64_t n, int64_t in, int64_t out, bool relu, const Pieces& cut, Kernel forced = Kernel(-1));

// ---- matmul_bf16.cpp ----
/// bf16 GEMM (matmul_low_precision; C bf16, or Float32 unrounded) and Dense inference (linear_forward's
/// bf16 case) on oneDNN's bf16 matmul, float32 accumulation; false (C / y untouched) where oneDNN declines.
bool gemm_bf16(const uint16_t* a, const uint16_t* b, uint16_t* c, const backend::Gemm& g);
bool gemm_bf16(const uint16_t* a, const uint16_t* b, float* c, const backend::Gemm& g);
bool linear_bf16(const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y, int64_t n,
                 int64_t in, int64_t out, bool relu);

// ---- matmul_own.cpp ----
/// Dense inference on flux's panels of w, packed once per content and kept in `cache`; output
/// columns cut as `cut`.
void linear_panels(const float* x, const float* w, backend::PreparedCache* cache, const float* bias, float* y,
                   int64_t n, int64_t in, int64_t out, bool relu, const Pieces& cut);

}  // namespace flux::cpu_backend
