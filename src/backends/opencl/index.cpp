// gather (index_select) and its adjoint scatter_add over [outer, len, inner], on OpenCL devices.
// Indices are int64 and checked on the host by the ops layer; kernels skip out-of-range ones rather
// than touch memory outside the tensor.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

const char* const kIndexSource = R"CLC(
// dst[o, j, i] = src[o, idx[j], i]; U moves the element's bits.
__kernel void gather(__global uchar* src, ulong src_off, __global uchar* idx, ulong idx_off, __global uchar* dst,
                     ulong dst_off, long outer, long len, long inner, long nidx) {
  __global const U* s = AT(U, src, src_off);
  __global const long* ix = AT(long, idx, idx_off);
  __global U* d = AT(U, dst, dst_off);
  GRID_LOOP(r, outer * nidx * inner) {
    long i = r % inner, oj = r / inner, j = oj % nidx, o = oj / nidx;
    long at = ix[j];
    d[r] = (at >= 0 && at < len) ? s[(o * len + at) * inner + i] : (U)0;
  }
}
#ifdef T
// dst[o, idx[j], i] += src[o, j, i]. One work-item per (o, i) walks j in order, so repeated indices
// accumulate correctly and deterministically without atomics.
__kernel void scatter_add(__global uchar* src, ulong src_off, __global uchar* idx, ulong idx_off, __global uchar* dst,
                          ulong dst_off, long outer, long len, long inner, long nidx) {
  __global const T* s = AT(T, src, src_off);
  __global const long* ix = AT(long, idx, idx_off);
  __global T* d = AT(T, dst, dst_off);
  GRID_LOOP(r, outer * inner) {
    long o = r / inner, i = r - o * inner;
    for (long j = 0; j < nidx; ++j) {
      long at = ix[j];
      if (at < 0 || at >= len) continue;
      __global T* into = d + (o * len + at) * inner + i;
      *into = (T)(*into + s[(o * nidx + j) * inner + i]);
    }
  }
}
#endif
)CLC";

}  // namespace

void gather(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer, int64_t len,
            int64_t inner, int64_t nidx) {
  int64_t total = outer * nidx * inner;
  if (total == 0) return;
  DeviceState& dev = device(d);
  std::string o = std::string(dev.fp64 ? "-DFP64" : "") + " -DU=" + bits_type(dtype_size(t));
  auto& k = kernel(dev, "index", kIndexSource, o, "gather");
  launch(dev, k, total, false, mem(src), off(src), mem(idx), off(idx), mem(dst), off(dst), cl_long(outer),
         cl_long(len), cl_long(inner), cl_long(nidx));
}

void scatter_add(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
                 int64_t len, int64_t inner, int64_t nidx) {
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "scatter_add") + " -DU=" + bits_type(dtype_size(t));
  if (outer * inner == 0 || nidx == 0) return;
  auto& k = kernel(dev, "index", kIndexSource, o, "scatter_add");
  launch(dev, k, outer * inner, false, mem(src), off(src), mem(idx), off(idx), mem(dst), off(dst), cl_long(outer),
         cl_long(len), cl_long(inner), cl_long(nidx));
}

}  // namespace flux::opencl
