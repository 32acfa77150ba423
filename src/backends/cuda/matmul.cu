// Batched row-major GEMM on the GPU (reference: src/backends/cpu/matmul.cpp).
//   CUDA:   cuBLAS strided-batched S/D GEMM (f16/bf16 through GemmStridedBatchedEx with
//           CUBLAS_COMPUTE_32F: tensor cores, float32 accumulation, alpha/beta in float32; this is
//           also matmul_low_precision); row-major C = A B is column-major C^T = B^T A^T, so the
//           operands are swapped. One handle per host thread and device (handle_pool.hpp): threads
//           never share one, as cuBLAS asks.
//   AMDGPU: no rocBLAS in Debian 12, so floats use the tiled kernel below, as integers do on both.
#include "src/backends/cuda/cuda_backend.hpp"
#include "src/backends/cuda/handle_pool.hpp"

#ifndef FLUX_HIP
#include <cublas_v2.h>
#endif

namespace flux::cuda_backend {

namespace {

// Tiled GEMM: a block computes a 64 x 64 tile of C[b] from 64 x 16 / 16 x 64 tiles of A and B in
// shared memory; each of its 16 x 16 threads owns 4 x 4 outputs, strided by 16 (conflict-free reads).
// M, N, K = g.m, g.n, g.k; A is [M, K] (or [K, M] when trans_a), B is [K, N] (or [N, K]).
constexpr int kTile = 64, kDepth = 16, kSide = 16, kPer = kTile / kSide;

template <class T> __global__ void __launch_bounds__(kSide * kSide)
gemm_tiled(const T* A, const T* B, T* C, backend::Gemm g, T alpha, T beta) {
  __shared__ T As[kDepth][kTile + 1];
  __shared__ T Bs[kDepth][kTile + 1];
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide, tid = threadIdx.x;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < g.batch; b += gridDim.z) {
    const T* a = A + b * g.stride_a;
    const T* bm = B + b * g.stride_b;
    T* c = C + b * g.stride_c;
    T acc[kPer][kPer];
    for (int r = 0; r < kPer; ++r)
      for (int q = 0; q < kPer; ++q) acc[r][q] = T(0);
    for (int64_t k0 = 0; k0 < g.k; k0 += kDepth) {
      for (int e = tid; e < kTile * kDepth; e += kSide * kSide) {
        // consecutive threads read consecutive addresses in either layout
        int r = g.trans_a ? e % kTile : e / kDepth, kk = g.trans_a ? e / kTile : e % kDepth;
        int64_t i = m0 + r, l = k0 + kk;
        As[kk][r] = (i < g.m && l < g.k) ? (g.trans_a ? a[l * g.m + i] : a[i * g.k + l]) : T(0);
        int q = g.trans_b ? e / kDepth : e % kTile, kb = g.trans_b ? e % kDepth : e / kTile;
        int64_t j = n0 + q, lb = k0 + kb;
        Bs[kb][q] = (j < g.n && lb < g.k) ? (g.trans_b ? bm[j * g.k + lb] : bm[lb * g.n + j]) : T(0);
      }
      __syncthreads();
      for (int kk = 0; kk < kDepth; ++kk) {
        T av[kPer], bv[kPer];
        for (int r = 0; r < kPer; ++r) av[r] = As[kk][ty + kSide * r];
        for (int q = 0; q < kPer; ++q) bv[q] = Bs[kk][tx + kSide * q];
        for (int r = 0; r < kPer; ++r)
          for (int q = 0; q < kPer; ++q) acc[r][q] += av[r] * bv[q];
      }
      __syncthreads();
    }
    for (int r = 0; r < kPer; ++r)
      for (int q = 0; q < kPer; ++q) {
        int64_t i = m0 + ty + kSide * r, j = n0 + tx + kSide * q;
        if (i < g.m && j < g.n) {
          T out = alpha * acc[r][q];
          if (beta != T(0)) out += beta * c[i * g.n + j];
          c[i * g.n + j] = out;
        }
      }
  }
}

template <class T> void tiled(Stream s, const void* a, const void* b, void* c, const backend::Gemm& g) {
  dim3 grid(unsigned((g.n + kTile - 1) / kTile), unsigned((g.m + kTile - 1) / kTile),
            unsigned(g.batch < 65535 ? g.batch : 65535));
  if (grid.y > 65535) detail::fail("[matmul] ", g.m, " rows exceed the tiled kernel's grid (", 65535 * kTile, ")");
  gemm_tiled<T><<<grid, kSide * kSide, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), g,
                                               T(g.alpha), T(g.beta));
  check_launch("matmul (tiled) kernel");
}

#ifndef FLUX_HIP
void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) detail::fail("[matmul] ", what, " failed: ", cublasGetStatusString(st));
}

/// cuBLAS's side of the per-thread handles (handle_pool.hpp): one per host thread and device, created
/// on first use with that device current (a failed cublasCreate throws, on every call).
struct CublasLibrary {
  using Handle = cublasHandle_t;
  using Stream = cuda_backend::Stream;
  static Handle create(int) {
    cublasHandle_t h = nullptr;
    check_blas(cublasCreate(&h), "cublasCreate");
    return h;
  }
  static void bind(Handle h, Stream s, int) { check_blas(cublasSetStream(h, s), "cublasSetStream"); }
};

void cublas_gemm(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  for (int64_t v : {g.m, g.n, g.k, g.batch})
    if (v > INT32_MAX) detail::fail("[matmul] dimension ", v, " exceeds cuBLAS's 32-bit sizes");
  cublasHandle_t h = HandlePool<CublasLibrary>::get(device, s);
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = int(g.m), n = int(g.n), k = int(g.k), batch = int(g.batch);
  const int lda = int(g.trans_a ? g.m : g.k), ldb = int(g.trans_b ? g.k : g.n), ldc = int(g.n);
  switch (t) {
    case DType::f32: {
      const float alpha = float(g.alpha), beta = float(g.beta);
      check_blas(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, static_cast<const float*>(b), ldb, g.stride_b,
                                           static_cast<const float*>(a), lda, g.stride_a, &beta, static_cast<float*>(c),
                                           ldc, g.stride_c, batch),
                 "cublasSgemmStridedBatched");
    } break;
    case DType::f64: {
      const double alpha = g.alpha, beta = g.beta;
      check_blas(cublasDgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, static_cast<const double*>(b), ldb,
                                           g.stride_b, static_cast<const double*>(a), lda, g.stride_a, &beta,
                                           static_cast<double*>(c), ldc, g.stride_c, batch),
                 "cublasDgemmStridedBatched");
    } break;
    default: {  // f16 / bf16 storage, f32 accumulation
      const cudaDataType_t type = t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
      const float alpha = float(g.alpha), beta = float(g.beta);
      check_blas(cublasGemmStridedBatchedEx(h, op_b, op_a, n, m, k, &alpha, b, type, ldb, g.stride_b, a, type, lda,
                                            g.stride_a, &beta, c, type, ldc, g.stride_c, batch, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
    }
  }
}
#endif

}  // namespace

void matmul(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) {  // as the CPU: an empty inner dimension gives zeros
    fill(s, t, c, g.batch * g.m * g.n, 0.0);
    return;
  }
  switch (t) {
#ifdef FLUX_HIP
    case DType::f32: tiled<float>(s, a, b, c, g); break;
    case DType::f64: tiled<double>(s, a, b, c, g); break;
#else
    case DType::f32: case DType::f64: case DType::f16: case DType::bf16: cublas_gemm(device, s, t, a, b, c, g); break;
#endif
    case DType::i32: tiled<int32_t>(s, a, b, c, g); break;
    case DType::i64: tiled<int64_t>(s, a, b, c, g); break;
    default: detail::fail("[matmul] " FLUX_GPU_BACKEND_NAME " kernel does not support ", dtype_name(t));
  }
  (void)device;
}

bool matmul_low_precision(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  if (t != DType::f16 && t != DType::bf16) return false;
#ifdef FLUX_HIP
  (void)device, (void)s, (void)a, (void)b, (void)c, (void)g;
  return false;  // no rocBLAS: the core computes through float32
#else
  matmul(device, s, t, a, b, c, g);  // empty shapes and k = 0 as every dtype; then cublasGemmStridedBatchedEx
  return true;
#endif
}

std::string blas_version() {
#ifdef FLUX_HIP
  return "own tiled GEMM kernel (no rocBLAS in Debian 12)";
#else
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return "cuBLAS " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch) +
         " (integer GEMM: own tiled kernel)";
#endif
}

}  // namespace flux::cuda_backend
