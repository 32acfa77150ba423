// The index math of the GPU window kernels (conv.cu: im2col / col2im; pooling.cu: pooling), one
// output element per call, as host-and-device functions: the kernels are loops over these, and
// tests/test_gpu_window_math.cpp runs the same functions on the CPU against float64 references, so
// the arithmetic is checked on machines without a GPU. Semantics: include/flux/backend.hpp.
// No runtime headers: the host test includes this file alone.
#pragma once
#include <cmath>
#include <cstdint>

#include "flux/backend.hpp"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FLUX_WINDOW_HD __host__ __device__ inline
#else
#define FLUX_WINDOW_HD inline
#endif

namespace flux::cuda_backend {

/// A ConvGeometry on exactly three spatial axes (D, H, W), unused leading axes of length 1, so 1-D and
/// 2-D windows run the 3-D loops. Plain data: kernels take it by value.
struct Window3 {
  int64_t in[3], out[3], kernel[3], stride[3], pad[3], dilation[3];
  int64_t in_size, out_size, kernel_size;  // products over the three axes
};

inline Window3 window3(const backend::ConvGeometry& g) {
  Window3 a{};
  a.in_size = a.out_size = a.kernel_size = 1;
  const int shift = 3 - g.spatial;
  for (int i = 0; i < 3; ++i) {
    const int j = i - shift;
    const bool used = j >= 0;
    a.in[i] = used ? g.in[j] : 1;
    a.out[i] = used ? g.out[j] : 1;
    a.kernel[i] = used ? g.kernel[j] : 1;
    a.stride[i] = used ? g.stride[j] : 1;
    a.pad[i] = used ? g.pad_lo[j] : 0;
    a.dilation[i] = used ? g.dilation[j] : 1;
    a.in_size *= a.in[i];
    a.out_size *= a.out[i];
    a.kernel_size *= a.kernel[i];
  }
  return a;
}

/// Splits a flat index over (rest, size[0], size[1], size[2]) into its three positions; returns rest.
FLUX_WINDOW_HD int64_t split3(int64_t k, const int64_t size[3], int64_t at[3]) {
  at[2] = k % size[2];
  k /= size[2];
  at[1] = k % size[1];
  k /= size[1];
  at[0] = k % size[0];
  return k / size[0];
}

// ---- convolution: col is (N * C, K, P) row blocks, r = n * C + c ----

/// col[k] for k = (r * K + kk) * P + p: x[r, p * stride - pad + kk * dilation], 0 outside.
template <class T> FLUX_WINDOW_HD T im2col_value(const T* x, const Window3& a, int64_t k) {
  int64_t o[3], w[3];
  const int64_t r = split3(k / a.out_size, a.kernel, w);
  split3(k % a.out_size, a.out, o);
  int64_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t p = o[i] * a.stride[i] - a.pad[i] + w[i] * a.dilation[i];
    if (p < 0 || p >= a.in[i]) return T(0);
    at = at * a.in[i] + p;
  }
  return x[r * a.in_size + at];
}

/// The new dx[j]: dx[j] plus, in kernel order, every column element that im2col read from j.
template <class T> FLUX_WINDOW_HD T col2im_value(const T* col, const T* dx, const Window3& a, int64_t j) {
  int64_t q[3];
  const int64_t r = split3(j, a.in, q);
  const T* c = col + r * a.kernel_size * a.out_size;
  T acc = dx[j];
  for (int64_t k0 = 0; k0 < a.kernel[0]; ++k0) {
    const int64_t t0 = q[0] + a.pad[0] - k0 * a.dilation[0];
    if (t0 < 0 || t0 % a.stride[0] || t0 / a.stride[0] >= a.out[0]) continue;
    for (int64_t k1 = 0; k1 < a.kernel[1]; ++k1) {
      const int64_t t1 = q[1] + a.pad[1] - k1 * a.dilation[1];
      if (t1 < 0 || t1 % a.stride[1] || t1 / a.stride[1] >= a.out[1]) continue;
      for (int64_t k2 = 0; k2 < a.kernel[2]; ++k2) {
        const int64_t t2 = q[2] + a.pad[2] - k2 * a.dilation[2];
        if (t2 < 0 || t2 % a.stride[2] || t2 / a.stride[2] >= a.out[2]) continue;
        const int64_t kk = (k0 * a.kernel[1] + k1) * a.kernel[2] + k2;
        const int64_t p = (t0 / a.stride[0] * a.out[1] + t1 / a.stride[1]) * a.out[2] + t2 / a.stride[2];
        acc += c[kk * a.out_size + p];
      }
    }
  }
  return acc;
}

// ---- pooling: x (N * C, in...), y and dy (N * C, out...) ----

template <class T> FLUX_WINDOW_HD T pool_take_max(T m, T v) { return (v > m || v != v) ? v : m; }  // NaN wins, stays
template <class T> FLUX_WINDOW_HD bool pool_holds(T v, T y) { return v == y || (v != v && y != y); }

/// The window of output position o along axis i, clipped to the input: [begin, end).
FLUX_WINDOW_HD void pool_clip(const Window3& a, int i, int64_t o, int64_t& begin, int64_t& end) {
  const int64_t start = o * a.stride[i] - a.pad[i];
  begin = start > 0 ? start : 0;
  end = start + a.kernel[i] < a.in[i] ? start + a.kernel[i] : a.in[i];
}

/// The outputs [begin, end) along axis i whose windows contain input position p.
FLUX_WINDOW_HD void pool_reach(const Window3& a, int i, int64_t p, int64_t& begin, int64_t& end) {
  const int64_t lo = p + a.pad[i] - a.kernel[i] + 1;  // o * stride >= lo
  begin = lo > 0 ? (lo + a.stride[i] - 1) / a.stride[i] : 0;
  const int64_t last = (p + a.pad[i]) / a.stride[i] + 1;  // o * stride <= p + pad
  end = last < a.out[i] ? last : a.out[i];
}

/// y[k]: the max (padding never counts; -inf for a window of padding only) or the mean over the full
/// window size (padding counts as zeros).
template <class T, backend::PoolOp op> FLUX_WINDOW_HD T pool_value(const T* x, const Window3& a, int64_t k) {
  int64_t o[3], b[3], e[3];
  const int64_t plane = split3(k, a.out, o);
  for (int i = 0; i < 3; ++i) pool_clip(a, i, o[i], b[i], e[i]);
  const T* xp = x + plane * a.in_size;
  T acc = op == backend::PoolOp::max ? T(-HUGE_VAL) : T(0);
  for (int64_t d = b[0]; d < e[0]; ++d)
    for (int64_t h = b[1]; h < e[1]; ++h) {
      const T* row = xp + (d * a.in[1] + h) * a.in[2];
      for (int64_t w = b[2]; w < e[2]; ++w)
        acc = op == backend::PoolOp::max ? pool_take_max(acc, row[w]) : acc + row[w];
    }
  return op == backend::PoolOp::max ? acc : acc / T(a.kernel_size);
}

/// Max pooling: the in-plane index of the first window position (d, then h, then w) holding y[k], or -1.
template <class T> FLUX_WINDOW_HD int64_t pool_first_max(const T* x, const T* y, const Window3& a, int64_t k) {
  int64_t o[3], b[3], e[3];
  const int64_t plane = split3(k, a.out, o);
  for (int i = 0; i < 3; ++i) pool_clip(a, i, o[i], b[i], e[i]);
  const T* xp = x + plane * a.in_size;
  const T target = y[k];
  for (int64_t d = b[0]; d < e[0]; ++d)
    for (int64_t h = b[1]; h < e[1]; ++h) {
      const int64_t base = (d * a.in[1] + h) * a.in[2];
      for (int64_t w = b[2]; w < e[2]; ++w)
        if (pool_holds(xp[base + w], target)) return base + w;
    }
  return -1;
}

/// The new dx[j]: dx[j] plus, in output order, dy of every output whose window reaches j (max: only
/// those whose first maximum arg[o] is j; mean: dy / window size).
template <class T, backend::PoolOp op>
FLUX_WINDOW_HD T pool_gather(const T* dy, const int64_t* arg, const T* dx, const Window3& a, int64_t j) {
  const int64_t pos = j % a.in_size, plane = j / a.in_size;
  int64_t q[3], b[3], e[3];
  split3(pos, a.in, q);
  for (int i = 0; i < 3; ++i) pool_reach(a, i, q[i], b[i], e[i]);
  const T* dyp = dy + plane * a.out_size;
  T acc = dx[j];
  for (int64_t d = b[0]; d < e[0]; ++d)
    for (int64_t h = b[1]; h < e[1]; ++h)
      for (int64_t w = b[2]; w < e[2]; ++w) {
        const int64_t o = (d * a.out[1] + h) * a.out[2] + w;
        if constexpr (op == backend::PoolOp::max) {
          if (arg[plane * a.out_size + o] == pos) acc += dyp[o];
        } else {
          acc += dyp[o] / T(a.kernel_size);
        }
      }
  return acc;
}

}  // namespace flux::cuda_backend
