// Loss functions with Flux's names and semantics. Observations lie along the first axis and classes
// along the last; `agg` reduces the per-element (or per-observation) losses, mean by default.
#pragma once
#include <functional>

#include "flux/ops.hpp"

namespace flux {

enum class Agg { mean, sum, none };

struct LossOptions {
  Agg agg = Agg::mean;
};

Tensor mse(const Tensor& yhat, const Tensor& y, LossOptions o = {});
Tensor mae(const Tensor& yhat, const Tensor& y, LossOptions o = {});
/// -sum(y * log(yhat + eps)) over classes; yhat are probabilities.
Tensor crossentropy(const Tensor& yhat, const Tensor& y, LossOptions o = {}, double eps = 1e-7);
/// crossentropy(softmax(logits), y) fused and stable: -sum(y * logsoftmax(logits)).
Tensor logitcrossentropy(const Tensor& logits, const Tensor& y, LossOptions o = {});
Tensor binarycrossentropy(const Tensor& yhat, const Tensor& y, LossOptions o = {}, double eps = 1e-7);
/// binarycrossentropy(sigmoid(logits), y), stable.
Tensor logitbinarycrossentropy(const Tensor& logits, const Tensor& y, LossOptions o = {});
Tensor huber(const Tensor& yhat, const Tensor& y, LossOptions o = {}, double delta = 1.0);
/// sum(y * log(y / yhat)) over classes, per observation.
Tensor kldivergence(const Tensor& yhat, const Tensor& y, LossOptions o = {}, double eps = 1e-7);

}  // namespace flux
