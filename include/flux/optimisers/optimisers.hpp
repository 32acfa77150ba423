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
  /// Sets the learning rate; a rule with one checks it first (as validate()) and keeps the old one on error.
  virtual void adjust(double eta) { (void)eta; }
  /// Throws flux::Error naming the rule and the first invalid hyper-parameter, with PyTorch's limits
  /// ("[Adam] invalid learning rate: -0.001 (must be finite and >= 0)"). Run by every constructor,
  /// setup(), adjust() and update(), so a value changed through the public fields is caught too.
  virtual void validate() const {}
  /// Moment buffers this rule keeps per array (Adam: 2); save_checkpoint checks states against it.
  /// -1 (the default, a user's own rule): not declared, so not checked.
  virtual int buffer_count() const { return -1; }
};

#define FLUX_RULE_(Type)                                                                     \
  std::shared_ptr<Rule> clone() const override { return std::make_shared<Type>(*this); }     \
  std::string name() const override;                                                         \
  Tensor apply(LeafState& s, const Tensor& x, const Tensor& dx) const override;              \
  void validate() const override;

/// x -= eta * dx.
struct DescentOptions {
  double eta = 0.1;
};
struct Descent : Rule {
  double eta;
  explicit Descent(double eta = 0.1) : eta(eta) { validate(); }
  /// By name: Descent({.eta = 0.05}).
  explicit Descent(DescentOptions o) : eta(o.eta) { validate(); }
  FLUX_RULE_(Descent)
  int buffer_count() const override { return 0; }
  void adjust(double e) override;
};
/// v = rho v + eta dx; x -= v.
struct MomentumOptions {
  double eta = 0.01, rho = 0.9;
};
struct Momentum : Rule {
  double eta, rho;
  explicit Momentum(double eta = 0.01, double rho = 0.9) : eta(eta), rho(rho) { validate(); }
  explicit Momentum(MomentumOptions o) : eta(o.eta), rho(o.rho) { validate(); }
  FLUX_RULE_(Momentum)
  int buffer_count() const override { return 1; }
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override;
};
/// Nesterov momentum, as Optimisers.jl.
struct NesterovOptions {
  double eta = 0.001, rho = 0.9;
};
struct Nesterov : Rule {
  double eta, rho;
  explicit Nesterov(double eta = 0.001, double rho = 0.9) : eta(eta), rho(rho) { validate(); }
  explicit Nesterov(NesterovOptions o) : eta(o.eta), rho(o.rho) { validate(); }
  FLUX_RULE_(Nesterov)
  int buffer_count() const override { return 1; }
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override;
};
/// RMSProp (not centred): a = rho a + (1 - rho) dx²; step = eta dx / (sqrt(a) + eps).
struct RMSPropOptions {
  double eta = 0.001, rho = 0.9, eps = 1e-8;
};
struct RMSProp : Rule {
  double eta, rho, eps;
  explicit RMSProp(double eta = 0.001, double rho = 0.9, double eps = 1e-8) : eta(eta), rho(rho), eps(eps) { validate(); }
  explicit RMSProp(RMSPropOptions o) : eta(o.eta), rho(o.rho), eps(o.eps) { validate(); }
  FLUX_RULE_(RMSProp)
  int buffer_count() const override { return 1; }
  void init(LeafState& s, const Tensor& x) const override;
  void adjust(double e) override;
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
      : eta(eta), beta1(beta1), beta2(beta2), eps(eps) { validate(); }
  explicit Adam(AdamOptions o) : Adam(o.eta, o.beta.first, o.beta.second, o.eps) {}
  FLUX_RULE_(Adam)
  int buffer_count() const override { return 2; }
  void init(LeafState& s, const Tensor& x) const override;
  bool apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const override;
  void adjust(double e) override;
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
      : eta(eta), beta1(beta1), beta2(beta2), lambda(lambda), eps(eps) { validate(); }
  /// AdamW({.eta = 1e-3, .lambda = 1e-4}).
  explicit AdamW(AdamWOptions o) : AdamW(o.eta, o.beta.first, o.beta.second, o.lambda, o.eps) {}
  FLUX_RULE_(AdamW)
  int buffer_count() const override { return 2; }
  void init(LeafState& s, const Tensor& x) const override;
  bool apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const override;
  void adjust(double e) override;
};
/// dx + lambda x (L2 penalty on the gradient).
struct WeightDecayOptions {
  double lambda = 5e-4;
};
struct WeightDecay : Rule {
  double lambda;
  explicit WeightDecay(double lambda = 5e-4) : lambda(lambda) { validate(); }
  explicit WeightDecay(WeightDecayOptions o) : lambda(o.lambda) { validate(); }
  FLUX_RULE_(WeightDecay)
  int buffer_count() const override { return 0; }
};
/// clamp(dx, -delta, delta).
struct ClipGradOptions {
  double delta = 10.0;
};
struct ClipGrad : Rule {
  double delta;
  explicit ClipGrad(double delta = 10.0) : delta(delta) { validate(); }
  explicit ClipGrad(ClipGradOptions o) : delta(o.delta) { validate(); }
  FLUX_RULE_(ClipGrad)
  int buffer_count() const override { return 0; }
};
/// Rescales dx so that its p-norm is at most omega; errors on a non-finite norm.
struct ClipNormOptions {
  double omega = 10.0, p = 2.0;
};
struct ClipNorm : Rule {
  double omega, p;
  explicit ClipNorm(double omega = 10.0, double p = 2.0) : omega(omega), p(p) { validate(); }
  explicit ClipNorm(ClipNormOptions o) : omega(o.omega), p(o.p) { validate(); }
  FLUX_RULE_(ClipNorm)
  int buffer_count() const override { return 0; }
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
  void validate() const override;
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
  rule.validate();
  State s{rule.clone(), {}, 0};
  for (const Tensor& x : params(model)) {
    s.leaves.emplace_back();
    s.rule->init(s.leaves.back(), x);
  }
  return s;
}

namespace detail {
/// Checks that `s` was made by setup(s.rule, model) for a model with these arrays: one leaf per
/// array, the rule's number of buffers (where it declares one) each of the array's shape, dtype and
/// device, one part per rule of a chain, step counts >= 0. Throws flux::Error "[api] ..." naming the
/// first mismatch.
void check_state_matches(const std::string& api, const State& s, const std::vector<Tensor>& xs);
void update_arrays(State& state, std::vector<Tensor> xs, const std::vector<Tensor>& dxs);
}

/// One optimiser step: every array of `model` moves by the rule's step for its gradient in `grads`.
/// Only params() arrays take part: NonTrainable state (BatchNorm's running statistics) is never
/// read from `grads` nor changed, whatever the gradient holds there.
template <class M> void update(State& state, M& model, const M& grads) {
  detail::update_arrays(state, params(model), params(grads));
}

/// Sets the learning rate of every rule in the state; an invalid one (NaN, infinite, negative) is an
/// error and leaves the state as it was.
void adjust(State& state, double eta);

}  // namespace flux::optimisers
