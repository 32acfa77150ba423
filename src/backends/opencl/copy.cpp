// fill, cast (including Float16/BFloat16 conversion) and strided copy on OpenCL devices.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

// U: an unsigned type of the element's size; fill and strided copy only move bits.
const char* const kCopySource = R"CLC(
__kernel void fill(__global uchar* dst, ulong dst_off, long n, ulong bits) {
  __global U* d = AT(U, dst, dst_off);
  U v = (U)bits;
  GRID_LOOP(i, n) d[i] = v;
}
// dst[i...] = src[i...] over `shape` (collapsed), element strides.
__kernel void strided_copy(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long n, int ndim,
                           long8 shape, long8 ss, long8 ds) {
  __global const U* s = AT(U, src, src_off);
  __global U* d = AT(U, dst, dst_off);
  GRID_LOOP(i, n) {
    long a, b, c;
    offsets(i, ndim, shape, ss, ds, ds, &a, &b, &c);
    d[b] = s[a];
  }
}
)CLC";

// One program per source dtype (S_KIND: 0 arithmetic of type S_T, 1 Float16, 2 BFloat16) holding a
// kernel per destination dtype, so that a cold cache compiles 8 programs rather than 64.
const char* const kCastSource = R"CLC(
#if S_KIND == 1
#define SRC_PTR half
#define LOAD(s, i) vload_half(i, s)
#elif S_KIND == 2
#define SRC_PTR ushort
#define LOAD(s, i) as_float(((uint)(s)[i]) << 16)
#else
#define SRC_PTR S_T
#define LOAD(s, i) ((s)[i])
#endif
inline ushort to_bfloat16(float f) {  // round to nearest even, as flux::float_to_bfloat16
  uint x = as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40u);
  uint rounding = 0x7fffu + ((x >> 16) & 1u);
  return (ushort)((x + rounding) >> 16);
}
#define CAST_KERNEL(NAME, D_T, STORE)                                                                \
  __kernel void NAME(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long n) { \
    __global const SRC_PTR* s = AT(SRC_PTR, src, src_off);                                           \
    __global D_T* d = AT(D_T, dst, dst_off);                                                         \
    GRID_LOOP(i, n) { STORE; }                                                                       \
  }
CAST_KERNEL(cast_to_Float32, float, d[i] = (float)LOAD(s, i))
#ifdef FP64
CAST_KERNEL(cast_to_Float64, double, d[i] = (double)LOAD(s, i))
#endif
CAST_KERNEL(cast_to_Float16, half, vstore_half_rte((float)LOAD(s, i), i, d))
CAST_KERNEL(cast_to_BFloat16, ushort, d[i] = to_bfloat16((float)LOAD(s, i)))
CAST_KERNEL(cast_to_Int32, int, d[i] = (int)LOAD(s, i))
CAST_KERNEL(cast_to_Int64, long, d[i] = (long)LOAD(s, i))
CAST_KERNEL(cast_to_UInt8, uchar, d[i] = (uchar)LOAD(s, i))
CAST_KERNEL(cast_to_Bool, uchar, d[i] = LOAD(s, i) != 0 ? 1 : 0)
)CLC";

std::string copy_options(DeviceState& dev, size_t es) {
  return std::string(dev.fp64 ? "-DFP64 " : "") + "-DU=" + bits_type(es);
}

int kind(DType t) { return t == DType::f16 ? 1 : t == DType::bf16 ? 2 : 0; }

}  // namespace

void fill(int d, DType t, backend::Buffer dst, int64_t n, double value) {
  if (n <= 0) return;
  DeviceState& dev = device(d);
  if (t == DType::f64 && !dev.fp64) type_options(dev, t, "fill");  // throws: no Float64 here
  Scalar s = scalar_of(t, value);
  cl_ulong bits = 0;
  std::memcpy(&bits, s.bytes, s.size);
  auto& k = kernel(dev, "copy", kCopySource, copy_options(dev, dtype_size(t)), "fill");
  launch(dev, k, n, false, mem(dst), off(dst), cl_long(n), bits);
}

void cast(int d, DType from, backend::Buffer src, DType to, backend::Buffer dst, int64_t n) {
  if (n <= 0) return;
  DeviceState& dev = device(d);
  if (from == to || (dtype_size(from) == 1 && dtype_size(to) == 1 && to != DType::boolean)) {
    check(clEnqueueCopyBuffer(dev.queue, mem(src), mem(dst), src.offset, dst.offset, size_t(n) * dtype_size(from), 0,
                              nullptr, nullptr),
          "clEnqueueCopyBuffer");
    return;
  }
  if ((from == DType::f64 || to == DType::f64) && !dev.fp64) type_options(dev, DType::f64, "cast");  // throws
  std::string o = dev.fp64 ? "-DFP64" : "";
  o += " -DS_KIND=" + std::to_string(kind(from));
  if (kind(from) == 0) o += std::string(" -DS_T=") + cl_type(from);
  std::string name = std::string("cast_to_") + dtype_name(to);
  auto& k = kernel(dev, "cast", kCastSource, o, name.c_str());
  launch(dev, k, n, false, mem(src), off(src), mem(dst), off(dst), cl_long(n));
}

void strided_copy(int d, DType t, backend::Buffer src, backend::Buffer dst, const backend::StridedCopy& p) {
  const int64_t* strides[2] = {p.src_stride, p.dst_stride};
  Layout l = collapse(p.ndim, p.shape, strides, 2);
  if (l.total == 0) return;
  DeviceState& dev = device(d);
  auto& k = kernel(dev, "copy", kCopySource, copy_options(dev, dtype_size(t)), "strided_copy");
  launch(dev, k, l.total, false, mem(src), off(src), mem(dst), off(dst), cl_long(l.total), cl_int(l.ndim), l.shape,
         l.stride[0], l.stride[1]);
}

}  // namespace flux::opencl
