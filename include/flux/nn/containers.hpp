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
//   Maxout(layers...):                    y = max(layer_1(x), layer_2(x), ...) elementwise (Goodfellow et
//                                         al. 2013; Flux's Maxout), state "layers.0.weight", ...
//   PairwiseFusion(connection, layers...): Flux's: with inputs x_1..x_n (or one x for all),
//                                         y_1 = layer_1(x_1), y_i = layer_i(connection(y_{i-1}, x_i));
//                                         returns every y_i (a std::vector, Flux's tuple).
//   Bilinear(in1, in2, out, act):         y[n, o] = act(Σ_ij x[n, i] W[o, i, j] z[n, j] + b[o]), x (N, in1),
//                                         z (N, in2), W (out, in1, in2), b (out,): PyTorch's nn.Bilinear
//                                         (weight, bias) and Flux's Bilinear((in1, in2) => out); b(x) = b(x, x).
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

template <class... Layers> struct Maxout {
  static_assert(sizeof...(Layers) > 0, "Maxout needs at least one layer");
  std::tuple<Layers...> layers;

  Maxout() = default;
  explicit Maxout(Layers... ls) : layers(std::move(ls)...) {}
  /// The elementwise maximum of every layer's output (all of one shape).
  Tensor operator()(const Tensor& x) const {
    return std::apply(
        [&](const auto& first, const auto&... rest) {
          Tensor y = first(x);
          ((y = maximum(y, rest(x))), ...);
          return y;
        },
        layers);
  }
};
template <class... L> Maxout(L...) -> Maxout<L...>;

template <class Connection, class... Layers> struct PairwiseFusion {
  static_assert(sizeof...(Layers) > 0, "PairwiseFusion needs at least one layer");
  Connection connection;
  std::tuple<Layers...> layers;

  PairwiseFusion() = default;
  PairwiseFusion(Connection c, Layers... ls) : connection(std::move(c)), layers(std::move(ls)...) {}
  /// One input for every layer: y_1 = l_1(x), y_i = l_i(connection(y_{i-1}, x)).
  std::vector<Tensor> operator()(const Tensor& x) const {
    std::vector<Tensor> xs(sizeof...(Layers), x);
    return (*this)(xs);
  }
  /// One input per layer (as many as layers): y_1 = l_1(x_1), y_i = l_i(connection(y_{i-1}, x_i)).
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs) const;
};
template <class C, class... L> PairwiseFusion(C, L...) -> PairwiseFusion<C, L...>;

struct BilinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
};

struct Bilinear {
  Tensor weight;  // (out, in1, in2)
  Tensor bias;    // (out,), undefined when bias = false
  Activation activation;

  Bilinear() = default;
  /// Weight glorot_uniform as Flux's (fan_in = out * in1, fan_out = out * in2 on its (out, in1, in2) array).
  Bilinear(int64_t in1, int64_t in2, int64_t out, Activation act = Activation(), BilinearOptions options = {});
  Bilinear(int64_t in1, int64_t in2, int64_t out, BilinearOptions options) : Bilinear(in1, in2, out, Activation(), options) {}
  /// x (N, in1), z (N, in2) -> (N, out).
  Tensor operator()(const Tensor& x, const Tensor& z) const;
  /// Flux's a(x) = a(x, x) (in1 == in2).
  Tensor operator()(const Tensor& x) const { return (*this)(x, x); }
};
FLUX_LAYER(Bilinear, weight, bias)
/// "Bilinear((5, 6) => 7)" or "Bilinear(5 => 7, relu)" (in1 == in2) as Flux.
std::string layer_string(const Bilinear& b);
std::ostream& operator<<(std::ostream& os, const Bilinear& b);

template <class C, class... L>
std::vector<Tensor> PairwiseFusion<C, L...>::operator()(const std::vector<Tensor>& xs) const {
  if (xs.size() != sizeof...(L))
    detail::fail("[PairwiseFusion] got ", xs.size(), " inputs for ", sizeof...(L), " layers; pass one input or one per layer");
  std::vector<Tensor> ys;
  size_t i = 0;
  std::apply(
      [&](const auto&... l) {
        ((ys.push_back(i == 0 ? l(xs[0]) : l(connection(ys.back(), xs[i]))), ++i), ...);
      },
      layers);
  return ys;
}

template <class T> struct is_skip_connection : std::false_type {};
template <class L, class C> struct is_skip_connection<SkipConnection<L, C>> : std::true_type {};
template <class T> struct is_parallel : std::false_type {};
template <class C, class... L> struct is_parallel<Parallel<C, L...>> : std::true_type {};
template <class T> struct is_maxout : std::false_type {};
template <class... L> struct is_maxout<Maxout<L...>> : std::true_type {};
template <class T> struct is_pairwise_fusion : std::false_type {};
template <class C, class... L> struct is_pairwise_fusion<PairwiseFusion<C, L...>> : std::true_type {};

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

template <class Self, class Visit>
  requires is_maxout<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("layers", self.layers);
}
template <class Self, class Visit>
  requires is_pairwise_fusion<std::remove_const_t<Self>>::value
void flux_fields(Self& self, Visit&& visit) {
  visit("connection", self.connection);
  visit("layers", self.layers);
}

template <class L, class C> const char* flux_layer_name(const SkipConnection<L, C>*) { return "SkipConnection"; }
template <class... L> const char* flux_layer_name(const Maxout<L...>*) { return "Maxout"; }
template <class C, class... L> const char* flux_layer_name(const PairwiseFusion<C, L...>*) { return "PairwiseFusion"; }
template <class C, class... L> const char* flux_layer_name(const Parallel<C, L...>*) { return "Parallel"; }

/// Display order, as Flux's: SkipConnection (layers, connection); Parallel (connection, layers...).
template <class L, class C> auto flux_show_children(const SkipConnection<L, C>& s) {
  return std::tuple<const L&, const C&>(s.layers, s.connection);
}
template <class C, class... L> auto flux_show_children(const Parallel<C, L...>& p) {
  return std::apply([&](const auto&... ls) { return std::tuple<const C&, const L&...>(p.connection, ls...); },
                    p.layers);
}

template <class... L> auto flux_show_children(const Maxout<L...>& m) {
  return std::apply([](const auto&... ls) { return std::tuple<const L&...>(ls...); }, m.layers);
}
template <class C, class... L> auto flux_show_children(const PairwiseFusion<C, L...>& p) {
  return std::apply([&](const auto&... ls) { return std::tuple<const C&, const L&...>(p.connection, ls...); },
                    p.layers);
}
/// "Maxout(Dense(2 => 3), Dense(2 => 3))", "PairwiseFusion(+, Dense(2 => 3), Dense(3 => 4))", as Flux.
template <class... L> std::string layer_string(const Maxout<L...>& m) {
  std::string s = "Maxout(";
  bool first = true;
  std::apply([&](const auto&... ls) { ((s += (first ? "" : ", ") + show::one_line(ls), first = false), ...); }, m.layers);
  return s + ")";
}
template <class C, class... L> std::string layer_string(const PairwiseFusion<C, L...>& p) {
  std::string s = "PairwiseFusion(" + show::one_line(p.connection);
  std::apply([&](const auto&... ls) { ((s += ", " + show::one_line(ls)), ...); }, p.layers);
  return s + ")";
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
