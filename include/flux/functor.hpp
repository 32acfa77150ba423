// Walking a model's tensors: fmap, params, state. A struct opts in with
//   FLUX_LAYER(MyLayer, weight, bias, activation)
// written after the struct, in its namespace. Chain, std::vector, std::tuple and std::array of
// layers are walked too; fields that are not tensors or layers (activations, ints) are skipped.
//
// Nothing is skipped silently: a type reached by the walk (a Chain's element, a listed field, ...)
// that is not walkable must be one that cannot hold tensors, else the program does not compile
// (static_assert "flux: ... FLUX_LAYER ..."). Allowed without FLUX_LAYER: non-class types, empty
// classes (activations, captureless lambdas), types smaller than a Tensor, types that cannot be
// copy-assigned (lambdas with captures), simple aggregates whose fields hold no tensors (looked
// at field by field), std::string/function/optional/variant/pair/smart pointers of such. A
// non-aggregate class with tensor-free state of its own (MaxPool's window) writes FLUX_LAYER(Type).
//
// Non-trainable state: a field of type NonTrainable (a Tensor, e.g. BatchNorm's running_mean) is a
// leaf like any tensor for fmap, `| dev`, gpu/cpu, state(), save and load, but params() (hence
// optimisers::setup/update and parameter_count) skips it. gradient() still gives the model's own
// type, so the gradient holds something (zeros, usually) in those fields; update never reads it.
//
// Modes: a layer with a field `std::optional<bool> active` (BatchNorm, Dropout, or a user's own)
// has Flux's train/test mode: nullopt = automatic (training behaviour while a gradient tape records,
// inference outside), true = always training, false = always inference. trainmode/testmode/automode
// set it on every such layer reachable through Chain, FLUX_LAYER fields, vectors, tuples and arrays.
#pragma once
#include <array>
#include <concepts>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "flux/tensor.hpp"

// ---- a small FOR_EACH over up to 16 fields ----
#define FLUX_PP_CAT_(a, b) a##b
#define FLUX_PP_CAT(a, b) FLUX_PP_CAT_(a, b)
#define FLUX_PP_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define FLUX_PP_NARGS(...) FLUX_PP_NARGS_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define FLUX_PP_EACH_1(m, x) m(x)
#define FLUX_PP_EACH_2(m, x, ...) m(x) FLUX_PP_EACH_1(m, __VA_ARGS__)
#define FLUX_PP_EACH_3(m, x, ...) m(x) FLUX_PP_EACH_2(m, __VA_ARGS__)
#define FLUX_PP_EACH_4(m, x, ...) m(x) FLUX_PP_EACH_3(m, __VA_ARGS__)
#define FLUX_PP_EACH_5(m, x, ...) m(x) FLUX_PP_EACH_4(m, __VA_ARGS__)
#define FLUX_PP_EACH_6(m, x, ...) m(x) FLUX_PP_EACH_5(m, __VA_ARGS__)
#define FLUX_PP_EACH_7(m, x, ...) m(x) FLUX_PP_EACH_6(m, __VA_ARGS__)
#define FLUX_PP_EACH_8(m, x, ...) m(x) FLUX_PP_EACH_7(m, __VA_ARGS__)
#define FLUX_PP_EACH_9(m, x, ...) m(x) FLUX_PP_EACH_8(m, __VA_ARGS__)
#define FLUX_PP_EACH_10(m, x, ...) m(x) FLUX_PP_EACH_9(m, __VA_ARGS__)
#define FLUX_PP_EACH_11(m, x, ...) m(x) FLUX_PP_EACH_10(m, __VA_ARGS__)
#define FLUX_PP_EACH_12(m, x, ...) m(x) FLUX_PP_EACH_11(m, __VA_ARGS__)
#define FLUX_PP_EACH_13(m, x, ...) m(x) FLUX_PP_EACH_12(m, __VA_ARGS__)
#define FLUX_PP_EACH_14(m, x, ...) m(x) FLUX_PP_EACH_13(m, __VA_ARGS__)
#define FLUX_PP_EACH_15(m, x, ...) m(x) FLUX_PP_EACH_14(m, __VA_ARGS__)
#define FLUX_PP_EACH_16(m, x, ...) m(x) FLUX_PP_EACH_15(m, __VA_ARGS__)
#define FLUX_PP_FOR_EACH(m, ...) FLUX_PP_CAT(FLUX_PP_EACH_, FLUX_PP_NARGS(__VA_ARGS__))(m, __VA_ARGS__)
#define FLUX_LAYER_FIELD_(field) visit(#field, self.field);

namespace flux::show {
/// Prints a layer as Flux shows it (defined in flux/nn/show.hpp): containers on several lines with
/// parameter counts, a FLUX_LAYER struct as "Name(field, ...)".
template <class L> std::ostream& print_layer(std::ostream& os, const L& layer);
}  // namespace flux::show

/// Makes `Type` walkable by fmap/params/state: lists its fields in order. Write it right after the
/// struct, in the struct's own namespace (it is found by argument-dependent lookup). FLUX_LAYER(Type)
/// with no fields declares a layer without tensors. It also gives `std::cout << layer` in that
/// namespace (no `using namespace flux` needed); an operator<< the user writes for Type wins over it
/// (a non-template beats this template). `Type` may also name a class template whose parameters are
/// all types (`template <class A> struct Block`) or all values (`template <int N>`): FLUX_LAYER(Block,
/// attn, mlp) then covers every Block<...>.
#define FLUX_LAYER(Type, ...)                                                              \
  template <class Self_, class Visit_>                                                     \
    requires(::flux::functor::is_layer_type<std::remove_const_t<Self_>, Type>())           \
  void flux_fields([[maybe_unused]] Self_& self, [[maybe_unused]] Visit_&& visit) {        \
    __VA_OPT__(FLUX_PP_FOR_EACH(FLUX_LAYER_FIELD_, __VA_ARGS__))                           \
  }                                                                                        \
  template <class Self_>                                                                   \
    requires(::flux::functor::is_layer_type<Self_, Type>())                                \
  const char* flux_layer_name(const Self_*) {                                              \
    return #Type;                                                                          \
  }                                                                                        \
  template <class Self_>                                                                   \
    requires(::flux::functor::is_layer_type<Self_, Type>())                                \
  constexpr bool flux_layer_streams(const Self_*) {                                        \
    return true;                                                                           \
  }                                                                                        \
  template <class Layer_>                                                                  \
    requires(::flux::functor::is_layer_type<Layer_, Type>())                               \
  std::ostream& operator<<(std::ostream& os, const Layer_& layer) {                        \
    return ::flux::show::print_layer(os, layer);                                           \
  }

namespace flux::functor {
template <class T, template <class...> class Template> struct is_specialisation_of : std::false_type {};
template <template <class...> class Template, class... A>
struct is_specialisation_of<Template<A...>, Template> : std::true_type {};
template <class T, template <auto...> class Template> struct is_value_specialisation_of : std::false_type {};
template <template <auto...> class Template, auto... A>
struct is_value_specialisation_of<Template<A...>, Template> : std::true_type {};
/// FLUX_LAYER's test of a type: Self is Type (a class), or a specialisation of Type (a class template).
/// Only the overload whose parameter kind fits what the macro was given takes part.
template <class Self, class Type> consteval bool is_layer_type() { return std::is_same_v<Self, Type>; }
template <class Self, template <class...> class Type> consteval bool is_layer_type() {
  return is_specialisation_of<Self, Type>::value;
}
template <class Self, template <auto...> class Type> consteval bool is_layer_type() {
  return is_value_specialisation_of<Self, Type>::value;
}
}  // namespace flux::functor

namespace flux {

/// A tensor that a layer holds but does not train (running statistics, counters): moved, saved and
/// loaded with the model, skipped by params() and so by optimisers. Usable wherever a Tensor is.
struct NonTrainable : Tensor {
  NonTrainable() = default;
  NonTrainable(Tensor t) : Tensor(std::move(t)) {}
};

namespace functor {

template <class T>
concept HasFields = requires(T& t) { flux_fields(t, [](const char*, auto&) {}); };

template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... T> struct is_tuple<std::tuple<T...>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, size_t N> struct is_array<std::array<T, N>> : std::true_type {};

// ---- which unwalkable types may hold tensors (see the top of this file) ----

/// Converts to anything: counts an aggregate's fields by brace-initialising it (as Boost.PFR does).
struct AnyField {
  template <class U> operator U&() const&&;
};
template <class T, size_t... I>
concept BraceInitialisable = requires { T{(void(I), AnyField{})...}; };
template <class T, size_t N> consteval bool brace_initialisable() {
  return []<size_t... I>(std::index_sequence<I...>) { return BraceInitialisable<T, I...>; }(std::make_index_sequence<N>{});
}
/// The number of fields of aggregate T (up to 16; 17 when there are more or they cannot be counted).
template <class T, size_t N = 0> consteval size_t field_count() {
  if constexpr (N > 16) return 17;
  else if constexpr (brace_initialisable<T, N>() && !brace_initialisable<T, N + 1>()) return N;
  else return field_count<T, N + 1>();
}
template <class... F> struct TypeList {};
#define FLUX_FIELD_TYPES_(n, ...)                                        \
  if constexpr (field_count<T>() == n) {                                 \
    auto& [__VA_ARGS__] = t;                                             \
    return [](auto&... f) { return TypeList<std::remove_cvref_t<decltype(f)>...>{}; }(__VA_ARGS__); \
  } else
/// The field types of aggregate T, by structured binding (declared only; used in decltype).
template <class T> auto field_types(T& t) {
  FLUX_FIELD_TYPES_(1, a) FLUX_FIELD_TYPES_(2, a, b) FLUX_FIELD_TYPES_(3, a, b, c)
  FLUX_FIELD_TYPES_(4, a, b, c, d) FLUX_FIELD_TYPES_(5, a, b, c, d, e) FLUX_FIELD_TYPES_(6, a, b, c, d, e, f)
  FLUX_FIELD_TYPES_(7, a, b, c, d, e, f, g) FLUX_FIELD_TYPES_(8, a, b, c, d, e, f, g, h)
  FLUX_FIELD_TYPES_(9, a, b, c, d, e, f, g, h, i) FLUX_FIELD_TYPES_(10, a, b, c, d, e, f, g, h, i, j)
  FLUX_FIELD_TYPES_(11, a, b, c, d, e, f, g, h, i, j, k) FLUX_FIELD_TYPES_(12, a, b, c, d, e, f, g, h, i, j, k, l)
  FLUX_FIELD_TYPES_(13, a, b, c, d, e, f, g, h, i, j, k, l, m)
  FLUX_FIELD_TYPES_(14, a, b, c, d, e, f, g, h, i, j, k, l, m, n)
  FLUX_FIELD_TYPES_(15, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o)
  FLUX_FIELD_TYPES_(16, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)
  return TypeList<void>{};  // uncountable: treated as possibly holding tensors
}
#undef FLUX_FIELD_TYPES_

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_variant : std::false_type {};
template <class... T> struct is_variant<std::variant<T...>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T> struct is_opaque_std : std::false_type {};  // std types whose contents we cannot see
template <class C, class Tr, class A> struct is_opaque_std<std::basic_string<C, Tr, A>> : std::true_type {};
template <class S> struct is_opaque_std<std::function<S>> : std::true_type {};
template <class T> struct is_opaque_std<std::shared_ptr<T>> : std::true_type {};
template <class T, class D> struct is_opaque_std<std::unique_ptr<T, D>> : std::true_type {};

template <class T> consteval bool holds_no_tensors();
template <class List> struct all_hold_no_tensors : std::false_type {};
template <class... F> struct all_hold_no_tensors<TypeList<F...>> : std::bool_constant<(holds_no_tensors<F>() && ...)> {};
template <class... F> struct all_hold_no_tensors<std::tuple<F...>> : all_hold_no_tensors<TypeList<F...>> {};
template <class... F> struct all_hold_no_tensors<std::variant<F...>> : all_hold_no_tensors<TypeList<F...>> {};
template <class A, class B> struct all_hold_no_tensors<std::pair<A, B>> : all_hold_no_tensors<TypeList<A, B>> {};

/// True when T certainly holds no tensor and no layer (so skipping it loses nothing).
template <class T> consteval bool holds_no_tensors() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, void>) return false;
  else if constexpr (!std::is_class_v<U>) return true;  // numbers, enums, pointers, functions
  else if constexpr (std::is_base_of_v<Tensor, U> || HasFields<U>) return false;
  else if constexpr (is_vector<U>::value || is_array<U>::value) return holds_no_tensors<typename U::value_type>();
  else if constexpr (is_tuple<U>::value || is_variant<U>::value || is_pair<U>::value) return all_hold_no_tensors<U>::value;
  else if constexpr (is_optional<U>::value) return holds_no_tensors<typename U::value_type>();
  else if constexpr (is_opaque_std<U>::value) return true;
  else if constexpr (std::is_empty_v<U> || sizeof(U) < sizeof(Tensor)) return true;
  else if constexpr (!std::is_copy_assignable_v<U>) return true;  // closures with captures
  else if constexpr (std::is_aggregate_v<U>) return all_hold_no_tensors<decltype(field_types(std::declval<U&>()))>::value;
  else return false;
}
/// Walkable types (tensors, FLUX_LAYER structs, Chain, containers) or types that hold no tensors.
template <class T>
concept Layerlike = std::is_base_of_v<Tensor, std::remove_cv_t<T>> || HasFields<T> || is_vector<std::remove_cv_t<T>>::value ||
                    is_array<std::remove_cv_t<T>>::value || is_tuple<std::remove_cv_t<T>>::value || holds_no_tensors<T>();

#define FLUX_NOT_WALKABLE_MESSAGE_                                                                    \
  "flux: this type is used as a layer (in a Chain, fmap, gradient, params, `| dev`, "                \
  "optimisers::setup) but is not walkable, so its tensors would be skipped silently. Declare "       \
  "FLUX_LAYER(Type, field, ...) right after the struct IN THE STRUCT'S OWN NAMESPACE (it is found by " \
  "argument-dependent lookup; written elsewhere it is not seen), listing its tensor and layer fields; " \
  "FLUX_LAYER(Type) for a layer without tensors. See flux/functor.hpp."

/// Fails to compile, naming FLUX_LAYER, when T could hold tensors that the walk would skip.
template <class T> constexpr void require_walkable() {
  static_assert(Layerlike<T>, FLUX_NOT_WALKABLE_MESSAGE_);
}

inline std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

template <class F, class L> void visit_leaf(F& f, const std::string& name, L& t, bool trainable) {
  if constexpr (std::is_invocable_v<F&, const std::string&, L&, bool>) f(name, t, trainable);
  else f(name, t);
}

/// Calls f(dotted_name, Tensor&, trainable) (or f(dotted_name, Tensor&)) for every defined tensor
/// leaf of m, depth first, in field order; trainable is false for NonTrainable fields.
template <class M, class F> void walk(M& m, const std::string& prefix, F& f) {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, Tensor>) {
    if (m.defined()) visit_leaf(f, prefix, m, true);
  } else if constexpr (std::is_same_v<T, NonTrainable>) {
    auto& t = static_cast<std::conditional_t<std::is_const_v<M>, const Tensor, Tensor>&>(m);
    if (t.defined()) visit_leaf(f, prefix, t, false);
  } else if constexpr (HasFields<M>) {
    flux_fields(m, [&](const char* name, auto& field) { walk(field, join(prefix, name), f); });
  } else if constexpr (is_vector<T>::value || is_array<T>::value) {
    for (size_t i = 0; i < m.size(); ++i) walk(m[i], join(prefix, std::to_string(i)), f);
  } else if constexpr (is_tuple<T>::value) {
    size_t i = 0;
    std::apply([&](auto&... items) { ((walk(items, join(prefix, std::to_string(i++)), f)), ...); }, m);
  } else {
    require_walkable<T>();
  }
}

}  // namespace functor

/// A copy of `m` with every tensor leaf replaced by f(leaf); a tensor seen twice (tied) maps once.
template <class M, class F> M fmap(F&& f, const M& m) {
  M out = m;
  std::unordered_map<const TensorImpl*, Tensor> seen;
  auto visit = [&](const std::string&, Tensor& t) {
    auto it = seen.find(t.impl());
    if (it != seen.end()) {
      t = it->second;
      return;
    }
    const TensorImpl* key = t.impl();
    t = f(static_cast<const Tensor&>(t));
    seen.emplace(key, t);
  };
  functor::walk(out, "", visit);
  return out;
}

/// Flux's deepcopy: a copy of `m` whose tensors (parameters and NonTrainable state such as
/// BatchNorm's running statistics) are fresh copies on the same devices, so updating one model
/// never changes the other; tensors tied inside m stay tied inside the copy. A plain C++ copy
/// (`auto copy = m;`) shares every tensor with m instead, as Julia's `copy = m` does.
template <class M> M deepcopy(const M& m) {
  return fmap([](const Tensor& t) { return t.contiguous_copy(); }, m);
}

/// Every distinct trainable tensor leaf, in walk order (tied tensors once; NonTrainable skipped).
template <class M> std::vector<Tensor> params(const M& m) {
  std::vector<Tensor> out;
  std::unordered_map<const TensorImpl*, bool> seen;
  auto visit = [&](const std::string&, const Tensor& t, bool trainable) {
    if (trainable && seen.emplace(t.impl(), true).second) out.push_back(t);
  };
  functor::walk(m, "", visit);
  return out;
}

/// Every distinct NonTrainable leaf, in walk order (BatchNorm's running_mean, running_var, ...).
template <class M> std::vector<Tensor> nontrainables(const M& m) {
  std::vector<Tensor> out;
  std::unordered_map<const TensorImpl*, bool> seen;
  auto visit = [&](const std::string&, const Tensor& t, bool trainable) {
    if (!trainable && seen.emplace(t.impl(), true).second) out.push_back(t);
  };
  functor::walk(m, "", visit);
  return out;
}

/// (dotted name, tensor) for every leaf in PyTorch's state_dict order: "layers.0.weight", ...
template <class M> std::vector<std::pair<std::string, Tensor>> state(const M& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  auto visit = [&](const std::string& name, const Tensor& t) { out.emplace_back(name, t); };
  functor::walk(m, "", visit);
  return out;
}

/// Total number of parameters (elements of distinct trainable leaves).
template <class M> int64_t parameter_count(const M& m) {
  int64_t n = 0;
  for (const Tensor& t : params(m)) n += t.numel();
  return n;
}

/// Elements of the distinct floating-point NonTrainable leaves: Flux's "plus N non-trainable"
/// (BatchNorm(C): 2C, its running mean and variance; PyTorch's integer num_batches_tracked counter
/// is bookkeeping and not counted, so the figure is Flux's).
template <class M> int64_t nontrainable_count(const M& m) {
  int64_t n = 0;
  for (const Tensor& t : nontrainables(m))
    if (is_floating(t.dtype())) n += t.numel();
  return n;
}

// ---- train/test mode ----
namespace functor {
template <class T>
concept HasMode = requires(T& t) {
  { t.active } -> std::same_as<std::optional<bool>&>;
};

/// Calls f(layer.active) for every layer of m that has a mode (see the top of this file), depth first.
template <class M, class F> void walk_modes(M& m, F& f) {
  if constexpr (HasMode<M>) f(m.active);
  if constexpr (std::is_same_v<M, Tensor> || std::is_same_v<M, NonTrainable>) {
  } else if constexpr (HasFields<M>) {
    flux_fields(m, [&](const char*, auto& field) { walk_modes(field, f); });
  } else if constexpr (is_vector<M>::value || is_array<M>::value) {
    for (auto& item : m) walk_modes(item, f);
  } else if constexpr (is_tuple<M>::value) {
    std::apply([&](auto&... items) { (walk_modes(items, f), ...); }, m);
  } else {
    require_walkable<M>();
  }
}
template <class M> void set_mode(M& m, std::optional<bool> active) {
  auto f = [&](std::optional<bool>& a) { a = active; };
  walk_modes(m, f);
}
}  // namespace functor

/// Flux's trainmode!: every layer with a mode (BatchNorm, Dropout, ...) behaves as in training,
/// also outside gradient(); `trainmode(m, std::nullopt)` returns them to automatic. Modifies m.
template <class M>
  requires(!std::is_const_v<M>)
M& trainmode(M& m, std::optional<bool> active = true) {
  functor::set_mode(m, active);
  return m;
}
template <class M>
  requires(!std::is_reference_v<M>)
M trainmode(M&& m, std::optional<bool> active = true) {
  functor::set_mode(m, active);
  return std::move(m);
}
/// Flux's testmode!: inference behaviour (running statistics, no dropout), also inside gradient();
/// `testmode(m, false)` is trainmode(m), `testmode(m, std::nullopt)` automatic. Modifies m.
template <class M>
  requires(!std::is_const_v<M>)
M& testmode(M& m, std::optional<bool> inactive = true) {
  functor::set_mode(m, inactive ? std::optional<bool>(!*inactive) : std::nullopt);
  return m;
}
template <class M>
  requires(!std::is_reference_v<M>)
M testmode(M&& m, std::optional<bool> inactive = true) {
  testmode(m, inactive);
  return std::move(m);
}
/// Back to Flux's automatic mode: training behaviour inside gradient()/withgradient() only.
template <class M>
  requires(!std::is_const_v<M>)
M& automode(M& m) {
  functor::set_mode(m, std::nullopt);
  return m;
}
template <class M>
  requires(!std::is_reference_v<M>)
M automode(M&& m) {
  functor::set_mode(m, std::nullopt);
  return std::move(m);
}

}  // namespace flux
