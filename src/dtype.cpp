#include "flux/dtype.hpp"

#include <cstring>

#include "flux/error.hpp"

namespace flux {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "Float32";
    case DType::f64: return "Float64";
    case DType::f16: return "Float16";
    case DType::bf16: return "BFloat16";
    case DType::i32: return "Int32";
    case DType::i64: return "Int64";
    case DType::u8: return "UInt8";
    case DType::boolean: return "Bool";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

static int rank(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::u8: return 1;
    case DType::i32: return 2;
    case DType::i64: return 3;
    case DType::f16: return 4;
    case DType::bf16: return 5;
    case DType::f32: return 6;
    case DType::f64: return 7;
  }
  return 0;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
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

float half_to_float(uint16_t h) {
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
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return uint16_t((x + rounding) >> 16);
}

float bfloat16_to_float(uint16_t b) {
  uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace flux
