// Dropout(p, {.dims}): in training, y = x * mask / (1 - p) with mask ~ Bernoulli(1 - p) drawn on x's
// device by the counter-based generator that seed(n) seeds (the same mask on every device); in
// inference, y = x. Any shape; `dims` lists the axes the mask varies along (empty: all), so
// Dropout(0.5, {.dims = {0, 1}}) on (N, C, H, W) drops whole channels. Flux's Dropout(p; dims) and
// PyTorch's nn.Dropout (p is the probability of zeroing); automatic mode as Flux: active inside
// gradient()/withgradient() only, unless trainmode/testmode force it.
#pragma once
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "flux/functor.hpp"
#include "flux/tensor.hpp"

namespace flux {

struct DropoutOptions {
  std::vector<int> dims = {};
};

struct Dropout {
  double p = 0.5;
  std::vector<int> dims;
  std::optional<bool> active;  // nullopt: automatic (training inside gradient()); see trainmode

  Dropout() = default;
  /// p in [0, 1): the probability that an element is zeroed.
  explicit Dropout(double p, DropoutOptions options = {});
  Tensor operator()(const Tensor& x) const;
  /// Whether the next call drops (training behaviour).
  bool training() const;
};
FLUX_LAYER(Dropout)  // no tensors; its mode is set through `active`

/// "Dropout(0.5)", "Dropout(0.5, dims = 1)" as Flux.
std::string layer_string(const Dropout& d);
std::ostream& operator<<(std::ostream& os, const Dropout& d);

}  // namespace flux
