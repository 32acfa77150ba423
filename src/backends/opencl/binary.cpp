// Elementwise functions of two (or three, for where) tensors with broadcasting, on OpenCL devices.
// The host collapses the broadcast plan (drops size-1 axes, merges runs) before the launch.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

using backend::BinaryOp;

namespace {

// op numbers follow backend::BinaryOp; ops >= 7 are comparisons writing uchar.
const char* const kBinarySource = R"CLC(
#ifndef IS_FLOAT
inline T ipow(T x, T y) {  // exact integer power; negative exponents truncate as T(pow(x, y)) does
  if (y < 0) return x == 1 ? (T)1 : (x == (T)-1 ? ((y & 1) ? x : (T)1) : (T)0);
  T r = 1;
  while (y) {
    if (y & 1) r = (T)(r * x);
    y >>= 1;
    x = (T)(x * x);
  }
  return r;
}
#endif
inline T arith(int op, T x, T y) {
  switch (op) {
    case 0: return (T)(x + y);
    case 1: return (T)(x - y);
    case 2: return (T)(x * y);
#ifdef IS_FLOAT
    case 3: return x / y;
    case 4: return pow(x, y);
#else
    case 3:  // integer division by zero gives 0 here (the CPU backend throws; a kernel cannot)
#ifdef IS_SIGNED
      if (y == (T)-1) return (T)(-x);
#endif
      return y == 0 ? (T)0 : (T)(x / y);
    case 4: return ipow(x, y);
#endif
    case 5: return x > y || x != x ? x : y;  // NaN in either operand gives NaN (not fmax)
    case 6: return x < y || x != x ? x : y;
  }
  return (T)0;
}
inline uchar compare(int op, T x, T y) {
  switch (op) {
    case 7: return x == y;
    case 8: return x != y;
    case 9: return x < y;
    case 10: return x <= y;
    case 11: return x > y;
    case 12: return x >= y;
  }
  return 0;
}
__kernel void binary(__global uchar* a, ulong a_off, __global uchar* b, ulong b_off, __global uchar* out, ulong out_off,
                     long n, int op, int ndim, long8 shape, long8 sa, long8 sb) {
  __global const T* x = AT(T, a, a_off);
  __global const T* y = AT(T, b, b_off);
  if (op >= 7) {
    __global uchar* z = AT(uchar, out, out_off);
    GRID_LOOP(i, n) {
      long ia, ib, ic;
      offsets(i, ndim, shape, sa, sb, sb, &ia, &ib, &ic);
      z[i] = compare(op, x[ia], y[ib]);
    }
  } else {
    __global T* z = AT(T, out, out_off);
    GRID_LOOP(i, n) {
      long ia, ib, ic;
      offsets(i, ndim, shape, sa, sb, sb, &ia, &ib, &ic);
      z[i] = arith(op, x[ia], y[ib]);
    }
  }
}
// out = cond ? a : b
__kernel void where(__global uchar* c, ulong c_off, __global uchar* a, ulong a_off, __global uchar* b, ulong b_off,
                    __global uchar* out, ulong out_off, long n, int ndim, long8 shape, long8 sc, long8 sa, long8 sb) {
  __global const uchar* k = AT(uchar, c, c_off);
  __global const T* x = AT(T, a, a_off);
  __global const T* y = AT(T, b, b_off);
  __global T* z = AT(T, out, out_off);
  GRID_LOOP(i, n) {
    long ic, ia, ib;
    offsets(i, ndim, shape, sc, sa, sb, &ic, &ia, &ib);
    z[i] = k[ic] ? x[ia] : y[ib];
  }
}
)CLC";

static_assert(int(BinaryOp::minimum) == 6 && int(BinaryOp::eq) == 7 && int(BinaryOp::ge) == 12,
              "kBinarySource numbers the ops");

}  // namespace

void binary(int d, BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
            const backend::Broadcast& p) {
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "binary");
  const int64_t* strides[2] = {p.stride[0], p.stride[1]};
  Layout l = collapse(p.ndim, p.shape, strides, 2);
  if (l.total == 0) return;
  auto& k = kernel(dev, "binary", kBinarySource, o, "binary");
  launch(dev, k, l.total, false, mem(a), off(a), mem(b), off(b), mem(out), off(out), cl_long(l.total), cl_int(op),
         cl_int(l.ndim), l.shape, l.stride[0], l.stride[1]);
}

void where(int d, DType t, backend::Buffer cond, backend::Buffer a, backend::Buffer b, backend::Buffer out,
           const backend::Broadcast& p) {
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "where");
  const int64_t* strides[3] = {p.stride[0], p.stride[1], p.stride[2]};
  Layout l = collapse(p.ndim, p.shape, strides, 3);
  if (l.total == 0) return;
  auto& k = kernel(dev, "binary", kBinarySource, o, "where");
  launch(dev, k, l.total, false, mem(cond), off(cond), mem(a), off(a), mem(b), off(b), mem(out), off(out),
         cl_long(l.total), cl_int(l.ndim), l.shape, l.stride[0], l.stride[1], l.stride[2]);
}

}  // namespace flux::opencl
