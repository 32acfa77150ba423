// conv and conv_transpose over (N, C, spatial...) activations with 1 to 3 spatial axes
// (cross-correlation, as PyTorch's conv1d/2d/3d and conv_transpose1d/2d/3d).
//   conv:           x (N, C, in...), w (O, C / G, k...), bias (O,)     -> y (N, O, out...)
//   conv_transpose: x (N, C, in...), w (C, O / G, k...), bias (O,)     -> y (N, O, out...)
// conv_transpose is conv's gradient with respect to its input, so the two share three raw kernels on
// one ConvGeometry (that of the conv): forward, data gradient and weight gradient. Each first asks the
// backend for its library fast path (oneDNN, cuDNN), then runs the portable path:
//   forward:     col = im2col(x) (N, G, C/G * K, P); y[n, g] = w[g] (O/G, C/G * K) col[n, g] (+ bias)
//   data grad:   dcol[n, g] = w[g]ᵀ dy[n, g]; dx = col2im(dcol)
//   weight grad: dw[g] = sum_n dy[n, g] col[n, g]ᵀ; dbias = sum of dy over N and the spatial axes
// with K = prod(kernel), P = prod(out) and every GEMM through the backend's batched matmul.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "flux/autodiff.hpp"
#include "flux/nn/conv_fusion.hpp"
#include "flux/ops.hpp"
#include "src/autocast.hpp"
#include "src/autodiff_state.hpp"
#include "src/environment.hpp"
#include "src/ops/conv_geometry.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/through_float32.hpp"
#include "src/storage_cache.hpp"
#include "src/ops/registry.hpp"

namespace flux {

using Grads = std::vector<Tensor>;
using backend::ConvGeometry;
using namespace detail;

namespace detail {

namespace {
std::atomic<int> g_library_kernels{-1};  // -1: not yet read from FLUX_LIBRARY_KERNELS
std::atomic<int> g_conv_fusion{-1};      // -1: not yet read from FLUX_CONV_FUSION

/// A switch read from the environment variable `name` (a boolean, on by default), until set explicitly.
bool switch_value(std::atomic<int>& value, const char* name) {
  int v = value.load();
  if (v < 0) {
    v = environment::flag(name) ? 1 : 0;
    int expected = -1;
    value.compare_exchange_strong(expected, v);
    v = value.load();
  }
  return v == 1;
}
}  // namespace

void set_library_kernels(bool enabled) { g_library_kernels = enabled ? 1 : 0; }
bool library_kernels() { return switch_value(g_library_kernels, "FLUX_LIBRARY_KERNELS"); }
void set_conv_fusion(bool enabled) { g_conv_fusion = enabled ? 1 : 0; }
bool conv_fusion() { return switch_value(g_conv_fusion, "FLUX_CONV_FUSION"); }

}  // namespace detail

namespace {

int64_t product(const int64_t* v, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= v[i];
  return p;
}

/// t's buffer advanced by `elements` elements.
backend::Buffer at(const Tensor& t, int64_t elements) {
  backend::Buffer b = flux::detail::buffer_of(t);
  b.offset += size_t(elements) * dtype_size(t.dtype());
  return b;
}

Shape input_shape(const ConvGeometry& g) {
  Shape s{g.batch, g.in_channels};
  for (int i = 0; i < g.spatial; ++i) s.push_back(g.in[i]);
  return s;
}

Shape weight_shape(const ConvGeometry& g) {
  Shape s{g.out_channels, g.in_channels / g.groups};
  for (int i = 0; i < g.spatial; ++i) s.push_back(g.kernel[i]);
  return s;
}

/// For every sample n and group g: C[n, g] = op(A[g]) op(B[n, g]) + beta C[n, g], where A holds one
/// (m, k) matrix per group and B, C are (N, G, ...) arrays of (k, n) and (m, n) matrices. One batched
/// GEMM when G == 1 (A broadcast), else a loop over the shorter of N and G.
void grouped_gemm(const Tensor& A, const Tensor& B, const Tensor& C, int64_t N, int64_t G, int64_t m, int64_t n,
                  int64_t k, bool trans_a, double beta) {
  backend::Backend& be = C.backend();
  int dev = C.device().index();
  DType t = C.dtype();
  int64_t a_group = m * k, b_item = k * n, c_item = m * n;
  backend::Gemm gm;
  gm.m = m, gm.n = n, gm.k = k;
  gm.trans_a = trans_a;
  gm.beta = beta;
  if (G == 1 || N <= G) {
    gm.batch = G;
    gm.stride_a = G == 1 ? 0 : a_group;
    gm.stride_b = b_item, gm.stride_c = c_item;
    if (G == 1) gm.batch = N;  // every sample against the one weight matrix
    int64_t loops = G == 1 ? 1 : N;
    for (int64_t i = 0; i < loops; ++i)
      be.matmul(dev, t, flux::detail::buffer_of(A), at(B, i * G * b_item), at(C, i * G * c_item), gm);
  } else {
    gm.batch = N;
    gm.stride_a = 0;
    gm.stride_b = G * b_item, gm.stride_c = G * c_item;
    for (int64_t j = 0; j < G; ++j) be.matmul(dev, t, at(A, j * a_group), at(B, j * b_item), at(C, j * c_item), gm);
  }
}

/// y (N, O, spatial...) filled with bias[o] along the channel axis.
void fill_with_bias(Tensor& y, const Tensor& bias) {
  int64_t n = y.shape()[0], o = y.shape()[1], p = o ? y.numel() / (n * o) : 0;
  backend::StridedCopy plan;
  plan.ndim = 3;
  plan.shape[0] = n, plan.shape[1] = o, plan.shape[2] = p;
  plan.src_stride[0] = 0, plan.src_stride[1] = 1, plan.src_stride[2] = 0;
  plan.dst_stride[0] = o * p, plan.dst_stride[1] = p, plan.dst_stride[2] = 1;
  y.backend().strided_copy(y.device().index(), y.dtype(), flux::detail::buffer_of(bias), flux::detail::buffer_of(y), plan);
}

/// y += bias[o] along the channel axis of y (N, O, spatial...).
void add_bias(Tensor& y, const Tensor& bias) {
  Shape b{1, bias.shape()[0]};
  for (int i = 2; i < y.ndim(); ++i) b.push_back(1);
  backend::Broadcast plan = make_plan(y.shape(), {&y.shape(), &b});
  y.backend().binary(y.device().index(), backend::BinaryOp::add, y.dtype(), flux::detail::buffer_of(y), flux::detail::buffer_of(bias), flux::detail::buffer_of(y), plan);
}

/// (O,) sums of dy (N, O, spatial...) over the batch and spatial axes.
Tensor channel_sum(const Tensor& dy) {
  if (is_half(dy.dtype())) return raw_cast(channel_sum(raw_cast(dy, DType::f32)), dy.dtype());
  int64_t n = dy.shape()[0], o = dy.shape()[1], p = o && n ? dy.numel() / (n * o) : 0;
  Tensor out = Tensor::empty(Shape{o}, dy.dtype(), dy.device());
  backend::Backend& be = dy.backend();
  int dev = dy.device().index();
  if (n * p == 0) {
    be.fill(dev, dy.dtype(), flux::detail::buffer_of(out), o, 0.0);
    return out;
  }
  Tensor rows = Tensor::empty(Shape{n, o}, dy.dtype(), dy.device());
  be.reduce(dev, backend::ReduceOp::sum, dy.dtype(), flux::detail::buffer_of(dy), flux::detail::buffer_of(rows), n * o, p, 1);
  be.reduce(dev, backend::ReduceOp::sum, dy.dtype(), flux::detail::buffer_of(rows), flux::detail::buffer_of(out), 1, n, o);
  return out;
}

Tensor im2col_raw(const Tensor& x, const ConvGeometry& g) {
  int64_t cgk = g.in_channels / g.groups * product(g.kernel, g.spatial), p = product(g.out, g.spatial);
  Tensor col = Tensor::empty(Shape{g.batch, g.groups, cgk, p}, x.dtype(), x.device());
  x.backend().im2col(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(col), g);
  return col;
}

/// y = conv(x, w) + bias (bias may be undefined) for the geometry g.
/// y = conv(x, w) + bias, followed by relu when `relu` (fused by the backend where it can).
Tensor conv_forward_raw(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeometry& geometry,
                        bool relu = false) {
  Tensor y = Tensor::empty(output_shape(geometry), x.dtype(), x.device());
  if (y.numel() == 0) return y;
  if (is_half(x.dtype())) {
    // The backend's low-precision kernel (float32 accumulation), else through float32.
    ConvGeometry g = geometry;
    if (inference_call()) g.weight_cache = &detail::storage_cache(w), g.inference = true;
    backend::Backend& be = x.backend();
    const int dev = x.device().index();
    const backend::Buffer xb = flux::detail::buffer_of(x), wb = flux::detail::buffer_of(w), yb = flux::detail::buffer_of(y);
    const backend::Buffer b = bias.defined() ? flux::detail::buffer_of(bias) : backend::Buffer{};
    if (library_kernels() && x.numel() && w.numel() &&
        (relu ? be.conv_forward_relu(dev, x.dtype(), xb, wb, b, yb, g) : be.conv_forward(dev, x.dtype(), xb, wb, b, yb, g)))
      return y;
    // Through float32; the float32 copies of x and w go before y is cast down.
    const Tensor y32 = conv_forward_raw(float32_of(x), f32_weight(w), float32_of(bias), geometry, relu);
    return raw_cast(y32, x.dtype());
  }
  ConvGeometry g = geometry;
  // Inference: the backend may keep w prepared in its kernel's layout (never in training, forward or
  // backward: a step writes w, so a prepared copy would be made and dropped each time).
  if (inference_call()) g.weight_cache = &detail::storage_cache(w), g.inference = true;
  backend::Backend& be = x.backend();
  int dev = x.device().index();
  backend::Buffer b = bias.defined() ? flux::detail::buffer_of(bias) : backend::Buffer{};
  auto finish = [&] {
    if (relu) {
      be.unary(dev, backend::UnaryOp::relu, y.dtype(), flux::detail::buffer_of(y), flux::detail::buffer_of(y), y.numel(), 0);
    }
    return y;
  };
  if (x.numel() == 0 || w.numel() == 0) {  // no input channels: the bias alone
    if (bias.defined()) fill_with_bias(y, bias);
    else be.fill(dev, y.dtype(), flux::detail::buffer_of(y), y.numel(), 0.0);
    return finish();
  }
  if (library_kernels()) {
    const backend::Buffer xb = flux::detail::buffer_of(x);
    if (relu && be.conv_forward_relu(dev, x.dtype(), xb, flux::detail::buffer_of(w), b, flux::detail::buffer_of(y), g))
      return y;
    if (be.conv_forward(dev, x.dtype(), xb, flux::detail::buffer_of(w), b, flux::detail::buffer_of(y), g)) return finish();
  }
  Tensor col = im2col_raw(x, g);
  if (bias.defined()) fill_with_bias(y, bias);  // the GEMM accumulates onto it (beta = 1)
  int64_t cgk = col.shape()[2], p = col.shape()[3];
  grouped_gemm(w, col, y, g.batch, g.groups, g.out_channels / g.groups, p, cgk, false, bias.defined() ? 1.0 : 0.0);
  return finish();
}

/// dx (N, C, in...) = the gradient of conv(x, w) for the output gradient dy (N, O, out...), plus
/// bias[c] along the channel axis when bias is defined (conv_transpose's forward).
Tensor conv_data_raw(const Tensor& dy, const Tensor& w, const ConvGeometry& g, const Tensor& bias = Tensor()) {
  Tensor dx = Tensor::empty(input_shape(g), dy.dtype(), dy.device());
  if (dx.numel() == 0) return dx;
  backend::Backend& be = dy.backend();
  int dev = dy.device().index();
  if (is_half(dy.dtype())) {
    if (library_kernels() && !bias.defined() && dy.numel() && w.numel() &&
        be.conv_backward_data(dev, dy.dtype(), flux::detail::buffer_of(dy), flux::detail::buffer_of(w), flux::detail::buffer_of(dx), g))
      return dx;
    const Tensor dx32 = conv_data_raw(float32_of(dy), f32_weight(w), g, float32_of(bias));  // (copies freed first)
    return raw_cast(dx32, dy.dtype());
  }
  if (dy.numel() == 0 || w.numel() == 0) {
    if (bias.defined()) fill_with_bias(dx, bias);
    else be.fill(dev, dx.dtype(), flux::detail::buffer_of(dx), dx.numel(), 0.0);
    return dx;
  }
  if (library_kernels() && be.conv_backward_data(dev, dy.dtype(), flux::detail::buffer_of(dy), flux::detail::buffer_of(w), flux::detail::buffer_of(dx), g)) {
    if (bias.defined()) add_bias(dx, bias);
    return dx;
  }
  int64_t cgk = g.in_channels / g.groups * product(g.kernel, g.spatial), p = product(g.out, g.spatial);
  Tensor dcol = Tensor::empty(Shape{g.batch, g.groups, cgk, p}, dy.dtype(), dy.device());
  grouped_gemm(w, dy, dcol, g.batch, g.groups, cgk, p, g.out_channels / g.groups, true, 0.0);
  if (bias.defined()) fill_with_bias(dx, bias);
  else be.fill(dev, dx.dtype(), flux::detail::buffer_of(dx), dx.numel(), 0.0);
  be.col2im(dev, dx.dtype(), flux::detail::buffer_of(dcol), flux::detail::buffer_of(dx), g);
  return dx;
}

/// The gradients of conv(x, w) + bias with respect to w (O, C / G, k...) and, when want_bias, bias (O,).
std::pair<Tensor, Tensor> conv_weight_raw(const Tensor& x, const Tensor& dy, const ConvGeometry& g, bool want_weight,
                                          bool want_bias) {
  backend::Backend& be = x.backend();
  int dev = x.device().index();
  DType t = x.dtype();
  Tensor dw, db;
  if (!want_weight) return {dw, want_bias ? channel_sum(dy) : db};
  if (is_half(t)) {
    // Half operands: the gradients in Float32, as the kernels accumulate them. Under autocast the weight
    // is a cast of a Float32 master, whose backward then hands them on unrounded and without a pass;
    // a half parameter's (bf16(model)) is rounded once, where the tape hands it out.
    if (library_kernels() && x.numel() && dy.numel()) {
      dw = Tensor::empty(weight_shape(g), DType::f32, x.device());
      if (want_bias) db = Tensor::empty(Shape{g.out_channels}, DType::f32, x.device());
      if (dw.numel() && be.conv_backward_weight_float32(dev, t, flux::detail::buffer_of(x), flux::detail::buffer_of(dy),
                                                        flux::detail::buffer_of(dw),
                                                        want_bias ? flux::detail::buffer_of(db) : backend::Buffer{}, g))
        return {dw, db};
      dw = Tensor::empty(weight_shape(g), t, x.device());
      if (want_bias) db = Tensor::empty(Shape{g.out_channels}, t, x.device());
      if (dw.numel() && be.conv_backward_weight(dev, t, flux::detail::buffer_of(x), flux::detail::buffer_of(dy),
                                                flux::detail::buffer_of(dw),
                                                want_bias ? flux::detail::buffer_of(db) : backend::Buffer{}, g))
        return {dw, db};
    }
    return conv_weight_raw(float32_of(x), float32_of(dy), g, true, want_bias);  // (copies freed first)
  }
  dw = Tensor::empty(weight_shape(g), t, x.device());
  if (want_bias) db = Tensor::empty(Shape{g.out_channels}, t, x.device());
  if (dw.numel() == 0) return {dw, want_bias ? channel_sum(dy) : db};
  if (x.numel() == 0 || dy.numel() == 0) {
    be.fill(dev, t, flux::detail::buffer_of(dw), dw.numel(), 0.0);
    return {dw, want_bias ? channel_sum(dy) : db};
  }
  if (library_kernels() && be.conv_backward_weight(dev, t, flux::detail::buffer_of(x), flux::detail::buffer_of(dy), flux::detail::buffer_of(dw),
                                                   want_bias ? flux::detail::buffer_of(db) : backend::Buffer{}, g))
    return {dw, db};
  Tensor col = im2col_raw(x, g);
  int64_t n = g.batch, groups = g.groups, og = g.out_channels / groups, cgk = col.shape()[2], p = col.shape()[3];
  // dw[n, g] (O/G, C/G * K) = dy[n, g] (O/G, P) col[n, g]ᵀ: one batched GEMM over (n, g) into per-sample
  // partial products summed over n when they fit in a modest buffer, else GEMMs accumulating over n.
  backend::Gemm gm;
  gm.m = og, gm.n = cgk, gm.k = p;
  gm.trans_b = true;
  gm.stride_a = og * p, gm.stride_b = cgk * p, gm.stride_c = og * cgk;
  int64_t partial_bytes = n * dw.numel() * int64_t(dtype_size(t));
  if (n == 1) {
    gm.batch = groups;
    be.matmul(dev, t, flux::detail::buffer_of(dy), flux::detail::buffer_of(col), flux::detail::buffer_of(dw), gm);
  } else if (partial_bytes <= (int64_t(64) << 20)) {
    Tensor partial = Tensor::empty(Shape{n, dw.numel()}, t, x.device());
    gm.batch = n * groups;
    be.matmul(dev, t, flux::detail::buffer_of(dy), flux::detail::buffer_of(col), flux::detail::buffer_of(partial), gm);
    be.reduce(dev, backend::ReduceOp::sum, t, flux::detail::buffer_of(partial), flux::detail::buffer_of(dw), 1, n, dw.numel());
  } else {
    gm.batch = groups;
    for (int64_t i = 0; i < n; ++i) {
      gm.beta = i ? 1.0 : 0.0;
      be.matmul(dev, t, at(dy, i * groups * og * p), at(col, i * groups * cgk * p), flux::detail::buffer_of(dw), gm);
    }
  }
  if (want_bias) db = channel_sum(dy);
  return {dw, db};
}

void check_pair(const char* api, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  if (a.device() != b.device())
    fail("[", api, "] ", a_name, " is on ", to_string(a.device()), " but ", b_name, " is on ", to_string(b.device()),
         "; move one with to(x, device)");
  if (a.dtype() != b.dtype())
    fail("[", api, "] ", a_name, " is ", dtype_name(a.dtype()), " but ", b_name, " is ", dtype_name(b.dtype()),
         "; cast one (e.g. .f32())");
}

/// Checks the operands shared by conv and conv_transpose and fills everything but the padding and the
/// sizes of the geometry's input/output. `weight_in` is the weight axis that must match x's channels
/// (1 for conv, where it counts channels per group; 0 for conv_transpose).
ConvGeometry check_operands(const char* api, const Tensor& x, const Tensor& w, const Tensor& bias, int64_t groups,
                            bool transpose) {
  check_defined(api, x);
  check_defined(api, w);
  if (w.ndim() < 3 || w.ndim() > 5)
    fail("[", api, "] weight must be (", transpose ? "C_in, C_out / groups" : "C_out, C_in / groups",
         ", kernel...) with 1 to 3 spatial axes; got shape ", to_string(w.shape()));
  int n = spatial_axes(api, x, w.ndim() - 2);
  check_pair(api, "input", x, "weight", w);
  if (groups < 1) fail("[", api, "] groups must be >= 1; got ", groups);
  int64_t c = x.shape()[1];
  if (c % groups != 0) fail("[", api, "] input channels ", c, " are not divisible by groups ", groups);
  int64_t expects = transpose ? w.shape()[0] : w.shape()[1] * groups;
  if (c != expects)
    fail("[", api, "] input has ", c, " channels, weight expects ", expects, " (weight ", to_string(w.shape()),
         groups > 1 ? ", groups " + std::to_string(groups) : std::string(), ")");
  int64_t out_channels = transpose ? w.shape()[1] * groups : w.shape()[0];
  if (!transpose && out_channels % groups != 0)
    fail("[", api, "] weight's ", out_channels, " output channels are not divisible by groups ", groups, " (weight ",
         to_string(w.shape()), ")");
  if (bias.defined()) {
    check_pair(api, "input", x, "bias", bias);
    if (bias.ndim() != 1 || bias.shape()[0] != out_channels)
      fail("[", api, "] bias must have shape (", out_channels, ",) for ", out_channels, " output channels; got ",
           to_string(bias.shape()));
  }
  ConvGeometry g;
  g.spatial = n;
  g.batch = x.shape()[0];
  g.groups = groups;
  // The geometry is always the conv's: for conv_transpose, the conv maps y (O channels) to x (C).
  g.in_channels = transpose ? out_channels : c;
  g.out_channels = transpose ? c : out_channels;
  for (int i = 0; i < n; ++i) g.kernel[i] = w.shape()[i + 2];
  return g;
}

}  // namespace

namespace {
/// The geometry as the tracer reports it (src/trace.hpp): ONNX's Conv attributes.
std::vector<trace::Attr> conv_attrs(const ConvGeometry& g, bool relu) {
  std::vector<int64_t> kernel, stride, dilation, pads;
  for (int i = 0; i < g.spatial; ++i) {
    kernel.push_back(g.kernel[i]), stride.push_back(g.stride[i]), dilation.push_back(g.dilation[i]);
    pads.push_back(g.pad_lo[i]);
  }
  for (int i = 0; i < g.spatial; ++i) pads.push_back(g.pad_hi[i]);
  return {{"kernel", kernel, {}}, {"strides", stride, {}}, {"dilations", dilation, {}}, {"pads", pads, {}},
          {"group", {g.groups}, {}}, {"relu", {int64_t(relu)}, {}}};
}

/// conv's checked geometry for x, w, bias under p.
ConvGeometry conv_geometry(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) {
  const char* api = "conv";
  ConvGeometry g = check_operands(api, x, w, bias, p.groups, false);
  int n = g.spatial;
  auto stride = expand_dims(api, "stride", p.stride, n, 1);
  auto dilation = expand_dims(api, "dilation", p.dilation, n, 1);
  for (int i = 0; i < n; ++i) {
    g.in[i] = x.shape()[i + 2];
    g.stride[i] = stride[size_t(i)];
    g.dilation[i] = dilation[size_t(i)];
  }
  resolve_padding(api, p.pad, g);
  compute_output_size(api, g);
  return g;
}

Tensor conv_impl(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p, bool relu) {
  if (auto low = autocast_low({&x, &w}))
    return conv_impl(autocast_to(x, *low), autocast_to(w, *low), autocast_to(bias, *low), p, relu);
  const ConvGeometry g = conv_geometry(x, w, bias, p);
  const bool need_x = autodiff::tracked(x), need_w = autodiff::tracked(w), need_b = autodiff::tracked(bias);
  // One node keeping x and w in their own dtype: the backward's raw kernels take the half dtypes too.
  return through_float32(
      &ops::conv, {&x, &w, &bias}, {need_w ? x : Tensor(), need_x ? w : Tensor()},
      [&](std::vector<Tensor>& keep) {
        Tensor y = conv_forward_raw(x, w, bias, g, relu);
        // relu's derivative from its output: y > 0 exactly where conv(x, w) + bias > 0.
        keep.push_back(relu ? y : Tensor());
        return y;
      },
      [g, need_x, need_w, need_b](const Grads& k, const Tensor& gy_in) {
        const Tensor &keep_x = k[0], &keep_w = k[1], &keep_y = k[2];
        Tensor gy = keep_y.defined() ? relu_grad(keep_y, gy_in) : gy_in;
        Tensor dx, dw, db;
        if (need_x) dx = conv_data_raw(gy, keep_w, g);
        if (need_w) std::tie(dw, db) = conv_weight_raw(keep_x, gy, g, true, need_b);
        else if (need_b) db = channel_sum(gy);
        return Grads{dx, dw, db};
      },
      trace::active() ? conv_attrs(g, relu) : std::vector<trace::Attr>{}, x.dtype(), kFloat32ParameterGrads);
}
}  // namespace

Tensor conv(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) {
  return conv_impl(x, w, bias, p, false);
}

Tensor detail::conv_relu(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) {
  return conv_impl(x, w, bias, p, true);
}

Tensor detail::conv_affine(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& shift,
                           const Tensor& residual, const ConvParams& p, bool relu, bool relu_after) {
  // Never on a tape: the fused kernel has no backward (callers run the recorded composition there).
  if (autodiff::recording() || trace::active() || !library_kernels()) return Tensor();
  if (auto low = autocast_low({&x, &w}))
    return conv_affine(autocast_to(x, *low), autocast_to(w, *low), autocast_to(scale, *low), autocast_to(shift, *low),
                       autocast_to(residual, *low), p, relu, relu_after);
  ConvGeometry g = conv_geometry(x, w, Tensor(), p);
  g.weight_cache = &detail::storage_cache(w), g.inference = true;
  const DType t = x.dtype();
  for (const Tensor* v : {&scale, &shift})
    if (!v->defined() || v->dtype() != t || v->device() != x.device() || v->shape() != Shape{g.out_channels})
      return Tensor();
  Shape out = output_shape(g);
  if (residual.defined() && (residual.dtype() != t || residual.device() != x.device() || residual.shape() != out))
    return Tensor();
  Tensor y = Tensor::empty(out, t, x.device());
  if (y.numel() == 0 || x.numel() == 0 || w.numel() == 0) return Tensor();
  backend::Buffer r = residual.defined() ? flux::detail::buffer_of(residual) : backend::Buffer{};
  if (!x.backend().conv_forward_affine(x.device().index(), t, flux::detail::buffer_of(x), flux::detail::buffer_of(w), flux::detail::buffer_of(scale),
                                       flux::detail::buffer_of(shift), r, flux::detail::buffer_of(y), g, relu, relu_after))
    return Tensor();
  return y;
}

Tensor conv_transpose(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvTransposeParams& p) {
  if (auto low = autocast_low({&x, &w}))
    return conv_transpose(autocast_to(x, *low), autocast_to(w, *low), autocast_to(bias, *low), p);
  const char* api = "conv_transpose";
  ConvGeometry g = check_operands(api, x, w, bias, p.groups, true);
  int n = g.spatial;
  auto stride = expand_dims(api, "stride", p.stride, n, 1);
  auto dilation = expand_dims(api, "dilation", p.dilation, n, 1);
  auto extra = expand_dims(api, "output_padding", p.output_padding, n, 0);
  for (int i = 0; i < n; ++i) {
    g.stride[i] = stride[size_t(i)];
    g.dilation[i] = dilation[size_t(i)];
    g.out[i] = x.shape()[i + 2];  // the conv's output is the transposed conv's input
  }
  if (p.pad.same) {
    // Flux's SamePad for ConvTranspose: out = in * stride (dilation 1), the pad of a conv with kernel
    // k - stride + 1; the odd pixel on the low side, as for conv.
    for (int i = 0; i < n; ++i) {
      int64_t total = std::max<int64_t>(0, int64_t(std::clamp<__int128>(__int128(g.dilation[i]) * (g.kernel[i] - g.stride[i]), 0, INT64_MAX)));
      g.pad_lo[i] = total - total / 2;
      g.pad_hi[i] = total / 2;
    }
  } else {
    resolve_padding(api, p.pad, g);
  }
  for (int i = 0; i < n; ++i)
    if (extra[size_t(i)] >= g.stride[i] && extra[size_t(i)] >= g.dilation[i])
      fail("[", api, "] output_padding ", dims_string(extra.data(), n), " must be smaller than the stride ",
           dims_string(g.stride, n), " or the dilation ", dims_string(g.dilation, n));
  int64_t sizes[3] = {1, 1, 1};
  bool positive = true;
  for (int i = 0; i < n; ++i) {
    // In 128 bits: a huge stride, kernel or dilation is an error below, never a wrapped size.
    // The unpadded extent too: the kernels index o * stride + k * dilation before removing the pad.
    const __int128 extent = __int128(g.out[i] - 1) * g.stride[i] + __int128(g.dilation[i]) * (g.kernel[i] - 1) +
                            extra[size_t(i)] + 1;
    const __int128 size = extent - g.pad_lo[i] - g.pad_hi[i];
    if (size > INT64_MAX || extent > INT64_MAX)
      fail("[", api, "] output size on axis ", i, " overflows int64 (input ", dims_string(g.out, n), ", stride ",
           dims_string(g.stride, n), ", kernel ", dims_string(g.kernel, n), ", dilation ", dims_string(g.dilation, n), ")");
    sizes[i] = int64_t(size);
    positive = positive && sizes[i] >= 1;
  }
  if (!positive)
    fail("[", api, "] output size ", dims_string(sizes, n), " is not positive (input ",
         dims_string(g.out, n), ", kernel ", dims_string(g.kernel, n), ", padding lo ", dims_string(g.pad_lo, n),
         " hi ", dims_string(g.pad_hi, n), ")");
  for (int i = 0; i < n; ++i) g.in[i] = sizes[i];
  check_geometry_sizes(api, g);
  std::vector<trace::Attr> attrs;
  if (trace::active()) {
    attrs = conv_attrs(g, false);
    attrs.push_back({"output_padding", std::vector<int64_t>(extra.begin(), extra.begin() + n), {}});
  }
  const bool need_x = autodiff::tracked(x), need_w = autodiff::tracked(w), need_b = autodiff::tracked(bias);
  return through_float32(
      &ops::conv_transpose, {&x, &w, &bias}, {need_w ? x : Tensor(), need_x ? w : Tensor()},
      [&](std::vector<Tensor>&) { return conv_data_raw(x, w, g, bias); },
      [g, need_x, need_w, need_b](const Grads& k, const Tensor& gy) {
        Tensor dx, dw, db;
        if (need_x) dx = conv_forward_raw(gy, k[1], Tensor(), g);
        if (need_w) dw = conv_weight_raw(gy, k[0], g, true, false).first;
        if (need_b) db = channel_sum(gy);
        return Grads{dx, dw, db};
      },
      std::move(attrs), x.dtype(), kFloat32ParameterGrads);
}

}  // namespace flux
