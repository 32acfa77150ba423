// Printing models in Flux's style (multi-line Chain with parameter counts and a total).
#pragma once
#include <concepts>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"
#include "flux/nn/chain.hpp"
#include "flux/nn/dense.hpp"

namespace flux {

namespace show {
/// 1628170 -> "1_628_170".
std::string underscorise(int64_t n);
/// Julia's Base.format_bytes: "6.211 MiB", "3 bytes".
std::string format_bytes(size_t bytes);

template <class T>
concept Streamable = requires(std::ostream& os, const T& t) { os << t; };
template <class T>
concept Named = requires(const T* t) { flux_layer_name(t); };
/// A layer holding other layers (SkipConnection, Parallel) lists them in display order with an
/// ADL-visible `flux_show_children(const L&)` (a tuple of references) and names itself with
/// flux_layer_name; big_show nests them as Flux's _big_show does.
template <class T>
concept ShowsChildren = Named<T> && requires(const T& t) { flux_show_children(t); };
/// Children that Flux prints as leaves (functions: activations, `+`, `vcat`, `flatten`).
template <class T> inline constexpr bool show_leaflike = requires { T::name; };
template <class Tuple> struct all_leaflike : std::false_type {};
template <class... T>
struct all_leaflike<std::tuple<T...>> : std::bool_constant<(show_leaflike<std::remove_cvref_t<T>> && ...)> {};
/// Whether a container holds only leaves (then Flux prints it on one line, as a layer).
template <class L> constexpr bool shows_nested() {
  if constexpr (ShowsChildren<L>)
    return !all_leaflike<std::remove_cvref_t<decltype(flux_show_children(std::declval<const L&>()))>>::value;
  else
    return false;
}

template <class L> size_t param_bytes(const L& l) {
  size_t b = 0;
  for (const Tensor& t : params(l)) b += t.nbytes();
  return b;
}

template <class L> std::string one_line(const L& layer) {
  if constexpr (requires { { layer_string(layer) } -> std::convertible_to<std::string>; }) {
    return layer_string(layer);  // every built-in layer defines layer_string (found by ADL)
  } else if constexpr (is_chain<L>::value) {
    std::string s = "Chain(";
    bool first = true;
    std::apply([&](const auto&... ls) { ((s += (first ? "" : ", ") + one_line(ls), first = false), ...); }, layer.layers);
    return s + ")";
  } else if constexpr (requires { L::name; }) {
    return L::name;
  } else if constexpr (Named<L>) {
    return std::string(flux_layer_name(&layer)) + "(...)";
  } else if constexpr (Streamable<L>) {
    std::ostringstream os;
    os << layer;
    return os.str();
  } else {
    return "#layer";
  }
}

template <class L> void big_show(std::ostream& os, const L& layer, int indent) {
  if constexpr (is_chain<L>::value) {
    os << std::string(indent, ' ') << "Chain(\n";
    std::apply([&](const auto&... ls) { (big_show(os, ls, indent + 2), ...); }, layer.layers);
    os << std::string(indent, ' ') << ")";
    if (indent > 0) os << ",\n";
  } else if constexpr (shows_nested<L>()) {
    os << std::string(indent, ' ') << flux_layer_name(&layer) << "(\n";
    std::apply([&](const auto&... c) { (big_show(os, c, indent + 2), ...); }, flux_show_children(layer));
    os << std::string(indent, ' ') << ")";
    if (indent > 0) os << ",\n";
  } else if (ShowsChildren<L> && indent == 0) {
    os << one_line(layer);  // a container of functions only: one line, as Flux's _layer_show
  } else {
    std::string str = one_line(layer);
    os << std::string(indent, ' ') << str << ",";
    int64_t n = parameter_count(layer);
    if (n > 0) {
      int pad = std::max(2, 39 - indent - int(str.size()));
      os << std::string(pad, ' ') << "# " << underscorise(n) << " parameters";
      if (int64_t k = nontrainable_count(layer); k > 0) os << ", plus " << underscorise(k);  // Flux: no word inside
    }
    os << "\n";
  }
}
}  // namespace show

/// Flux's REPL display of a Chain: one line per layer with its parameter count, then the total.
/// The same for the other containers (SkipConnection, Parallel).
template <class M>
  requires(is_chain<M>::value || show::ShowsChildren<M>)
std::ostream& operator<<(std::ostream& os, const M& c) {
  show::big_show(os, c, 0);
  auto ps = params(c);
  if (ps.size() > 2) {
    size_t non_arrays = 0, bytes = show::param_bytes(c);
    for (const Tensor& t : nontrainables(c)) non_arrays += is_floating(t.dtype()), bytes += t.nbytes();
    if (non_arrays > 0) {  // Flux's _big_finale with non-trainable arrays (BatchNorm's running statistics)
      os << std::string(9, ' ') << "# Total: " << ps.size() << " trainable arrays, " << show::underscorise(parameter_count(c))
         << " parameters,\n" << std::string(10, ' ') << "# plus " << non_arrays << " non-trainable, "
         << show::underscorise(nontrainable_count(c)) << " parameters, summarysize " << show::format_bytes(bytes) << ".";
    } else {
      os << std::string(19, ' ') << "# Total: " << ps.size() << " arrays, " << show::underscorise(parameter_count(c))
         << " parameters, " << show::format_bytes(bytes) << ".";
    }
  }
  return os;
}

/// One line: "Chain(Dense(10 => 64, relu), Dense(64 => 1))  # 769 parameters".
template <class M> std::string repr(const M& m) {
  std::string s = show::one_line(m);
  int64_t n = parameter_count(m);
  if (n > 0) s += "  # " + show::underscorise(n) + " parameters";
  if (int64_t k = nontrainable_count(m); n > 0 && k > 0) s += ", plus " + show::underscorise(k) + " non-trainable";
  return s;
}

}  // namespace flux
