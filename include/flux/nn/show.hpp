// Printing models in Flux's style (multi-line Chain with parameter counts and a total).
// A user's layer prints as Flux (0.15 on) prints a @layer struct: when a FLUX_LAYER field holds a
// layer, as a nested tree with one line and count per layer and a total (Flux's _big_show),
//   Block(
//     LayerNorm(64),                      # 128 parameters
//     Dense(64 => 64),                    # 4_160 parameters
//   )                   # Total: 4 arrays, 4_288 parameters, 16.750 KiB.
// and on one line, `Scale(weight = 4-element Tensor{Float32, CPU})`, when its fields are tensors and values
// only (and always inside repr()). An operator<< of the user's own for it is used instead (found by
// argument-dependent lookup). Callables that are not layers print readably: an activation by its
// name (`leakyrelu(0.2)` with its slope), a function by its symbol (`my_act`, from the dynamic symbol
// table or the program's own ELF symbol table), a lambda as `lambda(Tensor const&)#1 in main`, a
// function object as `Scale()`.
#pragma once
#include <concepts>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

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

/// A type's name as the compiler spells it, made readable: "lambda(Tensor const&)#1 in main" for a
/// lambda, "Scale" for a class, with "flux::" and "(anonymous namespace)::" removed.
std::string type_name(const std::type_info& type);

template <class T>
concept Streamable = requires(std::ostream& os, const T& t) { os << t; };
template <class T>
concept HasLayerString = requires(const T& t) { { layer_string(t) } -> std::convertible_to<std::string>; };
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

/// A user's FLUX_LAYER struct: no layer_string of its own, not a container flux knows.
template <class T>
concept UserLayer = Named<T> && functor::HasFields<T> && !HasLayerString<T> && !ShowsChildren<T> && !is_chain<T>::value;

/// The stream FLUX_LAYER's operator<< recognises: it notes that it was reached instead of printing, so
/// that the display can tell a user's own operator<< (which prints into it) from FLUX_LAYER's.
struct ProbeStream : std::ostringstream {
  bool reached_flux_layer = false;
};
/// Whether the user wrote an operator<< for L; if so, `text` receives what it prints.
template <class L> bool prints_itself(const L& layer, std::string& text) {
  ProbeStream probe;
  static_cast<std::ostream&>(probe) << layer;
  if (probe.reached_flux_layer) return false;
  text = probe.str();
  return true;
}

/// Flux's _show_leaflike: tensors, values and functions are leaves; layers holding fields are not.
template <class F> bool show_leaf(const F& f) {
  if constexpr (std::is_base_of_v<Tensor, F>) {
    return true;
  } else if constexpr (is_chain<F>::value || ShowsChildren<F>) {
    return false;
  } else if constexpr (functor::HasFields<F>) {
    bool any = false;
    flux_fields(f, [&](const char*, const auto&) { any = true; });
    return !any;  // FLUX_LAYER(Type) without fields (MaxPool): a leaf
  } else if constexpr (functor::is_vector<F>::value || functor::is_array<F>::value) {
    for (const auto& x : f)
      if (!show_leaf(x)) return false;
    return true;
  } else if constexpr (functor::is_tuple<F>::value) {
    return std::apply([](const auto&... x) { return (show_leaf(x) && ...); }, f);
  } else {
    return true;
  }
}
/// Whether a user's layer shows as a tree (some field is a layer) rather than on one line.
template <class L> bool expands(const L& layer) {
  bool leaves = true;
  flux_fields(layer, [&](const char*, const auto& field) { leaves = leaves && show_leaf(field); });
  return !leaves;
}

template <class L> size_t param_bytes(const L& l) {
  size_t b = 0;
  for (const Tensor& t : params(l)) b += t.nbytes();
  return b;
}

template <class L> std::string one_line(const L& layer);

/// How a non-layer callable prints: a function pointer by its symbol, else the type's name.
template <class L> std::string callable_line(const L& f) {
  if constexpr (std::is_pointer_v<L> && std::is_function_v<std::remove_pointer_t<L>>) {
    std::string name = function_name(reinterpret_cast<const void*>(f));
    return name.empty() ? type_name(typeid(L)) : name;
  } else if constexpr (std::is_class_v<L>) {
    std::string name = type_name(typeid(L));
    return name.rfind("lambda", 0) == 0 || name.rfind("std::", 0) == 0 ? name : name + "()";
  } else {
    return type_name(typeid(L));
  }
}

/// One field of a user's layer inside its line: tensors by their summary, vectors of layers as
/// [a, b], everything else as one_line.
template <class F> std::string field_line(const F& f) {
  if constexpr (std::is_base_of_v<Tensor, F>) {
    return f.defined() ? summary(f) : "undefined Tensor";
  } else if constexpr (requires { typename F::value_type; f.begin(); f.end(); } &&
                       !std::is_same_v<F, std::string>) {
    std::string s = "[";
    bool first = true;
    for (const auto& x : f) s += (first ? "" : ", ") + field_line(x), first = false;
    return s + "]";
  } else {
    return one_line(f);
  }
}

/// A field inside a user's layer: a tensor with its field's name ("weight = 4-element Tensor{...}"),
/// since a bare summary does not say which field it is; layers and values as field_line.
template <class F> std::string named_field_line(const char* name, const F& f) {
  if constexpr (std::is_base_of_v<Tensor, F>)
    return std::string(name) + " = " + field_line(f);
  else
    return field_line(f);
}

/// A FLUX_LAYER type as Flux shows a @layer struct: "Name(field, field, ...)".
template <class L> std::string fields_line(const L& layer) {
  std::string s = std::string(flux_layer_name(&layer)) + "(";
  bool first = true;
  flux_fields(layer, [&](const char* name, const auto& field) { s += (first ? "" : ", ") + named_field_line(name, field), first = false; });
  return s + ")";
}

template <class L> std::string one_line(const L& layer) {
  if constexpr (HasLayerString<L>) {
    return layer_string(layer);  // every built-in layer defines layer_string (found by ADL)
  } else if constexpr (is_chain<L>::value) {
    std::string s = "Chain(";
    bool first = true;
    std::apply([&](const auto&... ls) { ((s += (first ? "" : ", ") + one_line(ls), first = false), ...); }, layer.layers);
    return s + ")";
  } else if constexpr (UserLayer<L>) {
    std::string own;
    return prints_itself(layer, own) ? own : fields_line(layer);
  } else if constexpr (requires { L::name; }) {
    return L::name;
  } else if constexpr (Streamable<L> && !ShowsChildren<L> && !std::is_pointer_v<L> &&
                       !(std::is_class_v<L> && std::is_convertible_v<const L&, bool>)) {
    // (function pointers and captureless lambdas stream as a bool "1": they go to callable_line)
    std::ostringstream os;  // the user's own operator<< (or a value: an int, a double)
    os << layer;
    return os.str();
  } else if constexpr (Named<L> && functor::HasFields<L>) {
    return fields_line(layer);
  } else if constexpr (Named<L>) {
    return std::string(flux_layer_name(&layer)) + "(...)";
  } else {
    return callable_line(layer);
  }
}

/// One line of the tree: the layer's text, then its parameter count (Flux's _layer_show).
template <class L> void leaf_show(std::ostream& os, const L& layer, const std::string& str, int indent) {
  os << std::string(indent, ' ') << str << (indent == 0 ? "" : ",");
  int64_t n = parameter_count(layer);
  if (n > 0) {
    int pad = std::max(2, (indent == 0 ? 20 : 39) - indent - int(str.size()));
    os << std::string(pad, ' ') << "# " << underscorise(n) << " parameters";
    if (int64_t k = nontrainable_count(layer); k > 0)
      os << ", plus " << underscorise(k) << (indent == 0 ? " non-trainable" : "");  // Flux: no word inside
  }
  if (indent > 0) os << "\n";
}

template <class L> void big_show(std::ostream& os, const L& layer, int indent);
/// "pre", every child one level deeper, "post" (with a comma below the top), as Flux's _big_show.
template <class F> void nested_show(std::ostream& os, const std::string& pre, const std::string& post, int indent, F&& children) {
  os << std::string(indent, ' ') << pre << "\n";
  children(indent + 2);
  os << std::string(indent, ' ') << post;
  if (indent > 0) os << ",\n";
}

template <class L> void big_show(std::ostream& os, const L& layer, int indent) {
  if constexpr (is_chain<L>::value) {
    nested_show(os, "Chain(", ")", indent, [&](int in) {
      std::apply([&](const auto&... ls) { (big_show(os, ls, in), ...); }, layer.layers);
    });
  } else if constexpr (shows_nested<L>()) {
    nested_show(os, std::string(flux_layer_name(&layer)) + "(", ")", indent, [&](int in) {
      std::apply([&](const auto&... c) { (big_show(os, c, in), ...); }, flux_show_children(layer));
    });
  } else if constexpr (UserLayer<L>) {
    std::string own;
    if (prints_itself(layer, own)) {
      leaf_show(os, layer, own, indent);
    } else if (expands(layer)) {  // a field holds a layer: its fields one level deeper, in FLUX_LAYER's order
      nested_show(os, std::string(flux_layer_name(&layer)) + "(", ")", indent, [&](int in) {
        flux_fields(layer, [&](const char* name, const auto& field) {
          if constexpr (std::is_base_of_v<Tensor, std::remove_cvref_t<decltype(field)>>)
            leaf_show(os, field, named_field_line(name, field), in);
          else
            big_show(os, field, in);
        });
      });
    } else {
      leaf_show(os, layer, fields_line(layer), indent);
    }
  } else if constexpr (functor::is_vector<L>::value || functor::is_array<L>::value) {
    if (show_leaf(layer)) {
      leaf_show(os, layer, field_line(layer), indent);
    } else {
      nested_show(os, "[", "]", indent, [&](int in) {
        for (const auto& x : layer) big_show(os, x, in);
      });
    }
  } else if constexpr (functor::is_tuple<L>::value) {
    if (show_leaf(layer)) {
      leaf_show(os, layer, "(" + std::apply([](const auto&... x) {
                              std::string s;
                              ((s += (s.empty() ? "" : ", ") + field_line(x)), ...);
                              return s;
                            }, layer) + ")", indent);
    } else {
      nested_show(os, "(", ")", indent, [&](int in) {
        std::apply([&](const auto&... x) { (big_show(os, x, in), ...); }, layer);
      });
    }
  } else if (ShowsChildren<L> && indent == 0) {
    os << one_line(layer);  // a container of functions only: one line, as Flux's _layer_show
  } else {
    leaf_show(os, layer, field_line(layer), indent);
  }
}

/// Flux's _big_finale: the totals under a tree (only when it holds more than two arrays).
template <class L> void big_finale(std::ostream& os, const L& layer) {
  auto ps = params(layer);
  if (ps.size() <= 2) return;
  size_t non_arrays = 0, bytes = param_bytes(layer);
  for (const Tensor& t : nontrainables(layer)) non_arrays += is_floating(t.dtype()), bytes += t.nbytes();
  if (non_arrays > 0) {  // Flux's _big_finale with non-trainable arrays (BatchNorm's running statistics)
    os << std::string(9, ' ') << "# Total: " << ps.size() << " trainable arrays, " << underscorise(parameter_count(layer))
       << " parameters,\n" << std::string(10, ' ') << "# plus " << non_arrays << " non-trainable, "
       << underscorise(nontrainable_count(layer)) << " parameters, summarysize " << format_bytes(bytes) << ".";
  } else {
    os << std::string(19, ' ') << "# Total: " << ps.size() << " arrays, " << underscorise(parameter_count(layer))
       << " parameters, " << format_bytes(bytes) << ".";
  }
}
}  // namespace show

namespace show {
/// Whether FLUX_LAYER gave the type its own operator<< (found by ADL in the type's namespace).
template <class T>
concept StreamsThroughMacro = requires(const T* t) { flux_layer_streams(t); };

template <class L> std::ostream& print_layer(std::ostream& os, const L& layer) {
  if constexpr (is_chain<L>::value || ShowsChildren<L>) {
    // Flux's REPL display of a container: one line per layer with its parameter count, then the total.
    big_show(os, layer, 0);
    big_finale(os, layer);
  } else if constexpr (HasLayerString<L>) {
    os << layer_string(layer);
  } else {
    // A user's FLUX_LAYER struct without an operator<< of its own, as Flux shows a @layer struct: a
    // tree when a field holds a layer, else one line, "Scale(weight = 4-element Tensor{Float32, CPU})".
    if (auto* probe = dynamic_cast<ProbeStream*>(&os)) {
      probe->reached_flux_layer = true;
      return os;
    }
    if (expands(layer)) {
      big_show(os, layer, 0);
      big_finale(os, layer);
    } else {
      os << fields_line(layer);
    }
  }
  return os;
}
}  // namespace show

/// Flux's REPL display of a Chain: one line per layer with its parameter count, then the total.
/// The same for the other containers (SkipConnection, Parallel). A user's FLUX_LAYER type prints
/// through the operator<< that FLUX_LAYER declares beside it (show::print_layer, the same display).
template <class M>
  requires(is_chain<M>::value || (show::ShowsChildren<M> && !show::StreamsThroughMacro<M>))
std::ostream& operator<<(std::ostream& os, const M& c) {
  return show::print_layer(os, c);
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
