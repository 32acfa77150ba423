// For tests that compare the backends' fused/library kernels with the portable composed ops, and
// fused conv + BatchNorm with the unfused layers.
#pragma once
#include "flux/nn/conv_fusion.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::testing {

/// For its scope: one of flux's process-wide kernel switches set to `on`, restored afterwards.
template <bool (*Get)(), void (*Set)(bool)> struct ScopedSwitch {
  explicit ScopedSwitch(bool on) : saved(Get()) { Set(on); }
  ~ScopedSwitch() { Set(saved); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;
  bool saved;
};

/// The fused/library kernels (true, the default) or the portable path (false), as
/// FLUX_LIBRARY_KERNELS=0 does for a whole process.
using LibraryKernels = ScopedSwitch<detail::library_kernels, detail::set_library_kernels>;

/// Conv + BatchNorm(+ activation, + residual) fusion on or off, as FLUX_CONV_FUSION=0 does for a
/// whole process (include/flux/nn/conv_fusion.hpp).
using ConvFusion = ScopedSwitch<detail::conv_fusion, detail::set_conv_fusion>;

}  // namespace flux::testing
