// Moving tensors and whole models between devices: gpu(x), cpu(x), x | gpu, x | dev, to(x, dev).
#pragma once
#include "flux/functor.hpp"
#include "flux/tensor.hpp"

namespace flux {

namespace detail {
/// The device gpu() moves to: get_device() once; CPU (with one info line) when no GPU works.
const Device& default_gpu();
/// gpu's conversion of one tensor: float64 becomes float32, other dtypes are kept.
Tensor to_gpu_tensor(const Tensor& x, const Device& d);
}  // namespace detail

/// Moves every tensor of x (a Tensor or a model) to device d, keeping dtypes; tied tensors stay tied.
template <class M> M to(const M& m, const Device& d) {
  return fmap([&](const Tensor& t) { return to(t, d); }, m);
}

struct GpuMover;
struct CpuMover;
/// A type that moves differently from its tensors (DataLoader -> DeviceLoader) provides, in its
/// namespace, `flux_move(const T&, const GpuMover&)` and/or `flux_move(const T&, const CpuMover&)`.
template <class M, class Mover>
concept MovesItself = requires(const M& m, const Mover& mover) { flux_move(m, mover); };

struct GpuMover {
  template <class M> auto operator()(const M& m) const {
    if constexpr (MovesItself<M, GpuMover>) {
      return flux_move(m, *this);
    } else {
      const Device& d = detail::default_gpu();
      return fmap([&](const Tensor& t) { return detail::to_gpu_tensor(t, d); }, m);
    }
  }
};
struct CpuMover {
  template <class M> auto operator()(const M& m) const {
    if constexpr (MovesItself<M, CpuMover>) {
      return flux_move(m, *this);
    } else {
      return fmap([](const Tensor& t) { return to(t, Device()); }, m);
    }
  }
};
/// Moves to the default GPU (float64 -> float32, as Flux); a no-op without a functional GPU.
inline constexpr GpuMover gpu{};
/// Moves to the CPU, keeping dtypes.
inline constexpr CpuMover cpu{};

template <class M> auto operator|(const M& m, const GpuMover& g) { return g(m); }
template <class M> auto operator|(const M& m, const CpuMover& c) { return c(m); }
/// x | dev: the same as to(x, dev) (DataLoader | dev gives a device loader, see data/device_loader.hpp).
template <class M> auto operator|(const M& m, const Device& d) { return to(m, d); }

}  // namespace flux
