// Feature standardisation fitted on training data and applied to any data, as scikit-learn's
// StandardScaler and StatsBase's fit(ZScoreTransform, X) / transform / reconstruct:
//   auto scaler = data::Standardiser::fit(Xtrain);   // per-feature mean and standard deviation
//   Tensor Ztrain = scaler.transform(Xtrain), Ztest = scaler.transform(Xtest);   // (x - mean) / std
//   Tensor X2 = scaler.reconstruct(Ztest);           // back to the original units
// Features are everything after the first (observation) axis: X (N, F) has F features, X (N, C, H, W)
// has C*H*W. The standard deviation is the population one (divide by N, as StandardScaler and
// Flux.normalise); a constant feature gets scale 1, so it becomes 0 rather than NaN.
#pragma once
#include <vector>

#include "flux/tensor.hpp"

namespace flux::data {

class Standardiser {
 public:
  /// The statistics of x's rows (Float16/BFloat16/Float32/Float64, any device), in float64 on the host.
  static Standardiser fit(const Tensor& x);
  /// (x - mean) / scale, in x's dtype and on x's device; x's feature shape must be the fitted one.
  Tensor transform(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return transform(x); }
  /// The inverse: z * scale + mean.
  Tensor reconstruct(const Tensor& z) const;
  /// Per-feature mean and scale, Float64 on the CPU, shaped as one observation (x.shape() minus axis 0).
  const Tensor& mean() const { return mean_; }
  const Tensor& scale() const { return scale_; }

 private:
  Tensor stat_for(const char* api, const Tensor& stat, const Tensor& x) const;
  Tensor mean_, scale_;
};

}  // namespace flux::data
