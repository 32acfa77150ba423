// bf16 tile products (bf16_tiles.hpp): the AVX512-BF16 micro-kernel, its portable reference and the
// packing into vdpbf16ps's pair layout. The micro-kernel holds a block of up to 4 rows x 64 columns
// of C in 16 zmm accumulators; per pair of k it loads up to 4 vectors of 16 B pairs, broadcasts one
// A pair per row and issues one vdpbf16ps per accumulator.
#include "src/backends/cpu/bf16_tiles.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLUX_BF16_TILES_X86 1
#define FLUX_TARGET_BF16_TILES __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#else
#define FLUX_BF16_TILES_X86 0
#endif

namespace flux::cpu_backend {

namespace {
// Two adjacent bf16 as 32 bits (the first low), as vdpbf16ps pairs them.
[[gnu::always_inline]] inline uint32_t pair_bits(const uint16_t* x) {
  uint32_t w;
  std::memcpy(&w, x, sizeof w);
  return w;
}

void product_reference(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t a_row, int64_t a_pair,
                       const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float x = half_bits::bfloat16_to_float(a[i * a_row + (kk / 2) * a_pair + kk % 2]);
        const float y = half_bits::bfloat16_to_float(b[(kk / 2) * 2 * ldb + 2 * j + kk % 2]);
        s += x * y;
      }
      c[i * ldc + j] = alpha * s + (accumulate ? c[i * ldc + j] : 0.0f);
    }
}

void pack_row_pairs_reference(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldb) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const uint16_t* r0 = src + 2 * p * ld;
    const uint16_t* r1 = 2 * p + 1 < rows ? r0 + ld : nullptr;
    uint16_t* d = dst + p * 2 * ldb;
    for (int64_t j = 0; j < cols; ++j) d[2 * j] = r0[j], d[2 * j + 1] = r1 ? r1[j] : uint16_t(0);
  }
}

#if FLUX_BF16_TILES_X86
// The block's accumulators are named variables, not an array: GCC 12 keeps a __m512 array on the stack
// (a store and a load per vdpbf16ps). Unused rows / columns (i >= MR, j >= NV) fold away.
#define FLUX_BT_LOAD_B(j)                                                                              \
  const __m512i b##j = j < NV ? (j + 1 < NV ? _mm512_loadu_si512(bp + 32 * j)                         \
                                            : _mm512_maskz_loadu_epi32(last, bp + 32 * j))            \
                              : _mm512_setzero_si512();
#define FLUX_BT_DP(i, j) \
  if constexpr (j < NV) c##i##j = _mm512_dpbf16_ps(c##i##j, av, (__m512bh)b##j);
#define FLUX_BT_ROW(i, PAIR)                                            \
  if constexpr (i < MR) {                                               \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(int(PAIR(a##i))); \
    FLUX_BT_DP(i, 0) FLUX_BT_DP(i, 1) FLUX_BT_DP(i, 2) FLUX_BT_DP(i, 3) \
  }
#define FLUX_BT_STEP(PAIR)                                                                  \
  {                                                                                         \
    FLUX_BT_LOAD_B(0) FLUX_BT_LOAD_B(1) FLUX_BT_LOAD_B(2) FLUX_BT_LOAD_B(3)                 \
    FLUX_BT_ROW(0, PAIR) FLUX_BT_ROW(1, PAIR) FLUX_BT_ROW(2, PAIR) FLUX_BT_ROW(3, PAIR)     \
  }
#define FLUX_BT_STORE(i, j)                                                       \
  if constexpr (i < MR && j < NV) {                                               \
    float* cp = c + i * ldc + 16 * j;                                             \
    const __mmask16 mk = j + 1 < NV ? __mmask16(0xffff) : last;                   \
    __m512 v = _mm512_mul_ps(c##i##j, scale);                                     \
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, cp));          \
    _mm512_mask_storeu_ps(cp, mk, v);                                             \
  }

template <int MR, int NV>
FLUX_TARGET_BF16_TILES void product_block(int64_t k, float alpha, const uint16_t* a, int64_t a_row, int64_t a_pair,
                                          const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                                          __mmask16 last) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00,
         c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
  const uint16_t* a0 = a;
  const uint16_t* a1 = a + (MR > 1 ? a_row : 0);
  const uint16_t* a2 = a + (MR > 2 ? 2 * a_row : 0);
  const uint16_t* a3 = a + (MR > 3 ? 3 * a_row : 0);
  const uint16_t* bp = b;
  const int64_t full = k / 2, bstep = 2 * ldb;
#define FLUX_BT_PAIR(x) pair_bits(x)
  for (int64_t p = 0; p < full; ++p, a0 += a_pair, a1 += a_pair, a2 += a_pair, a3 += a_pair, bp += bstep)
    FLUX_BT_STEP(FLUX_BT_PAIR)
#undef FLUX_BT_PAIR
#define FLUX_BT_PAIR(x) uint32_t((x)[0])
  if (k % 2) FLUX_BT_STEP(FLUX_BT_PAIR)  // odd k: the last pair's first element only
#undef FLUX_BT_PAIR
  const __m512 scale = _mm512_set1_ps(alpha);
  FLUX_BT_STORE(0, 0) FLUX_BT_STORE(0, 1) FLUX_BT_STORE(0, 2) FLUX_BT_STORE(0, 3)
  FLUX_BT_STORE(1, 0) FLUX_BT_STORE(1, 1) FLUX_BT_STORE(1, 2) FLUX_BT_STORE(1, 3)
  FLUX_BT_STORE(2, 0) FLUX_BT_STORE(2, 1) FLUX_BT_STORE(2, 2) FLUX_BT_STORE(2, 3)
  FLUX_BT_STORE(3, 0) FLUX_BT_STORE(3, 1) FLUX_BT_STORE(3, 2) FLUX_BT_STORE(3, 3)
}
#undef FLUX_BT_LOAD_B
#undef FLUX_BT_DP
#undef FLUX_BT_ROW
#undef FLUX_BT_STEP
#undef FLUX_BT_STORE

using Block = void (*)(int64_t, float, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t,
                       bool, __mmask16);
template <int MR>
constexpr Block block_for(int nv) {
  return nv == 1 ? product_block<MR, 1> : nv == 2 ? product_block<MR, 2> : nv == 3 ? product_block<MR, 3> : product_block<MR, 4>;
}

void product_avx512_bf16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t a_row,
                         int64_t a_pair, const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kRows = 4, kCols = 64;
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {  // a 64-column panel of B stays in L1 across the row blocks
    const int64_t cols = std::min(kCols, n - j0);
    const int nv = int((cols + 15) / 16);
    const int rem = int(cols - 16 * (nv - 1));
    const __mmask16 last = __mmask16((1u << rem) - 1u);
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t rows = std::min(kRows, m - i0);
      const Block f = rows == 4 ? block_for<4>(nv) : rows == 3 ? block_for<3>(nv) : rows == 2 ? block_for<2>(nv) : block_for<1>(nv);
      f(k, alpha, a + i0 * a_row, a_row, a_pair, b + 2 * j0, ldb, c + i0 * ldc + j0, ldc, accumulate, last);
    }
  }
}

FLUX_TARGET_BF16_TILES void pack_row_pairs_avx512(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols,
                                                  uint16_t* dst, int64_t ldb) {
  // idx[2t] = t (row 2p's element t, from the first operand), idx[2t + 1] = 32 + t (row 2p + 1's)
  alignas(64) uint16_t idx[32];
  for (int t = 0; t < 16; ++t) idx[2 * t] = uint16_t(t), idx[2 * t + 1] = uint16_t(32 + t);
  const __m512i perm = _mm512_load_si512(idx);
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const uint16_t* r0 = src + 2 * p * ld;
    const bool pair = 2 * p + 1 < rows;
    uint16_t* d = dst + p * 2 * ldb;
    for (int64_t j = 0; j < cols; j += 16) {
      const int64_t w = std::min<int64_t>(16, cols - j);
      const __mmask32 mk = __mmask32((1u << w) - 1u);
      const __m512i lo = _mm512_maskz_loadu_epi16(mk, r0 + j);
      const __m512i hi = pair ? _mm512_maskz_loadu_epi16(mk, r0 + ld + j) : _mm512_setzero_si512();
      const __m512i v = _mm512_permutex2var_epi16(lo, perm, hi);
      _mm512_mask_storeu_epi16(d + 2 * j, w == 16 ? ~__mmask32(0) : __mmask32((1ull << (2 * w)) - 1u), v);
    }
  }
}

// GCC 12's AVX-512 headers' "undefined" vectors trip -Wmaybe-uninitialized (a false positive, as in
// half_cast.cpp) where a 256-bit value is widened.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
FLUX_TARGET_BF16_TILES void float_rows_to_bf16_pairs_avx512(const float* src, int64_t ld, int64_t rows, int64_t cols,
                                                            uint16_t* dst, int64_t ldb, uint16_t* natural,
                                                            int64_t ldn) {
  alignas(64) uint16_t idx[32];  // as pack_row_pairs_avx512: row 2p's element t, then row 2p + 1's
  for (int t = 0; t < 16; ++t) idx[2 * t] = uint16_t(t), idx[2 * t + 1] = uint16_t(32 + t);
  const __m512i perm = _mm512_load_si512(idx);
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* r0 = src + 2 * p * ld;
    const bool pair = 2 * p + 1 < rows;
    uint16_t* d = dst + p * 2 * ldb;
    for (int64_t j = 0; j < cols; j += 16) {
      const int64_t w = std::min<int64_t>(16, cols - j);
      const __mmask16 mk = __mmask16((1u << w) - 1u);
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r0 + j));
      const __m256i hi = pair ? (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r0 + ld + j)) : _mm256_setzero_si256();
      if (natural) {
        _mm256_mask_storeu_epi16(natural + 2 * p * ldn + j, mk, lo);
        if (pair) _mm256_mask_storeu_epi16(natural + (2 * p + 1) * ldn + j, mk, hi);
      }
      const __m512i v = _mm512_permutex2var_epi16(_mm512_castsi256_si512(lo), perm, _mm512_castsi256_si512(hi));
      _mm512_mask_storeu_epi16(d + 2 * j, w == 16 ? ~__mmask32(0) : __mmask32((1ull << (2 * w)) - 1u), v);
    }
  }
  if (natural && cols % 2 && ldn > cols)
    for (int64_t r = 0; r < rows; ++r) natural[r * ldn + cols] = 0;
}

// pack_transposed_pairs' full pairs in 16 x 16 blocks of 32-bit words: 16 rows' words loaded, transposed
// in registers (unpack 32 / 64, then 128-bit lane shuffles), stored as 16 pair rows.
FLUX_TARGET_BF16_TILES void pack_transposed_pairs_avx512(const uint16_t* src, int64_t ld, int64_t rows, int64_t pairs,
                                                         uint16_t* dst, int64_t ldb) {
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t nr = std::min<int64_t>(16, rows - j0);
    const __mmask16 row_mask = __mmask16((1u << nr) - 1u);
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      const int64_t np = std::min<int64_t>(16, pairs - p0);
      const __mmask16 pair_mask = __mmask16((1u << np) - 1u);
      __m512i r[16], t[16], u[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < nr ? _mm512_maskz_loadu_epi32(pair_mask, src + (j0 + i) * ld + 2 * p0) : _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      }
      for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: u[4g + c] holds column 4k + c of them in lane k
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
      }
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), w = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88),
                      w2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        const __m512i col[4] = {_mm512_shuffle_i32x4(v, v2, 0x88), _mm512_shuffle_i32x4(w, w2, 0x88),
                                _mm512_shuffle_i32x4(v, v2, 0xdd), _mm512_shuffle_i32x4(w, w2, 0xdd)};
        for (int k = 0; k < 4; ++k) {  // column 4k + c of the block: pair p0 + 4k + c of rows j0..j0+15
          const int64_t pc = 4 * k + c;
          if (pc < np) _mm512_mask_storeu_epi32(dst + (p0 + pc) * 2 * ldb + 2 * j0, row_mask, col[k]);
        }
      }
    }
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
}  // namespace

bool bf16_tile_kernel_available() {
#if FLUX_BF16_TILES_X86
  return active_isa() == Isa::avx512 && has_avx512_bf16_instructions();
#else
  return false;
#endif
}

void bf16_tile_product(bool fast, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t a_row,
                       int64_t a_pair, const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
#if FLUX_BF16_TILES_X86
  if (fast) return product_avx512_bf16(m, n, k, alpha, a, a_row, a_pair, b, ldb, c, ldc, accumulate);
#else
  (void)fast;
#endif
  product_reference(m, n, k, alpha, a, a_row, a_pair, b, ldb, c, ldc, accumulate);
}

void pack_row_pairs(bool fast, const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldb) {
#if FLUX_BF16_TILES_X86
  if (fast) return pack_row_pairs_avx512(src, ld, rows, cols, dst, ldb);
#else
  (void)fast;
#endif
  pack_row_pairs_reference(src, ld, rows, cols, dst, ldb);
}

void pack_transposed_pairs(bool fast, const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst,
                           int64_t ldb) {
  const int64_t full = cols / 2;
#if FLUX_BF16_TILES_X86
  if (fast) {
    pack_transposed_pairs_avx512(src, ld, rows, full, dst, ldb);
  } else
#else
  (void)fast;
#endif
  for (int64_t p = 0; p < full; ++p) {  // 32-bit words: pair p of row j -> B's pair row p, column j
    uint16_t* d = dst + p * 2 * ldb;
    for (int64_t j = 0; j < rows; ++j) std::memcpy(d + 2 * j, src + j * ld + 2 * p, sizeof(uint32_t));
  }
  if (cols % 2) {
    uint16_t* d = dst + full * 2 * ldb;
    for (int64_t j = 0; j < rows; ++j) d[2 * j] = src[j * ld + cols - 1], d[2 * j + 1] = 0;
  }
}

void float_rows_to_bf16(const float* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldd) {
  float_rows_to_half_storage(DType::bf16, src, ld, dst, ldd, rows, cols);
  if (cols % 2 && ldd > cols)
    for (int64_t r = 0; r < rows; ++r) dst[r * ldd + cols] = 0;
}

void float_rows_to_bf16_pairs(bool fast, const float* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst,
                              int64_t ldb, uint16_t* natural, int64_t ldn) {
#if FLUX_BF16_TILES_X86
  if (fast) return float_rows_to_bf16_pairs_avx512(src, ld, rows, cols, dst, ldb, natural, ldn);
#endif
  std::vector<uint16_t> own;
  if (!natural) {
    own.resize(size_t(rows * (cols + 1)));
    natural = own.data(), ldn = cols + 1;
  }
  float_rows_to_bf16(src, ld, rows, cols, natural, ldn);
  pack_row_pairs_reference(natural, ldn, rows, cols, dst, ldb);
}

}  // namespace flux::cpu_backend
