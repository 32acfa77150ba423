// Convolutional layers over (N, C, spatial...) inputs with 1 to 3 spatial axes (NCHW for images).
//   Conv(k, in, out, act):  y = act(conv(x, W) + b), x (N, in, H, W), W (out, in / groups, kH, kW),
//     b (out,) -> (N, out, H', W'), H' = (H + pad_lo + pad_hi - dilation (kH - 1) - 1) / stride + 1.
//     Cross-correlation with PyTorch's nn.Conv2d layout, so its state_dict loads unchanged; Flux's
//     Conv((kH, kW), in => out, act; stride, pad, dilation, groups, bias, init).
//   ConvTranspose(k, in, out, act):  the adjoint (gradient) of a conv, W (in, out / groups, kH, kW) as
//     PyTorch's nn.ConvTranspose2d, H' = (H - 1) stride - pad_lo - pad_hi + dilation (kH - 1) +
//     output_padding + 1. Flux's ConvTranspose((kH, kW), in => out, act; ..., outpad).
// Options are resolved at construction as Flux does: `pad` is one int for every side, one per axis,
// (lo, hi) per axis, or SamePad() (total dilation (k - 1) per axis, the odd pixel on the low side, as
// Flux's calc_padding; output = ceil(input / stride)). Weights are glorot_uniform by default, with
// Flux's fans: fan_in = in / groups * prod(k), fan_out = out * prod(k) (see init.hpp); biases are zero.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"
#include "flux/nn/init.hpp"
#include "flux/ops.hpp"

namespace flux {

/// Conv's options, in DESIGN.md's order: Conv({3, 3}, 16, 32, relu, {.stride = 2, .pad = SamePad()}).
struct ConvOptions {
  Dims stride = 1;
  Padding pad = 0;
  Dims dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  Initialiser init = glorot_uniform;  // called as init(Shape{out, in / groups, k...}, dtype)
  DType dtype = DType::f32;
};

struct Conv {
  Tensor weight;  // (out, in / groups, k...)
  Tensor bias;    // (out,), undefined when bias = false
  Activation activation;
  std::vector<int64_t> stride;    // per spatial axis
  std::vector<int64_t> pad;       // (lo, hi) per spatial axis
  std::vector<int64_t> dilation;  // per spatial axis
  int64_t groups = 1;

  Conv() = default;
  /// kernel: one size per spatial axis ({5, 5} for images, {3} for sequences, {3, 3, 3} for volumes).
  Conv(const Dims& kernel, int64_t in, int64_t out, Activation act = Activation(), const ConvOptions& options = {});
  Conv(const Dims& kernel, int64_t in, int64_t out, const ConvOptions& options)
      : Conv(kernel, in, out, Activation(), options) {}
  /// From existing arrays: weight (out, in / groups, k...), optional bias (out,) (Flux's Conv(weight, bias, σ)).
  Conv(Tensor weight, Tensor bias, Activation act = Activation(), const ConvParams& params = {});

  /// x: (N, in, spatial...) -> (N, out, spatial'...).
  Tensor operator()(const Tensor& x) const;
  int64_t in_channels() const { return weight.size(1) * groups; }
  int64_t out_channels() const { return weight.size(0); }
  std::vector<int64_t> kernel_size() const;
};
FLUX_LAYER(Conv, weight, bias)

/// ConvTranspose's options: Conv's, then PyTorch's output_padding (Flux's outpad).
struct ConvTransposeOptions {
  Dims stride = 1;
  Padding pad = 0;
  Dims dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  Initialiser init = glorot_uniform;  // called as init(Shape{in, out / groups, k...}, dtype)
  Dims output_padding = 0;
  DType dtype = DType::f32;
};

struct ConvTranspose {
  Tensor weight;  // (in, out / groups, k...)
  Tensor bias;    // (out,), undefined when bias = false
  Activation activation;
  std::vector<int64_t> stride;
  std::vector<int64_t> pad;  // (lo, hi) per spatial axis
  std::vector<int64_t> dilation;
  std::vector<int64_t> output_padding;
  int64_t groups = 1;

  ConvTranspose() = default;
  ConvTranspose(const Dims& kernel, int64_t in, int64_t out, Activation act = Activation(),
                const ConvTransposeOptions& options = {});
  ConvTranspose(const Dims& kernel, int64_t in, int64_t out, const ConvTransposeOptions& options)
      : ConvTranspose(kernel, in, out, Activation(), options) {}
  /// From existing arrays: weight (in, out / groups, k...), optional bias (out,).
  ConvTranspose(Tensor weight, Tensor bias, Activation act = Activation(), const ConvTransposeParams& params = {});

  /// x: (N, in, spatial...) -> (N, out, spatial'...).
  Tensor operator()(const Tensor& x) const;
  int64_t in_channels() const { return weight.size(0); }
  int64_t out_channels() const { return weight.size(1) * groups; }
  std::vector<int64_t> kernel_size() const;
};
FLUX_LAYER(ConvTranspose, weight, bias)

/// Flux's printing: "Conv((5, 5), 1 => 6, relu)", then ", pad=1", ", stride=2", ", dilation=2",
/// ", groups=2", ", bias=false" where not the default; ConvTranspose adds ", outpad=(1, 1)".
std::string layer_string(const Conv& c);
std::string layer_string(const ConvTranspose& c);
/// Flux's display: "Conv((5, 5), 1 => 6, relu)  # 156 parameters".
std::ostream& operator<<(std::ostream& os, const Conv& c);
std::ostream& operator<<(std::ostream& os, const ConvTranspose& c);

}  // namespace flux
