// Chain(layers...): applies layers in order. Any callable Tensor(Tensor) is a layer.
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"
#include "flux/nn/conv_fusion.hpp"
#include "flux/tensor.hpp"

namespace flux {

template <class... Layers> struct Chain {
  static_assert((functor::Layerlike<Layers> && ...), FLUX_NOT_WALKABLE_MESSAGE_);
  std::tuple<Layers...> layers;

  Chain() = default;
  explicit Chain(Layers... ls) : layers(std::move(ls)...) {
    static_assert((std::is_invocable_v<const Layers&, const Tensor&> && ...),
                  "flux: a Chain element cannot be called on a flux::Tensor. A math function from <cmath> such "
                  "as tanh (double -> double) is not a layer: use flux's activation, flux::tanh (also tanh_act; "
                  "with `using namespace flux`, plain tanh works), or relu, sigmoid, gelu, softplus, swish, ...");
  }

  /// Each layer in turn; a Conv immediately followed by a BatchNorm runs as one fused convolution
  /// in inference where that cannot change the result (include/flux/nn/conv_fusion.hpp).
  Tensor operator()(const Tensor& x) const { return apply_from<0>(x); }
  template <size_t I> auto& get() { return std::get<I>(layers); }
  template <size_t I> const auto& get() const { return std::get<I>(layers); }
  static constexpr size_t size() { return sizeof...(Layers); }
  /// Layers [Begin, End) (0-based, End excluded) as a new Chain sharing their arrays: Flux's
  /// lenet[1:2] is lenet.slice<0, 2>(); training the slice trains the same arrays.
  template <size_t Begin, size_t End> auto slice() const {
    static_assert(Begin < End && End <= sizeof...(Layers),
                  "flux: Chain::slice<Begin, End>() takes layers Begin..End-1 (0-based) of a Chain: need Begin < End <= size()");
    return [this]<size_t... I>(std::index_sequence<I...>) {
      return Chain<std::tuple_element_t<Begin + I, std::tuple<Layers...>>...>(std::get<Begin + I>(layers)...);
    }(std::make_index_sequence<End - Begin>{});
  }

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

// Deduction for overloaded names: an argument such as `tanh` (::tanh and flux::tanh under `using
// namespace flux`) has no type to deduce, so its parameter falls back to the default, FunctionLayer,
// which takes the Tensor overload. One guide per length (a pack cannot have defaults), up to 32
// elements; longer chains deduce through the guide above (overloaded names there need flux::tanh).
#define FLUX_CHAIN_LIST_1(M) M(1)
#define FLUX_CHAIN_LIST_2(M) FLUX_CHAIN_LIST_1(M), M(2)
#define FLUX_CHAIN_LIST_3(M) FLUX_CHAIN_LIST_2(M), M(3)
#define FLUX_CHAIN_LIST_4(M) FLUX_CHAIN_LIST_3(M), M(4)
#define FLUX_CHAIN_LIST_5(M) FLUX_CHAIN_LIST_4(M), M(5)
#define FLUX_CHAIN_LIST_6(M) FLUX_CHAIN_LIST_5(M), M(6)
#define FLUX_CHAIN_LIST_7(M) FLUX_CHAIN_LIST_6(M), M(7)
#define FLUX_CHAIN_LIST_8(M) FLUX_CHAIN_LIST_7(M), M(8)
#define FLUX_CHAIN_LIST_9(M) FLUX_CHAIN_LIST_8(M), M(9)
#define FLUX_CHAIN_LIST_10(M) FLUX_CHAIN_LIST_9(M), M(10)
#define FLUX_CHAIN_LIST_11(M) FLUX_CHAIN_LIST_10(M), M(11)
#define FLUX_CHAIN_LIST_12(M) FLUX_CHAIN_LIST_11(M), M(12)
#define FLUX_CHAIN_LIST_13(M) FLUX_CHAIN_LIST_12(M), M(13)
#define FLUX_CHAIN_LIST_14(M) FLUX_CHAIN_LIST_13(M), M(14)
#define FLUX_CHAIN_LIST_15(M) FLUX_CHAIN_LIST_14(M), M(15)
#define FLUX_CHAIN_LIST_16(M) FLUX_CHAIN_LIST_15(M), M(16)
#define FLUX_CHAIN_LIST_17(M) FLUX_CHAIN_LIST_16(M), M(17)
#define FLUX_CHAIN_LIST_18(M) FLUX_CHAIN_LIST_17(M), M(18)
#define FLUX_CHAIN_LIST_19(M) FLUX_CHAIN_LIST_18(M), M(19)
#define FLUX_CHAIN_LIST_20(M) FLUX_CHAIN_LIST_19(M), M(20)
#define FLUX_CHAIN_LIST_21(M) FLUX_CHAIN_LIST_20(M), M(21)
#define FLUX_CHAIN_LIST_22(M) FLUX_CHAIN_LIST_21(M), M(22)
#define FLUX_CHAIN_LIST_23(M) FLUX_CHAIN_LIST_22(M), M(23)
#define FLUX_CHAIN_LIST_24(M) FLUX_CHAIN_LIST_23(M), M(24)
#define FLUX_CHAIN_LIST_25(M) FLUX_CHAIN_LIST_24(M), M(25)
#define FLUX_CHAIN_LIST_26(M) FLUX_CHAIN_LIST_25(M), M(26)
#define FLUX_CHAIN_LIST_27(M) FLUX_CHAIN_LIST_26(M), M(27)
#define FLUX_CHAIN_LIST_28(M) FLUX_CHAIN_LIST_27(M), M(28)
#define FLUX_CHAIN_LIST_29(M) FLUX_CHAIN_LIST_28(M), M(29)
#define FLUX_CHAIN_LIST_30(M) FLUX_CHAIN_LIST_29(M), M(30)
#define FLUX_CHAIN_LIST_31(M) FLUX_CHAIN_LIST_30(M), M(31)
#define FLUX_CHAIN_LIST_32(M) FLUX_CHAIN_LIST_31(M), M(32)
#define FLUX_CHAIN_PARAM_(i) class A##i = FunctionLayer
#define FLUX_CHAIN_ARG_(i) A##i
#define FLUX_CHAIN_GUIDE_(n) \
  template <FLUX_CHAIN_LIST_##n(FLUX_CHAIN_PARAM_)> Chain(FLUX_CHAIN_LIST_##n(FLUX_CHAIN_ARG_)) -> Chain<FLUX_CHAIN_LIST_##n(FLUX_CHAIN_ARG_)>;
FLUX_CHAIN_GUIDE_(1) FLUX_CHAIN_GUIDE_(2) FLUX_CHAIN_GUIDE_(3) FLUX_CHAIN_GUIDE_(4) FLUX_CHAIN_GUIDE_(5)
FLUX_CHAIN_GUIDE_(6) FLUX_CHAIN_GUIDE_(7) FLUX_CHAIN_GUIDE_(8) FLUX_CHAIN_GUIDE_(9) FLUX_CHAIN_GUIDE_(10)
FLUX_CHAIN_GUIDE_(11) FLUX_CHAIN_GUIDE_(12) FLUX_CHAIN_GUIDE_(13) FLUX_CHAIN_GUIDE_(14) FLUX_CHAIN_GUIDE_(15)
FLUX_CHAIN_GUIDE_(16) FLUX_CHAIN_GUIDE_(17) FLUX_CHAIN_GUIDE_(18) FLUX_CHAIN_GUIDE_(19) FLUX_CHAIN_GUIDE_(20)
FLUX_CHAIN_GUIDE_(21) FLUX_CHAIN_GUIDE_(22) FLUX_CHAIN_GUIDE_(23) FLUX_CHAIN_GUIDE_(24) FLUX_CHAIN_GUIDE_(25)
FLUX_CHAIN_GUIDE_(26) FLUX_CHAIN_GUIDE_(27) FLUX_CHAIN_GUIDE_(28) FLUX_CHAIN_GUIDE_(29) FLUX_CHAIN_GUIDE_(30)
FLUX_CHAIN_GUIDE_(31) FLUX_CHAIN_GUIDE_(32)
#undef FLUX_CHAIN_GUIDE_
#undef FLUX_CHAIN_ARG_
#undef FLUX_CHAIN_PARAM_

/// slice<0, 2>(chain): the same as chain.slice<0, 2>().
template <size_t Begin, size_t End, class... Layers> auto slice(const Chain<Layers...>& chain) {
  return chain.template slice<Begin, End>();
}

template <class T> struct is_chain : std::false_type {};
template <class... L> struct is_chain<Chain<L...>> : std::true_type {};

/// Chain's one field is `layers` (so state names read "layers.0.weight", as Flux's fields).
template <class Self, class Visit>
  requires is_chain<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("layers", self.layers);
}

}  // namespace flux
