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
  template <size_t I> Tensor apply_from(const Tensor& y) const {
    if constexpr (I == sizeof...(Layers)) {
      return y;
    } else {
      if constexpr (I + 1 < sizeof...(Layers)) {
        using Layer = std::tuple_element_t<I, std::tuple<Layers...>>;
        using Next = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
        if constexpr (std::is_same_v<Layer, Conv> && std::is_same_v<Next, BatchNorm>) {
          Tensor fused = detail::conv_batchnorm(std::get<I>(layers), std::get<I + 1>(layers), y);
          if (fused.defined()) return apply_from<I + 2>(fused);
        }
      }
      return apply_from<I + 1>(std::get<I>(layers)(y));
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
