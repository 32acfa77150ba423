// The matmul family's questions to the kernel-choice seam (kernel_choice.hpp), by name, as
// conv_query.hpp's for convolutions: what matmul.cpp asks, what its tuner timers read back, and what
// the tuner prints. Query::dims holds the fields in the order written here (the tuned table stores
// them so).
#pragma once
#include <cstdint>

#include "src/backends/cpu/kernel_choice.hpp"

namespace flux::cpu_backend {

/// Site::gemm: one f32 GEMM piece C (m, n) = alpha op(A) op(B) + beta C, row-major (alpha is not asked).
struct GemmQuery {
  int64_t m = 1, n = 1, k = 1;
  bool trans_a = false, trans_b = false;
  int64_t lda = 1, ldb = 1, ldc = 1;
  bool accumulate = false;  // beta != 0

  static GemmQuery from(const Query& q) {
    const auto& d = q.dims;
    return {d[0], d[1], d[2], d[3] != 0, d[4] != 0, d[5], d[6], d[7], d[8] != 0};
  }
  Query query(int threads) const {
    Query q;
    q.site = Site::gemm;
    q.threads = threads;
    q.dims = {m, n, k, trans_a, trans_b, lda, ldb, ldc, accumulate};
    return q;
  }
};

/// Site::linear: a Dense inference y (n, out) = relu?(x (n, in) w^T + bias).
struct LinearQuery {
  int64_t n = 1, in = 1, out = 1;
  bool bias = false, relu = false;

  static LinearQuery from(const Query& q) {
    const auto& d = q.dims;
    return {d[0], d[1], d[2], d[3] != 0, d[4] != 0};
  }
  Query query(int threads) const {
    Query q;
    q.site = Site::linear;
    q.threads = threads;
    q.dims = {n, in, out, bias, relu};
    return q;
  }
};

}  // namespace flux::cpu_backend
