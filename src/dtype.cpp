#include "flux/dtype.hpp"

#include "flux/error.hpp"
#include "src/half_bits.hpp"

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

std::string to_string(DType t) { return dtype_name(t); }

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

uint16_t float_to_half(float f) { return half_bits::from_float(f); }
float half_to_float(uint16_t h) { return half_bits::to_float(h); }
uint16_t float_to_bfloat16(float f) { return half_bits::bfloat16_from_float(f); }
float bfloat16_to_float(uint16_t b) { return half_bits::bfloat16_to_float(b); }

}  // namespace flux
