// Conversions between float32 and the 16-bit storage dtypes (bf16, f16) on the CPU: the casts every
// op on bf16/f16 tensors runs on its way into and out of float32 arithmetic. Round to nearest even,
// NaN quieted exactly as src/half_bits.hpp (the scalar reference kept beside the vector code).
// The path is chosen per call from CPUID (isa.hpp) and the active ISA level (force_isa), best first:
//   bf16 -> AVX512-BF16: vcvtneps2bf16, 16 lanes. It flushes float32 subnormals to a signed zero, so
//                          a block that holds one takes the AVX-512 integer rounding for those lanes.
//           AVX-512:     the upper 16 bits of the float rounded by an integer add, 16 lanes, masked tails.
//           AVX2:        the same in 8 lanes.
//   f16  -> AVX-512 / AVX2+F16C: vcvtps2ph / vcvtph2ps (16 / 8 lanes), then NaNs (and, for f16 -> f32,
//           infinities) rewritten to the reference's bits: F16C keeps NaN payloads and quiets
//           signalling NaNs, half_bits does not.
//   bf16 -> f32 is a 16-bit shift on every path (there is no faster instruction for it).
// Tests compare every path the CPU can run with the reference, bitwise, over every 16-bit pattern.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLUX_HALF_CAST_X86 1
#define FLUX_TARGET_AVX2_F16C __attribute__((target("avx2,f16c")))
#define FLUX_TARGET_AVX512_CAST __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define FLUX_TARGET_AVX512_BF16_CAST \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c")))
#else
#define FLUX_HALF_CAST_X86 0
#endif

namespace flux::cpu_backend {

namespace {

constexpr int64_t kGrain = 1 << 16;

void to_half_reference_range(DType to, const float* s, uint16_t* d, int64_t b, int64_t e) {
  if (to == DType::bf16)
    for (int64_t i = b; i < e; ++i) d[i] = half_bits::bfloat16_from_float(s[i]);
  else
    for (int64_t i = b; i < e; ++i) d[i] = half_bits::from_float(s[i]);
}
void from_half_reference_range(DType from, const uint16_t* s, float* d, int64_t b, int64_t e) {
  if (from == DType::bf16)
    for (int64_t i = b; i < e; ++i) d[i] = half_bits::bfloat16_to_float(s[i]);
  else
    for (int64_t i = b; i < e; ++i) d[i] = half_bits::to_float(s[i]);
}

#if FLUX_HALF_CAST_X86
/// 8 floats -> 8 bf16 in the low 16 bits of each 32-bit lane: (x + 0x7fff + lsb) >> 16, NaN -> (x >> 16) | 0x40.
FLUX_TARGET_AVX2_F16C inline __m256i bf16_lanes(__m256i x) {
  const __m256i high = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));  // both below 2^31
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

FLUX_TARGET_AVX2_F16C void to_bf16_avx2(const float* s, uint16_t* d, int64_t b, int64_t e) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m256i lo = bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    const __m256i hi = bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 8)));
    // packus works within 128-bit halves: [lo0 hi0 lo1 hi1] -> [lo0 lo1 hi0 hi1] by a 64-bit permute.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
  }
  to_half_reference_range(DType::bf16, s, d, i, e);
}

FLUX_TARGET_AVX2_F16C void from_bf16_avx2(const uint16_t* s, float* d, int64_t b, int64_t e) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(wide, 16));
  }
  from_half_reference_range(DType::bf16, s, d, i, e);
}

FLUX_TARGET_AVX2_F16C void to_f16_avx2(const float* s, uint16_t* d, int64_t b, int64_t e) {
  int64_t i = b;
  const __m128i magnitude_mask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
  const __m128i sign_mask = _mm_set1_epi16(int16_t(0x8000)), quiet_nan = _mm_set1_epi16(0x7e00);
  for (; i + 8 <= e; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, magnitude_mask), inf);  // signed, both below 2^15
    const __m128i fixed = _mm_or_si128(_mm_and_si128(h, sign_mask), quiet_nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_blendv_epi8(h, fixed, nan));
  }
  to_half_reference_range(DType::f16, s, d, i, e);
}

FLUX_TARGET_AVX2_F16C void from_f16_avx2(const uint16_t* s, float* d, int64_t b, int64_t e) {
  int64_t i = b;
  const __m256i exponent = _mm256_set1_epi32(0x7c00), sign = _mm256_set1_epi32(0x8000);
  const __m256i mantissa = _mm256_set1_epi32(0x3ff), float_inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= e; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
    // Infinities and NaNs: sign | 0x7f800000 | mantissa << 13, the payload kept and not quieted.
    const __m256i wide = _mm256_cvtepu16_epi32(h);
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(wide, exponent), exponent);
    const __m256i exact = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(wide, sign), 16), float_inf),
        _mm256_slli_epi32(_mm256_and_si256(wide, mantissa), 13));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_blendv_epi8(f, exact, special));
  }
  from_half_reference_range(DType::f16, s, d, i, e);
}

// ---- AVX-512: 16 lanes, tails by masked loads and stores ----
// GCC 12's AVX-512 headers initialise their "undefined" vectors from themselves (__m512i __Y = __Y),
// which -Wmaybe-uninitialized reports wherever such an intrinsic inlines: a false positive.
#if defined(__GNUC__) && !defined(__clang__)  // clang has no such warning (and errors on the name)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }
// body(i, mask) over [b, e) in steps of 16: full steps with an all-ones mask (constant, so the masked
// loads and stores compile to plain ones), then one masked step for the tail. A lambda does not take
// its enclosing function's target: each body carries the target attribute itself.
template <class F> [[gnu::always_inline]] inline void for_blocks_of_16(int64_t b, int64_t e, F&& body) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16) body(i, __mmask16(0xffff));
  if (i < e) body(i, tail_mask(e - i));
}

/// 16 floats (as bits) -> 16 bf16: bf16_lanes' integer rounding, packed by vpmovdw.
FLUX_TARGET_AVX512_CAST inline __m256i bf16_round_avx512(__m512i x) {
  const __m512i high = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

FLUX_TARGET_AVX512_CAST void to_bf16_avx512(const float* s, uint16_t* d, int64_t b, int64_t e) {
  for_blocks_of_16(b, e, [&](int64_t i, __mmask16 m) FLUX_TARGET_AVX512_CAST {
    const __m512i x = _mm512_maskz_loadu_epi32(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, bf16_round_avx512(x));
  });
}

/// vcvtneps2bf16 rounds as the reference except on subnormal inputs (flushed to a signed zero):
/// lanes with a zero exponent and a non-zero mantissa take the integer rounding instead (rare: one
/// test per 16 lanes).
FLUX_TARGET_AVX512_BF16_CAST void to_bf16_avx512_bf16(const float* s, uint16_t* d, int64_t b, int64_t e) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  for_blocks_of_16(b, e, [&](int64_t i, __mmask16 m) FLUX_TARGET_AVX512_BF16_CAST {
    const __m512i x = _mm512_maskz_loadu_epi32(m, s + i);
    __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(x)));
    const __mmask16 subnormal = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(x, exponent), x, mantissa);
    if (subnormal) h = _mm256_mask_blend_epi16(subnormal, h, bf16_round_avx512(x));
    _mm256_mask_storeu_epi16(d + i, m, h);
  });
}

FLUX_TARGET_AVX512_CAST void from_bf16_avx512(const uint16_t* s, float* d, int64_t b, int64_t e) {
  for_blocks_of_16(b, e, [&](int64_t i, __mmask16 m) FLUX_TARGET_AVX512_CAST {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
    _mm512_mask_storeu_epi32(d + i, m, _mm512_slli_epi32(wide, 16));
  });
}

FLUX_TARGET_AVX512_CAST void to_f16_avx512(const float* s, uint16_t* d, int64_t b, int64_t e) {
  const __m256i magnitude_mask = _mm256_set1_epi16(0x7fff), inf = _mm256_set1_epi16(0x7c00);
  const __m256i sign_mask = _mm256_set1_epi16(int16_t(0x8000)), quiet_nan = _mm256_set1_epi16(0x7e00);
  for_blocks_of_16(b, e, [&](int64_t i, __mmask16 m) FLUX_TARGET_AVX512_CAST {
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, magnitude_mask), inf);
    const __m256i fixed = _mm256_or_si256(_mm256_and_si256(h, sign_mask), quiet_nan);
    _mm256_mask_storeu_epi16(d + i, m, _mm256_mask_blend_epi16(nan, h, fixed));
  });
}

FLUX_TARGET_AVX512_CAST void from_f16_avx512(const uint16_t* s, float* d, int64_t b, int64_t e) {
  const __m512i exponent = _mm512_set1_epi32(0x7c00), sign = _mm512_set1_epi32(0x8000);
  const __m512i mantissa = _mm512_set1_epi32(0x3ff), float_inf = _mm512_set1_epi32(0x7f800000);
  for_blocks_of_16(b, e, [&](int64_t i, __mmask16 m) FLUX_TARGET_AVX512_CAST {
    const __m256i h = _mm256_maskz_loadu_epi16(m, s + i);
    const __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
    // Infinities and NaNs: sign | 0x7f800000 | mantissa << 13, the payload kept and not quieted.
    const __m512i wide = _mm512_cvtepu16_epi32(h);
    const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(wide, exponent), exponent);
    const __m512i exact = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(wide, sign), 16), float_inf),
                                          _mm512_slli_epi32(_mm512_and_si512(wide, mantissa), 13));
    _mm512_mask_storeu_epi32(d + i, m, _mm512_mask_blend_epi32(special, f, exact));
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif

std::atomic<int> g_path_cap{int(HalfCastPath::avx512_bf16)};

/// The best path the CPU has for `t` at the active ISA level, before any cap.
HalfCastPath best_path(DType t) {
#if FLUX_HALF_CAST_X86
  const Isa isa = active_isa();
  if (isa == Isa::avx512) return t == DType::bf16 && has_avx512_bf16_instructions() ? HalfCastPath::avx512_bf16 : HalfCastPath::avx512;
  if (isa == Isa::avx2 && (t == DType::bf16 || has_f16c())) return HalfCastPath::avx2;
#else
  (void)t;
#endif
  return HalfCastPath::scalar;
}

/// The path the kernels take for `t` now: the best, lowered to the cap (f16 has no AVX512-BF16 path).
HalfCastPath current_path(DType t) {
  int p = std::min(int(best_path(t)), g_path_cap.load(std::memory_order_relaxed));
  if (t != DType::bf16 && p == int(HalfCastPath::avx512_bf16)) p = int(HalfCastPath::avx512);
  return HalfCastPath(p);
}

}  // namespace

void float_to_half_storage_reference(DType to, const float* src, uint16_t* dst, int64_t n) {
  to_half_reference_range(to, src, dst, 0, n);
}
void half_storage_to_float_reference(DType from, const uint16_t* src, float* dst, int64_t n) {
  from_half_reference_range(from, src, dst, 0, n);
}

namespace {
// [b, e) on this thread along `path` (current_path's answer for the dtype).
void to_half_range(DType to, HalfCastPath path, const float* src, uint16_t* dst, int64_t b, int64_t e) {
#if FLUX_HALF_CAST_X86
  const bool bf16 = to == DType::bf16;
  switch (path) {
    case HalfCastPath::avx512_bf16: return to_bf16_avx512_bf16(src, dst, b, e);
    case HalfCastPath::avx512: return bf16 ? to_bf16_avx512(src, dst, b, e) : to_f16_avx512(src, dst, b, e);
    case HalfCastPath::avx2: return bf16 ? to_bf16_avx2(src, dst, b, e) : to_f16_avx2(src, dst, b, e);
    case HalfCastPath::scalar: break;
  }
#endif
  (void)path;
  to_half_reference_range(to, src, dst, b, e);
}
void from_half_range(DType from, HalfCastPath path, const uint16_t* src, float* dst, int64_t b, int64_t e) {
#if FLUX_HALF_CAST_X86
  const bool bf16 = from == DType::bf16;
  switch (path) {
    case HalfCastPath::avx512_bf16:
    case HalfCastPath::avx512: return bf16 ? from_bf16_avx512(src, dst, b, e) : from_f16_avx512(src, dst, b, e);
    case HalfCastPath::avx2: return bf16 ? from_bf16_avx2(src, dst, b, e) : from_f16_avx2(src, dst, b, e);
    case HalfCastPath::scalar: break;
  }
#endif
  (void)path;
  from_half_reference_range(from, src, dst, b, e);
}
}  // namespace

// Blocks below kGrain (the kernels' per-block conversions) run here directly: no pool hand-off and no
// std::function to allocate per call.
void float_to_half_storage(DType to, const float* src, uint16_t* dst, int64_t n) {
  const HalfCastPath path = current_path(to);
  if (n < kGrain) return to_half_range(to, path, src, dst, 0, n);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { to_half_range(to, path, src, dst, b, e); });
}

void float_rows_to_half_storage(DType to, const float* src, int64_t ld, uint16_t* dst, int64_t ldd, int64_t rows,
                                int64_t cols) {
  const HalfCastPath path = current_path(to);
  for (int64_t r = 0; r < rows; ++r) to_half_range(to, path, src + r * ld, dst + r * ldd, 0, cols);
}

void half_storage_to_float(DType from, const uint16_t* src, float* dst, int64_t n) {
  const HalfCastPath path = current_path(from);
  if (n < kGrain) return from_half_range(from, path, src, dst, 0, n);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { from_half_range(from, path, src, dst, b, e); });
}

bool half_cast_vectorised(DType t) { return current_path(t) != HalfCastPath::scalar; }
HalfCastPath half_cast_path(DType t) { return current_path(t); }
HalfCastPath half_cast_best_path(DType t) { return best_path(t); }
HalfCastPath cap_half_cast_path(HalfCastPath cap) { return HalfCastPath(g_path_cap.exchange(int(cap))); }
const char* half_cast_path_name(HalfCastPath p) {
  switch (p) {
    case HalfCastPath::avx512_bf16: return "AVX512-BF16";
    case HalfCastPath::avx512: return "AVX-512";
    case HalfCastPath::avx2: return "AVX2";
    case HalfCastPath::scalar: break;
  }
  return "scalar";
}

}  // namespace flux::cpu_backend
