// Optimisation rules (Optimisers.jl's apply! formulas) and the update loop.
#include "flux/optimisers/optimisers.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_set>
#include <sstream>

#include "flux/autodiff.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::optimisers {

namespace {
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
// The limits of each hyper-parameter, PyTorch's (torch/optim: "Invalid learning rate: ...") where it
// has one. One check per kind of parameter; each rule's validate() lists its parameters.
[[noreturn]] void invalid(const char* rule, const char* what, double v, const char* allowed) {
  flux::detail::fail("[", rule, "] invalid ", what, ": ", num(v), " (must be ", allowed, ")");
}
void learning_rate(const char* rule, double eta) {
  if (!(std::isfinite(eta) && eta >= 0)) invalid(rule, "learning rate", eta, "finite and >= 0");
}
// Decay factors (Adam's betas, momentum, RMSProp's rho): 1 would never forget, above 1 diverges.
void decay(const char* rule, const char* what, double v) {
  if (!(v >= 0 && v < 1)) invalid(rule, what, v, "in [0, 1)");
}
void nonnegative(const char* rule, const char* what, double v) {
  if (!(std::isfinite(v) && v >= 0)) invalid(rule, what, v, "finite and >= 0");
}
// A clipping bound: infinity means no clipping, NaN or a negative bound has no meaning.
void bound(const char* rule, const char* what, double v) {
  if (!(v >= 0)) invalid(rule, what, v, ">= 0 (infinity: no clipping)");
}
void init_buffers(LeafState& s, const Tensor& x, int n) {
  s.buffers.clear();
  for (int i = 0; i < n; ++i) s.buffers.push_back(zeros_like(x));
  s.t = 0;
}
}  // namespace

void Descent::validate() const { learning_rate("Descent", eta); }
void Momentum::validate() const {
  learning_rate("Momentum", eta);
  decay("Momentum", "momentum rho", rho);
}
void Nesterov::validate() const {
  learning_rate("Nesterov", eta);
  decay("Nesterov", "momentum rho", rho);
}
void RMSProp::validate() const {
  learning_rate("RMSProp", eta);
  decay("RMSProp", "rho", rho);
  nonnegative("RMSProp", "epsilon", eps);
}
void Adam::validate() const {
  learning_rate("Adam", eta);
  decay("Adam", "beta parameter at index 0", beta1);
  decay("Adam", "beta parameter at index 1", beta2);
  nonnegative("Adam", "epsilon", eps);
}
void AdamW::validate() const {
  learning_rate("AdamW", eta);
  decay("AdamW", "beta parameter at index 0", beta1);
  decay("AdamW", "beta parameter at index 1", beta2);
  nonnegative("AdamW", "weight decay lambda", lambda);
  nonnegative("AdamW", "epsilon", eps);
}
void WeightDecay::validate() const { nonnegative("WeightDecay", "weight decay lambda", lambda); }
void ClipGrad::validate() const { bound("ClipGrad", "delta", delta); }
void ClipNorm::validate() const {
  bound("ClipNorm", "omega", omega);
  if (!(p > 0)) invalid("ClipNorm", "norm p", p, "> 0 (infinity: the max norm)");
}
void OptimiserChain::validate() const {
  for (const auto& r : rules) {
    if (!r) flux::detail::fail("[OptimiserChain] a rule is null");
    r->validate();
  }
}

// adjust() checks the new rate before storing it, so a refused rate leaves the rule unchanged.
void Descent::adjust(double e) { learning_rate("Descent", e), eta = e; }
void Momentum::adjust(double e) { learning_rate("Momentum", e), eta = e; }
void Nesterov::adjust(double e) { learning_rate("Nesterov", e), eta = e; }
void RMSProp::adjust(double e) { learning_rate("RMSProp", e), eta = e; }
void Adam::adjust(double e) { learning_rate("Adam", e), eta = e; }
void AdamW::adjust(double e) { learning_rate("AdamW", e), eta = e; }

std::string Descent::name() const { return "Descent(" + num(eta) + ")"; }
Tensor Descent::apply(LeafState&, const Tensor&, const Tensor& dx) const { return dx * eta; }

std::string Momentum::name() const { return "Momentum(" + num(eta) + ", " + num(rho) + ")"; }
void Momentum::init(LeafState& s, const Tensor& x) const { init_buffers(s, x, 1); }
Tensor Momentum::apply(LeafState& s, const Tensor&, const Tensor& dx) const {
  Tensor v = s.buffers[0] * rho + dx * eta;
  s.buffers[0] = v;
  return v;
}

std::string Nesterov::name() const { return "Nesterov(" + num(eta) + ", " + num(rho) + ")"; }
void Nesterov::init(LeafState& s, const Tensor& x) const { init_buffers(s, x, 1); }
Tensor Nesterov::apply(LeafState& s, const Tensor&, const Tensor& dx) const {
  Tensor& vel = s.buffers[0];
  Tensor step = vel * (-rho * rho) + dx * ((1 + rho) * eta);
  vel = vel * rho - dx * eta;
  return step;
}

std::string RMSProp::name() const { return "RMSProp(" + num(eta) + ", " + num(rho) + ", " + num(eps) + ")"; }
void RMSProp::init(LeafState& s, const Tensor& x) const { init_buffers(s, x, 1); }
Tensor RMSProp::apply(LeafState& s, const Tensor&, const Tensor& dx) const {
  Tensor acc = s.buffers[0] * rho + square(dx) * (1 - rho);
  s.buffers[0] = acc;
  return dx * eta / (sqrt(acc) + eps);
}

namespace {
void adam_fused(LeafState& s, Tensor& x, const Tensor& dx, double eta, double b1, double b2, double eps, double wd) {
  ++s.t;
  backend::AdamStep st{eta, b1, b2, eps, wd, 1 - std::pow(b1, double(s.t)), 1 - std::pow(b2, double(s.t))};
  Tensor g = dx.dtype() == x.dtype() ? dx : dx.cast(x.dtype());
  x.backend().adam_step(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(g), flux::detail::buffer_of(s.buffers[0]),
                        flux::detail::buffer_of(s.buffers[1]), x.numel(), st);
  flux::detail::mark_written(x);
  flux::detail::mark_written(s.buffers[0]);
  flux::detail::mark_written(s.buffers[1]);
}
Tensor adam_apply(LeafState& s, const Tensor& dx, double eta, double b1, double b2, double eps) {
  ++s.t;
  Tensor m = s.buffers[0] * b1 + dx * (1 - b1);
  Tensor v = s.buffers[1] * b2 + square(dx) * (1 - b2);
  s.buffers[0] = m;
  s.buffers[1] = v;
  double c1 = 1 - std::pow(b1, double(s.t)), c2 = 1 - std::pow(b2, double(s.t));
  return (m / c1) / (sqrt(v / c2) + eps) * eta;
}
bool fusable(const Tensor& x) { return x.dtype() == DType::f32 || x.dtype() == DType::f64; }
}  // namespace

std::string Adam::name() const {
  return "Adam(" + num(eta) + ", (" + num(beta1) + ", " + num(beta2) + "), " + num(eps) + ")";
}
void Adam::init(LeafState& s, const Tensor& x) const { init_buffers(s, x, 2); }
Tensor Adam::apply(LeafState& s, const Tensor&, const Tensor& dx) const { return adam_apply(s, dx, eta, beta1, beta2, eps); }
bool Adam::apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const {
  if (!fusable(x)) return false;
  adam_fused(s, x, dx, eta, beta1, beta2, eps, 0.0);
  return true;
}

std::string AdamW::name() const {
  return "AdamW(" + num(eta) + ", (" + num(beta1) + ", " + num(beta2) + "), " + num(lambda) + ", " + num(eps) + ")";
}
void AdamW::init(LeafState& s, const Tensor& x) const { init_buffers(s, x, 2); }
Tensor AdamW::apply(LeafState& s, const Tensor& x, const Tensor& dx) const {
  return adam_apply(s, dx, eta, beta1, beta2, eps) + x * (eta * lambda);
}
bool AdamW::apply_fused(LeafState& s, Tensor& x, const Tensor& dx) const {
  if (!fusable(x)) return false;
  adam_fused(s, x, dx, eta, beta1, beta2, eps, lambda);
  return true;
}

std::string WeightDecay::name() const { return "WeightDecay(" + num(lambda) + ")"; }
Tensor WeightDecay::apply(LeafState&, const Tensor& x, const Tensor& dx) const { return dx + x * lambda; }

std::string ClipGrad::name() const { return "ClipGrad(" + num(delta) + ")"; }
Tensor ClipGrad::apply(LeafState&, const Tensor&, const Tensor& dx) const { return clamp(dx, -delta, delta); }

std::string ClipNorm::name() const { return "ClipNorm(" + num(omega) + ", " + num(p) + ")"; }
Tensor ClipNorm::apply(LeafState&, const Tensor&, const Tensor& dx) const {
  double norm;
  if (std::isinf(p)) norm = max(abs(dx)).item<double>();
  else norm = std::pow(sum(pow(abs(dx).f64(), p)).item<double>(), 1.0 / p);
  if (!std::isfinite(norm))
    flux::detail::fail("[ClipNorm] the gradient's ", p, "-norm is ", norm, "; refusing to rescale a non-finite gradient");
  if (norm > omega) return dx * (omega / norm);
  return dx;
}

std::shared_ptr<Rule> OptimiserChain::clone() const {
  auto c = std::make_shared<OptimiserChain>();
  for (auto& r : rules) c->rules.push_back(r->clone());
  return c;
}
std::string OptimiserChain::name() const {
  std::string s = "OptimiserChain(";
  for (size_t i = 0; i < rules.size(); ++i) s += (i ? ", " : "") + rules[i]->name();
  return s + ")";
}
void OptimiserChain::init(LeafState& s, const Tensor& x) const {
  s.children.assign(rules.size(), LeafState{});
  for (size_t i = 0; i < rules.size(); ++i) rules[i]->init(s.children[i], x);
}
Tensor OptimiserChain::apply(LeafState& s, const Tensor& x, const Tensor& dx) const {
  Tensor d = dx;
  for (size_t i = 0; i < rules.size(); ++i) d = rules[i]->apply(s.children[i], x, d);
  return d;
}
void OptimiserChain::adjust(double eta) {
  learning_rate("OptimiserChain", eta);  // before any rule changes: all or nothing
  for (auto& r : rules) r->adjust(eta);
}

void adjust(State& state, double eta) {
  if (!state.rule) flux::detail::fail("[adjust] the optimiser state is empty; make it with setup(rule, model)");
  state.rule->adjust(eta);
  learning_rate("adjust", eta);  // rules without a rate (WeightDecay, ClipGrad) must not hide a NaN
}

namespace detail {
namespace {
// The state's buffers must match their array (a model moved or reshaped after setup() would let the
// kernels read the wrong memory).
void check_leaf_state(const LeafState& s, const Tensor& x, size_t i) {
  for (const Tensor& b : s.buffers) {
    if (b.device() != x.device())
      flux::detail::fail("[update] the optimiser state of array ", i, " is on ", to_string(b.device()),
                         " but the array is on ", to_string(x.device()), "; call setup(rule, model) after moving the model");
    if (b.shape() != x.shape())
      flux::detail::fail("[update] the optimiser state of array ", i, " has shape ", to_string(b.shape()),
                         " but the array has shape ", to_string(x.shape()), "; call setup(rule, model) for this model");
  }
  for (const LeafState& c : s.children) check_leaf_state(c, x, i);
}
}  // namespace

namespace {
// The arrays optimisers::update is writing right now, in any thread.
std::mutex g_updating_mutex;
std::unordered_set<const Storage*>& updating() {
  static std::unordered_set<const Storage*> set;
  return set;
}

// Claims every array of one update for its duration. Training one model from two threads is a user
// error (README, "Threads"): their steps would interleave into run-to-run different results. A second
// update that finds an array claimed throws instead; one lock per update, one set entry per array.
class UpdateClaim {
 public:
  explicit UpdateClaim(const std::vector<Tensor>& xs) {
    std::lock_guard<std::mutex> lock(g_updating_mutex);
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].defined()) continue;
      const Storage* s = xs[i].impl()->storage.get();
      if (std::find(held_.begin(), held_.end(), s) != held_.end()) continue;  // views of one array
      if (!updating().insert(s).second) {
        for (const Storage* h : held_) updating().erase(h);
        held_.clear();
        flux::detail::fail("[update] another thread is updating the same model at this moment (array ", i, ", ",
                           summary(xs[i]), "): training one model from two threads is not supported. Give each ",
                           "thread its own model (deepcopy) and optimiser state, or update from one thread");
      }
      held_.push_back(s);
    }
  }
  ~UpdateClaim() {
    std::lock_guard<std::mutex> lock(g_updating_mutex);
    for (const Storage* h : held_) updating().erase(h);
  }
  UpdateClaim(const UpdateClaim&) = delete;
  UpdateClaim& operator=(const UpdateClaim&) = delete;

 private:
  std::vector<const Storage*> held_;
};
}  // namespace

bool is_updating(const Tensor& t) {
  if (!t.defined()) return false;
  std::lock_guard<std::mutex> lock(g_updating_mutex);
  return updating().count(t.impl()->storage.get()) != 0;
}

namespace {
void check_leaf_matches(const std::string& api, const Rule& rule, const LeafState& s, const Tensor& x,
                        const std::string& where) {
  if (s.t < 0) flux::detail::fail("[", api, "] the optimiser state of ", where, " has step count ", s.t, " (must be >= 0)");
  if (auto* chain = dynamic_cast<const OptimiserChain*>(&rule)) {
    if (s.children.size() != chain->rules.size())
      flux::detail::fail("[", api, "] the optimiser state of ", where, " has ", s.children.size(), " parts but ",
                         rule.name(), " has ", chain->rules.size(), " rules; make it with setup(rule, model)");
    for (size_t k = 0; k < s.children.size(); ++k)
      check_leaf_matches(api, *chain->rules[k], s.children[k], x, where + " (rule " + std::to_string(k) + ")");
    return;
  }
  if (!is_floating(x.dtype())) return;  // integer arrays are not trained; their state is not read
  if (rule.buffer_count() < 0) return;  // a user's rule: its buffers are its own business
  if (s.buffers.size() != size_t(rule.buffer_count()))
    flux::detail::fail("[", api, "] the optimiser state of ", where, " has ", s.buffers.size(), " buffers but ",
                       rule.name(), " keeps ", rule.buffer_count(), "; make it with setup(rule, model)");
  for (size_t j = 0; j < s.buffers.size(); ++j) {
    const Tensor& b = s.buffers[j];
    if (!b.defined() || b.shape() != x.shape() || b.dtype() != x.dtype() || b.device() != x.device())
      flux::detail::fail("[", api, "] the optimiser state of ", where, " (buffer ", j, ": ",
                         b.defined() ? summary(b) : std::string("undefined"), ") does not match its array (",
                         summary(x), "); the state belongs to another model: make it with setup(rule, model)");
  }
}
}  // namespace

void check_state_matches(const std::string& api, const State& s, const std::vector<Tensor>& xs) {
  if (!s.rule) flux::detail::fail("[", api, "] the optimiser state is empty; make it with setup(rule, model)");
  s.rule->validate();
  if (s.steps < 0) flux::detail::fail("[", api, "] the optimiser state's step count is ", s.steps, " (must be >= 0)");
  if (xs.size() != s.leaves.size())
    flux::detail::fail("[", api, "] the model has ", xs.size(), " arrays but the optimiser state was set up for ",
                       s.leaves.size(), "; the state belongs to another model: make it with setup(rule, model)");
  for (size_t i = 0; i < xs.size(); ++i) check_leaf_matches(api, *s.rule, s.leaves[i], xs[i], "array " + std::to_string(i));
}

void update_arrays(State& state, std::vector<Tensor> xs, const std::vector<Tensor>& dxs) {
  if (!state.rule) flux::detail::fail("[update] the optimiser state is empty; make it with setup(rule, model)");
  state.rule->validate();  // fields are public: a NaN set after setup() must not reach the weights
  if (xs.size() != state.leaves.size())
    flux::detail::fail("[update] the model has ", xs.size(), " arrays but the optimiser state was set up for ",
                       state.leaves.size(), "; call setup(rule, model) for this model");
  if (dxs.size() != xs.size())
    flux::detail::fail("[update] the gradient has ", dxs.size(), " arrays but the model has ", xs.size());
  UpdateClaim claim(xs);
  autodiff::NoGrad no_grad;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor& x = xs[i];
    const Tensor& dx = dxs[i];
    if (dx.shape() != x.shape())
      flux::detail::fail("[update] gradient ", i, " has shape ", to_string(dx.shape()), " but its array has shape ",
                         to_string(x.shape()));
    if (dx.device() != x.device())
      flux::detail::fail("[update] gradient ", i, " is on ", to_string(dx.device()), " but its array is on ",
                         to_string(x.device()));
    if (!is_floating(x.dtype())) continue;  // integer arrays are not trained
    check_leaf_state(state.leaves[i], x, i);
    if (state.rule->apply_fused(state.leaves[i], x, dx)) continue;
    Tensor step = state.rule->apply(state.leaves[i], x, dx);
    if (step.dtype() != x.dtype()) step = step.cast(x.dtype());
    sub_(x, step);
  }
  ++state.steps;
}
}  // namespace detail

}  // namespace flux::optimisers

namespace flux::detail {
bool being_updated(const Tensor& t) { return optimisers::detail::is_updating(t); }
}  // namespace flux::detail
