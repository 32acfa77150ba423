// Shared by the conv and pooling layers (src/nn/conv.cpp, src/nn/pooling.cpp): checking kernel and
// window sizes, resolving per-axis options at construction as Flux does, input checks and Flux's
// printing of tuples.
#pragma once
#include <string>
#include <vector>

#include "flux/ops.hpp"

namespace flux::detail {

/// The kernel / window / output sizes (`what`): 1 to 3 values (one per spatial axis), each >= 1.
std::vector<int64_t> window_sizes(const char* api, const char* what, const Dims& d);

/// One value for every spatial axis or one per axis, each >= minimum (else an error naming `what`).
std::vector<int64_t> per_axis(const char* api, const char* what, const Dims& d, int spatial, int64_t minimum);

/// Padding resolved at construction into (lo, hi) per spatial axis (2 * spatial values), as Flux's
/// calc_padding: an int for every side, one per axis, (lo, hi) per axis, or SamePad(), which pads
/// dilation (k - 1) in total per axis with the odd pixel on the LOW side (cld, then fld), so the output
/// is ceil(input / stride) and, with stride 1, the input's size.
std::vector<int64_t> resolve_layer_padding(const char* api, const Padding& p, const std::vector<int64_t>& kernel,
                                           const std::vector<int64_t>& dilation);

/// Julia's tuple printing: "(5, 5)", "(5,)".
std::string tuple_string(const std::vector<int64_t>& v);
/// Flux's _maybetuple_string: "2" when every value is 2, else the tuple.
std::string maybe_tuple_string(const std::vector<int64_t>& v);
/// True when every value equals v.
bool all_equal(const std::vector<int64_t>& values, int64_t v);

/// The error for an input of the wrong rank, naming the layer (printed as `layer`) and the layout.
[[noreturn]] void fail_input_rank(const char* api, const Tensor& x, int spatial, const std::string& layer);
void check_layer_defined(const char* api, const Tensor& x);

/// Checks that x is (N, C, spatial...) with `spatial` spatial axes; `describe()` prints the layer
/// (called only on error, so the forward pass formats no strings).
template <class Describe> void check_layer_input(const char* api, const Tensor& x, int spatial, const Describe& describe) {
  check_layer_defined(api, x);
  if (x.ndim() != spatial + 2) fail_input_rank(api, x, spatial, describe());
}

}  // namespace flux::detail
