// Feature standardisation; see include/flux/data/standardise.hpp.
#include "flux/data/standardise.hpp"

#include <cmath>

#include "flux/error.hpp"
#include "flux/ops.hpp"

namespace flux::data {
namespace {

using flux::detail::fail;

Shape feature_shape(const Tensor& x) {
  Shape s;
  for (int a = 1; a < x.ndim(); ++a) s.push_back(x.shape()[a]);
  return s;
}

}  // namespace

Standardiser Standardiser::fit(const Tensor& x) {
  if (!x.defined()) fail("[Standardiser::fit] the tensor is undefined");
  if (!is_floating(x.dtype()))
    fail("[Standardiser::fit] expects floating-point features, got ", dtype_name(x.dtype()), " of shape ",
         to_string(x.shape()), "; cast first, e.g. x.f32()");
  if (x.ndim() == 0 || x.shape()[0] < 1)
    fail("[Standardiser::fit] expects at least one observation along the first axis, got shape ", to_string(x.shape()));
  const int64_t n = x.shape()[0], f = x.numel() / n;
  std::vector<double> v = x.to_vector<double>(), mean(size_t(f), 0.0), scale(size_t(f), 0.0);
  // Two passes in float64: the mean, then the mean squared deviation (no cancellation).
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) mean[size_t(j)] += v[size_t(i * f + j)];
  for (double& m : mean) m /= double(n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double d = v[size_t(i * f + j)] - mean[size_t(j)];
      scale[size_t(j)] += d * d;
    }
  for (double& s : scale) {
    s = std::sqrt(s / double(n));
    if (s == 0) s = 1;  // a constant feature
  }
  Shape fs = feature_shape(x);
  Standardiser out;
  out.mean_ = Tensor(mean, fs);
  out.scale_ = Tensor(scale, fs);
  return out;
}

Tensor Standardiser::stat_for(const char* api, const Tensor& stat, const Tensor& x) const {
  if (!mean_.defined()) fail("[", api, "] the Standardiser is not fitted; make it with Standardiser::fit(x)");
  if (!x.defined()) fail("[", api, "] the tensor is undefined");
  if (!is_floating(x.dtype()))
    fail("[", api, "] expects floating-point features, got ", dtype_name(x.dtype()), " of shape ", to_string(x.shape()));
  if (x.ndim() == 0 || feature_shape(x) != mean_.shape())
    fail("[", api, "] x has shape ", to_string(x.shape()), " but the Standardiser was fitted on observations of shape ",
         to_string(mean_.shape()), "; expected (N, ", [&] {
           std::string s;
           for (int a = 0; a < mean_.ndim(); ++a) s += (a ? ", " : "") + std::to_string(mean_.shape()[a]);
           return s;
         }(), ")");
  Shape one{1};
  for (int64_t d : mean_.shape()) one.push_back(d);
  return to(stat.cast(x.dtype()).reshape(one), x.device());
}

Tensor Standardiser::transform(const Tensor& x) const {
  Tensor m = stat_for("Standardiser::transform", mean_, x), s = stat_for("Standardiser::transform", scale_, x);
  return (x - m) / s;
}

Tensor Standardiser::reconstruct(const Tensor& z) const {
  Tensor m = stat_for("Standardiser::reconstruct", mean_, z), s = stat_for("Standardiser::reconstruct", scale_, z);
  return z * s + m;
}

}  // namespace flux::data
