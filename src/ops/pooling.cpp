// Pooling over (N, C, spatial...) activations with 1 to 3 spatial axes (NCHW, as PyTorch; Flux's
// WHCN in memory): maxpool and meanpool with Flux's defaults and NNlib's semantics, adaptive pools
// with PyTorch's windows, global pools. Forward and backward run through the backend's pool_forward
// and pool_backward (src/backends/<name>/pooling.cpp); each backward is recorded beside its forward.
//
//   maxpool(x, window, {.stride, .pad})   y[n, c, o...] = max of x over the window at o * stride - pad_lo,
//                                         padding never taken as the maximum (NNlib, PyTorch)
//   meanpool(x, window, {.stride, .pad})  y = sum over the window / prod(window), padding counted as
//                                         zeros (NNlib's meanpool, PyTorch's count_include_pad = True)
//   adaptive_*pool(x, out)                window i on an axis of length in: [floor(i in / out),
//                                         ceil((i + 1) in / out)) (PyTorch's AdaptiveAvgPool/MaxPool)
//   global_*pool(x)                       one window over all spatial axes -> (N, C, 1...)
//
// The stride defaults to the window (Flux's MaxPool/MeanPool). A window of one value applies to every
// spatial axis of x; a window of k values needs a (k + 2)-dimensional x.
#include <algorithm>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/ops/conv_geometry.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"
#include "src/ops/through_float32.hpp"
#include "src/trace.hpp"

namespace flux {

using Grads = std::vector<Tensor>;
using backend::ConvGeometry;
using backend::PoolOp;
using namespace detail;

namespace {

// The geometry of a pool over x with the spatial sizes of x and no padding yet (stride 1, kernel 1).
ConvGeometry base_geometry(const Tensor& x, int spatial) {
  ConvGeometry g;
  g.spatial = spatial;
  g.batch = x.shape()[0];
  g.in_channels = g.out_channels = x.shape()[1];
  g.groups = 1;
  for (int i = 0; i < spatial; ++i) g.in[i] = g.out[i] = x.shape()[2 + i];
  return g;
}

// Checks that the (padded) input holds the window on every axis, then fills g.out.
void window_fits(const char* api, ConvGeometry& g) {
  for (int i = 0; i < g.spatial; ++i) {
    // 128 bits: a huge pad is the error of compute_output_size below, not a wrapped sum here.
    if (__int128(g.kernel[i]) <= __int128(g.in[i]) + g.pad_lo[i] + g.pad_hi[i]) continue;
    int64_t padded[3];
    for (int j = 0; j < g.spatial; ++j) padded[j] = g.in[j] + g.pad_lo[j] + g.pad_hi[j];
    fail("[", api, "] window ", dims_string(g.kernel, g.spatial), " is larger than the padded input ",
         dims_string(padded, g.spatial), " (input ", dims_string(g.in, g.spatial), ")");
  }
  compute_output_size(api, g);
}

// y = pool(x) over g through the backend, with its backward recorded: dx = the adjoint of dy, max
// sending each window's gradient to its first maximum in window order. Float16/BFloat16 as the backend
// takes them (reads_half) or through Float32 (a max is exact; a mean is rounded once); the tape keeps x
// and y in their own dtype either way, and a max's y cast up is the Float32 maximum exactly.
Tensor pool_raw(PoolOp op, const Tensor& x, const ConvGeometry& g) {
  const DType t = x.dtype();
  const bool half = is_half(t), direct = reads_half(x);
  std::vector<trace::Attr> attrs;
  if (trace::active() && !half) {  // (a half x while tracing: the trace keeps the casts)
    std::vector<int64_t> kernel, stride, pads;
    for (int i = 0; i < g.spatial; ++i) kernel.push_back(g.kernel[i]), stride.push_back(g.stride[i]), pads.push_back(g.pad_lo[i]);
    for (int i = 0; i < g.spatial; ++i) pads.push_back(g.pad_hi[i]);
    attrs = {{"kernel", kernel, {}}, {"strides", stride, {}}, {"pads", pads, {}}};
  }
  return through_float32(
      half ? nullptr : op == PoolOp::max ? &ops::maxpool : &ops::meanpool, {&x}, {x},
      [&](Grads& kept) {
        Tensor y;
        if (half && !direct) {
          y = raw_cast(pool_raw(op, raw_cast(x, DType::f32), g), t);
        } else {
          y = Tensor::empty(output_shape(g), t, x.device());
          if (y.numel()) x.backend().pool_forward(x.device().index(), op, t, buffer_of(x), buffer_of(y), g);
        }
        kept.push_back(y);
        return y;
      },
      [op, g](const Grads& k, const Tensor& dy) {
        // A gradient of another dtype than the kept x (Float32 for a half x) goes through Float32 copies:
        // rounding it first would lose bits.
        const DType u = dy.dtype() == k[0].dtype() ? dy.dtype() : DType::f32;
        auto as_u = [u](const Tensor& v) { return v.dtype() == u ? v : raw_cast(v, u); };
        Tensor dx = zeros(k[0].shape(), u, dy.device());
        if (dy.numel())
          dy.backend().pool_backward(dy.device().index(), op, u, buffer_of(as_u(k[0])), buffer_of(as_u(k[1])),
                                     buffer_of(as_u(dy)), buffer_of(dx), g);
        return Grads{dx};
      },
      std::move(attrs), half ? (direct ? kAsStored : DType::f32) : std::optional<DType>(t));
}

// The number of spatial axes implied by an option with 1 to 3 values (1 value: every axis of x).
int spatial_from(const char* api, const char* what, const Dims& d, const Tensor& x) {
  check_defined(api, x);
  size_t n = d.values.size();
  if (n < 1 || n > 3) fail("[", api, "] ", what, " needs 1 to 3 values (one per spatial axis); got ", n);
  return spatial_axes(api, x, n == 1 ? 0 : int(n));
}

Tensor pool(const char* api, PoolOp op, const Tensor& x, const Dims& window, const PoolParams& p) {
  int n = spatial_from(api, "window", window, x);
  ConvGeometry g = base_geometry(x, n);
  std::vector<int64_t> k = expand_dims(api, "window", window, n, 1);
  std::vector<int64_t> s = p.stride ? expand_dims(api, "stride", *p.stride, n, 1) : k;
  for (int i = 0; i < n; ++i) g.kernel[i] = k[size_t(i)], g.stride[i] = s[size_t(i)];
  resolve_padding(api, p.pad, g);
  if (op == PoolOp::max)
    for (int i = 0; i < n; ++i)
      if (g.pad_lo[i] >= g.kernel[i] || g.pad_hi[i] >= g.kernel[i]) {
        int64_t pads[6];
        for (int j = 0; j < n; ++j) pads[2 * j] = g.pad_lo[j], pads[2 * j + 1] = g.pad_hi[j];
        fail("[", api, "] padding ", dims_string(pads, 2 * n), " (lo, hi per axis) must be smaller than the window ",
             dims_string(g.kernel, n), " on every side: a window of padding alone has no maximum");
      }
  window_fits(api, g);
  return pool_raw(op, x, g);
}

// Non-overlapping windows of `kernel` along spatial axis `axis` only (length must divide evenly).
Tensor pool_along(PoolOp op, const Tensor& x, int spatial, int axis, int64_t kernel) {
  ConvGeometry g = base_geometry(x, spatial);
  g.kernel[axis] = g.stride[axis] = kernel;
  g.out[axis] = g.in[axis] / kernel;
  return pool_raw(op, x, g);
}

// Adaptive pooling. When every input length is a multiple of its output length, PyTorch's windows are
// the plain non-overlapping pool with kernel = stride = in / out: one backend call. Otherwise the
// windows have unequal sizes and are not evenly spaced, so each axis is pooled on its own, from the
// last to the first (max and mean over a box are separable: mean of means, max of maxima; reducing
// the last axis first keeps the max gradient on the first maximum in window order). On an axis that
// does not divide, each output cell i pools its slice [floor(i in / out), ceil((i + 1) in / out)) and
// the cells are concatenated: out[axis] backend pools per axis, built only from recorded ops
// (slice, pool, concat), so it is correct and differentiable on every device.
Tensor adaptive(const char* api, PoolOp op, const Tensor& x, const Dims& out) {
  int n = spatial_from(api, "output size", out, x);
  std::vector<int64_t> o = expand_dims(api, "output size", out, n, 1);
  bool divisible = true;
  for (int i = 0; i < n; ++i) {
    int64_t in = x.shape()[2 + i];
    if (in == 0) fail("[", api, "] cannot pool an empty spatial axis: input shape ", to_string(x.shape()));
    divisible = divisible && in % o[size_t(i)] == 0;
  }
  if (divisible) {
    ConvGeometry g = base_geometry(x, n);
    for (int i = 0; i < n; ++i) g.kernel[i] = g.stride[i] = g.in[i] / o[size_t(i)], g.out[i] = o[size_t(i)];
    return pool_raw(op, x, g);
  }
  Tensor y = x;
  for (int i = n - 1; i >= 0; --i) {
    int64_t in = y.shape()[2 + i], len = o[size_t(i)];
    if (in == len) continue;
    if (in % len == 0) {
      y = pool_along(op, y, n, i, in / len);
      continue;
    }
    std::vector<Tensor> cells;
    cells.reserve(size_t(len));
    for (int64_t c = 0; c < len; ++c) {
      int64_t start = c * in / len, stop = ((c + 1) * in + len - 1) / len;
      cells.push_back(pool_along(op, slice(y, 2 + i, start, stop), n, i, stop - start));
    }
    y = concat(cells, 2 + i);
  }
  return y;
}

// One window covering every spatial axis (as Flux's GlobalMaxPool = maxpool(x, size(x)[1:end-2])).
Tensor global(const char* api, PoolOp op, const Tensor& x) {
  int n = spatial_axes(api, x);
  ConvGeometry g = base_geometry(x, n);
  for (int i = 0; i < n; ++i) {
    if (g.in[i] == 0) fail("[", api, "] cannot pool an empty spatial axis: input shape ", to_string(x.shape()));
    g.kernel[i] = g.stride[i] = g.in[i];
    g.out[i] = 1;
  }
  return pool_raw(op, x, g);
}

}  // namespace

Tensor maxpool(const Tensor& x, const Dims& window, const PoolParams& p) { return pool("maxpool", PoolOp::max, x, window, p); }
Tensor meanpool(const Tensor& x, const Dims& window, const PoolParams& p) { return pool("meanpool", PoolOp::mean, x, window, p); }
Tensor adaptive_maxpool(const Tensor& x, const Dims& out) { return adaptive("adaptive_maxpool", PoolOp::max, x, out); }
Tensor adaptive_meanpool(const Tensor& x, const Dims& out) { return adaptive("adaptive_meanpool", PoolOp::mean, x, out); }
Tensor global_maxpool(const Tensor& x) { return global("global_maxpool", PoolOp::max, x); }
Tensor global_meanpool(const Tensor& x) { return global("global_meanpool", PoolOp::mean, x); }

}  // namespace flux
