// GEMM on the CPU: BLAS sgemm/dgemm for floats (transposes folded into the call), loops for integers.
#include <cblas.h>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu {

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

void matmul(DType t, const void* a, const void* b, void* c, const backend::Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
  int lda = int(g.trans_a ? g.m : g.k), ldb = int(g.trans_b ? g.k : g.n), ldc = int(g.n);
  if (g.k == 0) {
    fill(t, c, g.batch * g.m * g.n, 0.0);
    return;
  }
  switch (t) {
    case DType::f32:
      for (int64_t p = 0; p < g.batch; ++p)
        cblas_sgemm(CblasRowMajor, ta, tb, int(g.m), int(g.n), int(g.k), float(g.alpha),
                    static_cast<const float*>(a) + p * g.stride_a, lda, static_cast<const float*>(b) + p * g.stride_b,
                    ldb, float(g.beta), static_cast<float*>(c) + p * g.stride_c, ldc);
      break;
    case DType::f64:
      for (int64_t p = 0; p < g.batch; ++p)
        cblas_dgemm(CblasRowMajor, ta, tb, int(g.m), int(g.n), int(g.k), g.alpha,
                    static_cast<const double*>(a) + p * g.stride_a, lda, static_cast<const double*>(b) + p * g.stride_b,
                    ldb, g.beta, static_cast<double*>(c) + p * g.stride_c, ldc);
      break;
    case DType::i32: gemm_loops(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), static_cast<int32_t*>(c), g); break;
    case DType::i64: gemm_loops(static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), static_cast<int64_t*>(c), g); break;
    default: detail::fail("[matmul] CPU kernel does not support ", dtype_name(t));
  }
}

}  // namespace flux::cpu
