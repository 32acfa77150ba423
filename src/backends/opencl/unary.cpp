// Elementwise functions of one tensor on OpenCL devices (same formulas as src/backends/cpu/unary.cpp).
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

using backend::UnaryOp;

namespace {

// op numbers follow backend::UnaryOp.
const char* const kUnarySource = R"CLC(
#ifdef IS_FLOAT
inline T sigm(T x) { return x >= 0 ? (T)1 / ((T)1 + exp(-x)) : exp(x) / ((T)1 + exp(x)); }
// tanh that is exactly +-1 where the correctly rounded value is (|x| > 9.02 in float, 19.1 in
// double): the spec lets tanh stop one ulp short of 1 (PoCL does), and 1 - tanh^2 in the backward
// would then read 1.2e-7 instead of 0.
inline T tanh_exact(T x) { return fabs(x) > (sizeof(T) == 4 ? (T)9.02 : (T)19.1) ? copysign((T)1, x) : tanh(x); }
inline T apply(int op, T x, T a) {
  switch (op) {
    case 0: return -x;
    case 1: return exp(x);
    case 2: return log(x);
    case 3: return sqrt(x);
    case 4: return fabs(x);
    case 5: return tanh_exact(x);
    case 6: return sigm(x);
    case 7: return x <= 0 ? (T)0 : x;  // NaN stays NaN
    case 8: return x > 0 ? x : a * x;
    case 9: return x > 0 ? x : a * expm1(x);
    case 10: {  // NNlib's gelu (tanh approximation) as x sigmoid(2u): exact 0 / x in the tails
      const T c2 = (T)1.5957691216057308;  // 2 sqrt(2 / pi)
      return x * sigm(c2 * x * ((T)1 + (T)0.044715 * x * x));
    }
    case 11: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
    case 12: return x * sigm(x);
    case 13: return x > 0 ? (T)1 : (x < 0 ? (T)-1 : (x == 0 ? (T)0 : x));  // sign(NaN) = NaN
    case 14: return x * x;
    case 15: return (T)1 / x;
    case 16: return sin(x);
    case 17: return cos(x);
    case 18: return log1p(x);
    case 19: return x > 0 ? (T)1 : (x <= 0 ? (T)0 : x);  // relu's derivative: NaN at NaN
    case 20: return erf(x);
  }
  return x;
}
#else
inline T apply(int op, T x, T a) {
  switch (op) {
    case 0: return (T)(-x);
#ifdef IS_SIGNED
    case 4: return x < 0 ? (T)(-x) : x;
#else
    case 4: return x;
#endif
    case 13: return x > 0 ? (T)1 : (x < 0 ? (T)-1 : (T)0);
    case 14: return (T)(x * x);
    case 7: return x > 0 ? x : (T)0;
    case 19: return x > 0 ? (T)1 : (T)0;
  }
  return x;
}
#endif
__kernel void unary(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long n, int op, T alpha) {
  __global const T* s = AT(T, src, src_off);
  __global T* d = AT(T, dst, dst_off);
  GRID_LOOP(i, n) d[i] = apply(op, s[i], alpha);
}
)CLC";

bool integer_ok(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::sign: case UnaryOp::square: case UnaryOp::relu:
    case UnaryOp::step:
      return true;
    default: return false;
  }
}

static_assert(int(UnaryOp::gelu) == 10 && int(UnaryOp::step) == 19 && int(UnaryOp::erf) == 20, "kUnarySource numbers the ops");

}  // namespace

void unary(int d, UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n, double alpha) {
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "unary");
  if (!is_floating(t) && !integer_ok(op)) ::flux::detail::fail("[unary] this function needs a floating-point tensor");
  if (n <= 0) return;
  auto& k = kernel(dev, "unary", kUnarySource, o, "unary");
  launch(dev, k, n, false, mem(src), off(src), mem(dst), off(dst), cl_long(n), cl_int(op),
         scalar_of(t, is_floating(t) ? alpha : 0.0));
}

}  // namespace flux::opencl
