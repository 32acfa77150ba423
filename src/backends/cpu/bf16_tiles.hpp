// bf16 tile products for the fused attention (attention.cpp): C = alpha A·B (+ C) with A and B in bf16
// and the sum over k in Float32. Two implementations of one contract: an AVX512-BF16 micro-kernel
// (vdpbf16ps: 16 lanes of a pair of bf16 products added to a Float32 accumulator) where the CPU has
// the instruction, and a portable scalar reference the tests compare it with.
//
// Layouts (bf16 as uint16_t bits, k in pairs as vdpbf16ps reads it):
//   A (m, k): element (i, kk) at a[i * a_row + (kk / 2) * a_pair + kk % 2]; a plain row-major matrix
//     is a_row = its row stride, a_pair = 2; a "pair-packed" transposed one (pack_row_pairs of Aᵀ)
//     is a_row = 2, a_pair = 2 * ldb. When k is odd the last pair's second element is not read.
//   B (k, n): pair-packed, element (kk, j) at b[(kk / 2) * 2 * ldb + 2 * j + kk % 2] (ldb >= n): the
//     layout pack_row_pairs writes from row-major rows and pack_transposed_pairs from the rows of Bᵀ;
//     the second element of an odd k's last pair is 0.
#pragma once
#include <cstdint>

namespace flux::cpu_backend {

/// Whether the AVX512-BF16 micro-kernel runs now: the CPU has AVX512-BF16 and the active ISA level
/// (force_isa, ONEDNN_MAX_CPU_ISA) is AVX-512.
bool bf16_tile_kernel_available();

/// c (m, n, row stride ldc) = alpha A·B, plus c's old values when `accumulate`. `fast`: the
/// AVX512-BF16 kernel (only where bf16_tile_kernel_available()), else the portable reference.
void bf16_tile_product(bool fast, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t a_row,
                       int64_t a_pair, const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

/// B pair-packed from `rows` row-major rows of `cols` bf16 (row stride ld): rows 2p and 2p + 1
/// interleaved into dst's pair row p (stride 2 * ldb elements); an odd last row pairs with 0.
void pack_row_pairs(bool fast, const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldb);

/// B = Sᵀ pair-packed from S's `rows` row-major rows of `cols` bf16 (row stride ld): B's pair row p
/// holds (S[j][2p], S[j][2p + 1]) for every j < rows, at dst + p * 2 * ldb + 2 j; odd cols pair with 0.
/// `fast`: AVX-512 16 x 16 transposes (where bf16_tile_kernel_available()).
void pack_transposed_pairs(bool fast, const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldb);

/// `rows` rows of `cols` Float32 (row stride ld) rounded to bf16 rows (row stride ldd); an odd cols
/// gets a 0 after each row's end when ldd > cols (the pair the tile product reads).
void float_rows_to_bf16(const float* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldd);

/// `rows` rows of `cols` Float32 (row stride ld) rounded to bf16 in B's pair layout (pack_row_pairs of
/// the rounded rows: dst, pair-row stride 2 * ldb) and, where `natural` is not null, also as rows
/// (stride ldn, as float_rows_to_bf16). `fast`: AVX512-BF16 (vcvtneps2bf16, subnormals flushed).
void float_rows_to_bf16_pairs(bool fast, const float* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst,
                              int64_t ldb, uint16_t* natural, int64_t ldn);

}  // namespace flux::cpu_backend
