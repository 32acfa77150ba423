// Elementwise functions of one tensor on the GPU (reference: src/backends/cpu/unary.cpp).
// One kernel per dtype; the op is a uniform runtime switch (the kernel is memory bound).
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

using backend::UnaryOp;

namespace {

template <class T> __device__ inline T sigmoid_of(T x) {
  return x >= 0 ? T(1) / (T(1) + exp(-x)) : exp(x) / (T(1) + exp(x));
}

// tanh that is exactly +-1 where the correctly rounded value is (|x| > 9.02 in float, 19.1 in
// double), so that 1 - tanh^2 in the backward is 0 there (see src/backends/opencl/unary.cpp).
template <class T> __device__ inline T tanh_exact(T x) {
  return fabs(x) > (sizeof(T) == 4 ? T(9.02) : T(19.1)) ? copysign(T(1), x) : tanh(x);
}

template <class T> __device__ inline T apply(UnaryOp op, T x, T a) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::neg: return -x;
      case UnaryOp::exp: return exp(x);
      case UnaryOp::log: return log(x);
      case UnaryOp::sqrt: return sqrt(x);
      case UnaryOp::abs: return fabs(x);
      case UnaryOp::tanh: return tanh_exact(x);
      case UnaryOp::sigmoid: return sigmoid_of(x);
      case UnaryOp::relu: return x <= 0 ? T(0) : x;  // NaN stays NaN
      case UnaryOp::leakyrelu: return x > 0 ? x : a * x;
      case UnaryOp::elu: return x > 0 ? x : a * expm1(x);
      case UnaryOp::gelu: {  // Flux/NNlib's gelu (tanh approximation) as x sigmoid(2u): exact in the tails
        const T c2 = T(1.5957691216057308);  // 2 sqrt(2 / pi)
        return x * sigmoid_of(c2 * x * (T(1) + T(0.044715) * x * x));
      }
      case UnaryOp::softplus: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
      case UnaryOp::swish: return x * sigmoid_of(x);
      case UnaryOp::sign: return x > 0 ? T(1) : (x < 0 ? T(-1) : (x == 0 ? T(0) : x));  // sign(NaN) = NaN
      case UnaryOp::square: return x * x;
      case UnaryOp::reciprocal: return T(1) / x;
      case UnaryOp::sin: return sin(x);
      case UnaryOp::cos: return cos(x);
      case UnaryOp::log1p: return log1p(x);
      case UnaryOp::step: return x > 0 ? T(1) : (x <= 0 ? T(0) : x);  // relu's derivative: NaN at NaN
      case UnaryOp::erf: return erf(x);
    }
    return x;
  } else {  // integers and booleans: the host has already rejected the float-only functions
    switch (op) {
      case UnaryOp::neg: return T(-x);
      case UnaryOp::abs: if constexpr (std::is_signed_v<T>) return x < 0 ? T(-x) : x; else return x;
      case UnaryOp::sign:
        if constexpr (std::is_signed_v<T>) return x > 0 ? T(1) : (x < 0 ? T(-1) : T(0));
        else return x > 0 ? T(1) : T(0);
      case UnaryOp::square: return T(x * x);
      case UnaryOp::relu: return x > 0 ? x : T(0);
      case UnaryOp::step: return x > 0 ? T(1) : T(0);
      default: return x;
    }
  }
}

template <class T> __global__ void unary_kernel(UnaryOp op, const T* s, T* d, int64_t n, T alpha) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) d[i] = apply<T>(op, s[i], alpha);
}

bool integer_ok(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::sign: case UnaryOp::square: case UnaryOp::relu:
    case UnaryOp::step: return true;
    default: return false;
  }
}

}  // namespace

void unary(Stream s, UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha) {
  if (!is_floating(t) && !integer_ok(op)) detail::fail("[unary] this function needs a floating-point tensor");
  if (n <= 0) return;
  FLUX_GPU_DISPATCH("unary", t, {
    unary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(src), static_cast<T*>(dst), n, T(alpha));
  });
  check_launch("unary kernel");
}

}  // namespace flux::cuda_backend
