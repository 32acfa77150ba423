// exp, sigmoid and tanh for the CPU kernels in a form the compiler vectorises: straight-line float
// arithmetic, integer bit tricks and selects, no libm call (a call to expf/tanhf stops the vectoriser,
// and libm's scalar tanhf costs ~20 ns an element). Used inside FLUX_CPU_VARIANTS bodies (isa.hpp), so
// each ISA level gets its own vector code; float64 keeps libm (the f64 paths are references, not hot).
//
// exp (Cephes' expf, S. Moshier): e^x = 2^n e^r with n = round(x / ln 2), r = x - n ln 2 in
// [-ln 2 / 2, ln 2 / 2] (ln 2 split in two for an exact product), e^r by Cephes' degree-7 polynomial.
// 2^n is applied as two factors 2^(n >> 1) 2^(n - (n >> 1)), each a normal float, so results down to
// the subnormal range and up to FLT_MAX come out right. x < -104 gives 0 (the true value is below half
// the smallest subnormal), x > 88.7228 gives inf, NaN stays NaN. Error <= 2 ulp (tests/test_cpu_kernels.cpp).
// tanh (Cephes' tanhf): |x| < 0.625 an odd polynomial in x (no cancellation near 0), else
// sign(x) (1 - 2 / (e^{2|x|} + 1)); exactly ±1 where e^{2|x|} overflows 2 / (e + 1) to 0 in 1 - ..
// sigmoid: e = e^{-|x|}, s = 1 / (1 + e), x >= 0 ? s : e s (no 1 - s cancellation for x < 0).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend::vmath {

// Low / High: whether x may lie below -104 / above 88.7228 (false skips that clamp and select).
template <bool Low = true, bool High = true> FLUX_CPU_INLINE float exp_f32(float x) {
  float xc = x;
  if constexpr (Low) xc = std::max(xc, -104.0f);
  if constexpr (High) xc = std::min(xc, 88.7228394f);
  // round(xc / ln 2) by the 1.5 * 2^23 trick (round to nearest; |n| < 2^22), and n as an integer.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;  // ln 2 = 0.693359375 - 2.12194440e-4 (+ ~1e-12)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // each in [-75, 64]: 2^n1 and 2^n2 are normal floats
  const float s1 = std::bit_cast<float>((n1 + 127) << 23), s2 = std::bit_cast<float>((n2 + 127) << 23);
  const float y = p * s1 * s2;
  float out = y;
  if constexpr (Low) out = x < -104.0f ? 0.0f : out;
  if constexpr (High) out = x > 88.7228394f ? std::numeric_limits<float>::infinity() : out;
  return out;
}

FLUX_CPU_INLINE float sigmoid_f32(float x) {
  const float e = exp_f32<true, false>(-std::abs(x));  // x <= 0 (NaN: NaN either way)
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}

FLUX_CPU_INLINE float tanh_f32(float x) {
  const float ax = std::abs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float e = exp_f32<false, true>(2.0f * ax);  // 2|x| >= 0
  const float large = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return ax < 0.625f ? small : large;
}

/// T = float: the functions above; T = double: libm.
template <class T> FLUX_CPU_INLINE T exp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}
template <class T> FLUX_CPU_INLINE T tanh(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
  else return std::tanh(x);
}
template <class T> FLUX_CPU_INLINE T sigmoid(T x) {
  if constexpr (std::is_same_v<T, float>) return sigmoid_f32(x);
  else return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

}  // namespace flux::cpu_backend::vmath
