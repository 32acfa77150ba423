// Max and mean pooling on OpenCL devices, forward and backward, float32 and float64, with 1 to 3
// spatial axes (normalised to (D, H, W) with leading length-1 axes, as in conv.cpp). Semantics:
// include/flux/backend.hpp, the same as src/backends/cpu/pooling.cpp (NNlib / PyTorch):
//   - a window starts at o * stride - pad_lo; positions outside the input are skipped;
//   - max never takes padding (an all-padding window gives -inf), propagates NaN, and its backward
//     sends dy to the FIRST position in window order (d, then h, then w) that holds y;
//   - mean divides by the full window size (count_include_pad), and its backward gives dy / window
//     size to every covered in-bounds element.
// Shapes: x, dx (N, C, in...); y, dy (N, C, out...).
//   forward:  one work-item per output row (p, od, oh), looping over ow;
//   backward: a gather, one work-item per dx row (p, id, ih), looping over iw: each dx element visits
//             the windows that cover it in window order (od, oh, ow ascending) and adds their share,
//             so there are no atomics and the sums are deterministic (and in the CPU's order).
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

using backend::PoolOp;

namespace {

// op: 0 max, 1 mean (backend::PoolOp).
const char* const kPoolingSource = R"CLC(
inline bool holds(T v, T y) { return v == y || (isnan(v) && isnan(y)); }

__kernel void pool_forward(__global uchar* x, ulong x_off, __global uchar* y, ulong y_off, long planes, long4 in,
                           long4 out, long4 ks, long4 st, long4 lo, long4 dil, int op) {
  __global const T* X = AT(T, x, x_off);
  __global T* Y = AT(T, y, y_off);
  const long I = in.x * in.y * in.z, O = out.x * out.y * out.z;
  const T scale = (T)1 / (T)(ks.x * ks.y * ks.z);
  const long rows_per_plane = out.x * out.y;
  GRID_LOOP(r, planes * rows_per_plane) {
    long p = r / rows_per_plane, odh = r - p * rows_per_plane;
    long od = odh / out.y, oh = odh - od * out.y;
    __global const T* xp = X + p * I;
    __global T* dst = Y + p * O + odh * out.z;
    for (long ow = 0; ow < out.z; ++ow) {
      T m = op == 0 ? -INFINITY : (T)0;
      for (long kd = 0; kd < ks.x; ++kd) {
        long id = od * st.x - lo.x + kd * dil.x;
        if (id < 0 || id >= in.x) continue;
        for (long kh = 0; kh < ks.y; ++kh) {
          long ih = oh * st.y - lo.y + kh * dil.y;
          if (ih < 0 || ih >= in.y) continue;
          __global const T* row = xp + (id * in.y + ih) * in.z;
          for (long kw = 0; kw < ks.z; ++kw) {
            long iw = ow * st.z - lo.z + kw * dil.z;
            if (iw < 0 || iw >= in.z) continue;
            T v = row[iw];
            if (op == 0) m = (v > m || isnan(v)) ? v : m;  // NaN wins and stays
            else m += v;
          }
        }
      }
      dst[ow] = op == 0 ? m : m * scale;
    }
  }
}

// True when (kd, kh, kw) is the first in-bounds position of window (od, oh, ow) holding y, i.e. no
// in-bounds position before it in window order holds y and it does.
inline bool first_max(__global const T* xp, T yv, long4 in, long4 ks, long4 st, long4 lo, long4 dil, long od,
                      long oh, long ow, long kd0, long kh0, long kw0) {
  for (long kd = 0; kd <= kd0; ++kd) {
    long id = od * st.x - lo.x + kd * dil.x;
    if (id < 0 || id >= in.x) continue;
    for (long kh = 0; kh < ks.y; ++kh) {
      if (kd == kd0 && kh > kh0) break;
      long ih = oh * st.y - lo.y + kh * dil.y;
      if (ih < 0 || ih >= in.y) continue;
      __global const T* row = xp + (id * in.y + ih) * in.z;
      for (long kw = 0; kw < ks.z; ++kw) {
        long iw = ow * st.z - lo.z + kw * dil.z;
        if (iw < 0 || iw >= in.z) continue;
        bool mine = kd == kd0 && kh == kh0 && kw == kw0;
        if (holds(row[iw], yv)) return mine;
        if (mine) return false;
      }
    }
  }
  return false;
}

// dx[p, i] += the share of dy of every window covering i, windows in (od, oh, ow) order.
__kernel void pool_backward(__global uchar* x, ulong x_off, __global uchar* y, ulong y_off, __global uchar* dy,
                            ulong dy_off, __global uchar* dx, ulong dx_off, long planes, long4 in, long4 out,
                            long4 ks, long4 st, long4 lo, long4 dil, int op) {
  __global const T* X = AT(T, x, x_off);
  __global const T* Y = AT(T, y, y_off);
  __global const T* DY = AT(T, dy, dy_off);
  __global T* DX = AT(T, dx, dx_off);
  const long I = in.x * in.y * in.z, O = out.x * out.y * out.z;
  const T window = (T)(ks.x * ks.y * ks.z);
  const long rows_per_plane = in.x * in.y;
  GRID_LOOP(r, planes * rows_per_plane) {
    long p = r / rows_per_plane, idh = r - p * rows_per_plane;
    long id = idh / in.y, ih = idh - id * in.y;
    __global const T* xp = X + p * I;
    __global const T* yp = Y + p * O;
    __global const T* dyp = DY + p * O;
    __global T* dst = DX + p * I + idh * in.z;
    for (long iw = 0; iw < in.z; ++iw) {
      T acc = dst[iw];
      // Kernel offsets in descending order visit the covering windows in ascending order.
      for (long kd = ks.x - 1; kd >= 0; --kd) {
        long od = window_of(id, lo.x, kd, dil.x, st.x, out.x);
        if (od < 0) continue;
        for (long kh = ks.y - 1; kh >= 0; --kh) {
          long oh = window_of(ih, lo.y, kh, dil.y, st.y, out.y);
          if (oh < 0) continue;
          for (long kw = ks.z - 1; kw >= 0; --kw) {
            long ow = window_of(iw, lo.z, kw, dil.z, st.z, out.z);
            if (ow < 0) continue;
            long at = (od * out.y + oh) * out.z + ow;
            if (op == 0) {
              if (first_max(xp, yp[at], in, ks, st, lo, dil, od, oh, ow, kd, kh, kw)) acc += dyp[at];
            } else {
              acc += dyp[at] / window;
            }
          }
        }
      }
      dst[iw] = acc;
    }
  }
}
)CLC";

}  // namespace

void pool_forward(int d, PoolOp op, DType t, backend::Buffer x, backend::Buffer y, const backend::ConvGeometry& g) {
  check_window_geometry("pool", t, g);
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "pool");
  WindowArgs a = window_args(g);
  const int64_t planes = g.batch * g.in_channels;
  const int64_t rows = planes * a.out.s[0] * a.out.s[1];
  if (rows == 0 || a.out.s[2] == 0) return;
  auto& k = kernel(dev, "pooling", kPoolingSource, o, "pool_forward");
  launch(dev, k, rows, false, mem(x), off(x), mem(y), off(y), cl_long(planes), a.in, a.out, a.kernel, a.stride, a.pad,
         a.dilation, cl_int(op == PoolOp::max ? 0 : 1));
}

void pool_backward(int d, PoolOp op, DType t, backend::Buffer x, backend::Buffer y, backend::Buffer dy,
                   backend::Buffer dx, const backend::ConvGeometry& g) {
  check_window_geometry("pool backward", t, g);
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "pool backward");
  WindowArgs a = window_args(g);
  const int64_t planes = g.batch * g.in_channels;
  const int64_t rows = planes * a.in.s[0] * a.in.s[1];
  if (rows == 0 || a.in.s[2] == 0 || a.out_size == 0) return;
  auto& k = kernel(dev, "pooling", kPoolingSource, o, "pool_backward");
  launch(dev, k, rows, false, mem(x), off(x), mem(y), off(y), mem(dy), off(dy), mem(dx), off(dx), cl_long(planes),
         a.in, a.out, a.kernel, a.stride, a.pad, a.dilation, cl_int(op == PoolOp::max ? 0 : 1));
}

}  // namespace flux::opencl
