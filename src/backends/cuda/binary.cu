// Elementwise functions of two (or three, for where) tensors with broadcasting, on the GPU
// (reference: src/backends/cpu/binary.cpp). Broadcast strides come in the plan (0 on broadcast axes).
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

using backend::BinaryOp;

namespace {

template <class T> __device__ inline T arith(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::add: return T(x + y);
    case BinaryOp::sub: return T(x - y);
    case BinaryOp::mul: return T(x * y);
    case BinaryOp::div:
      if constexpr (std::is_integral_v<T>) {
        if (y == 0) return T(0);  // the CPU throws; a kernel cannot, so integer x / 0 gives 0
      }
      return T(x / y);
    case BinaryOp::pow:
      if constexpr (std::is_floating_point_v<T>) return pow(x, y);
      else return T(pow(double(x), double(y)));
    case BinaryOp::maximum: return x > y || x != x ? x : y;  // NaN in either operand gives NaN (not fmax)
    case BinaryOp::minimum: return x < y || x != x ? x : y;
    default: return T(0);
  }
}

template <class T> __device__ inline uint8_t compare(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::eq: return x == y;
    case BinaryOp::ne: return x != y;
    case BinaryOp::lt: return x < y;
    case BinaryOp::le: return x <= y;
    case BinaryOp::gt: return x > y;
    case BinaryOp::ge: return x >= y;
    default: return 0;
  }
}

// Offsets of output element i into each of `Operands` inputs.
template <int Operands> struct Offsets { int64_t at[Operands]; };

template <int Operands> __device__ inline Offsets<Operands> offsets(const backend::Broadcast& p, int64_t i) {
  Offsets<Operands> o{};
  if (p.contiguous) {
    for (int k = 0; k < Operands; ++k) o.at[k] = i;
    return o;
  }
  int64_t rem = i;
  for (int d = p.ndim - 1; d >= 0; --d) {
    int64_t c = rem % p.shape[d];
    rem /= p.shape[d];
    for (int k = 0; k < Operands; ++k) o.at[k] += c * p.stride[k][d];
  }
  return o;
}

template <class T, class Out> __global__ void binary_kernel(BinaryOp op, const T* x, const T* y, Out* z, int64_t total,
                                                            backend::Broadcast p, bool comparison) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    Offsets<2> o = offsets<2>(p, i);
    if (comparison) z[i] = Out(compare<T>(op, x[o.at[0]], y[o.at[1]]));
    else z[i] = Out(arith<T>(op, x[o.at[0]], y[o.at[1]]));
  }
}

template <class T> __global__ void where_kernel(const uint8_t* c, const T* x, const T* y, T* z, int64_t total,
                                                backend::Broadcast p) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    Offsets<3> o = offsets<3>(p, i);
    z[i] = c[o.at[0]] ? x[o.at[1]] : y[o.at[2]];
  }
}

int64_t total_of(const backend::Broadcast& p) {
  int64_t total = 1;
  for (int i = 0; i < p.ndim; ++i) total *= p.shape[i];
  return total;
}

}  // namespace

void binary(Stream s, BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& p) {
  int64_t total = total_of(p);
  if (total == 0) return;
  bool comparison = op >= BinaryOp::eq;
  FLUX_GPU_DISPATCH("binary", t, {
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    if (comparison)
      binary_kernel<T, uint8_t><<<blocks_for(total), kThreads, 0, s>>>(op, x, y, static_cast<uint8_t*>(out), total, p, true);
    else
      binary_kernel<T, T><<<blocks_for(total), kThreads, 0, s>>>(op, x, y, static_cast<T*>(out), total, p, false);
  });
  check_launch("binary kernel");
}

void where(Stream s, DType t, const void* cond, const void* a, const void* b, void* out, const backend::Broadcast& p) {
  int64_t total = total_of(p);
  if (total == 0) return;
  FLUX_GPU_DISPATCH_SIZE("where", t, {
    where_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const uint8_t*>(cond), static_cast<const T*>(a),
                                                            static_cast<const T*>(b), static_cast<T*>(out), total, p);
  });
  check_launch("where kernel");
}

}  // namespace flux::cuda_backend
