// Loss functions with Flux's names and semantics. Observations lie along the first axis and classes
// along the last; `agg` reduces the per-element (or per-observation) losses, mean by default.
// `eps` (crossentropy, binarycrossentropy, kldivergence) defaults to Flux's epseltype(yhat): the
// machine epsilon of yhat's dtype (2^-52 for Float64, 2^-23 for Float32, 2^-10 for Float16, 2^-7
// for BFloat16). xlogy(y, p) = y log p with 0 log p = 0 (also for p = 0), as LogExpFunctions.
#pragma once
#include <functional>
#include <optional>

#include "flux/ops.hpp"

namespace flux {

enum class Agg { mean, sum, none };

struct LossOptions {
  Agg agg = Agg::mean;
};

Tensor mse(const Tensor& yhat, const Tensor& y, LossOptions o = {});
Tensor mae(const Tensor& yhat, const Tensor& y, LossOptions o = {});
/// -sum(xlogy(y, yhat + eps)) over classes; yhat are probabilities.
Tensor crossentropy(const Tensor& yhat, const Tensor& y, LossOptions o = {}, std::optional<double> eps = std::nullopt);
/// crossentropy(softmax(logits), y) fused and stable: -sum(y * logsoftmax(logits)).
Tensor logitcrossentropy(const Tensor& logits, const Tensor& y, LossOptions o = {});
/// -xlogy(y, yhat + eps) - xlogy(1 - y, 1 - yhat + eps), elementwise.
Tensor binarycrossentropy(const Tensor& yhat, const Tensor& y, LossOptions o = {},
                          std::optional<double> eps = std::nullopt);
/// binarycrossentropy(sigmoid(logits), y), stable.
Tensor logitbinarycrossentropy(const Tensor& logits, const Tensor& y, LossOptions o = {});
Tensor huber(const Tensor& yhat, const Tensor& y, LossOptions o = {}, double delta = 1.0);
/// sum(xlogx(y)) + crossentropy(yhat, y; eps) over classes, per observation (Flux's kldivergence:
/// the entropy term has no eps and 0 log 0 = 0, so one-hot targets with eps = 0 stay finite).
Tensor kldivergence(const Tensor& yhat, const Tensor& y, LossOptions o = {}, std::optional<double> eps = std::nullopt);

// The target may be a tensor of the prediction's shape, a tensor that broadcasts to it (a 0-d tensor,
// one row of classes (1, C) or (C,), a column (N, 1), ...), or a number: logitbinarycrossentropy(ŷ, 1),
// as Flux's losses broadcast ŷ .- y. Gradients flow to both arguments through the broadcast.
Tensor mse(const Tensor& yhat, double y, LossOptions o = {});
Tensor mae(const Tensor& yhat, double y, LossOptions o = {});
Tensor crossentropy(const Tensor& yhat, double y, LossOptions o = {}, std::optional<double> eps = std::nullopt);
Tensor logitcrossentropy(const Tensor& logits, double y, LossOptions o = {});
Tensor binarycrossentropy(const Tensor& yhat, double y, LossOptions o = {}, std::optional<double> eps = std::nullopt);
Tensor logitbinarycrossentropy(const Tensor& logits, double y, LossOptions o = {});
Tensor huber(const Tensor& yhat, double y, LossOptions o = {}, double delta = 1.0);
Tensor kldivergence(const Tensor& yhat, double y, LossOptions o = {}, std::optional<double> eps = std::nullopt);

/// Flux's epseltype: the machine epsilon of a floating dtype (the default eps above).
double epseltype(DType t);

}  // namespace flux
