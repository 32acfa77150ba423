// BatchNorm: batch statistics in training (the batchnorm op, src/ops/normalisation.cpp), running
// statistics in inference; the running statistics are updated in place, unrecorded.
// LayerNorm, GroupNorm, InstanceNorm: the layernorm / groupnorm ops, the same in train and test mode.
#include "flux/nn/normalisation.hpp"

#include <algorithm>

#include "flux/autodiff.hpp"
#include "flux/nn/show.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

BatchNorm::BatchNorm(int64_t chs, Activation act, BatchNormOptions o)
    : activation(std::move(act)), channels(chs), eps(o.eps), momentum(o.momentum) {
  if (chs <= 0) detail::fail("[BatchNorm] channels must be positive; got BatchNorm(", chs, ")");
  if (!(o.eps > 0)) detail::fail("[BatchNorm] eps must be positive; got ", o.eps);
  if (!(o.momentum >= 0 && o.momentum <= 1)) detail::fail("[BatchNorm] momentum must be in [0, 1]; got ", o.momentum);
  if (!is_floating(o.dtype)) detail::fail("[BatchNorm] needs a floating-point dtype; got ", dtype_name(o.dtype));
  if (o.affine) {
    weight = ones(Shape{chs}, o.dtype);
    bias = zeros(Shape{chs}, o.dtype);
  }
  if (o.track_stats) {
    running_mean = zeros(Shape{chs}, o.dtype);
    running_var = ones(Shape{chs}, o.dtype);
    num_batches_tracked = Tensor(std::vector<int64_t>{0}, Shape{});
  }
}

bool BatchNorm::training() const { return active.value_or(autodiff::recording()); }

Tensor BatchNorm::operator()(const Tensor& x) const {
  if (channels <= 0) detail::fail("[BatchNorm] the layer is empty (default-constructed)");
  detail::check_defined("BatchNorm", x);
  if (x.ndim() < 2)
    detail::fail("[BatchNorm] expects input (N, C, ...) with at least 2 dimensions, channels on axis 1; got shape ",
                 to_string(x.shape()));
  if (x.shape()[1] != channels)
    detail::fail("[BatchNorm] input has ", x.shape()[1], " channels, layer expects ", channels, " (", layer_string(*this),
                 "); got shape ", to_string(x.shape()), ". Channels go along axis 1: (N, C, ...)");
  if (!is_floating(x.dtype())) detail::fail("[BatchNorm] needs a floating-point input; got ", summary(x));
  const Tensor& any_state = weight.defined() ? weight : static_cast<const Tensor&>(running_mean);
  if (any_state.defined() && x.device() != any_state.device())
    detail::fail("[BatchNorm] input on ", to_string(x.device()), " but the layer's state on ",
                 to_string(any_state.device()), "; move one with to() or | dev");

  const int64_t m = x.numel() / channels;  // values per channel
  const bool train = training();
  if (train || !running_mean.defined()) {
    if (m < 2)
      detail::fail("[BatchNorm] batch statistics need more than 1 value per channel; got input shape ",
                   to_string(x.shape()));
    Tensor mean, var;  // (C,), the batch's mean and biased variance
    Tensor y = batchnorm(x, weight, bias, eps, &mean, &var);
    if (train && running_mean.defined()) {
      // Not recorded: the running statistics are state, not part of the differentiated function.
      autodiff::NoGrad no_grad;
      Tensor rm = running_mean, rv = running_var, nbt = num_batches_tracked;
      Tensor unbiased = var * (double(m) / double(m - 1));
      copy_(rm, running_mean * (1.0 - momentum) + mean * momentum);
      copy_(rv, running_var * (1.0 - momentum) + unbiased * momentum);
      if (nbt.defined()) copy_(nbt, nbt + 1.0);
    }
    return activation(y);
  }
  return activation(batchnorm(x, weight, bias, running_mean, running_var, eps));
}

namespace {
void check_norm_options(const char* api, int64_t size, double eps, DType t) {
  if (size <= 0) detail::fail("[", api, "] sizes must be positive; got ", size);
  if (!(eps > 0)) detail::fail("[", api, "] eps must be positive; got ", eps);
  if (!is_floating(t)) detail::fail("[", api, "] needs a floating-point dtype; got ", dtype_name(t));
}
void check_state_device(const char* api, const Tensor& x, const Tensor& state) {
  if (state.defined() && x.device() != state.device())
    detail::fail("[", api, "] input on ", to_string(x.device()), " but the layer's state on ", to_string(state.device()),
                 "; move one with to() or | dev");
}
// Channels-on-axis-1 check shared by GroupNorm and InstanceNorm.
void check_channels(const char* api, const std::string& layer, const Tensor& x, int64_t channels, int min_ndim) {
  detail::check_defined(api, x);
  if (x.ndim() < min_ndim)
    detail::fail("[", api, "] expects input (N, C", min_ndim > 2 ? ", spatial..." : ", ...", ") with at least ", min_ndim,
                 " dimensions, channels on axis 1; got shape ", to_string(x.shape()), " (", layer, ")");
  if (x.shape()[1] != channels)
    detail::fail("[", api, "] input has ", x.shape()[1], " channels, layer expects ", channels, " (", layer,
                 "); got shape ", to_string(x.shape()), ". Channels go along axis 1: (N, C, ...)");
  if (!is_floating(x.dtype())) detail::fail("[", api, "] needs a floating-point input; got ", summary(x));
}
std::string activation_suffix(const Activation& a) { return a.is_identity() ? "" : ", " + a.name(); }
template <class L> std::ostream& show_with_count(std::ostream& os, const L& l) {
  std::string s = layer_string(l);
  os << s;
  if (int64_t n = parameter_count(l); n > 0)
    os << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(n) << " parameters";
  return os;
}
}  // namespace

LayerNorm::LayerNorm(int64_t d, Activation act, LayerNormOptions o) : activation(std::move(act)), features(d), eps(o.eps) {
  check_norm_options("LayerNorm", d, o.eps, o.dtype);
  if (o.affine) {
    weight = ones(Shape{d}, o.dtype);
    bias = zeros(Shape{d}, o.dtype);
  }
}

Tensor LayerNorm::operator()(const Tensor& x) const {
  if (features <= 0) detail::fail("[LayerNorm] the layer is empty (default-constructed)");
  detail::check_defined("LayerNorm", x);
  if (x.ndim() < 1 || x.shape()[x.ndim() - 1] != features)
    detail::fail("[LayerNorm] expected input with last dimension ", features, " (", layer_string(*this), "); got shape ",
                 to_string(x.shape()), ". Features go along the last axis: (N, ", features, ") or (N, T, ", features, ")");
  if (!is_floating(x.dtype())) detail::fail("[LayerNorm] needs a floating-point input; got ", summary(x));
  check_state_device("LayerNorm", x, weight);
  return activation(layernorm(x, weight, bias, eps));
}

GroupNorm::GroupNorm(int64_t chs, int64_t g, Activation act, GroupNormOptions o)
    : activation(std::move(act)), channels(chs), groups(g), eps(o.eps) {
  check_norm_options("GroupNorm", chs, o.eps, o.dtype);
  if (g <= 0 || chs % g != 0)
    detail::fail("[GroupNorm] the number of groups (", g, ") must be positive and divide the channels (", chs,
                 "); got GroupNorm(", chs, ", ", g, ")");
  if (o.affine) {
    weight = ones(Shape{chs}, o.dtype);
    bias = zeros(Shape{chs}, o.dtype);
  }
}

Tensor GroupNorm::operator()(const Tensor& x) const {
  if (channels <= 0) detail::fail("[GroupNorm] the layer is empty (default-constructed)");
  check_channels("GroupNorm", layer_string(*this), x, channels, 2);
  check_state_device("GroupNorm", x, weight);
  return activation(groupnorm(x, groups, weight, bias, eps));
}

InstanceNorm::InstanceNorm(int64_t chs, Activation act, InstanceNormOptions o)
    : activation(std::move(act)), channels(chs), eps(o.eps) {
  check_norm_options("InstanceNorm", chs, o.eps, o.dtype);
  if (o.affine) {
    weight = ones(Shape{chs}, o.dtype);
    bias = zeros(Shape{chs}, o.dtype);
  }
}

Tensor InstanceNorm::operator()(const Tensor& x) const {
  if (channels <= 0) detail::fail("[InstanceNorm] the layer is empty (default-constructed)");
  check_channels("InstanceNorm", layer_string(*this), x, channels, 3);
  check_state_device("InstanceNorm", x, weight);
  return activation(groupnorm(x, channels, weight, bias, eps));
}

std::string layer_string(const LayerNorm& l) {
  return "LayerNorm(" + std::to_string(l.features) + activation_suffix(l.activation) +
         (l.weight.defined() ? "" : ", affine=false") + ")";
}
std::string layer_string(const GroupNorm& l) {
  return "GroupNorm(" + std::to_string(l.channels) + ", " + std::to_string(l.groups) + activation_suffix(l.activation) +
         (l.weight.defined() ? "" : ", affine=false") + ")";
}
std::string layer_string(const InstanceNorm& l) {
  return "InstanceNorm(" + std::to_string(l.channels) + activation_suffix(l.activation) +
         (l.weight.defined() ? ", affine=true" : "") + ")";
}
std::ostream& operator<<(std::ostream& os, const LayerNorm& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const GroupNorm& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const InstanceNorm& l) { return show_with_count(os, l); }

std::string layer_string(const BatchNorm& b) {
  std::string s = "BatchNorm(" + std::to_string(b.channels);
  if (!b.activation.is_identity()) s += ", " + b.activation.name();
  if (!b.weight.defined()) s += ", affine=false";
  if (b.active) s += std::string(", active=") + (*b.active ? "true" : "false");
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const BatchNorm& b) {
  std::string s = layer_string(b);
  os << s;
  if (int64_t n = parameter_count(b); n > 0) {  // Flux's _layer_show at the top level
    os << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(n) << " parameters";
    if (int64_t k = nontrainable_count(b); k > 0) os << ", plus " << show::underscorise(k) << " non-trainable";
  }
  return os;
}

}  // namespace flux
