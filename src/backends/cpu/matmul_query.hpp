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
  Query query(int threads) const { return {Site::gemm, threads, {m, n, k, trans_a, trans_b, lda, ldb, ldc, accumulate}}; }
};

/// Site::linear: a Dense inference y (n, out) = relu?(x (n, in) w^T + bias).
struct LinearQuery {
  int64_t n = 1, in = 1, out = 1;
  bool bias = false, relu = false;

  static LinearQuery from(const Query& q) {
    const auto& d = q.dims;
    return {d[0], d[1], d[2], d[3] != 0, d[4] != 0};
  }
  Query query(int threads) const { return {Site::linear, threads, {n, in, out, bias, relu}}; }
};

/// Site::linear_weights: one piece of a Dense forward without prepared weights (training), y (n, cols) =
/// relu?(x (n, in) w^T + bias) in dtype `dtype` (DType as int: f32 or bf16), whose oneDNN kernel wants w
/// packed: the kernel on w as it is (Kernel::in_place), or w packed into the call's scratch (packed).
struct LinearWeightsQuery {
  int64_t n = 1, in = 1, cols = 1;
  bool bias = false, relu = false;
  int64_t dtype = 0;

  static LinearWeightsQuery from(const Query& q) {
    const auto& d = q.dims;
    return {d[0], d[1], d[2], d[3] != 0, d[4] != 0, d[5]};
  }
  Query query(int threads) const { return {Site::linear_weights, threads, {n, in, cols, bias, relu, dtype}}; }
};

/// Site::bf16_transposed_a: a bf16 GEMM C (m, n) = A^T op(B), A stored (k, m), cut along m over the pool
/// into pieces of piece_rows rows (the largest): each piece's rows of A^T copied row-major first
/// (Kernel::copied), or the product cut strided (strided: along n where n >= m, else along m).
struct TransposedAQuery {
  int64_t m = 1, n = 1, k = 1, piece_rows = 1;
  bool trans_b = false, float32_c = false;

  static TransposedAQuery from(const Query& q) {
    const auto& d = q.dims;
    return {d[0], d[1], d[2], d[3], d[4] != 0, d[5] != 0};
  }
  Query query(int threads) const {
    return {Site::bf16_transposed_a, threads, {m, n, k, piece_rows, trans_b, float32_c}};
  }
};

}  // namespace flux::cpu_backend
