// Containers beside Chain (Flux.jl src/layers/basic.jl):
//   SkipConnection(layer, connection):    y = connection(layer(x), x); SkipConnection(block, plus) is
//                                         a residual block (x and block(x) of one shape).
//   Parallel(connection, layers...):      y = connection(layer_1(x), layer_2(x), ...); with as many
//                                         inputs as layers, layer_i gets x_i; with one layer and several
//                                         inputs, it gets each of them.
// Connections are values like activations: `plus` adds (Flux's +), `vcat` concatenates along the
// feature axis, which in flux-cpp is axis 1 (observations are on the first axis): (N, a) and (N, b)
// give (N, a + b), (N, C1, H, W) and (N, C2, H, W) give (N, C1 + C2, H, W); 1-D (features,) inputs
// are joined along axis 0. Any callable works as a connection ((mx, x) -> Tensor for SkipConnection).
// State names keep Flux's field names: SkipConnection(Chain(Conv, Conv), plus) has "layers.0.weight",
// "layers.1.weight" (pytorch_state drops the Chain's own "layers"); Parallel(vcat, Dense, Dense) has
// "layers.0.weight", "layers.1.weight". Both print as Flux: one line in a Chain's one-line form, and
// nested, one line per layer, in the multi-line display.
#pragma once
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "flux/nn/show.hpp"
#include "flux/ops.hpp"

namespace flux {

/// connection `+`: the sum of its arguments (with broadcasting).
struct Plus {
  static constexpr const char* name = "+";
  template <class... Rest> Tensor operator()(const Tensor& a, const Rest&... rest) const {
    Tensor y = a;
    ((y = y + rest), ...);
    return y;
  }
};
inline constexpr Plus plus{};

/// connection `vcat`: concatenation along the feature axis (axis 1; axis 0 for 1-D inputs).
struct Vcat {
  static constexpr const char* name = "vcat";
  template <class... Rest> Tensor operator()(const Tensor& a, const Rest&... rest) const {
    if constexpr (sizeof...(Rest) == 0) {
      return a;
    } else {
      std::vector<Tensor> xs{a, rest...};
      return concat(xs, a.defined() && a.ndim() == 1 ? 0 : 1);
    }
  }
};
inline constexpr Vcat vcat{};
inline std::ostream& operator<<(std::ostream& os, const Plus&) { return os << "+"; }
inline std::ostream& operator<<(std::ostream& os, const Vcat&) { return os << "vcat"; }

template <class Layer, class Connection> struct SkipConnection {
  Layer layers;           // Flux's field names
  Connection connection;

  SkipConnection() = default;
  SkipConnection(Layer layer, Connection c) : layers(std::move(layer)), connection(std::move(c)) {}
  /// connection(layers(x), x).
  Tensor operator()(const Tensor& x) const { return connection(layers(x), x); }
};
template <class L, class C> SkipConnection(L, C) -> SkipConnection<L, C>;

template <class Connection, class... Layers> struct Parallel {
  static_assert(sizeof...(Layers) > 0, "Parallel needs at least one layer");
  Connection connection;
  std::tuple<Layers...> layers;

  Parallel() = default;
  Parallel(Connection c, Layers... ls) : connection(std::move(c)), layers(std::move(ls)...) {}

  /// One input: connection(layer_1(x), layer_2(x), ...).
  Tensor operator()(const Tensor& x) const {
    return std::apply([&](const auto&... l) { return connection(l(x)...); }, layers);
  }
  /// Several inputs: one per layer, or all through a single layer.
  template <class... X>
    requires(sizeof...(X) > 0 && (std::is_convertible_v<const X&, const Tensor&> && ...) &&
             (sizeof...(X) + 1 == sizeof...(Layers) || sizeof...(Layers) == 1))
  Tensor operator()(const Tensor& x0, const X&... xs) const {
    if constexpr (sizeof...(Layers) == 1) {
      const auto& l = std::get<0>(layers);
      return connection(l(x0), l(xs)...);
    } else {
      return call_each(std::index_sequence_for<Layers...>{}, x0, xs...);
    }
  }
  template <size_t I> auto& get() { return std::get<I>(layers); }
  template <size_t I> const auto& get() const { return std::get<I>(layers); }
  static constexpr size_t size() { return sizeof...(Layers); }

 private:
  template <size_t... I, class... X> Tensor call_each(std::index_sequence<I...>, const X&... xs) const {
    return connection(std::get<I>(layers)(xs)...);
  }
};
template <class C, class... L> Parallel(C, L...) -> Parallel<C, L...>;

template <class T> struct is_skip_connection : std::false_type {};
template <class L, class C> struct is_skip_connection<SkipConnection<L, C>> : std::true_type {};
template <class T> struct is_parallel : std::false_type {};
template <class C, class... L> struct is_parallel<Parallel<C, L...>> : std::true_type {};

// ---- walking (fmap / params / state) and printing ----

template <class Self, class Visit>
  requires is_skip_connection<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("layers", self.layers);
  visit("connection", self.connection);
}
template <class Self, class Visit>
  requires is_parallel<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("connection", self.connection);
  visit("layers", self.layers);
}

template <class L, class C> const char* flux_layer_name(const SkipConnection<L, C>*) { return "SkipConnection"; }
template <class C, class... L> const char* flux_layer_name(const Parallel<C, L...>*) { return "Parallel"; }

/// Display order, as Flux's: SkipConnection (layers, connection); Parallel (connection, layers...).
template <class L, class C> auto flux_show_children(const SkipConnection<L, C>& s) {
  return std::tuple<const L&, const C&>(s.layers, s.connection);
}
template <class C, class... L> auto flux_show_children(const Parallel<C, L...>& p) {
  return std::apply([&](const auto&... ls) { return std::tuple<const C&, const L&...>(p.connection, ls...); },
                    p.layers);
}

/// "SkipConnection(Dense(2 => 2), +)", "Parallel(vcat, Dense(2 => 3), Dense(2 => 4))", as Flux's show.
template <class L, class C> std::string layer_string(const SkipConnection<L, C>& s) {
  return "SkipConnection(" + show::one_line(s.layers) + ", " + show::one_line(s.connection) + ")";
}
template <class C, class... L> std::string layer_string(const Parallel<C, L...>& p) {
  std::string s = "Parallel(" + show::one_line(p.connection);
  std::apply([&](const auto&... ls) { ((s += ", " + show::one_line(ls)), ...); }, p.layers);
  return s + ")";
}

}  // namespace flux
