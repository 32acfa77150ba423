// Numerically stable (log)softmax over the middle axis of [outer, len, inner], on OpenCL devices.
// One work-item per (outer, inner) row; the sum of exponentials accumulates in ACC (double where the
// device has it), as on the CPU.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

const char* const kSoftmaxSource = R"CLC(
__kernel void softmax(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long outer, long len,
                      long inner, int log_softmax) {
  __global const T* s = AT(T, src, src_off);
  __global T* d = AT(T, dst, dst_off);
  GRID_LOOP(r, outer * inner) {
    long o = r / inner, i = r - o * inner;
    __global const T* x = s + o * len * inner + i;
    __global T* y = d + o * len * inner + i;
    T m = -INFINITY;
    for (long j = 0; j < len; ++j) m = fmax(m, x[j * inner]);
    if (isinf(m) && m < 0) m = 0;
    ACC total = 0;
    for (long j = 0; j < len; ++j) total += exp((ACC)(x[j * inner] - m));
    if (log_softmax) {
      T log_total = (T)log(total);  // (x - m) - log(total): m + log(total) would round at m's magnitude
      for (long j = 0; j < len; ++j) y[j * inner] = (x[j * inner] - m) - log_total;
    } else {
      T inv = (T)((ACC)1 / total);
      for (long j = 0; j < len; ++j) y[j * inner] = exp(x[j * inner] - m) * inv;
    }
  }
}
)CLC";

}  // namespace

void softmax(int d, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len, int64_t inner,
             bool log) {
  if (t != DType::f32 && t != DType::f64)
    ::flux::detail::fail("[softmax] needs a floating-point tensor, got ", dtype_name(t));
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "softmax");
  if (outer * inner == 0 || len == 0) return;
  auto& k = kernel(dev, "softmax", kSoftmaxSource, o, "softmax");
  launch(dev, k, outer * inner, false, mem(src), off(src), mem(dst), off(dst), cl_long(outer), cl_long(len),
         cl_long(inner), cl_int(log ? 1 : 0));
}

}  // namespace flux::opencl
