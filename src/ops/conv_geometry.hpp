// Window geometry shared by conv, conv_transpose and the pools (src/ops/conv.cpp, pooling.cpp):
// per-axis options (Dims, Padding) resolved against an (N, C, spatial...) input into a
// backend::ConvGeometry. Errors name the calling API and the shapes involved.
#pragma once
#include <string>
#include <vector>

#include "flux/backend.hpp"
#include "flux/ops.hpp"

namespace flux::detail {

/// One value for every spatial axis, or exactly `spatial` values; each must be >= minimum.
std::vector<int64_t> expand_dims(const char* api, const char* what, const Dims& d, int spatial, int64_t minimum);

/// Fills g.pad_lo / g.pad_hi from `p` for the sizes already in g (in, kernel, stride, dilation).
/// Padding takes 1 value (every side), `spatial` values (both sides of each axis) or 2 * spatial
/// values (lo, hi per axis). SamePad is Flux's: total d (k - 1), the odd pixel low; out = ceil(in / stride).
void resolve_padding(const char* api, const Padding& p, backend::ConvGeometry& g);

/// Checks that x is (N, C, spatial...) with 1 to 3 spatial axes, float32 or float64; returns the
/// number of spatial axes.
int spatial_axes(const char* api, const Tensor& x, int expected = 0);

/// out[i] = (in + lo + hi - dilation (kernel - 1) - 1) / stride + 1 for every axis; errors (naming
/// the padded input and the effective kernel) when the window does not fit.
void compute_output_size(const char* api, backend::ConvGeometry& g);

/// Errors (naming api and the sizes) unless g's input, output and im2col column counts fit in int64.
void check_geometry_sizes(const char* api, const backend::ConvGeometry& g);

/// The output shape (N, C_out, out...) of g.
Shape output_shape(const backend::ConvGeometry& g);

/// "(3, 3)" for the first `spatial` entries of v.
std::string dims_string(const int64_t* v, int spatial);

}  // namespace flux::detail
