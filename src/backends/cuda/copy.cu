// fill, cast and strided copy on the GPU (reference: src/backends/cpu/copy.cpp).
#include <cstring>

#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

// fill: the value's bit pattern is made on the host, so one kernel per element size serves all dtypes.
template <class T> __global__ void fill_kernel(T* dst, int64_t n, T bits) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) dst[i] = bits;
}

// Element types as stored: the arithmetic C++ types plus two 16-bit float formats.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

template <class T> __device__ inline double to_double(T x) { return double(x); }
template <> __device__ inline double to_double(Half x) { return half_bits_to_float(x.bits); }
template <> __device__ inline double to_double(BFloat16 x) { return bfloat16_bits_to_float(x.bits); }

// As the CPU: arithmetic pairs convert directly (To(From), exact for int64), booleans become 0/1,
// and half formats go through float (double -> float -> half, exactly like store_from_double).
template <class To, class From> __device__ inline To convert(From x, bool to_bool) {
  if constexpr (std::is_same_v<To, Half>) {
    return Half{float_to_half_bits(float(to_double(x)))};
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return BFloat16{float_to_bfloat16_bits(float(to_double(x)))};
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    double v = to_double(x);
    return to_bool ? To(v != 0) : To(v);
  } else {
    return to_bool ? To(x != From(0)) : To(x);
  }
}

template <class From, class To> __global__ void cast_kernel(const From* s, To* d, int64_t n, bool to_bool) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) d[i] = convert<To, From>(s[i], to_bool);
}

// Calls BODY with `using T = <stored type>` for every dtype.
#define FLUX_CAST_DISPATCH(dtype, ...)                                                    \
  switch (dtype) {                                                                       \
    case DType::f32: { using T = float; __VA_ARGS__; } break;                            \
    case DType::f64: { using T = double; __VA_ARGS__; } break;                           \
    case DType::f16: { using T = Half; __VA_ARGS__; } break;                             \
    case DType::bf16: { using T = BFloat16; __VA_ARGS__; } break;                        \
    case DType::i32: { using T = int32_t; __VA_ARGS__; } break;                          \
    case DType::i64: { using T = int64_t; __VA_ARGS__; } break;                          \
    case DType::u8: case DType::boolean: { using T = uint8_t; __VA_ARGS__; } break;      \
  }

// strided copy: dst[i...] = src[i...]; the output index is decomposed over the plan's shape.
template <class T> __global__ void strided_copy_kernel(const T* src, T* dst, int64_t total, backend::StridedCopy p) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    int64_t rem = i, so = 0, d = 0;
    for (int k = p.ndim - 1; k >= 0; --k) {
      int64_t c = rem % p.shape[k];
      rem /= p.shape[k];
      so += c * p.src_stride[k];
      d += c * p.dst_stride[k];
    }
    dst[d] = src[so];
  }
}

}  // namespace

void fill(Stream s, DType t, void* dst, int64_t n, double value) {
  if (n <= 0) return;
  unsigned long long bits = 0;  // the element's bytes, little-endian, in the low bytes
  switch (t) {
    case DType::f32: { float v = float(value); std::memcpy(&bits, &v, 4); } break;
    case DType::f64: std::memcpy(&bits, &value, 8); break;
    case DType::f16: bits = float_to_half_bits(float(value)); break;
    case DType::bf16: bits = float_to_bfloat16_bits(float(value)); break;
    case DType::i32: { int32_t v = int32_t(value); std::memcpy(&bits, &v, 4); } break;
    case DType::i64: { int64_t v = int64_t(value); std::memcpy(&bits, &v, 8); } break;
    case DType::u8: bits = uint8_t(value); break;
    case DType::boolean: bits = value != 0 ? 1 : 0; break;
  }
  FLUX_GPU_DISPATCH_SIZE("fill", t, {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), n, v);
  });
  check_launch("fill kernel");
}

void cast(Stream s, DType from, const void* src, DType to, void* dst, int64_t n) {
  if (n <= 0) return;
  if (from == to || (dtype_size(from) == 1 && dtype_size(to) == 1 && to != DType::boolean)) {
    check(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(from), cudaMemcpyDeviceToDevice, s), "cast copy");
    return;
  }
  bool to_bool = to == DType::boolean;
  FLUX_CAST_DISPATCH(from, {
    using From = T;
    FLUX_CAST_DISPATCH(to, {
      cast_kernel<From, T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const From*>(src), static_cast<T*>(dst), n, to_bool);
    });
  });
  check_launch("cast kernel");
}

void strided_copy(Stream s, DType t, const void* src, void* dst, const backend::StridedCopy& p) {
  int64_t total = 1;
  for (int i = 0; i < p.ndim; ++i) total *= p.shape[i];
  if (total == 0) return;
  FLUX_GPU_DISPATCH_SIZE("strided_copy", t, {
    strided_copy_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const T*>(src), static_cast<T*>(dst), total, p);
  });
  check_launch("strided_copy kernel");
}

}  // namespace flux::cuda_backend
