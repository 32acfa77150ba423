// The register-blocked product under conv_own.cpp's few-pixel forwards, matmul_own.cpp's Dense panels and
// (through the panels) winograd.cpp: R rows of y held in registers as R x V vectors over one pass of
// k, each x value broadcast against the V vectors of b's row. Vec: L floats, the active ISA's vector
// (4-byte aligned, so loads and stores through Vec* need no alignment). No local's address is taken:
// that kept GCC from holding acc in registers (it stored all of acc every iteration). x's rows are
// addressed from base pointers three rows apart (with an array of one pointer a row GCC spilled
// them). What each cost: bench/results/2026-12-06-notes-from-comments.md. Call it from a function
// with the ISA's target attribute, not from a lambda (a lambda is compiled for the baseline ISA
// whatever encloses it).
#pragma once
#include <cstdint>

#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

using Vec16 = float __attribute__((vector_size(64), aligned(4)));
using Vec8 = float __attribute__((vector_size(32), aligned(4)));
using Vec4 = float __attribute__((vector_size(16), aligned(4)));

/// y (R, V L; rows ldy apart) = relu?(x (R, k; rows ldx apart) b (k, V L; dense) + bias (V L; null: none)).
template <class Vec, int R, int V>
FLUX_CPU_INLINE void broadcast_rows(const float* x, int64_t ldx, const float* b, int64_t k, const float* bias,
                                    bool relu, float* y, int64_t ldy) {
  static_assert(R <= 12, "four base pointers");
  constexpr int L = int(sizeof(Vec) / sizeof(float));
  Vec acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = Vec{};
  // Rows 3j, 3j + 1, 3j + 2 from base[j] (pointers only to rows that exist).
  const float* base[4] = {x, R > 3 ? x + 3 * ldx : x, R > 6 ? x + 6 * ldx : x, R > 9 ? x + 9 * ldx : x};
  for (int64_t i = 0; i < k; ++i) {
    Vec bv[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = *reinterpret_cast<const Vec*>(b + (i * V + v) * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float a = base[r / 3][(r % 3) * ldx + i];
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] += a * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      Vec s = acc[r][v];
      if (bias) s += *reinterpret_cast<const Vec*>(bias + v * L);
      if (relu) s = s <= Vec{} ? Vec{} : s;  // NaN stays NaN (not max(s, 0))
      *reinterpret_cast<Vec*>(y + r * ldy + v * L) = s;
    }
}

/// broadcast_rows for `rows` (1 to R) rows.
template <class Vec, int R, int V>
FLUX_CPU_INLINE void broadcast_block(int64_t rows, const float* x, int64_t ldx, const float* b, int64_t k,
                                     const float* bias, bool relu, float* y, int64_t ldy) {
  if constexpr (R > 1) {
    if (rows < R) return broadcast_block<Vec, R - 1, V>(rows, x, ldx, b, k, bias, relu, y, ldy);
  }
  broadcast_rows<Vec, R, V>(x, ldx, b, k, bias, relu, y, ldy);
}

}  // namespace flux::cpu_backend
