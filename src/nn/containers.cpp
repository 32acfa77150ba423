// Bilinear: y = act(Σ_ij x_i W_oij z_j + b_o) as one GEMM and a reduction:
//   t = x (N, in1) @ W viewed as (in1, out * in2) after permuting W (out, in1, in2) to (in1, out, in2),
//   y = Σ_j t (N, out, in2) * z (N, 1, in2) + b.
#include <cmath>

#include "flux/nn/containers.hpp"
#include "src/nn/match_eltype.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

Bilinear::Bilinear(int64_t in1, int64_t in2, int64_t out, Activation act, BilinearOptions o) : activation(std::move(act)) {
  if (in1 <= 0 || in2 <= 0 || out <= 0)
    detail::fail("[Bilinear] sizes must be positive; got Bilinear((", in1, ", ", in2, ") => ", out, ")");
  if (!is_floating(o.dtype)) detail::fail("[Bilinear] needs a floating-point dtype; got ", dtype_name(o.dtype));
  const double limit = std::sqrt(6.0 / double(out * (in1 + in2)));  // Flux's glorot_uniform(out, in1, in2)
  weight = ((rand(Shape{out, in1, in2}, DType::f64) * 2.0 - 1.0) * limit).cast(o.dtype);
  if (o.bias) bias = zeros(Shape{out}, o.dtype);
}

Tensor Bilinear::operator()(const Tensor& x0, const Tensor& z0) const {
  if (!weight.defined()) detail::fail("[Bilinear] the layer is empty (default-constructed)");
  detail::check_defined("Bilinear", x0);
  detail::check_defined("Bilinear", z0);
  // Float64 input: converted, warned once.
  const Tensor x = detail::match_eltype("Bilinear", *this, weight, x0), z = detail::match_eltype("Bilinear", *this, weight, z0);
  const int64_t out = weight.size(0), in1 = weight.size(1), in2 = weight.size(2);
  if (x.ndim() != 2 || z.ndim() != 2 || x.shape()[1] != in1 || z.shape()[1] != in2 || x.shape()[0] != z.shape()[0])
    detail::fail("[Bilinear] expects x (N, ", in1, ") and z (N, ", in2, ") (", layer_string(*this), "); got ",
                 to_string(x.shape()), " and ", to_string(z.shape()));
  for (const Tensor* t : {&x, &z})
    if (t->device() != weight.device())
      detail::fail("[Bilinear] input on ", to_string(t->device()), " but the layer's weight on ", to_string(weight.device()),
                   "; move one with to() or | dev");
  const int64_t n = x.shape()[0];
  Tensor w = permute(weight, {1, 0, 2}).reshape(Shape{in1, out * in2});
  Tensor t = matmul(x, w).reshape(Shape{n, out, in2});
  Tensor y = sum(t * z.reshape(Shape{n, 1, in2}), 2);
  if (bias.defined()) y = y + bias;
  return activation(y);
}

std::string layer_string(const Bilinear& b) {
  if (!b.weight.defined()) return "Bilinear()";
  const int64_t out = b.weight.size(0), in1 = b.weight.size(1), in2 = b.weight.size(2);
  std::string s = in1 == in2 ? "Bilinear(" + std::to_string(in1) + " => " + std::to_string(out)
                             : "Bilinear((" + std::to_string(in1) + ", " + std::to_string(in2) + ") => " + std::to_string(out);
  if (!b.activation.is_identity()) s += ", " + b.activation.name();
  if (!b.bias.defined()) s += "; bias=false";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Bilinear& b) {
  std::string s = layer_string(b);
  return os << s << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(parameter_count(b))
            << " parameters";
}

}  // namespace flux
