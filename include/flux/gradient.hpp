// gradient(f, args...) and withgradient(f, args...): reverse mode over any mix of tensors and models.
// With one argument the gradient has that argument's type (a Chain of gradient tensors; zeros for
// parameters that did not influence the result); with several, a std::tuple of them.
#pragma once
#include <optional>
#include <tuple>
#include <utility>

#include "flux/autocast.hpp"
#include "flux/autodiff.hpp"
#include "flux/functor.hpp"

namespace flux {

template <class G> struct WithGradient {
  Tensor value;
  G grad;
};

namespace detail {
template <class F, class... Args> auto run_with_gradient(F&& f, const Args&... args) {
  autodiff::Tape tape;
  std::tuple<Args...> tracked{fmap([&](const Tensor& t) { return tape.leaf(t); }, args)...};
  Tensor value = std::apply([&](auto&... a) -> Tensor { return f(a...); }, tracked);
  if (!value.defined()) fail("[gradient] the function returned an undefined tensor");
  tape.backward(value);
  auto grads = std::apply(
      [&](auto&... a) { return std::make_tuple(fmap([&](const Tensor& t) { return tape.grad(t); }, a)...); }, tracked);
  // The value leaves the tape untracked.
  Tensor plain(std::make_shared<TensorImpl>(*value.impl()));
  plain.impl()->tape_id = -1;
  return std::make_pair(plain, std::move(grads));
}
}  // namespace detail

/// The value of f(args...) and its gradient with respect to every argument.
template <class F, class... Args> auto withgradient(F&& f, const Args&... args) {
  static_assert(sizeof...(Args) > 0, "withgradient needs at least one argument to differentiate");
  auto [value, grads] = detail::run_with_gradient(std::forward<F>(f), args...);
  if constexpr (sizeof...(Args) == 1) {
    return WithGradient<std::tuple_element_t<0, decltype(grads)>>{value, std::move(std::get<0>(grads))};
  } else {
    return WithGradient<decltype(grads)>{value, std::move(grads)};
  }
}

/// The gradient of f(args...) (one argument: that argument's type; several: a tuple).
template <class F, class... Args> auto gradient(F&& f, const Args&... args) {
  return withgradient(std::forward<F>(f), args...).grad;
}

/// Options of withgradient(f, model, options) / gradient(f, model, options).
struct GradientOptions {
  /// Runs f under autocast to this dtype (Float16 or BFloat16; flux/autocast.hpp): the forward's
  /// matmul/conv/attention/recurrent ops in low precision, gradients in the parameters' own dtype.
  std::optional<DType> autocast = std::nullopt;
};

/// The value of f(model) and its gradient, under the options (e.g. {.autocast = BFloat16}).
template <class F, class M> auto withgradient(F&& f, const M& model, const GradientOptions& options) {
  // The forward under autocast; the backward's ops follow the dtypes the forward chose.
  return withgradient(
      [&f, &options](auto& m) -> Tensor {
        AutocastScope scope(options.autocast);
        return f(m);
      },
      model);
}
template <class F, class M> auto gradient(F&& f, const M& model, const GradientOptions& options) {
  return withgradient(std::forward<F>(f), model, options).grad;
}

}  // namespace flux
