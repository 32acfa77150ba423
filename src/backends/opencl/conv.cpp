// im2col and col2im on OpenCL devices (the portable convolution path: im2col + CLBlast GEMM), float32
// and float64. Semantics: include/flux/backend.hpp; the CPU counterpart is src/backends/cpu/conv_reference.cpp.
//
// Shapes: x and dx (N, C, in...), col (N, G, C/G * K, P) with K = prod(kernel), P = prod(out). Since
// the groups split the channels into consecutive blocks, col is also (N, C, K, P) row-major: groups
// do not change the indexing. Spatial axes are normalised to three (D, H, W) with LEADING length-1
// axes (window_args), so 1-D, 2-D and 3-D run the same kernels and the innermost loop is the last
// real axis.
//   im2col: one work-item per column row (n, c, k, od, oh): the loop over ow writes col contiguously.
//   col2im: a gather, one work-item per dx row (n, c, id, ih): each dx element sums the column
//           entries that im2col read from it (every (k, o) with o * stride - pad_lo + k * dilation ==
//           its position), so no atomics are needed and the result is deterministic. It adds to dx.
// Index math is 64-bit throughout.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

WindowArgs window_args(const backend::ConvGeometry& g) {
  WindowArgs a;
  const int shift = 3 - g.spatial;
  for (int i = 0; i < 3; ++i) {
    const int j = i - shift;
    const bool used = j >= 0 && j < g.spatial;
    a.in.s[i] = used ? g.in[j] : 1;
    a.out.s[i] = used ? g.out[j] : 1;
    a.kernel.s[i] = used ? g.kernel[j] : 1;
    a.stride.s[i] = used ? g.stride[j] : 1;
    a.pad.s[i] = used ? g.pad_lo[j] : 0;
    a.dilation.s[i] = used ? g.dilation[j] : 1;
  }
  a.in.s[3] = a.out.s[3] = a.kernel.s[3] = a.stride.s[3] = a.dilation.s[3] = 1;
  a.pad.s[3] = 0;
  a.in_size = a.in.s[0] * a.in.s[1] * a.in.s[2];
  a.out_size = a.out.s[0] * a.out.s[1] * a.out.s[2];
  a.window = a.kernel.s[0] * a.kernel.s[1] * a.kernel.s[2];
  return a;
}

void check_window_geometry(const char* api, DType t, const backend::ConvGeometry& g) {
  if (t != DType::f32 && t != DType::f64)
    ::flux::detail::fail("[", api, "] OpenCL kernel supports Float32 and Float64; got ", dtype_name(t));
  if (g.spatial < 1 || g.spatial > 3)
    ::flux::detail::fail("[", api, "] expected 1 to 3 spatial axes; got ", g.spatial);
  for (int i = 0; i < g.spatial; ++i)
    if (g.stride[i] < 1 || g.dilation[i] < 1 || g.kernel[i] < 1 || g.in[i] < 0 || g.out[i] < 0)
      ::flux::detail::fail("[", api, "] invalid window on spatial axis ", i, ": in ", g.in[i], ", out ", g.out[i],
                           ", kernel ", g.kernel[i], ", stride ", g.stride[i], ", dilation ", g.dilation[i],
                           " (expected kernel, stride, dilation >= 1)");
}

namespace {

// in/out/ks/st/lo/dil: (D, H, W, unused) of the normalised geometry; planes = N * C.
const char* const kConvSource = R"CLC(
// col[(p, k), o] = x[p, o * stride - lo + k * dil] (0 outside), p = n * C + c, one work-item per
// (p, k, od, oh) row of col, looping over ow.
__kernel void im2col(__global uchar* x, ulong x_off, __global uchar* col, ulong col_off, long planes,
                     long4 in, long4 out, long4 ks, long4 st, long4 lo, long4 dil) {
  __global const T* X = AT(T, x, x_off);
  __global T* C = AT(T, col, col_off);
  const long I = in.x * in.y * in.z, O = out.x * out.y * out.z, K = ks.x * ks.y * ks.z;
  const long rows_per_k = out.x * out.y;
  GRID_LOOP(r, planes * K * rows_per_k) {
    long pk = r / rows_per_k, odh = r - pk * rows_per_k;
    long p = pk / K, k = pk - p * K;
    long od = odh / out.y, oh = odh - od * out.y;
    long kdh = k / ks.z, kw = k - kdh * ks.z;
    long kd = kdh / ks.y, kh = kdh - kd * ks.y;
    long id = od * st.x - lo.x + kd * dil.x, ih = oh * st.y - lo.y + kh * dil.y;
    __global T* dst = C + pk * O + odh * out.z;
    if (id < 0 || id >= in.x || ih < 0 || ih >= in.y) {
      for (long ow = 0; ow < out.z; ++ow) dst[ow] = (T)0;
      continue;
    }
    __global const T* src = X + p * I + (id * in.y + ih) * in.z;
    long iw = kw * dil.z - lo.z;
    for (long ow = 0; ow < out.z; ++ow, iw += st.z) dst[ow] = (iw >= 0 && iw < in.z) ? src[iw] : (T)0;
  }
}

// dx[p, i] += sum over (k, o) with o * st - lo + k * dil == i of col[(p, k), o]; one work-item per
// (p, id, ih) row of dx, looping over iw. Terms are added in (k, o) order.
__kernel void col2im(__global uchar* col, ulong col_off, __global uchar* dx, ulong dx_off, long planes,
                     long4 in, long4 out, long4 ks, long4 st, long4 lo, long4 dil) {
  __global const T* C = AT(T, col, col_off);
  __global T* DX = AT(T, dx, dx_off);
  const long I = in.x * in.y * in.z, O = out.x * out.y * out.z, K = ks.x * ks.y * ks.z;
  const long rows_per_plane = in.x * in.y;
  GRID_LOOP(r, planes * rows_per_plane) {
    long p = r / rows_per_plane, idh = r - p * rows_per_plane;
    long id = idh / in.y, ih = idh - id * in.y;
    __global T* dst = DX + p * I + idh * in.z;
    __global const T* cp = C + p * K * O;
    for (long iw = 0; iw < in.z; ++iw) {
      T acc = dst[iw];
      for (long kd = 0; kd < ks.x; ++kd) {
        long od = window_of(id, lo.x, kd, dil.x, st.x, out.x);
        if (od < 0) continue;
        for (long kh = 0; kh < ks.y; ++kh) {
          long oh = window_of(ih, lo.y, kh, dil.y, st.y, out.y);
          if (oh < 0) continue;
          __global const T* row = cp + ((kd * ks.y + kh) * ks.z) * O + (od * out.y + oh) * out.z;
          for (long kw = 0; kw < ks.z; ++kw) {
            long ow = window_of(iw, lo.z, kw, dil.z, st.z, out.z);
            if (ow >= 0) acc += row[kw * O + ow];
          }
        }
      }
      dst[iw] = acc;
    }
  }
}
)CLC";

}  // namespace

void im2col(int d, DType t, backend::Buffer x, backend::Buffer col, const backend::ConvGeometry& g) {
  check_window_geometry("im2col", t, g);
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "im2col");
  WindowArgs a = window_args(g);
  const int64_t planes = g.batch * g.in_channels;
  const int64_t rows = planes * a.window * a.out.s[0] * a.out.s[1];
  if (rows == 0 || a.out.s[2] == 0) return;
  auto& k = kernel(dev, "conv", kConvSource, o, "im2col");
  launch(dev, k, rows, false, mem(x), off(x), mem(col), off(col), cl_long(planes), a.in, a.out, a.kernel, a.stride,
         a.pad, a.dilation);
}

void col2im(int d, DType t, backend::Buffer col, backend::Buffer dx, const backend::ConvGeometry& g) {
  check_window_geometry("col2im", t, g);
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "col2im");
  WindowArgs a = window_args(g);
  const int64_t planes = g.batch * g.in_channels;
  const int64_t rows = planes * a.in.s[0] * a.in.s[1];
  if (rows == 0 || a.in.s[2] == 0 || a.out_size == 0) return;
  auto& k = kernel(dev, "conv", kConvSource, o, "col2im");
  launch(dev, k, rows, false, mem(col), off(col), mem(dx), off(dx), cl_long(planes), a.in, a.out, a.kernel, a.stride,
         a.pad, a.dilation);
}

}  // namespace flux::opencl
