// Inference fusion of a convolution with the BatchNorm after it: bn(conv(x)), optionally followed by
// a residual add and relu (ResNet's relu(bn(conv(x)) + shortcut)), run as ONE convolution whose
// epilogue applies the BatchNorm's running statistics as a per-channel scale and shift
//   scale = weight / sqrt(running_var + eps),  shift = bias - running_mean * scale (+ conv bias * scale)
// (folded from the live tensors, and kept while their content stamps hold: a write by any of the
// library's in-place writers refolds; the weights are never rewritten), then relu and the residual
// (oneDNN post-ops on the CPU, or the epilogue of its few-output-pixel kernel). Chain applies it to every Conv immediately followed by a
// BatchNorm, and models::ResNet18 to its stem and blocks. It is skipped, and the layers run as written,
// whenever it could change the result: inside gradient() (anything recorded on a tape), BatchNorm in
// training mode or without running statistics, a Conv with its own activation, non-Float32 operands,
// a backend without Backend::conv_forward_affine (OpenCL, CUDA), FLUX_LIBRARY_KERNELS=0, or
// FLUX_CONV_FUSION=0.
#pragma once
#include "flux/tensor.hpp"

namespace flux {

struct Conv;
struct BatchNorm;

namespace detail {

/// bn(conv(x)), or relu(bn(conv(x)) + residual) when relu_after (residual + bn(conv(x)) without it),
/// fused as above; an undefined tensor when not applicable (the caller then runs the layers).
Tensor conv_batchnorm(const Conv& conv, const BatchNorm& bn, const Tensor& x, const Tensor& residual = Tensor(),
                      bool relu_after = false);

/// Whether conv_batchnorm may fuse (default true; FLUX_CONV_FUSION=0 disables; for tests and benchmarks).
void set_conv_fusion(bool enabled);
bool conv_fusion();

}  // namespace detail
}  // namespace flux
