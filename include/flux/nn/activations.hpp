// Activation functions as values: call them on tensors (relu(x)), pass them to layers
// (Dense(10, 5, relu)), or put them in a Chain (Chain(Dense(...), softmax)).
#pragma once
#include <ostream>
#include <string>
#include <type_traits>

#include "flux/ops.hpp"

namespace flux {

namespace show {
/// The symbol at a function's address ("my_act"), or "" when no symbol table has it (flux/nn/show.hpp).
std::string function_name(const void* address);
}  // namespace show

#define FLUX_ACTIVATION_(Type, value, name_str, expr)                            \
  struct Type {                                                                 \
    static constexpr const char* name = name_str;                               \
    Tensor operator()(const Tensor& x) const { return expr; }                   \
  };                                                                            \
  inline std::ostream& operator<<(std::ostream& os, const Type&) { return os << name_str; } \
  inline constexpr Type value{};

FLUX_ACTIVATION_(Identity, identity, "identity", x)
FLUX_ACTIVATION_(Relu, relu, "relu", detail::relu_op(x))
FLUX_ACTIVATION_(Sigmoid, sigmoid, "sigmoid", detail::sigmoid_op(x))
FLUX_ACTIVATION_(Tanh, tanh_act, "tanh", detail::tanh_op(x))
// gelu is NNlib's `gelu` (= `gelu_tanh`): x σ(2√(2/π) (x + 0.044715 x³)), PyTorch's
// nn.GELU(approximate="tanh"). gelu_erf is the exact form x Φ(x) = x (1 + erf(x / √2)) / 2: NNlib's
// `gelu_erf`, PyTorch's default nn.GELU(); composed of recorded ops (ONNX: Erf, Mul, Add).
FLUX_ACTIVATION_(Gelu, gelu, "gelu", detail::gelu_op(x))
FLUX_ACTIVATION_(GeluErf, gelu_erf, "gelu_erf", detail::gelu_erf_op(x))
FLUX_ACTIVATION_(Softplus, softplus, "softplus", detail::softplus_op(x))
FLUX_ACTIVATION_(Swish, swish, "swish", detail::swish_op(x))
#undef FLUX_ACTIVATION_

/// tanh(x) elementwise (a function so that `using namespace flux` does not clash with ::tanh).
inline Tensor tanh(const Tensor& x) { return detail::tanh_op(x); }

/// A plain function Tensor(const Tensor&) held as a Chain element. An overloaded name has no type of
/// its own to deduce, so Chain(Dense(2, 3), tanh, Dense(3, 1)) with <cmath> and `using namespace flux`
/// (where `tanh` names both ::tanh and flux::tanh) picks the Tensor overload into this (chain.hpp).
struct FunctionLayer {
  Tensor (*fn)(const Tensor&) = nullptr;
  FunctionLayer() = default;
  FunctionLayer(Tensor (*f)(const Tensor&)) : fn(f) {}
  Tensor operator()(const Tensor& x) const { return fn(x); }
};
/// "tanh" for flux::tanh, else the function's symbol (or "function"). A template on the exact type,
/// so that a plain function pointer (which converts to FunctionLayer) keeps its own display.
template <class F>
  requires std::is_same_v<F, FunctionLayer>
std::string layer_string(const F& f) {
  if (f.fn == &flux::tanh) return "tanh";
  std::string name = show::function_name(reinterpret_cast<const void*>(f.fn));
  return name.empty() ? "function" : name;
}

/// leakyrelu(x, a = 0.01); `leakyrelu` itself is a layer value with the default slope.
struct LeakyRelu {
  static constexpr const char* name = "leakyrelu";
  double a = 0.01;
  Tensor operator()(const Tensor& x) const { return detail::leakyrelu_op(x, a); }
  Tensor operator()(const Tensor& x, double slope) const { return detail::leakyrelu_op(x, slope); }
};
inline constexpr LeakyRelu leakyrelu{};
/// elu(x, a = 1).
struct Elu {
  static constexpr const char* name = "elu";
  double a = 1.0;
  Tensor operator()(const Tensor& x) const { return detail::elu_op(x, a); }
  Tensor operator()(const Tensor& x, double alpha) const { return detail::elu_op(x, alpha); }
};
inline constexpr Elu elu{};
/// How a parametrised activation prints: "leakyrelu" with the default slope, else "leakyrelu(0.2)";
/// "elu" or "elu(0.5)". Used by Chain's display and by the layers holding it (Dense(2 => 3, leakyrelu(0.2))).
std::string layer_string(const LeakyRelu& f);
std::string layer_string(const Elu& f);
namespace detail {
template <class A> std::string activation_name(const A& a) {
  if constexpr (requires { layer_string(a); }) return layer_string(a);
  else return A::name;
}
}  // namespace detail

/// softmax / logsoftmax along an axis (default: the last, where classes live).
struct Softmax {
  static constexpr const char* name = "softmax";
  Tensor operator()(const Tensor& x, int axis = -1) const { return detail::softmax_op(x, axis); }
};
inline constexpr Softmax softmax{};
struct LogSoftmax {
  static constexpr const char* name = "logsoftmax";
  Tensor operator()(const Tensor& x, int axis = -1) const { return detail::logsoftmax_op(x, axis); }
};
inline constexpr LogSoftmax logsoftmax{};
inline std::ostream& operator<<(std::ostream& os, const Softmax&) { return os << "softmax"; }
inline std::ostream& operator<<(std::ostream& os, const LogSoftmax&) { return os << "logsoftmax"; }

/// A type-erased activation, as held by Dense: a name for printing and a function.
class Activation {
 public:
  Activation() : name_("identity"), fn_(nullptr) {}
  template <class A>
    requires requires { A::name; }
  Activation(const A& a) : name_(detail::activation_name(a)), fn_(nullptr), object_(std::make_shared<Holder<A>>(a)) {
    if (std::string(A::name) == "identity") object_.reset();
  }
  /// A plain function, e.g. flux::tanh or a user's own; printed by `name`.
  Activation(Tensor (*fn)(const Tensor&), std::string name = "") : name_(std::move(name)), fn_(fn) {
    if (name_.empty()) name_ = fn == &flux::tanh ? "tanh" : show::function_name(reinterpret_cast<const void*>(fn));
    if (name_.empty()) name_ = "#activation";
  }
  Tensor operator()(const Tensor& x) const {
    if (object_) return object_->call(x);
    if (fn_) return fn_(x);
    return x;
  }
  const std::string& name() const { return name_; }
  bool is_identity() const { return !object_ && !fn_; }
  /// Whether this holds the activation value of type A (e.g. is<Relu>()): layers use it to fuse.
  template <class A> bool is() const { return dynamic_cast<const Holder<A>*>(object_.get()) != nullptr; }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual Tensor call(const Tensor& x) const = 0;
  };
  template <class A> struct Holder : Base {
    explicit Holder(const A& a) : a(a) {}
    Tensor call(const Tensor& x) const override { return a(x); }
    A a;
  };
  std::string name_;
  Tensor (*fn_)(const Tensor&);
  std::shared_ptr<const Base> object_;
};

}  // namespace flux
