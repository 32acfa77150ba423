// Dropout: the dropout op (src/ops/random.cpp) in training mode, the identity otherwise.
#include "flux/nn/dropout.hpp"

#include <sstream>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"

namespace flux {

Dropout::Dropout(double prob, DropoutOptions options) : p(prob), dims(std::move(options.dims)) {
  if (!(p >= 0.0 && p < 1.0)) detail::fail("[Dropout] p must be in [0, 1); got ", p);
}

bool Dropout::training() const { return active.value_or(autodiff::recording()); }

Tensor Dropout::operator()(const Tensor& x) const {
  if (!training() || p == 0.0) return x;
  return dropout(x, p, dims);
}

std::string layer_string(const Dropout& d) {
  std::ostringstream os;
  os << "Dropout(" << d.p;
  if (d.dims.size() == 1) os << ", dims = " << d.dims[0];
  if (d.dims.size() > 1) {
    os << ", dims = (";
    for (size_t i = 0; i < d.dims.size(); ++i) os << (i ? ", " : "") << d.dims[i];
    os << ")";
  }
  if (d.active) os << ", active=" << (*d.active ? "true" : "false");
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Dropout& d) { return os << layer_string(d); }

}  // namespace flux
