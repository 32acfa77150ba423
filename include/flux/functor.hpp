// Walking a model's tensors: fmap, params, state. A struct opts in with
//   FLUX_LAYER(MyLayer, weight, bias, activation)
// written after the struct, in its namespace. Chain, std::vector, std::tuple and std::array of
// layers are walked too; fields that are not tensors or layers (activations, ints) are skipped.
#pragma once
#include <array>
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

/// Calls f(dotted_name, Tensor&) for every tensor leaf of m, depth first, in field order.
template <class M, class F> void walk(M& m, const std::string& prefix, F& f) {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, Tensor>) {
    if (m.defined()) f(prefix, m);
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

/// Every distinct tensor leaf, in walk order (tied tensors once).
template <class M> std::vector<Tensor> params(const M& m) {
  std::vector<Tensor> out;
  std::unordered_map<const TensorImpl*, bool> seen;
  auto visit = [&](const std::string&, const Tensor& t) {
    if (seen.emplace(t.impl(), true).second) out.push_back(t);
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

/// Total number of parameters (elements of distinct leaves).
template <class M> int64_t parameter_count(const M& m) {
  int64_t n = 0;
  for (const Tensor& t : params(m)) n += t.numel();
  return n;
}

}  // namespace flux
