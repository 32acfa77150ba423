// Convolution on the CPU: which kernel runs a call. Forwards ask the kernel-choice seam (kernel_choice.hpp,
// Site::conv_forward) among the kernels that take the geometry: oneDNN (conv_onednn.cpp), flux's few-pixel
// kernel (conv_own.cpp) and Winograd F(2x2, 3x3) (winograd.cpp: at inference, and in training where its
// weights are small). A 3x3 stride-1 conv's data gradient is such a forward and asks the same question;
// other gradients run on oneDNN. false: none takes the case, and the core runs its portable im2col + GEMM
// path (conv_reference.cpp).
#include <algorithm>
#include <limits>
#include <vector>

#include "src/backends/cpu/call_scratch.hpp"
#include "src/backends/cpu/conv_query.hpp"
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

/// The seam's question for a forward (Site::conv_forward, conv_query.hpp).
Query conv_query(const backend::ConvGeometry& g, bool affine) { return ConvQuery::of(g, affine).query(num_threads()); }

/// Transformed Winograd weights a training forward makes anew at every call: at most this many bytes
/// (16 C O floats: ResNet-18's 64- and 128-channel stages). Measured on a Zen 4 only: with 4 MiB (the
/// 256-channel stage too) the training step was slower (bench/results/2026-12-07-winograd-avx512.md).
constexpr int64_t kTrainingWinogradBytes = int64_t(1) << 20;

/// The kernels that take a forward: oneDNN wherever built in, the few-pixel kernel where it fits,
/// Winograd where it fits at inference (its transformed weights are kept with the weight tensor) and
/// in training where its transformed weights are small (made for the call: the step writes w).
/// bf16: oneDNN alone (flux's own kernels are float32).
Candidates forward_candidates(const backend::ConvGeometry& g, DType dt = DType::f32) {
  Candidates c = FLUX_HAVE_ONEDNN ? bit(Kernel::onednn) : 0;
  if (dt != DType::f32) return c;
  if (few_pixel_fits(g)) c |= bit(Kernel::few_pixel);
  const bool small_transform =
      16.0 * double(g.in_channels) * double(g.out_channels) * sizeof(float) <= double(kTrainingWinogradBytes);
  if ((g.inference || small_transform) && winograd_fits(g)) c |= bit(Kernel::winograd);
  return c;
}

/// A forward by `use`; false when that kernel declines (oneDNN: no implementation for the case).
bool run_forward(Kernel use, ConvKind kind, const backend::ConvGeometry& g, const ConvArrays& a,
                 const ConvEpilogue& ep, DType dt) {
  const auto* x = static_cast<const float*>(a.x);
  const auto* w = static_cast<const float*>(a.w);
  switch (use) {
    case Kernel::few_pixel: few_pixel_forward(x, w, g, ep, static_cast<float*>(a.y)); return true;
    case Kernel::winograd: winograd_forward(x, w, g, ep, static_cast<float*>(a.y)); return true;
    default: return onednn_conv(kind, g, a, ep, dt);
  }
}

bool forward(ConvKind kind, const backend::ConvGeometry& g, const ConvArrays& a, const ConvEpilogue& ep,
             Kernel forced = Kernel(-1), DType dt = DType::f32) {
  if (g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  const Candidates candidates = forward_candidates(g, dt);
  if (!candidates) return false;
  if (int(forced) >= 0 && !(candidates & bit(forced))) return false;  // the tuner asked for a kernel that cannot
  const Kernel use = int(forced) >= 0 ? forced : choose(conv_query(g, kind == ConvKind::forward_affine), candidates);
  return run_forward(use, kind, g, a, ep, dt);
}

/// The tuner's timer for Site::conv_forward: the forward on operands of its shape (pads: "same" for
/// odd kernels; wall time, as its chunks run on the pool; best of reps, weights prepared first).
double time_conv(const Query& q, Kernel kernel, int reps) {
  backend::ConvGeometry g = ConvQuery::from(q).geometry();
  int64_t in = g.batch * g.in_channels, out = g.batch * g.out_channels, w = g.out_channels * g.in_channels / g.groups;
  for (int i = 0; i < g.spatial; ++i) in *= g.in[i], out *= g.out[i], w *= g.kernel[i];
  std::vector<float> x(size_t(in), 0.5f), wt(size_t(w), 0.01f), b(size_t(g.out_channels), 0.1f), y(size_t(out), 0.f);
  LocalPreparedCache cache;
  g.weight_cache = &cache, g.inference = true;
  ConvArrays a;
  a.x = x.data(), a.w = wt.data(), a.y = y.data();
  ConvEpilogue ep;
  ep.shift = b.data();
  if (!forward(ConvKind::forward, g, a, ep, kernel)) return std::numeric_limits<double>::infinity();
  return best_wall_seconds(reps, [&] { forward(ConvKind::forward, g, a, ep, kernel); });
}
[[maybe_unused]] const bool conv_timer_registered = (register_timer(Site::conv_forward, time_conv), true);

}  // namespace

namespace {
/// Whether the library kernels take dtype t now: float32 always, bf16 where the CPU's units run it.
bool takes(DType t) { return t == DType::f32 || (t == DType::bf16 && bf16_kernels_enabled()); }
}  // namespace

bool conv_forward(DType t, void* x, void* w, void* bias, void* y, const backend::ConvGeometry& g, bool relu) {
  if (!takes(t)) return false;
  ConvArrays a;
  a.x = x, a.w = w, a.y = y;
  ConvEpilogue ep;
  ep.shift = bias, ep.relu = relu;
  return forward(relu ? ConvKind::forward_relu : ConvKind::forward, g, a, ep, Kernel(-1), t);
}

bool conv_forward_affine(DType t, void* x, void* w, void* scale, void* shift, void* residual, void* y,
                         const backend::ConvGeometry& g, bool relu, bool relu_after) {
  if (!takes(t)) return false;
  ConvArrays a;
  a.x = x, a.w = w, a.y = y;
  ConvEpilogue ep;
  ep.scale = scale, ep.shift = shift, ep.relu = relu, ep.residual = residual, ep.relu_after = relu_after;
  if (t == DType::f32) return forward(ConvKind::forward_affine, g, a, ep);
  // bf16: the kernel takes the per-channel scale and shift in float32.
  std::vector<float> channels(size_t(2 * g.out_channels));
  half_storage_to_float(t, static_cast<const uint16_t*>(scale), channels.data(), g.out_channels);
  half_storage_to_float(t, static_cast<const uint16_t*>(shift), channels.data() + g.out_channels, g.out_channels);
  ep.scale = channels.data(), ep.shift = channels.data() + g.out_channels;
  return forward(ConvKind::forward_affine, g, a, ep, Kernel(-1), t);
}

Kernel conv_forward_kernel(const backend::ConvGeometry& g, bool affine) {
  const Candidates candidates = forward_candidates(g);
  return candidates ? choose(conv_query(g, affine), candidates) : Kernel(-1);
}

namespace {
/// The data gradient of a stride-1, undilated, ungrouped conv g as a forward conv: dy (N, O, out...)
/// convolved with the kernel flipped and its channel axes swapped gives dx (N, C, in...), padded by
/// k - 1 - pad on each side. False where that padding would be negative.
bool data_gradient_as_forward(const backend::ConvGeometry& g, backend::ConvGeometry& f) {
  if (g.groups != 1) return false;
  f = backend::ConvGeometry{};
  f.spatial = g.spatial, f.batch = g.batch, f.in_channels = g.out_channels, f.out_channels = g.in_channels;
  for (int i = 0; i < g.spatial; ++i) {
    if (g.stride[i] != 1 || g.dilation[i] != 1) return false;
    f.in[i] = g.out[i], f.out[i] = g.in[i], f.kernel[i] = g.kernel[i];
    f.pad_lo[i] = g.kernel[i] - 1 - g.pad_lo[i], f.pad_hi[i] = g.kernel[i] - 1 - g.pad_hi[i];
    if (f.pad_lo[i] < 0 || f.pad_hi[i] < 0) return false;
  }
  return true;
}
}  // namespace

bool conv_backward_data(DType t, void* dy, void* w, void* dx, const backend::ConvGeometry& g) {
  if (!takes(t) || g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  // A 3x3 stride-1 conv's data gradient is itself such a forward: it runs on Winograd where the seam
  // takes Winograd for that forward (Winograd takes 3x3 only; in training: small weights), on the
  // flipped kernel made for the call (C x O x 9 floats, from the pool).
  backend::ConvGeometry f;
  if (t == DType::f32 && data_gradient_as_forward(g, f) && conv_forward_kernel(f, false) == Kernel::winograd) {
    const int64_t C = g.in_channels, O = g.out_channels;
    enum class Block { flipped };
    CallScratch<Block, 1> scratch;
    auto* flipped = static_cast<float*>(scratch.get(Block::flipped, size_t(C * O * 9) * sizeof(float)));
    const auto* k = static_cast<const float*>(w);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t c = 0; c < C; ++c)
        for (int j = 0; j < 9; ++j) flipped[(c * O + o) * 9 + j] = k[(o * C + c) * 9 + (8 - j)];
    winograd_forward(static_cast<const float*>(dy), flipped, f, ConvEpilogue{}, static_cast<float*>(dx));
    return true;
  }
  ConvArrays a;
  a.dy = dy, a.w = w, a.dx = dx;
  return onednn_conv(ConvKind::backward_data, g, a, {}, t);
}

bool conv_backward_weight(DType t, void* x, void* dy, void* dw, void* dbias, const backend::ConvGeometry& g,
                          bool float32_grads) {
  if (!takes(t) || g.spatial < 1 || g.spatial > 3 || !fits_32_bits(g)) return false;
  ConvArrays a;
  a.x = x, a.dy = dy, a.dw = dw, a.dbias = dbias;
  a.float32_grads = float32_grads && t != DType::f32;
  return onednn_conv(ConvKind::backward_weight, g, a, {}, t);
}

}  // namespace flux::cpu_backend
