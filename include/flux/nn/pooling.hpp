// Pooling layers over (N, C, spatial...) inputs with 1 to 3 spatial axes (NCHW for images), and the
// layer value `flatten`. Flux: MaxPool((2, 2); pad, stride), MeanPool, GlobalMaxPool(), GlobalMeanPool(),
// AdaptiveMaxPool((1, 1)), AdaptiveMeanPool, flatten; PyTorch: nn.MaxPool2d, nn.AvgPool2d
// (count_include_pad=True), nn.AdaptiveMaxPool2d / nn.AdaptiveAvgPool2d, nn.Flatten. No parameters.
//   MaxPool(window, {.stride = window, .pad = 0}):  (N, C, H, W) -> (N, C, H', W'),
//     H' = (H + pad_lo + pad_hi - kH) / stride + 1; padding never wins a max; MeanPool counts it as 0.
//   GlobalMaxPool(), GlobalMeanPool():              (N, C, H, W) -> (N, C, 1, 1)
//   AdaptiveMaxPool(out), AdaptiveMeanPool(out):    (N, C, H, W) -> (N, C, out...)
//   flatten:                                        (N, d1, d2, ...) -> (N, d1 * d2 * ...)
// Padding is resolved at construction as Flux does (SamePad(): see src/nn/window_options.hpp).
#pragma once
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "flux/functor.hpp"
#include "flux/ops.hpp"

namespace flux {

/// Pool options, in Flux's keyword order. An empty stride means the window (non-overlapping).
struct PoolOptions {
  Dims stride = Dims(std::vector<int64_t>{});
  Padding pad = 0;
};

/// Max over each window: MaxPool({2, 2}), MaxPool({3, 3}, {.stride = 2, .pad = 1}).
struct MaxPool {
  std::vector<int64_t> window;  // per spatial axis
  std::vector<int64_t> stride;  // per spatial axis
  std::vector<int64_t> pad;     // (lo, hi) per spatial axis
  MaxPool() = default;
  explicit MaxPool(const Dims& window, const PoolOptions& options = {});
  /// MaxPool({2}) for one spatial axis (a single braced size would be ambiguous without it).
  explicit MaxPool(std::initializer_list<int64_t> window, const PoolOptions& options = {})
      : MaxPool(Dims(window), options) {}
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(MaxPool)  // no tensors: walkable, nothing to train

/// Mean over each window, dividing by the full window (padding counts as 0, as Flux and PyTorch's default).
struct MeanPool {
  std::vector<int64_t> window;
  std::vector<int64_t> stride;
  std::vector<int64_t> pad;
  MeanPool() = default;
  explicit MeanPool(const Dims& window, const PoolOptions& options = {});
  /// MeanPool({2}) for one spatial axis (a single braced size would be ambiguous without it).
  explicit MeanPool(std::initializer_list<int64_t> window, const PoolOptions& options = {})
      : MeanPool(Dims(window), options) {}
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(MeanPool)  // no tensors: walkable, nothing to train

/// Max / mean over all spatial axes: (N, C, spatial...) -> (N, C, 1...).
struct GlobalMaxPool {
  Tensor operator()(const Tensor& x) const { return global_maxpool(x); }
};
struct GlobalMeanPool {
  Tensor operator()(const Tensor& x) const { return global_meanpool(x); }
};

/// Pools to a fixed output size, PyTorch's adaptive windows: AdaptiveMeanPool({1, 1}).
struct AdaptiveMaxPool {
  std::vector<int64_t> out;  // per spatial axis
  AdaptiveMaxPool() = default;
  explicit AdaptiveMaxPool(const Dims& out);
  explicit AdaptiveMaxPool(std::initializer_list<int64_t> out) : AdaptiveMaxPool(Dims(out)) {}
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(AdaptiveMaxPool)  // no tensors: walkable, nothing to train
struct AdaptiveMeanPool {
  std::vector<int64_t> out;
  AdaptiveMeanPool() = default;
  explicit AdaptiveMeanPool(const Dims& out);
  explicit AdaptiveMeanPool(std::initializer_list<int64_t> out) : AdaptiveMeanPool(Dims(out)) {}
  Tensor operator()(const Tensor& x) const;
};
FLUX_LAYER(AdaptiveMeanPool)  // no tensors: walkable, nothing to train

/// flatten: (N, d1, d2, ...) -> (N, d1 * d2 * ...), a layer value as relu is (its op: detail::flatten_op).
struct Flatten {
  static constexpr const char* name = "flatten";
  Tensor operator()(const Tensor& x) const { return detail::flatten_op(x); }
};
inline constexpr Flatten flatten{};

/// Flux's printing: "MaxPool((2, 2))", "MaxPool((3, 3), pad=1, stride=2)", "MeanPool((2, 2))",
/// "GlobalMaxPool()", "GlobalMeanPool()", "AdaptiveMeanPool((1, 1))", "flatten".
std::string layer_string(const MaxPool& m);
std::string layer_string(const MeanPool& m);
std::string layer_string(const GlobalMaxPool& m);
std::string layer_string(const GlobalMeanPool& m);
std::string layer_string(const AdaptiveMaxPool& m);
std::string layer_string(const AdaptiveMeanPool& m);
std::ostream& operator<<(std::ostream& os, const MaxPool& m);
std::ostream& operator<<(std::ostream& os, const MeanPool& m);
std::ostream& operator<<(std::ostream& os, const GlobalMaxPool& m);
std::ostream& operator<<(std::ostream& os, const GlobalMeanPool& m);
std::ostream& operator<<(std::ostream& os, const AdaptiveMaxPool& m);
std::ostream& operator<<(std::ostream& os, const AdaptiveMeanPool& m);
inline std::ostream& operator<<(std::ostream& os, const Flatten&) { return os << "flatten"; }

}  // namespace flux
