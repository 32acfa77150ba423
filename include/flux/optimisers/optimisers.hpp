// Optimisers with Optimisers.jl semantics: state = setup(rule, model); update(state, model, grads)
// changes the model's arrays in place; adjust(state, eta) changes the learning rate.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flux/functor.hpp"
#include "flux/ops.hpp"

namespace flux::optimisers {

/// Per-array optimiser state: moment buffers, a step count, and children for OptimiserChain.
struct LeafState {
  std::vector<Tensor> buffers;
  int64_t t = 0;
  std::vector<LeafState> children;
};

/// A rule transforms a gradient dx of array x into the step subtracted from x.
class Rule {
 public:
  virtual ~Rule() = default;
  virtual std::shared_ptr<Rule> clone() const = 0;
  virtual std::string name() const = 0;  // "Adam(0.001, (0.9, 0.999), 1.0e-8)"
  virtual void init(LeafState& s, const Tensor& x) const { (void)s; (void)x; }
  virtual Tensor apply(LeafState& s, const Tensor& x, const Tensor& dx) const = 0;
  /// Updates x in place in one pass when the rule can (Adam, AdamW); false = use apply().
  virtual bool apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const { (void)s; (void)x; (void)dx; return false; }
  virtual void adjust(double eta) { (void)eta; }
};

#define FLUX_RULE_(Type)                                                                     \
  std::shared_ptr<Rule> clone() const override { return std::make_shared<Type>(*this); }     \
  std::string name() const override;                                                         \
  Tensor apply(LeafState& s, const Tensor& x, const Tensor& dx) const override;

/// x -= eta * dx.
struct DescentOptions {
  double eta = 0.1;
};
struct Descent : Rule {
  double eta;
  explicit Descent(double eta = 0.1) : eta(eta) {}
  /// By name: Descent({.eta = 0.05}).
  explicit Descent(DescentOptions o) : eta(o.eta) {}
  FLUX_RULE_(Descent)
  void adjust(double e) override { eta = e; }
};
/// v = rho v + eta dx; x -= v.
struct MomentumOptions {
  double eta = 0.01, rho = 0.9;
};
struct Momentum : Rule {
  double eta, rho;
  explicit Momentum(double eta = 0.01, double rho = 0.9) : eta(eta), rho(rho) {}
  explicit Momentum(MomentumOptions o) : eta(o.eta), rho(o.rho) {}
  FLUX_RULE_(Momentum)
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override { eta = e; }
};
/// Nesterov momentum, as Optimisers.jl.
struct NesterovOptions {
  double eta = 0.001, rho = 0.9;
};
struct Nesterov : Rule {
  double eta, rho;
  explicit Nesterov(double eta = 0.001, double rho = 0.9) : eta(eta), rho(rho) {}
  explicit Nesterov(NesterovOptions o) : eta(o.eta), rho(o.rho) {}
  FLUX_RULE_(Nesterov)
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override { eta = e; }
};
/// RMSProp (not centred): a = rho a + (1 - rho) dx²; step = eta dx / (sqrt(a) + eps).
struct RMSPropOptions {
  double eta = 0.001, rho = 0.9, eps = 1e-8;
};
struct RMSProp : Rule {
  double eta, rho, eps;
  explicit RMSProp(double eta = 0.001, double rho = 0.9, double eps = 1e-8) : eta(eta), rho(rho), eps(eps) {}
  explicit RMSProp(RMSPropOptions o) : eta(o.eta), rho(o.rho), eps(o.eps) {}
  FLUX_RULE_(RMSProp)
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override { eta = e; }
};
/// Adam with bias correction; the step is fused into one pass per array.
/// Optimisers.jl's keywords: Adam({.eta = 3e-4, .beta = {0.9, 0.999}}).
struct AdamOptions {
  double eta = 0.001;
  std::pair<double, double> beta = {0.9, 0.999};
  double eps = 1e-8;
};
struct Adam : Rule {
  double eta, beta1, beta2, eps;
  explicit Adam(double eta = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : eta(eta), beta1(beta1), beta2(beta2), eps(eps) {}
  explicit Adam(AdamOptions o) : Adam(o.eta, o.beta.first, o.beta.second, o.eps) {}
  FLUX_RULE_(Adam)
  void init(LeafState& s, const Tensor& x) const override;
  bool apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const override;
  void adjust(double e) override { eta = e; }
};
/// Adam with decoupled weight decay scaled by eta (PyTorch's AdamW; Optimisers.jl's couple = true).
struct AdamWOptions {
  double eta = 0.001;
  std::pair<double, double> beta = {0.9, 0.999};
  double lambda = 0.0, eps = 1e-8;
};
struct AdamW : Rule {
  double eta, beta1, beta2, lambda, eps;
  explicit AdamW(double eta = 0.001, double beta1 = 0.9, double beta2 = 0.999, double lambda = 0.0, double eps = 1e-8)
      : eta(eta), beta1(beta1), beta2(beta2), lambda(lambda), eps(eps) {}
  /// AdamW({.eta = 1e-3, .lambda = 1e-4}).
  explicit AdamW(AdamWOptions o) : AdamW(o.eta, o.beta.first, o.beta.second, o.lambda, o.eps) {}
  FLUX_RULE_(AdamW)
  void init(LeafState& s, const Tensor& x) const override;
  bool apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const override;
  void adjust(double e) override { eta = e; }
};
/// dx + lambda x (L2 penalty on the gradient).
struct WeightDecayOptions {
  double lambda = 5e-4;
};
struct WeightDecay : Rule {
  double lambda;
  explicit WeightDecay(double lambda = 5e-4) : lambda(lambda) {}
  explicit WeightDecay(WeightDecayOptions o) : lambda(o.lambda) {}
  FLUX_RULE_(WeightDecay)
};
/// clamp(dx, -delta, delta).
struct ClipGradOptions {
  double delta = 10.0;
};
struct ClipGrad : Rule {
  double delta;
  explicit ClipGrad(double delta = 10.0) : delta(delta) {}
  explicit ClipGrad(ClipGradOptions o) : delta(o.delta) {}
  FLUX_RULE_(ClipGrad)
};
/// Rescales dx so that its p-norm is at most omega; errors on a non-finite norm.
struct ClipNormOptions {
  double omega = 10.0, p = 2.0;
};
struct ClipNorm : Rule {
  double omega, p;
  explicit ClipNorm(double omega = 10.0, double p = 2.0) : omega(omega), p(p) {}
  explicit ClipNorm(ClipNormOptions o) : omega(o.omega), p(o.p) {}
  FLUX_RULE_(ClipNorm)
};
#undef FLUX_RULE_

/// Applies rules in order, each to the previous one's output.
struct OptimiserChain : Rule {
  std::vector<std::shared_ptr<Rule>> rules;
  template <class... R> explicit OptimiserChain(const R&... rs) : rules{rs.clone()...} {}
  std::shared_ptr<Rule> clone() const override;
  std::string name() const override;
  void init(LeafState& s, const Tensor& x) const override;
  Tensor apply(LeafState& s, const Tensor& x, const Tensor& dx) const override;
  void adjust(double eta) override;
};

/// The optimiser state of one model: the rule and one LeafState per distinct trainable array, in
/// params() order (NonTrainable leaves have none).
struct State {
  std::shared_ptr<Rule> rule;
  std::vector<LeafState> leaves;
  /// Updates made with this state (update() calls); save_checkpoint stores it and load_checkpoint
  /// restores it, so a resumed train() starts at {.start_step = state.steps}.
  int64_t steps = 0;
};

/// Makes the state for `model` (moment buffers on the arrays' devices).
template <class M> State setup(const Rule& rule, const M& model) {
  State s{rule.clone(), {}, 0};
  for (const Tensor& x : params(model)) {
    s.leaves.emplace_back();
    s.rule->init(s.leaves.back(), x);
  }
  return s;
}

namespace detail {
void update_arrays(State& state, std::vector<Tensor> xs, const std::vector<Tensor>& dxs);
}

/// One optimiser step: every array of `model` moves by the rule's step for its gradient in `grads`.
/// Only params() arrays take part: NonTrainable state (BatchNorm's running statistics) is never
/// read from `grads` nor changed, whatever the gradient holds there.
template <class M> void update(State& state, M& model, const M& grads) {
  detail::update_arrays(state, params(model), params(grads));
}

/// Sets the learning rate of every rule in the state.
void adjust(State& state, double eta);

}  // namespace flux::optimisers
