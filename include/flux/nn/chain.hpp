// Chain(layers...): applies layers in order. Any callable Tensor(Tensor) is a layer.
#pragma once
#include <tuple>
#include <utility>

#include "flux/functor.hpp"
#include "flux/tensor.hpp"

namespace flux {

template <class... Layers> struct Chain {
  static_assert((functor::Layerlike<Layers> && ...), FLUX_NOT_WALKABLE_MESSAGE_);
  std::tuple<Layers...> layers;

  Chain() = default;
  explicit Chain(Layers... ls) : layers(std::move(ls)...) {}

  Tensor operator()(const Tensor& x) const {
    Tensor y = x;
    std::apply([&](const auto&... layer) { ((y = layer(y)), ...); }, layers);
    return y;
  }
  template <size_t I> auto& get() { return std::get<I>(layers); }
  template <size_t I> const auto& get() const { return std::get<I>(layers); }
  static constexpr size_t size() { return sizeof...(Layers); }
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
