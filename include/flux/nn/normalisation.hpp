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
//
// LayerNorm(D, act = identity, {.eps = 1e-5, .affine = true}): x (..., D) normalised over its last
// axis, y = act(weight * x̂ + bias), weight, bias (D,). PyTorch's nn.LayerNorm(D) (weight, bias) and
// Flux's LayerNorm(D) (its Scale's scale and bias); the same eps in all three.
// GroupNorm(C, G, act, {.eps = 1e-5, .affine = true}): x (N, C, spatial...) with the C channels in G
// groups, each normalised over its C / G channels and the spatial axes, then a per-channel affine
// weight, bias (C,). PyTorch's nn.GroupNorm(G, C) and Flux's GroupNorm(C, G).
// InstanceNorm(C, act, {.eps = 1e-5, .affine = false}): GroupNorm with one channel per group (each
// sample's channel over its spatial axes). Flux's and PyTorch's defaults (affine off, no running
// statistics). These three never track running statistics: train and test mode compute the same
// thing (Flux's track_stats = true for InstanceNorm/GroupNorm is not offered).
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

struct LayerNormOptions {
  double eps = 1e-5;
  bool affine = true;  // learn weight (ones) and bias (zeros)
  DType dtype = DType::f32;
};

struct LayerNorm {
  Tensor weight;  // (D,), undefined when affine = false
  Tensor bias;    // (D,)
  Activation activation;
  int64_t features = 0;
  double eps = 1e-5;

  LayerNorm() = default;
  explicit LayerNorm(int64_t features, Activation act = Activation(), LayerNormOptions options = {});
  LayerNorm(int64_t features, LayerNormOptions options) : LayerNorm(features, Activation(), options) {}
  /// x: (..., D) -> the same shape.
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(LayerNorm, weight, bias)

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
  DType dtype = DType::f32;
};

struct GroupNorm {
  Tensor weight;  // (C,), undefined when affine = false
  Tensor bias;    // (C,)
  Activation activation;
  int64_t channels = 0, groups = 0;
  double eps = 1e-5;

  GroupNorm() = default;
  GroupNorm(int64_t channels, int64_t groups, Activation act = Activation(), GroupNormOptions options = {});
  GroupNorm(int64_t channels, int64_t groups, GroupNormOptions options)
      : GroupNorm(channels, groups, Activation(), options) {}
  /// x: (N, C, spatial...) or (N, C) -> the same shape.
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(GroupNorm, weight, bias)

struct InstanceNormOptions {
  double eps = 1e-5;
  bool affine = false;  // Flux's and PyTorch's default
  DType dtype = DType::f32;
};

struct InstanceNorm {
  Tensor weight;  // (C,), defined only when affine = true
  Tensor bias;    // (C,)
  Activation activation;
  int64_t channels = 0;
  double eps = 1e-5;

  InstanceNorm() = default;
  explicit InstanceNorm(int64_t channels, Activation act = Activation(), InstanceNormOptions options = {});
  InstanceNorm(int64_t channels, InstanceNormOptions options) : InstanceNorm(channels, Activation(), options) {}
  /// x: (N, C, spatial...) with at least one spatial axis -> the same shape.
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(InstanceNorm, weight, bias)

/// "LayerNorm(32)", "LayerNorm(32, relu, affine=false)" as Flux.
std::string layer_string(const LayerNorm& l);
/// "GroupNorm(32, 4)", "GroupNorm(32, 4, relu, affine=false)" as Flux.
std::string layer_string(const GroupNorm& l);
/// "InstanceNorm(32)", "InstanceNorm(32, affine=true)" as Flux.
std::string layer_string(const InstanceNorm& l);
/// Flux's display: "LayerNorm(32)       # 64 parameters".
std::ostream& operator<<(std::ostream& os, const LayerNorm& l);
std::ostream& operator<<(std::ostream& os, const GroupNorm& l);
std::ostream& operator<<(std::ostream& os, const InstanceNorm& l);

}  // namespace flux
