// Dense: y = act(x Wᵀ + b).
#include <cmath>
#include <cstdio>
#include <mutex>

#include "flux/move.hpp"
#include "flux/nn/show.hpp"
#include "src/autocast.hpp"
#include "src/nn/match_eltype.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

Dense::Dense(int64_t in, int64_t out, Activation act, DenseOptions options) : activation(std::move(act)) {
  if (in <= 0 || out <= 0) detail::fail("[Dense] sizes must be positive; got Dense(", in, " => ", out, ")");
  weight = detail::initialise("Dense", options.init, Shape{out, in}, options.dtype);
  if (options.bias) bias = zeros(Shape{out}, options.dtype);
}

Dense::Dense(InferSize, int64_t out, Activation act, DenseOptions options) : activation(std::move(act)) {
  if (out <= 0) detail::fail("[Dense] sizes must be positive; got Dense(_ => ", out, ")");
  pending = std::make_shared<const Pending>(Pending{out, std::move(options)});
}

Dense::Dense(Tensor w, Tensor b, Activation act) : weight(std::move(w)), bias(std::move(b)), activation(std::move(act)) {
  if (!weight.defined() || weight.ndim() != 2)
    detail::fail("[Dense] weight must be a 2-dimensional (out, in) tensor; got ", summary(weight));
  if (bias.defined() && (bias.ndim() != 1 || bias.shape()[0] != weight.shape()[0]))
    detail::fail("[Dense] bias must have shape (", weight.shape()[0], ",) to match weight ", to_string(weight.shape()),
                 "; got ", to_string(bias.shape()));
}

Tensor Dense::operator()(const Tensor& x0) const {
  if (!weight.defined() && pending)
    detail::fail("[Dense] Dense(_ => ", pending->out, ") has no input size yet: build the model with "
                 "autosize(input_shape, model) (flux/nn/autosize.hpp), or write the input size");
  if (!weight.defined()) detail::fail("[Dense] the layer is empty (default-constructed)");
  detail::check_defined("Dense", x0);
  const Tensor x = detail::match_eltype("Dense", *this, weight, x0);  // Float64 input: converted, warned once
  int64_t in = weight.shape()[1];
  if (x.ndim() == 0 || x.shape()[x.ndim() - 1] != in)
    detail::fail("[Dense] expected input with last dimension ", in, " (Dense(", in, " => ", weight.shape()[0],
                 ")); got shape ", to_string(x.shape()), ". Observations go along the first axis: (N, ", in, ")");
  if (x.device() != weight.device())
    detail::fail("[Dense] input on ", to_string(x.device()), " but the layer's weight on ", to_string(weight.device()),
                 "; move one with to() or | dev");
  // Autocast: the layer runs in the low dtype on casts of its float32 parameters.
  if (auto low = detail::autocast_low({&x, &weight})) {
    Dense cast = *this;
    cast.weight = detail::autocast_to(weight, *low);
    cast.bias = detail::autocast_to(bias, *low);
    return cast(detail::autocast_to(x, *low));
  }
  // Fused bias (float input) and relu, else below; (..., in) runs as one (rows, in) GEMM.
  const bool relu = activation.is<Relu>();
  if (bias.defined()) {
    Tensor y;
    if (x.ndim() > 2) {
      Shape out_shape = x.shape();
      out_shape[out_shape.size() - 1] = weight.shape()[0];
      y = detail::linear(x.reshape(Shape{x.numel() / in, in}), weight, bias, relu);
      if (y.defined()) y = y.reshape(out_shape);
    } else {
      y = detail::linear(x, weight, bias, relu);
    }
    if (y.defined()) return relu ? y : activation(y);
  }
  Tensor y = matmul(x, weight, false, true);
  if (bias.defined()) y = y + bias;
  return activation(y);
}

std::string layer_string(const Dense& d) {
  if (!d.weight.defined() && d.pending) {
    std::string s = "Dense(_ => " + std::to_string(d.pending->out);
    if (!d.activation.is_identity()) s += ", " + d.activation.name();
    return s + (d.pending->options.bias ? ")" : "; bias=false)");
  }
  std::string s = "Dense(" + std::to_string(d.in_features()) + " => " + std::to_string(d.out_features());
  if (!d.activation.is_identity()) s += ", " + d.activation.name();
  if (!d.bias.defined()) s += "; bias=false";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Dense& d) {
  std::string s = layer_string(d);
  os << s << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(parameter_count(d))
     << " parameters";
  return os;
}

}  // namespace flux
