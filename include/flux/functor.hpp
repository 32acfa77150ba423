// Walking a model's tensors: fmap, params, state. A struct opts in with
//   FLUX_LAYER(MyLayer, weight, bias, activation)
// written after the struct, in its namespace. Chain, std::vector, std::tuple and std::array of
// layers are walked too; fields that are not tensors or layers (activations, ints) are skipped.
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
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
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

/// Makes `Type` walkable by fmap/params/state: lists its fields in order.
#define FLUX_LAYER(Type, ...)                                                              \
  template <class Self_, class Visit_>                                                     \
    requires std::is_same_v<std::remove_const_t<Self_>, Type>                              \
  void flux_fields(Self_& self, Visit_&& visit) {                                          \
    FLUX_PP_FOR_EACH(FLUX_LAYER_FIELD_, __VA_ARGS__)                                       \
  }                                                                                        \
  inline const char* flux_layer_name(const Type*) { return #Type; }

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
