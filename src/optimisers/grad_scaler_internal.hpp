// The per-tensor step of GradScaler::unscale (src/optimisers/grad_scaler.cpp), shared with the tests
// that compare the backends' fused kernel with the portable path.
#pragma once
#include "flux/optimisers/grad_scaler.hpp"
#include "flux/tensor.hpp"

namespace flux::optimisers::detail {

/// A new tensor g * inv_scale (f16/bf16/f32 through float32, f64 in float64, rounded to g's dtype);
/// `flag` (a Float32 scalar on g's device, 0 at first) becomes nonzero (1, or NaN on the portable
/// path) when any result is not finite. use_kernel = false skips Backend::unscale_and_check and
/// composes public ops instead (what a backend without the kernel runs).
Tensor unscale_tensor(const Tensor& g, double inv_scale, Tensor& flag, bool use_kernel = true);

/// Whether a flag of unscale_tensor was set (reads it to the host).
bool flag_set(const Tensor& flag);

/// The one check of a scaler's settings, for the constructor's options and for a saved state (also
/// what load_checkpoint runs before it overwrites anything): throws "[<api>] <name> must be <rule>,
/// got <value>" for the first setting out of its range; `scale_name` names the scale ("init_scale"
/// in the options, "scale" in a saved state).
void check_settings(const char* api, const char* scale_name, const GradScaler::SavedState& s);

}  // namespace flux::optimisers::detail
