// Conversions between float32 and the 16-bit storage dtypes (bf16, f16) on the CPU: the casts every
// op on bf16/f16 tensors runs on its way into and out of float32 arithmetic. Round to nearest even,
// NaN quieted exactly as src/half_bits.hpp (the scalar reference kept beside the vector code).
//   bf16: the upper 16 bits of the float, rounded by an integer add (8 lanes of AVX2 integer ops).
//   f16:  F16C's vcvtps2ph / vcvtph2ps, then NaNs (and, for f16 -> f32, infinities) rewritten to the
//         reference's bits: F16C keeps NaN payloads and quiets signalling NaNs, half_bits does not.
// The vector code runs where the active ISA level (isa.hpp, force_isa) is AVX2 or higher and, for
// f16, the CPU has F16C; tests compare it bitwise with the reference over every 16-bit pattern.
#include <cstdint>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/half_bits.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLUX_HALF_CAST_X86 1
#define FLUX_TARGET_AVX2_F16C __attribute__((target("avx2,f16c")))
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

#endif

/// Whether the vector kernels run for `t` now.
bool vectorised(DType t) {
#if FLUX_HALF_CAST_X86
  if (int(active_isa()) < int(Isa::avx2)) return false;
  return t == DType::bf16 || has_f16c();
#else
  (void)t;
  return false;
#endif
}

}  // namespace

void float_to_half_storage_reference(DType to, const float* src, uint16_t* dst, int64_t n) {
  to_half_reference_range(to, src, dst, 0, n);
}
void half_storage_to_float_reference(DType from, const uint16_t* src, float* dst, int64_t n) {
  from_half_reference_range(from, src, dst, 0, n);
}

namespace {
// [b, e) on this thread: the vector kernels where the active ISA has them, else the references.
void to_half_range(DType to, bool fast, const float* src, uint16_t* dst, int64_t b, int64_t e) {
#if FLUX_HALF_CAST_X86
  if (fast) return to == DType::bf16 ? to_bf16_avx2(src, dst, b, e) : to_f16_avx2(src, dst, b, e);
#endif
  (void)fast;
  to_half_reference_range(to, src, dst, b, e);
}
void from_half_range(DType from, bool fast, const uint16_t* src, float* dst, int64_t b, int64_t e) {
#if FLUX_HALF_CAST_X86
  if (fast) return from == DType::bf16 ? from_bf16_avx2(src, dst, b, e) : from_f16_avx2(src, dst, b, e);
#endif
  (void)fast;
  from_half_reference_range(from, src, dst, b, e);
}
}  // namespace

// Blocks below kGrain (the kernels' per-block conversions) run here directly: no pool hand-off and no
// std::function to allocate per call.
void float_to_half_storage(DType to, const float* src, uint16_t* dst, int64_t n) {
  const bool fast = vectorised(to);
  if (n < kGrain) return to_half_range(to, fast, src, dst, 0, n);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { to_half_range(to, fast, src, dst, b, e); });
}

void half_storage_to_float(DType from, const uint16_t* src, float* dst, int64_t n) {
  const bool fast = vectorised(from);
  if (n < kGrain) return from_half_range(from, fast, src, dst, 0, n);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { from_half_range(from, fast, src, dst, b, e); });
}

bool half_cast_vectorised(DType t) { return vectorised(t); }

}  // namespace flux::cpu_backend
