// BatchNorm(C, act = identity, {.eps, .momentum, .affine, .track_stats}): per-channel normalisation
// over axis 1 of x (N, C, spatial...) or (N, C) -> the same shape:
//   y = act(weight * (x - mean) / sqrt(var + eps) + bias), weight (C,), bias (C,)
// with mean/var over every axis but 1. Training (inside gradient(), or trainmode): the batch's
// statistics, var biased; running_mean/running_var then move by
//   running = (1 - momentum) * running + momentum * batch   (running_var gets the unbiased batch var)
// and num_batches_tracked counts the steps. Inference (outside gradient(), or testmode): the running
// statistics. This is PyTorch's nn.BatchNorm1d/2d/3d (state names weight, bias, running_mean,
// running_var, num_batches_tracked; a torchvision state_dict loads unchanged) and Flux's BatchNorm
// (γ = weight, β = bias, μ = running_mean, σ² = running_var): both define momentum as the weight of the
// new batch, 0.1 by default, so the same number means the same thing in all three.
#pragma once
#include <optional>
#include <ostream>
#include <string>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"

namespace flux {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;       // learn weight (γ, ones) and bias (β, zeros)
  bool track_stats = true;  // keep running statistics (false: batch statistics always, as PyTorch)
  DType dtype = DType::f32;
};

struct BatchNorm {
  Tensor weight;                    // (C,) γ, undefined when affine = false
  Tensor bias;                      // (C,) β, undefined when affine = false
  NonTrainable running_mean;        // (C,) zeros at first; undefined when track_stats = false
  NonTrainable running_var;         // (C,) ones at first
  NonTrainable num_batches_tracked; // () Int64, training steps taken
  Activation activation;
  int64_t channels = 0;
  double eps = 1e-5, momentum = 0.1;
  std::optional<bool> active;       // nullopt: automatic (training inside gradient()); see trainmode

  BatchNorm() = default;
  explicit BatchNorm(int64_t channels, Activation act = Activation(), BatchNormOptions options = {});
  BatchNorm(int64_t channels, BatchNormOptions options) : BatchNorm(channels, Activation(), options) {}

  /// x: (N, C, spatial...) or (N, C) -> the same shape. Updates the running statistics in training.
  Tensor operator()(const Tensor& x) const;
  /// Whether the next call uses batch statistics (training behaviour).
  bool training() const;
};
FLUX_LAYER(BatchNorm, weight, bias, running_mean, running_var, num_batches_tracked)

/// "BatchNorm(32, relu)", ", affine=false", ", active=true" as Flux.
std::string layer_string(const BatchNorm& b);
/// Flux's display: "BatchNorm(32, relu)  # 64 parameters, plus 64 non-trainable".
std::ostream& operator<<(std::ostream& os, const BatchNorm& b);

}  // namespace flux
