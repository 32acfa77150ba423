// Weight initialisers, as Flux's (Flux.jl src/utils.jl): values callable as init(shape, dtype) ->
// a new CPU tensor drawn from the global seeded generator (seed(n)), chosen with `.init`:
//   Conv({3, 3}, 16, 32, relu, {.init = kaiming_normal});  Dense(10, 5, {.init = orthogonal});
// Shapes are flux-cpp's (PyTorch's) layouts: Dense (out, in), Conv (out, in / groups, k...),
// ConvTranspose (in, out / groups, k...). These are Flux's weights with the axes reversed (Julia is
// column-major), so Flux's nfan on Flux's shape equals nfan(shape) here:
//   (n,) -> fan_in 1, fan_out n;  (d0, d1, k...) -> fan_in = d1 * prod(k), fan_out = d0 * prod(k)
// (PyTorch's _calculate_fan_in_and_fan_out gives the same). The "32" initialisers return Float32
// unless the layer asks for another dtype.
#pragma once
#include <functional>
#include <utility>

#include "flux/tensor.hpp"

namespace flux {

/// Any initialiser: (shape, dtype) -> a tensor of exactly that shape and dtype.
using Initialiser = std::function<Tensor(const Shape&, DType)>;

/// (fan_in, fan_out) of a weight of `shape`, as Flux.nfan (see above).
std::pair<int64_t, int64_t> nfan(const Shape& shape);

/// U(-l, l) with l = gain * sqrt(6 / (fan_in + fan_out)). Flux's default for Dense and Conv.
struct GlorotUniform {
  double gain = 1;
  Tensor operator()(const Shape& shape, DType t = DType::f32) const;
  /// A Dense weight (out, in), the former glorot_uniform(out, in, dtype).
  Tensor operator()(int64_t out, int64_t in, DType t = DType::f32) const;
};
/// N(0, s²) with s = gain * sqrt(2 / (fan_in + fan_out)).
struct GlorotNormal {
  double gain = 1;
  Tensor operator()(const Shape& shape, DType t = DType::f32) const;
};
/// U(-l, l) with l = gain * sqrt(3 / fan_in); Flux's gain is sqrt(2) (for relu).
struct KaimingUniform {
  double gain = 1.4142135623730951;
  Tensor operator()(const Shape& shape, DType t = DType::f32) const;
};
/// N(0, s²) with s = gain / sqrt(fan_in); Flux's gain is sqrt(2) (for relu).
struct KaimingNormal {
  double gain = 1.4142135623730951;
  Tensor operator()(const Shape& shape, DType t = DType::f32) const;
};
/// gain * a random orthogonal matrix (QR of a Gaussian one, signs fixed by diag(R) as Flux): the
/// shape is viewed as (d0, d1 * d2 * ...); its columns are orthonormal when d0 >= the rest, else its rows.
struct Orthogonal {
  double gain = 1;
  Tensor operator()(const Shape& shape, DType t = DType::f32) const;
};
/// zeros32, ones32, rand32 (U[0, 1)), randn32 (N(0, 1)): Flux's Float32 array constructors.
struct Zeros32 {
  Tensor operator()(const Shape& shape, DType t = DType::f32) const { return zeros(shape, t); }
};
struct Ones32 {
  Tensor operator()(const Shape& shape, DType t = DType::f32) const { return ones(shape, t); }
};
struct Rand32 {
  Tensor operator()(const Shape& shape, DType t = DType::f32) const { return rand(shape, t); }
};
struct Randn32 {
  Tensor operator()(const Shape& shape, DType t = DType::f32) const { return randn(shape, t); }
};

/// The initialisers with Flux's defaults; another gain: GlorotNormal{.gain = 100}, KaimingNormal{.gain = 1}.
inline constexpr GlorotUniform glorot_uniform{};
inline constexpr GlorotNormal glorot_normal{};
inline constexpr KaimingUniform kaiming_uniform{};
inline constexpr KaimingNormal kaiming_normal{};
inline constexpr Orthogonal orthogonal{};
inline constexpr Zeros32 zeros32{};
inline constexpr Ones32 ones32{};
inline constexpr Rand32 rand32{};
inline constexpr Randn32 randn32{};

namespace detail {
/// init(shape, t) for layer `api`, checked: an empty init or a result of another shape is an error
/// naming both shapes; another dtype is converted to t.
Tensor initialise(const char* api, const Initialiser& init, const Shape& shape, DType t);
}  // namespace detail

}  // namespace flux
