// Options shared by the conv and pooling layers: sizes, Flux's static padding, tuple printing.
#include "src/nn/window_options.hpp"

#include "src/ops/conv_geometry.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::detail {

std::vector<int64_t> window_sizes(const char* api, const char* what, const Dims& d) {
  const std::vector<int64_t>& v = d.values;
  if (v.empty() || v.size() > 3)
    fail("[", api, "] ", what, " need 1 to 3 values (one per spatial axis); got ", tuple_string(v));
  for (int64_t k : v)
    if (k < 1) fail("[", api, "] ", what, " must be positive; got ", tuple_string(v));
  return v;
}

std::vector<int64_t> per_axis(const char* api, const char* what, const Dims& d, int spatial, int64_t minimum) {
  return expand_dims(api, what, d, spatial, minimum);
}

std::vector<int64_t> resolve_layer_padding(const char* api, const Padding& p, const std::vector<int64_t>& kernel,
                                           const std::vector<int64_t>& dilation) {
  const size_t n = kernel.size();
  std::vector<int64_t> out(2 * n);
  if (p.same) {
    for (size_t i = 0; i < n; ++i) {
      int64_t total = std::max<int64_t>(0, dilation[i] * (kernel[i] - 1));
      out[2 * i] = total - total / 2;  // Flux: cld(total, 2) low, fld(total, 2) high
      out[2 * i + 1] = total / 2;
    }
    return out;
  }
  const std::vector<int64_t>& v = p.values;
  for (int64_t x : v)
    if (x < 0) fail("[", api, "] padding must be non-negative; got ", tuple_string(v));
  if (v.size() == 1) {
    for (size_t i = 0; i < 2 * n; ++i) out[i] = v[0];
  } else if (v.size() == n) {
    for (size_t i = 0; i < n; ++i) out[2 * i] = out[2 * i + 1] = v[i];
  } else if (v.size() == 2 * n) {
    out = v;
  } else {
    fail("[", api, "] padding needs 1, ", n, " or ", 2 * n, " values for ", n, " spatial axes (every side, per axis, ",
         "or (lo, hi) per axis); got ", tuple_string(v));
  }
  return out;
}

std::string tuple_string(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

bool all_equal(const std::vector<int64_t>& values, int64_t v) {
  for (int64_t x : values)
    if (x != v) return false;
  return true;
}

std::string maybe_tuple_string(const std::vector<int64_t>& v) {
  if (!v.empty() && all_equal(v, v[0])) return std::to_string(v[0]);
  return tuple_string(v);
}

void check_layer_defined(const char* api, const Tensor& x) { check_defined(api, x); }

void fail_input_rank(const char* api, const Tensor& x, int spatial, const std::string& layer) {
  static const char* layouts[] = {"", "(N, C, L)", "(N, C, H, W)", "(N, C, D, H, W)"};
  fail("[", api, "] ", layer, " expects a ", spatial + 2, "-dimensional ", layouts[spatial], " input; got shape ",
       to_string(x.shape()));
}

}  // namespace flux::detail
