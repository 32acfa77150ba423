// Element types of a tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace flux {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, boolean };

inline constexpr DType Float32 = DType::f32;
inline constexpr DType Float64 = DType::f64;
inline constexpr DType Float16 = DType::f16;
inline constexpr DType BFloat16 = DType::bf16;
inline constexpr DType Int32 = DType::i32;
inline constexpr DType Int64 = DType::i64;
inline constexpr DType UInt8 = DType::u8;
inline constexpr DType Bool = DType::boolean;

/// Bytes per element.
size_t dtype_size(DType t);
/// Julia-style name: "Float32", "Int64", "Bool", ...
const char* dtype_name(DType t);
/// The same name as a string, as to_string(Device) and to_string(Shape): to_string(Float32) == "Float32".
std::string to_string(DType t);
/// True for f32, f64, f16, bf16.
bool is_floating(DType t);
/// Result type of mixing two dtypes in arithmetic (NumPy-like promotion).
DType promote(DType a, DType b);

/// The DType of a C++ scalar type.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

/// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(uint16_t b);

}  // namespace flux
