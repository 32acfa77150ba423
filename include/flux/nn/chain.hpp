// Chain(layers...): applies layers in order. Any callable Tensor(Tensor) is a layer.
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>

#include "flux/functor.hpp"
#include "flux/nn/conv_fusion.hpp"
#include "flux/tensor.hpp"

namespace flux {

template <class... Layers> struct Chain {
  static_assert((functor::Layerlike<Layers> && ...), FLUX_NOT_WALKABLE_MESSAGE_);
  std::tuple<Layers...> layers;

  Chain() = default;
  explicit Chain(Layers... ls) : layers(std::move(ls)...) {}

  /// Each layer in turn; a Conv immediately followed by a BatchNorm runs as one fused convolution
  /// in inference where that cannot change the result (include/flux/nn/conv_fusion.hpp).
  Tensor operator()(const Tensor& x) const { return apply_from<0>(x); }
  template <size_t I> auto& get() { return std::get<I>(layers); }
  template <size_t I> const auto& get() const { return std::get<I>(layers); }
  static constexpr size_t size() { return sizeof...(Layers); }

 private:
  // Each step's input is released as soon as its layer has run (y is taken by value and emptied), so
  // at inference a chain holds one intermediate at a time, as PyTorch's Sequential does: written as
  // apply_from<I + 1>(layer(y)), every intermediate lived until the whole chain returned (peak memory
  // the sum of all of them, and kept blocked conv outputs written out for tensors nobody read).
  // Under autodiff the tape holds what the backward pass needs, whatever is released here.
  template <size_t I> Tensor apply_from(Tensor y) const {
    if constexpr (I == sizeof...(Layers)) {
      return y;
    } else {
      if constexpr (I + 1 < sizeof...(Layers)) {
        using Layer = std::tuple_element_t<I, std::tuple<Layers...>>;
        using Next = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
        if constexpr (std::is_same_v<Layer, Conv> && std::is_same_v<Next, BatchNorm>) {
          Tensor fused = detail::conv_batchnorm(std::get<I>(layers), std::get<I + 1>(layers), y);
          if (fused.defined()) {
            y = Tensor();
            return apply_from<I + 2>(std::move(fused));
          }
        }
      }
      Tensor out = std::get<I>(layers)(y);
      y = Tensor();
      return apply_from<I + 1>(std::move(out));
    }
  }
};
template <class... Layers> Chain(Layers...) -> Chain<Layers...>;

template <class T> struct is_chain : std::false_type {};
template <class... L> struct is_chain<Chain<L...>> : std::true_type {};

/// Chain's one field is `layers` (so state names read "layers.0.weight", as Flux's fields).
template <class Self, class Visit>
  requires is_chain<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("layers", self.layers);
}

}  // namespace flux
