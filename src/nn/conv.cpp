// Conv and ConvTranspose: construction (Flux's options and init), checks, printing; the maths is in
// the conv / conv_transpose ops (src/ops/conv.cpp).
#include "flux/nn/conv.hpp"

#include <utility>

#include "flux/autodiff.hpp"
#include "flux/nn/conv_fusion.hpp"
#include "flux/nn/normalisation.hpp"
#include "flux/nn/show.hpp"
#include "src/nn/match_eltype.hpp"
#include "src/nn/window_options.hpp"
#include "src/internal.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/trace.hpp"

namespace flux {

namespace {
void check_groups(const char* api, int64_t in, int64_t out, int64_t groups) {
  if (groups < 1) detail::fail("[", api, "] groups must be >= 1; got ", groups);
  if (in % groups)
    detail::fail("[", api, "] input channels (", in, ") must be divisible by groups (", groups, "); got ", in, " => ",
                 out, " with groups=", groups);
  if (out % groups)
    detail::fail("[", api, "] output channels (", out, ") must be divisible by groups (", groups, "); got ", in,
                 " => ", out, " with groups=", groups);
}

void check_channels(const char* api, int64_t in, int64_t out, const std::vector<int64_t>& k) {
  if (in < 1 || out < 1)
    detail::fail("[", api, "] channel counts must be positive; got ", api, "(", detail::tuple_string(k), ", ", in,
                 " => ", out, ")");
}

Shape weight_shape(int64_t d0, int64_t d1, const std::vector<int64_t>& k) {
  Shape s{d0, d1};
  for (int64_t v : k) s.push_back(v);
  return s;
}

// weight (d0, d1, k...) with 1 to 3 spatial axes and an optional bias (out,).
void check_arrays(const char* api, const char* layout, const Tensor& weight, const Tensor& bias, int64_t out) {
  if (!weight.defined() || weight.ndim() < 3 || weight.ndim() > 5)
    detail::fail("[", api, "] weight must be a ", layout, " tensor with 1 to 3 spatial axes; got ",
                 weight.defined() ? summary(weight) : std::string("an undefined tensor"));
  if (bias.defined() && (bias.ndim() != 1 || bias.shape()[0] != out))
    detail::fail("[", api, "] bias must have shape (", out, ",) to match weight ", to_string(weight.shape()), "; got ",
                 to_string(bias.shape()));
}

std::vector<int64_t> spatial_of(const Tensor& w) {
  std::vector<int64_t> k;
  for (int i = 2; i < w.ndim(); ++i) k.push_back(w.shape()[i]);
  return k;
}

// Flux's calc_padding(ConvTranspose, SamePad(), ...): a conv's SamePad with kernel k - stride + 1.
std::vector<int64_t> transpose_padding(const char* api, const Padding& p, const std::vector<int64_t>& k,
                                       const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation) {
  if (!p.same) return detail::resolve_layer_padding(api, p, k, dilation);
  std::vector<int64_t> shifted(k.size());
  for (size_t i = 0; i < k.size(); ++i) shifted[i] = std::max<int64_t>(1, k[i] - stride[i] + 1);
  return detail::resolve_layer_padding(api, p, shifted, dilation);
}

// Flux's _print_conv_opt: activation, pad, stride, dilation, groups, bias=false (non-defaults only).
std::string conv_options_string(const Activation& act, const std::vector<int64_t>& pad,
                                const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation,
                                int64_t groups, bool has_bias) {
  std::string s;
  if (!act.is_identity()) s += ", " + act.name();
  if (!detail::all_equal(pad, 0)) s += ", pad=" + detail::maybe_tuple_string(pad);
  if (!detail::all_equal(stride, 1)) s += ", stride=" + detail::maybe_tuple_string(stride);
  if (!detail::all_equal(dilation, 1)) s += ", dilation=" + detail::maybe_tuple_string(dilation);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!has_bias) s += ", bias=false";
  return s;
}

template <class L> std::ostream& show_with_count(std::ostream& os, const L& layer) {
  std::string s = layer_string(layer);
  os << s << std::string(size_t(std::max(2, 20 - int(s.size()))), ' ') << "# "
     << show::underscorise(parameter_count(layer)) << " parameters";
  return os;
}

// Layer-level checks shared by both layers: built, input rank, channels, device. The layer's text is
// formatted only for an error message.
template <class L>
void check_input(const char* api, const Tensor& x, const L& layer, int64_t channels) {
  const Tensor& weight = layer.weight;
  if (!weight.defined()) detail::fail("[", api, "] the layer is empty (default-constructed)");
  detail::check_layer_input(api, x, weight.ndim() - 2, [&] { return layer_string(layer); });
  if (x.shape()[1] != channels)
    detail::fail("[", api, "] input has ", x.shape()[1], " channels, layer expects ", channels, " (",
                 layer_string(layer), ", weight ", to_string(weight.shape()), "); got input of shape ",
                 to_string(x.shape()));
  if (x.device() != weight.device())
    detail::fail("[", api, "] input on ", to_string(x.device()), " but the layer's weight on ",
                 to_string(weight.device()), "; move one with to() or | dev");
}
}  // namespace

// ---- Conv ----

Conv::Conv(const Dims& kernel, int64_t in, int64_t out, Activation act, const ConvOptions& o)
    : activation(std::move(act)) {
  const char* api = "Conv";
  std::vector<int64_t> k = detail::window_sizes(api, "kernel sizes", kernel);
  const int n = int(k.size());
  check_channels(api, in, out, k);
  check_groups(api, in, out, o.groups);
  groups = o.groups;
  stride = detail::per_axis(api, "stride", o.stride, n, 1);
  dilation = detail::per_axis(api, "dilation", o.dilation, n, 1);
  pad = detail::resolve_layer_padding(api, o.pad, k, dilation);
  weight = detail::initialise(api, o.init, weight_shape(out, in / groups, k), o.dtype);
  if (o.bias) bias = zeros(Shape{out}, o.dtype);
}

Conv::Conv(Tensor w, Tensor b, Activation act, const ConvParams& p)
    : weight(std::move(w)), bias(std::move(b)), activation(std::move(act)) {
  const char* api = "Conv";
  check_arrays(api, "(out, in / groups, k...)", weight, bias, weight.defined() ? weight.shape()[0] : 0);
  std::vector<int64_t> k = detail::window_sizes(api, "kernel sizes", Dims(spatial_of(weight)));
  const int n = int(k.size());
  if (p.groups < 1) detail::fail("[", api, "] groups must be >= 1; got ", p.groups);
  check_groups(api, weight.shape()[1] * p.groups, weight.shape()[0], p.groups);
  groups = p.groups;
  stride = detail::per_axis(api, "stride", p.stride, n, 1);
  dilation = detail::per_axis(api, "dilation", p.dilation, n, 1);
  pad = detail::resolve_layer_padding(api, p.pad, k, dilation);
}

std::vector<int64_t> Conv::kernel_size() const { return spatial_of(weight); }

Tensor Conv::operator()(const Tensor& x0) const {
  check_input("Conv", x0, *this, weight.defined() ? in_channels() : 0);
  const Tensor x = detail::match_eltype("Conv", *this, weight, x0);  // Float64 input: converted, warned once
  ConvParams p;
  p.stride = Dims(stride);
  p.pad = Padding(pad);
  p.dilation = Dims(dilation);
  p.groups = groups;
  // relu is fused into the convolution where the backend can (oneDNN's post-op on the CPU).
  if (activation.is<Relu>()) return detail::conv_relu(x, weight, bias, p);
  return activation(conv(x, weight, bias, p));
}

Tensor detail::conv_batchnorm(const Conv& conv, const BatchNorm& bn, const Tensor& x, const Tensor& residual,
                              bool relu_after) {
  // Only where the result equals the layers' own: see include/flux/nn/conv_fusion.hpp.
  // Not while tracing either (onnx::save): the layers' own ops are what is exported.
  if (!conv_fusion() || !library_kernels() || autodiff::recording() || trace::active()) return Tensor();
  if (!conv.activation.is_identity() || !conv.weight.defined() || bn.training() || !bn.running_mean.defined())
    return Tensor();
  const bool bn_relu = bn.activation.is<Relu>();
  if (residual.defined() && !bn_relu && !bn.activation.is_identity()) return Tensor();
  const DType t = DType::f32;
  if (!x.defined() || x.dtype() != t || x.ndim() != conv.weight.ndim() || x.shape()[1] != conv.in_channels() ||
      conv.weight.dtype() != t || x.device() != conv.weight.device() || bn.channels != conv.out_channels())
    return Tensor();
  for (const Tensor* v : {&conv.bias, &bn.weight, &bn.bias, &static_cast<const Tensor&>(bn.running_mean),
                          &static_cast<const Tensor&>(bn.running_var)})
    if (v->defined() && (v->dtype() != t || v->device() != x.device())) return Tensor();
  // Folding runs several small kernels: not for a backend without the fused kernel (OpenCL, CUDA).
  if (!x.backend().has_conv_forward_affine()) return Tensor();
  // Kept with running_var until one of the parts is written (fold_batchnorm).
  auto [scale, shift] = fold_batchnorm(bn.weight, bn.bias, static_cast<const Tensor&>(bn.running_mean),
                                       static_cast<const Tensor&>(bn.running_var), bn.eps, conv.bias, conv.weight);
  ConvParams p;
  p.stride = Dims(conv.stride);
  p.pad = Padding(conv.pad);
  p.dilation = Dims(conv.dilation);
  p.groups = conv.groups;
  Tensor y;
  if (residual.defined()) {
    y = conv_affine(x, conv.weight, scale, shift, residual, p, bn_relu, relu_after);
    if (y.defined()) return y;
  }
  y = conv_affine(x, conv.weight, scale, shift, Tensor(), p, bn_relu, false);
  if (!y.defined()) return y;
  if (!bn_relu) y = bn.activation(y);
  if (!residual.defined()) return y;
  y = y + residual;  // a residual the kernel could not take (e.g. broadcast): added as the layers would
  return relu_after ? relu(y) : y;
}

std::string layer_string(const Conv& c) {
  if (!c.weight.defined()) return "Conv()";
  return "Conv(" + detail::tuple_string(c.kernel_size()) + ", " + std::to_string(c.in_channels()) + " => " +
         std::to_string(c.out_channels()) +
         conv_options_string(c.activation, c.pad, c.stride, c.dilation, c.groups, c.bias.defined()) + ")";
}

std::ostream& operator<<(std::ostream& os, const Conv& c) { return show_with_count(os, c); }

// ---- ConvTranspose ----

ConvTranspose::ConvTranspose(const Dims& kernel, int64_t in, int64_t out, Activation act,
                             const ConvTransposeOptions& o)
    : activation(std::move(act)) {
  const char* api = "ConvTranspose";
  std::vector<int64_t> k = detail::window_sizes(api, "kernel sizes", kernel);
  const int n = int(k.size());
  check_channels(api, in, out, k);
  check_groups(api, in, out, o.groups);
  groups = o.groups;
  stride = detail::per_axis(api, "stride", o.stride, n, 1);
  dilation = detail::per_axis(api, "dilation", o.dilation, n, 1);
  output_padding = detail::per_axis(api, "output_padding", o.output_padding, n, 0);
  pad = transpose_padding(api, o.pad, k, stride, dilation);
  weight = detail::initialise(api, o.init, weight_shape(in, out / groups, k), o.dtype);
  if (o.bias) bias = zeros(Shape{out}, o.dtype);
}

ConvTranspose::ConvTranspose(Tensor w, Tensor b, Activation act, const ConvTransposeParams& p)
    : weight(std::move(w)), bias(std::move(b)), activation(std::move(act)) {
  const char* api = "ConvTranspose";
  if (p.groups < 1) detail::fail("[", api, "] groups must be >= 1; got ", p.groups);
  check_arrays(api, "(in, out / groups, k...)", weight, bias, weight.defined() ? weight.shape()[1] * p.groups : 0);
  std::vector<int64_t> k = detail::window_sizes(api, "kernel sizes", Dims(spatial_of(weight)));
  const int n = int(k.size());
  check_groups(api, weight.shape()[0], weight.shape()[1] * p.groups, p.groups);
  groups = p.groups;
  stride = detail::per_axis(api, "stride", p.stride, n, 1);
  dilation = detail::per_axis(api, "dilation", p.dilation, n, 1);
  output_padding = detail::per_axis(api, "output_padding", p.output_padding, n, 0);
  pad = transpose_padding(api, p.pad, k, stride, dilation);
}

std::vector<int64_t> ConvTranspose::kernel_size() const { return spatial_of(weight); }

Tensor ConvTranspose::operator()(const Tensor& x0) const {
  check_input("ConvTranspose", x0, *this, weight.defined() ? in_channels() : 0);
  const Tensor x = detail::match_eltype("ConvTranspose", *this, weight, x0);  // Float64 input: converted, warned once
  ConvTransposeParams p;
  p.stride = Dims(stride);
  p.pad = Padding(pad);
  p.dilation = Dims(dilation);
  p.groups = groups;
  p.output_padding = Dims(output_padding);
  return activation(conv_transpose(x, weight, bias, p));
}

std::string layer_string(const ConvTranspose& c) {
  if (!c.weight.defined()) return "ConvTranspose()";
  std::string s = "ConvTranspose(" + detail::tuple_string(c.kernel_size()) + ", " + std::to_string(c.in_channels()) +
                  " => " + std::to_string(c.out_channels()) +
                  conv_options_string(c.activation, c.pad, c.stride, c.dilation, c.groups, c.bias.defined());
  if (!detail::all_equal(c.output_padding, 0)) s += ", outpad=" + detail::tuple_string(c.output_padding);
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const ConvTranspose& c) { return show_with_count(os, c); }

}  // namespace flux
