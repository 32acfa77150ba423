// Convolution on the CPU: which kernel runs a call. Forwards ask the kernel-choice seam
// (kernel_choice.hpp, Site::conv_forward) among the kernels that take the geometry: oneDNN
// (conv_onednn.cpp), flux's few-pixel kernel (conv_own.cpp) and, at inference, Winograd F(2x2, 3x3)
// (winograd.cpp); gradients run on oneDNN. false: none takes the case, and the core runs its portable
// im2col + GEMM path (conv_reference.cpp).
#include <algorithm>
#include <limits>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/prepared.hpp"

namespace flux::cpu_backend {

namespace {

/// Whether oneDNN's 32-bit indexing takes the geometry: a size, stride, pad or dilation beyond 2^30
/// (valid, e.g. a stride of 2^62 with a one-pixel output; found by tests/fuzz/fuzz_shapes) takes the
/// portable im2col path, whose 64-bit offsets never exceed the padded input.
bool fits_32_bits(const backend::ConvGeometry& g) {
  constexpr int64_t kLimit = int64_t(1) << 30;
  for (int i = 0; i < g.spatial; ++i)
    if (g.in[i] > kLimit || g.out[i] > kLimit || g.kernel[i] > kLimit || g.stride[i] > kLimit ||
        g.dilation[i] > kLimit || g.pad_lo[i] > kLimit || g.pad_hi[i] > kLimit)
      return false;
  return true;
}

/// The seam's question for a forward (Site::conv_forward). Padding is not part of it.
Query conv_query(const backend::ConvGeometry& g, bool affine) {
  Query q;
  q.site = Site::conv_forward;
  q.threads = num_threads();
  q.dims[0] = g.spatial, q.dims[1] = g.batch, q.dims[2] = g.in_channels, q.dims[3] = g.out_channels;
  q.dims[4] = g.groups;
  for (int i = 0; i < 3; ++i) {
    const bool used = i < g.spatial;
    q.dims[size_t(5 + i)] = used ? g.in[i] : 1;
    q.dims[size_t(8 + i)] = used ? g.kernel[i] : 1;
    q.dims[size_t(11 + i)] = used ? g.stride[i] : 1;
    q.dims[size_t(14 + i)] = used ? g.dilation[i] : 1;
  }
  q.dims[17] = affine;
  return q;
}

/// The kernels that take a forward: oneDNN wherever built in, the few-pixel kernel where it fits,
/// Winograd where it fits at inference (its transformed weights are kept with the weight tensor).
/// bf16: oneDNN alone (flux's own kernels are float32).
Candidates forward_candidates(const backend::ConvGeometry& g, DType dt = DType::f32) {
  Candidates c = FLUX_HAVE_ONEDNN ? bit(Kernel::onednn) : 0;
  if (dt != DType::f32) return c;
  if (few_pixel_fits(g)) c |= bit(Kernel::few_pixel);
  if (g.weight_cache && winograd_fits(g)) c |= bit(Kernel::winograd);
  return c;
}

/// A forward by `use`; false when that kernel declines (oneDNN: no implementation for the case).
bool run_forward(Kernel use, ConvKind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
                 const ConvPostOps& ep, void* residual, DType dt) {
  switch (use) {
    case Kernel::few_pixel: few_pixel_forward(kind, bias, g, buffers, ep, residual); return true;
    case Kernel::winograd: {
      const bool affine = kind == ConvKind::forward_affine;
      WinogradEpilogue e;
      e.scale = affine ? static_cast<const float*>(buffers[2]) : nullptr;
      e.shift = affine ? static_cast<const float*>(buffers[3]) : bias ? static_cast<const float*>(buffers[2]) : nullptr;
      e.relu = kind == ConvKind::forward_relu || (affine && ep.relu);
      e.residual = affine && ep.residual ? static_cast<const float*>(residual) : nullptr;
      e.relu_after = affine && ep.relu_after;
      winograd_forward(static_cast<const float*>(buffers[0]), static_cast<const float*>(buffers[1]), g, e,
                       static_cast<float*>(buffers.back()));
      return true;
    }
    default: return onednn_conv(kind, bias, g, buffers, ep, residual, dt);
  }
}

bool forward(ConvKind kind, bool bias, const backend::ConvGeometry& g, const std::vector<void*>& buffers,
             const ConvPostOps& ep = {}, void* residual = nullptr, Kernel forced = Kernel(-1), DType dt = DType::f32) {
  if (g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  const Candidates candidates = forward_candidates(g, dt);
  if (!candidates) return false;
  if (int(forced) >= 0 && !(candidates & bit(forced))) return false;  // the tuner asked for a kernel that cannot
  const Kernel use = int(forced) >= 0 ? forced : choose(conv_query(g, kind == ConvKind::forward_affine), candidates);
  return run_forward(use, kind, bias, g, buffers, ep, residual, dt);
}

/// The tuner's timer for Site::conv_forward: the forward on operands of its shape (pads: "same" for
/// odd kernels; wall time, as its chunks run on the pool; best of reps, weights prepared first).
double time_conv(const Query& q, Kernel kernel, int reps) {
  backend::ConvGeometry g;
  g.spatial = int(q.dims[0]), g.batch = q.dims[1], g.in_channels = q.dims[2], g.out_channels = q.dims[3];
  g.groups = q.dims[4];
  for (int i = 0; i < g.spatial; ++i) {
    g.in[i] = q.dims[size_t(5 + i)], g.kernel[i] = q.dims[size_t(8 + i)], g.stride[i] = q.dims[size_t(11 + i)];
    g.dilation[i] = q.dims[size_t(14 + i)];
    g.pad_lo[i] = g.pad_hi[i] = g.dilation[i] * (g.kernel[i] - 1) / 2;
    g.out[i] = (g.in[i] + 2 * g.pad_lo[i] - g.dilation[i] * (g.kernel[i] - 1) - 1) / g.stride[i] + 1;
  }
  int64_t in = g.batch * g.in_channels, out = g.batch * g.out_channels, w = g.out_channels * g.in_channels / g.groups;
  for (int i = 0; i < g.spatial; ++i) in *= g.in[i], out *= g.out[i], w *= g.kernel[i];
  std::vector<float> x(size_t(in), 0.5f), wt(size_t(w), 0.01f), b(size_t(g.out_channels), 0.1f), y(size_t(out), 0.f);
  LocalPreparedCache cache;
  g.weight_cache = &cache;
  const std::vector<void*> buffers{x.data(), wt.data(), b.data(), y.data()};
  if (!forward(ConvKind::forward, true, g, buffers, {}, nullptr, kernel)) return std::numeric_limits<double>::infinity();
  return best_wall_seconds(reps, [&] { forward(ConvKind::forward, true, g, buffers, {}, nullptr, kernel); });
}
[[maybe_unused]] const bool conv_timer_registered = (register_timer(Site::conv_forward, time_conv), true);

}  // namespace

namespace {
/// Whether the library kernels take dtype t now: float32 always, bf16 where the CPU's units run it.
bool takes(DType t) { return t == DType::f32 || (t == DType::bf16 && bf16_kernels_enabled()); }
}  // namespace

bool conv_forward(DType t, void* x, void* w, void* bias, void* y, const backend::ConvGeometry& g, bool relu) {
  if (!takes(t)) return false;
  const ConvKind kind = relu ? ConvKind::forward_relu : ConvKind::forward;
  if (bias) return forward(kind, true, g, {x, w, bias, y}, {}, nullptr, Kernel(-1), t);
  return forward(kind, false, g, {x, w, y}, {}, nullptr, Kernel(-1), t);
}

bool conv_forward_affine(DType t, void* x, void* w, void* scale, void* shift, void* residual, void* y,
                         const backend::ConvGeometry& g, bool relu, bool relu_after) {
  if (!takes(t)) return false;
  ConvPostOps ep;
  ep.relu = relu, ep.residual = residual != nullptr, ep.relu_after = relu_after;
  if (t == DType::f32) return forward(ConvKind::forward_affine, false, g, {x, w, scale, shift, y}, ep, residual);
  // bf16: the kernel takes the per-channel scale and shift in float32.
  std::vector<float> channels(size_t(2 * g.out_channels));
  half_storage_to_float(t, static_cast<const uint16_t*>(scale), channels.data(), g.out_channels);
  half_storage_to_float(t, static_cast<const uint16_t*>(shift), channels.data() + g.out_channels, g.out_channels);
  return forward(ConvKind::forward_affine, false, g, {x, w, channels.data(), channels.data() + g.out_channels, y}, ep,
                 residual, Kernel(-1), t);
}

Kernel conv_forward_kernel(const backend::ConvGeometry& g, bool affine) {
  const Candidates candidates = forward_candidates(g);
  return candidates ? choose(conv_query(g, affine), candidates) : Kernel(-1);
}

bool conv_backward_data(DType t, void* dy, void* w, void* dx, const backend::ConvGeometry& g) {
  if (!takes(t) || g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  return onednn_conv(ConvKind::backward_data, false, g, {dy, w, dx}, {}, nullptr, t);
}

bool conv_backward_weight(DType t, void* x, void* dy, void* dw, void* dbias, const backend::ConvGeometry& g) {
  if (!takes(t) || g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  if (dbias) return onednn_conv(ConvKind::backward_weight, true, g, {x, dy, dw, dbias}, {}, nullptr, t);
  return onednn_conv(ConvKind::backward_weight, false, g, {x, dy, dw}, {}, nullptr, t);
}

}  // namespace flux::cpu_backend
