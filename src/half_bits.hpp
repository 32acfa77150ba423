// IEEE half and bfloat16 <-> float bit conversions (round to nearest even), the one definition used
// by src/dtype.cpp on the host and by the CUDA/HIP kernels on the device (no cuda_fp16.h needed).
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FLUX_HALF_HD __host__ __device__ inline
#else
#define FLUX_HALF_HD inline
#endif

namespace flux::half_bits {

FLUX_HALF_HD uint32_t float_bits(float f) {
  union { float f; uint32_t u; } v{f};
  return v.u;
}
FLUX_HALF_HD float bits_float(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

FLUX_HALF_HD uint16_t from_float(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = int32_t((x >> 23) & 0xff);
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));  // inf / nan
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                    // subnormal or zero
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    uint32_t shift = uint32_t(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return uint16_t(half);
}

FLUX_HALF_HD float to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      x = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return bits_float(x);
}

FLUX_HALF_HD uint16_t bfloat16_from_float(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return uint16_t((x + rounding) >> 16);
}

FLUX_HALF_HD float bfloat16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

}  // namespace flux::half_bits
