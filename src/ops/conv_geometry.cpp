// Window geometry shared by conv, conv_transpose and the pools.
#include "src/ops/conv_geometry.hpp"

#include "src/checked_size.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::detail {

std::string dims_string(const int64_t* v, int spatial) {
  std::string s = "(";
  for (int i = 0; i < spatial; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (spatial == 1 ? ",)" : ")");
}

std::vector<int64_t> expand_dims(const char* api, const char* what, const Dims& d, int spatial, int64_t minimum) {
  std::vector<int64_t> out;
  if (d.values.size() == 1) out.assign(size_t(spatial), d.values[0]);
  else if (int(d.values.size()) == spatial) out = d.values;
  else
    fail("[", api, "] ", what, " needs 1 or ", spatial, " values for ", spatial, " spatial axes; got ",
         d.values.size());
  for (int64_t v : out)
    if (v < minimum) fail("[", api, "] ", what, " must be >= ", minimum, "; got ", dims_string(out.data(), spatial));
  return out;
}

void resolve_padding(const char* api, const Padding& p, backend::ConvGeometry& g) {
  const int n = g.spatial;
  if (p.same) {
    // Flux's calc_padding(SamePad()): a total of dilation * (k - 1) per axis, the odd pixel on the
    // low side (cld low, fld high); independent of the input size, out = ceil(in / stride).
    for (int i = 0; i < n; ++i) {
      int64_t total = std::max<int64_t>(0, checked_mul(api, "SamePad's total padding", g.dilation[i], g.kernel[i] - 1));
      g.pad_lo[i] = total - total / 2;
      g.pad_hi[i] = total / 2;
    }
    return;
  }
  const auto& v = p.values;
  for (int64_t x : v)
    if (x < 0) fail("[", api, "] padding must be non-negative; got ", dims_string(v.data(), int(v.size())));
  if (v.size() == 1) {
    for (int i = 0; i < n; ++i) g.pad_lo[i] = g.pad_hi[i] = v[0];
  } else if (int(v.size()) == n) {
    for (int i = 0; i < n; ++i) g.pad_lo[i] = g.pad_hi[i] = v[size_t(i)];
  } else if (int(v.size()) == 2 * n) {
    for (int i = 0; i < n; ++i) g.pad_lo[i] = v[size_t(2 * i)], g.pad_hi[i] = v[size_t(2 * i + 1)];
  } else {
    fail("[", api, "] padding needs 1, ", n, " or ", 2 * n, " values for ", n, " spatial axes; got ", v.size());
  }
}

int spatial_axes(const char* api, const Tensor& x, int expected) {
  check_defined(api, x);
  int n = x.ndim() - 2;
  if (expected > 0 && n != expected)
    fail("[", api, "] expected a ", expected + 2, "-dimensional (N, C", expected >= 1 ? ", H" : "",
         expected >= 2 ? ", W" : "", expected >= 3 ? ", D" : "", ") input for ", expected, " spatial axes; got ",
         summary(x), " of shape ", to_string(x.shape()));
  if (n < 1 || n > 3)
    fail("[", api, "] expected an (N, C, spatial...) input with 1 to 3 spatial axes; got shape ", to_string(x.shape()));
  if (!is_floating(x.dtype()))
    fail("[", api, "] supports Float32, Float64, Float16 and BFloat16 inputs; got ", dtype_name(x.dtype()),
         " (cast with .f32())");
  return n;
}

void compute_output_size(const char* api, backend::ConvGeometry& g) {
  for (int i = 0; i < g.spatial; ++i) {
    // Checked: a huge pad, kernel or dilation is an error here, not a wrapped (negative) output size.
    int64_t padded = checked_add(api, "the padded input size", checked_add(api, "the padded input size", g.in[i], g.pad_lo[i]), g.pad_hi[i]);
    int64_t effective = checked_add(api, "the dilated kernel size", checked_mul(api, "the dilated kernel size", g.dilation[i], g.kernel[i] - 1), 1);
    if (effective > padded) {
      int64_t in_sizes[3], padded_sizes[3], eff[3];
      for (int j = 0; j < g.spatial; ++j) {
        in_sizes[j] = g.in[j];
        padded_sizes[j] = g.in[j] + g.pad_lo[j] + g.pad_hi[j];
        eff[j] = g.dilation[j] * (g.kernel[j] - 1) + 1;
      }
      fail("[", api, "] kernel ", dims_string(g.kernel, g.spatial), " (", dims_string(eff, g.spatial),
           " with dilation) is larger than the padded input ", dims_string(padded_sizes, g.spatial), " (input ",
           dims_string(in_sizes, g.spatial), ")");
    }
    g.out[i] = (padded - effective) / g.stride[i] + 1;
  }
  check_geometry_sizes(api, g);
}

void check_geometry_sizes(const char* api, const backend::ConvGeometry& g) {
  // The input, the output and the im2col columns (C * prod(kernel) by prod(out) per image) must be countable.
  int64_t window = std::max<int64_t>(g.in_channels, 1);
  for (int i = 0; i < g.spatial; ++i) window = checked_mul(api, "the window's element count", window, g.kernel[i]);
  int64_t pixels = 1;
  for (int i = 0; i < g.spatial; ++i) pixels = checked_mul(api, "the output's pixel count", pixels, g.out[i]);
  checked_mul(api, "the im2col column count", window, pixels);
  Shape out_shape{g.batch, g.out_channels}, in_shape{g.batch, g.in_channels};
  for (int i = 0; i < g.spatial; ++i) out_shape.push_back(g.out[i]), in_shape.push_back(g.in[i]);
  checked_numel(api, out_shape);
  checked_numel(api, in_shape);
}

Shape output_shape(const backend::ConvGeometry& g) {
  Shape s{g.batch, g.out_channels};
  for (int i = 0; i < g.spatial; ++i) s.push_back(g.out[i]);
  return s;
}

}  // namespace flux::detail
