// Optimiser rules against hand-computed steps (Optimisers.jl's formulas), on every device.
#include <cmath>
#include <functional>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using namespace flux::optimisers;
using flux::testing::max_rel_error;
using ::testing::HasSubstr;

namespace {
const std::vector<double> kX = {1.0, -2.0, 3.0, 0.5};
const std::vector<double> kG1 = {0.5, -1.0, 2.0, -0.25};
const std::vector<double> kG2 = {-0.1, 0.3, 1.0, 0.0};

// A one-array model: the rules see exactly one parameter.
struct Param {
  Tensor w;
};
FLUX_LAYER(Param, w)

Param param_on(const std::vector<double>& v, Device d) { return Param{to(Tensor(v, Shape{4}).f32(), d)}; }

using Step = std::function<std::vector<double>(std::vector<double>& x, const std::vector<double>& g)>;

// Runs two steps of `rule` on the device and of `reference` on the host; compares after each step.
void check_rule(const Rule& rule, Device d, const Step& reference) {
  SCOPED_TRACE(rule.name());
  Param m = param_on(kX, d);
  Tensor alias = m.w;  // update works in place
  State s = setup(rule, m);
  std::vector<double> x = kX;
  for (const auto& g : {kG1, kG2}) {
    update(s, m, param_on(g, d));
    reference(x, g);
    EXPECT_LE(max_rel_error(m.w, x), 1e-5);
    EXPECT_TRUE(alias.same_storage(m.w));
    EXPECT_EQ(m.w.device(), d);
  }
}

// Per-element state held by the host references.
struct Buffers {
  std::vector<double> a = std::vector<double>(4, 0.0), b = std::vector<double>(4, 0.0);
  int t = 0;
};

class Optimisers : public ::testing::TestWithParam<Device> {};
}  // namespace

TEST_P(Optimisers, Descent) {
  check_rule(Descent(0.1), GetParam(), [](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) x[i] -= 0.1 * g[i];
    return x;
  });
}

TEST_P(Optimisers, Momentum) {
  auto st = std::make_shared<Buffers>();
  check_rule(Momentum(0.01, 0.9), GetParam(), [st](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) {
      st->a[i] = 0.9 * st->a[i] + 0.01 * g[i];
      x[i] -= st->a[i];
    }
    return x;
  });
}

TEST_P(Optimisers, Nesterov) {
  auto st = std::make_shared<Buffers>();
  double eta = 0.05, rho = 0.8;
  check_rule(Nesterov(eta, rho), GetParam(), [=](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) {
      double step = -rho * rho * st->a[i] + (1 + rho) * eta * g[i];
      st->a[i] = rho * st->a[i] - eta * g[i];
      x[i] -= step;
    }
    return x;
  });
}

TEST_P(Optimisers, RMSProp) {
  auto st = std::make_shared<Buffers>();
  double eta = 0.01, rho = 0.9, eps = 1e-8;
  check_rule(RMSProp(eta, rho, eps), GetParam(), [=](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) {
      st->a[i] = rho * st->a[i] + (1 - rho) * g[i] * g[i];
      x[i] -= eta * g[i] / (std::sqrt(st->a[i]) + eps);
    }
    return x;
  });
}

namespace {
Step adam_reference(double eta, double b1, double b2, double eps, double lambda) {
  auto st = std::make_shared<Buffers>();
  return [=](auto& x, auto& g) {
    ++st->t;
    for (int i = 0; i < 4; ++i) {
      st->a[i] = b1 * st->a[i] + (1 - b1) * g[i];
      st->b[i] = b2 * st->b[i] + (1 - b2) * g[i] * g[i];
      double mhat = st->a[i] / (1 - std::pow(b1, st->t)), vhat = st->b[i] / (1 - std::pow(b2, st->t));
      x[i] -= eta * mhat / (std::sqrt(vhat) + eps) + eta * lambda * x[i];
    }
    return x;
  };
}
}  // namespace

TEST_P(Optimisers, Adam) {
  check_rule(Adam(0.01, 0.9, 0.999, 1e-8), GetParam(), adam_reference(0.01, 0.9, 0.999, 1e-8, 0));
  check_rule(Adam(0.1, 0.5, 0.9, 1e-3), GetParam(), adam_reference(0.1, 0.5, 0.9, 1e-3, 0));
}

TEST_P(Optimisers, AdamW) {
  check_rule(AdamW(0.01, 0.9, 0.999, 0.1, 1e-8), GetParam(), adam_reference(0.01, 0.9, 0.999, 1e-8, 0.1));
}

TEST_P(Optimisers, AdamUnfusedPathMatchesFused) {
  // In a chain, Adam runs through apply() rather than the fused kernel; the steps must agree.
  check_rule(OptimiserChain(Adam(0.01)), GetParam(), adam_reference(0.01, 0.9, 0.999, 1e-8, 0));
  check_rule(OptimiserChain(AdamW(0.01, 0.9, 0.999, 0.1)), GetParam(), adam_reference(0.01, 0.9, 0.999, 1e-8, 0.1));
}

TEST_P(Optimisers, WeightDecayClipGradClipNormInChains) {
  Device d = GetParam();
  check_rule(OptimiserChain(WeightDecay(0.1), Descent(0.5)), d, [](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) x[i] -= 0.5 * (g[i] + 0.1 * x[i]);
    return x;
  });
  check_rule(OptimiserChain(ClipGrad(0.4), Descent(1.0)), d, [](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) x[i] -= std::clamp(g[i], -0.4, 0.4);
    return x;
  });
  auto clip_norm = [](double omega, double p) {
    return [=](auto& x, auto& g) {
      double n = 0;
      for (double v : g) n = std::isinf(p) ? std::max(n, std::abs(v)) : n + std::pow(std::abs(v), p);
      if (!std::isinf(p)) n = std::pow(n, 1 / p);
      double scale = n > omega ? omega / n : 1.0;
      for (int i = 0; i < 4; ++i) x[i] -= g[i] * scale;
      return x;
    };
  };
  check_rule(OptimiserChain(ClipNorm(1.0), Descent(1.0)), d, clip_norm(1.0, 2.0));
  check_rule(OptimiserChain(ClipNorm(10.0), Descent(1.0)), d, clip_norm(10.0, 2.0));  // below the bound: unchanged
  check_rule(OptimiserChain(ClipNorm(0.5, 1.0), Descent(1.0)), d, clip_norm(0.5, 1.0));
  check_rule(OptimiserChain(ClipNorm(0.5, INFINITY), Descent(1.0)), d, clip_norm(0.5, INFINITY));
  // a chain with stateful rules on both sides
  auto mom = std::make_shared<Buffers>();
  check_rule(OptimiserChain(ClipGrad(1.0), Momentum(0.1, 0.5)), d, [mom](auto& x, auto& g) {
    for (int i = 0; i < 4; ++i) {
      mom->a[i] = 0.5 * mom->a[i] + 0.1 * std::clamp(g[i], -1.0, 1.0);
      x[i] -= mom->a[i];
    }
    return x;
  });
}

TEST_P(Optimisers, AdjustChangesTheLearningRate) {
  Device d = GetParam();
  Param m = param_on(kX, d);
  State s = setup(Descent(0.1), m);
  adjust(s, 0.5);
  update(s, m, param_on(kG1, d));
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(kX[i] - 0.5 * kG1[i]);
  EXPECT_LE(max_rel_error(m.w, want), 1e-6);
  // adjust reaches every rule in a chain
  Param m2 = param_on(kX, d);
  State s2 = setup(OptimiserChain(WeightDecay(0.0), Descent(0.1)), m2);
  adjust(s2, 1.0);
  update(s2, m2, param_on(kG1, d));
  want.clear();
  for (int i = 0; i < 4; ++i) want.push_back(kX[i] - kG1[i]);
  EXPECT_LE(max_rel_error(m2.w, want), 1e-6);
  // Adam's step size follows eta
  Param m3 = param_on(kX, d);
  State s3 = setup(Adam(0.1), m3);
  adjust(s3, 0.001);
  update(s3, m3, param_on(kG1, d));
  Step ref = adam_reference(0.001, 0.9, 0.999, 1e-8, 0);
  std::vector<double> x = kX;
  ref(x, kG1);
  EXPECT_LE(max_rel_error(m3.w, x), 1e-6);
}

TEST_P(Optimisers, UpdatesAWholeModelFromItsGradient) {
  Device d = GetParam();
  seed(11);
  auto model = fmap([&](const Tensor& t) { return to(t, d); }, Chain(Dense(3, 4, relu), Dense(4, 2)));
  Tensor x = to(randn({8, 3}), d), y = to(randn({8, 2}), d);
  auto before = params(model);
  std::vector<std::vector<double>> old;
  for (auto& p : before) old.push_back(p.to_vector<double>());
  auto g = gradient([&](const auto& m) { return mse(m(x), y); }, model);
  State s = setup(Descent(0.1), model);
  EXPECT_EQ(s.leaves.size(), 4u);
  update(s, model, g);
  auto after = params(model), grads = params(g);
  for (size_t i = 0; i < after.size(); ++i) {
    auto gi = grads[i].to_vector<double>();
    std::vector<double> want;
    for (size_t k = 0; k < gi.size(); ++k) want.push_back(old[i][k] - 0.1 * gi[k]);
    EXPECT_LE(max_rel_error(after[i], want), 1e-6) << "array " << i;
  }
}

TEST_P(Optimisers, StateOnAnotherDeviceIsRefused) {
  Device d = GetParam();
  if (d.is_cpu()) GTEST_SKIP() << "needs a second device";
  Param m = param_on(kX, Device());
  State s = setup(Adam(), m);  // buffers on the CPU
  Param moved{to(m.w, d)};
  EXPECT_THAT([&] { update(s, moved, moved); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[update] the optimiser state of array 0 is on CPU but the array is on " + to_string(d))));
}

TEST_P(Optimisers, TrainingReducesTheLoss) {
  Device d = GetParam();
  seed(3);
  auto model = fmap([&](const Tensor& t) { return to(t, d); }, Chain(Dense(2, 16, flux::tanh), Dense(16, 1)));
  Tensor x = to(rand({64, 2}), d);
  Tensor y = sum(x * x, 1, true);  // a smooth target
  State s = setup(Adam(0.01), model);
  auto loss = [&](const auto& m) { return mse(m(x), y); };
  float first = loss(model).item<float>();
  for (int i = 0; i < 300; ++i) {
    auto [l, g] = withgradient(loss, model);
    update(s, model, g);
  }
  float last = loss(model).item<float>();
  EXPECT_LT(last, first * 0.05f);
  EXPECT_EQ(s.leaves[0].t, 300);
}

TEST_P(Optimisers, FusedAdamOnLargeArraysMatchesHost) {
  // Large enough for the vectorised and threaded kernels, with a remainder that is not a multiple of 16.
  Device d = GetParam();
  const int64_t n = 100003;
  seed(21);
  Tensor x0 = randn({n}), g1 = randn({n}), g2 = randn({n});
  for (double lambda : {0.0, 0.1}) {
    SCOPED_TRACE(lambda);
    Param m{to(x0, d)};
    State s = setup(AdamW(0.01, 0.9, 0.999, lambda, 1e-8), m);
    std::vector<double> x = x0.to_vector<double>(), mom(n, 0.0), vel(n, 0.0);
    int t = 0;
    for (const Tensor& g : {g1, g2}) {
      update(s, m, Param{to(g, d)});
      ++t;
      std::vector<double> gv = g.to_vector<double>();
      for (int64_t i = 0; i < n; ++i) {
        mom[i] = 0.9 * mom[i] + 0.1 * gv[i];
        vel[i] = 0.999 * vel[i] + 0.001 * gv[i] * gv[i];
        double mhat = mom[i] / (1 - std::pow(0.9, t)), vhat = vel[i] / (1 - std::pow(0.999, t));
        x[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8) + 0.01 * lambda * x[i];
      }
      EXPECT_LE(max_rel_error(m.w, x), 1e-5);
    }
  }
}

FLUX_DEVICE_SUITE(Optimisers);

TEST(OptimiserRules, NamesAndDefaults) {
  EXPECT_EQ(Descent().name(), "Descent(0.1)");
  EXPECT_EQ(Adam().name(), "Adam(0.001, (0.9, 0.999), 1e-08)");
  EXPECT_EQ(Momentum().name(), "Momentum(0.01, 0.9)");
  EXPECT_EQ(OptimiserChain(ClipGrad(1), Descent(0.1)).name(), "OptimiserChain(ClipGrad(1), Descent(0.1))");
}

TEST(OptimiserRules, TiedArraysAreUpdatedOnce) {
  Tensor w = Tensor({{1, 2}, {3, 4}});
  auto model = Chain(Dense(w, Tensor({0, 0})), Dense(w, Tensor({0, 0})));
  State s = setup(Descent(1.0), model);
  EXPECT_EQ(s.leaves.size(), 3u);
  auto g = fmap([](const Tensor& t) { return ones_like(t); }, model);
  update(s, model, g);
  EXPECT_EQ(model.get<0>().weight.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_TRUE(model.get<0>().weight.same_storage(model.get<1>().weight));
}

TEST(OptimiserRules, IntegerArraysAreNotTrained) {
  struct Mixed {};
  Param m{Tensor(std::vector<int64_t>{1, 2, 3, 4}, Shape{4})};
  State s = setup(Adam(), m);
  update(s, m, Param{Tensor(std::vector<int64_t>{1, 1, 1, 1}, Shape{4})});
  EXPECT_EQ(m.w.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(OptimiserRules, DoublePrecisionAndHalfParameters) {
  Param m{Tensor(kX, Shape{4})};
  State s = setup(Adam(0.01), m);
  update(s, m, Param{Tensor(kG1, Shape{4})});
  std::vector<double> x = kX;
  adam_reference(0.01, 0.9, 0.999, 1e-8, 0)(x, kG1);
  EXPECT_EQ(m.w.dtype(), DType::f64);
  EXPECT_LE(max_rel_error(m.w, x), 1e-12);
  Param h{Tensor(kX, Shape{4}).cast(DType::f16)};
  State sh = setup(Descent(0.5), h);
  update(sh, h, Param{Tensor(kG1, Shape{4}).cast(DType::f16)});
  EXPECT_EQ(h.w.dtype(), DType::f16);
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(kX[i] - 0.5 * kG1[i]);
  EXPECT_LE(max_rel_error(h.w, want), 1e-3);
}

TEST(OptimiserRules, Errors) {
  Param m = param_on(kX, Device());
  State s = setup(Descent(), m);
  struct Two {
    Tensor a, b;
  };
  Param wrong{Tensor({1, 2})};
  EXPECT_THAT([&] { update(s, m, wrong); }, ::testing::ThrowsMessage<Error>(HasSubstr("[update] gradient 0 has shape (2,) but its array has shape (4,)")));
  State empty;
  EXPECT_THAT([&] { update(empty, m, m); }, ::testing::ThrowsMessage<Error>(HasSubstr("[update] the optimiser state is empty")));
  EXPECT_THAT([&] { adjust(empty, 0.1); }, ::testing::ThrowsMessage<Error>(HasSubstr("[adjust]")));
  Param other = param_on(kX, Device());
  State s2 = setup(Descent(), Chain(Dense(2, 2)));
  EXPECT_THAT([&] { update(s2, other, other); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[update] the model has 1 arrays but the optimiser state was set up for 2")));
  // a state made for arrays of another shape is refused, not read out of bounds
  Param small{Tensor({1, 2})};
  State sa = setup(Adam(), small);
  EXPECT_THAT([&] { update(sa, m, m); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[update] the optimiser state of array 0 has shape (2,) but the array has shape (4,)")));
  State sm = setup(OptimiserChain(ClipGrad(), Momentum()), small);
  EXPECT_THAT([&] { update(sm, m, m); }, ::testing::ThrowsMessage<Error>(HasSubstr("[update] the optimiser state of array 0 has shape (2,)")));
  State sc = setup(OptimiserChain(ClipNorm(1.0), Descent()), m);
  EXPECT_THAT([&] { update(sc, m, Param{Tensor({NAN, 1, 1, 1})}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[ClipNorm]")));
}

// Every hyper-parameter is checked where it is set, by the rule's validate(): constructors, setup(),
// adjust() and update() (fields are public), with PyTorch's limits and a message naming the rule.
TEST(OptimiserRules, HyperParametersAreValidatedWhereTheyAreSet) {
  auto refused = [](const std::function<void()>& f, const std::string& fragment) {
    EXPECT_THAT(f, ::testing::ThrowsMessage<Error>(HasSubstr(fragment))) << fragment;
  };
  refused([] { (void)Adam(NAN); }, "[Adam] invalid learning rate: nan (must be finite and >= 0)");
  refused([] { (void)Adam(-1e-3); }, "[Adam] invalid learning rate: -0.001 (must be finite and >= 0)");
  refused([] { (void)Adam(INFINITY); }, "[Adam] invalid learning rate: inf");
  refused([] { (void)Adam({.beta = {1.0, 0.999}}); }, "[Adam] invalid beta parameter at index 0: 1 (must be in [0, 1))");
  refused([] { (void)Adam(1e-3, 0.9, -0.5); }, "[Adam] invalid beta parameter at index 1: -0.5");
  refused([] { (void)Adam(1e-3, 0.9, 0.999, -1e-8); }, "[Adam] invalid epsilon: -1e-08");
  refused([] { (void)AdamW({.lambda = -1}); }, "[AdamW] invalid weight decay lambda: -1");
  refused([] { (void)AdamW({.eps = NAN}); }, "[AdamW] invalid epsilon: nan");
  refused([] { (void)Descent(-0.1); }, "[Descent] invalid learning rate: -0.1");
  refused([] { (void)Momentum(0.01, 1.0); }, "[Momentum] invalid momentum rho: 1 (must be in [0, 1))");
  refused([] { (void)Nesterov({.rho = NAN}); }, "[Nesterov] invalid momentum rho: nan");
  refused([] { (void)RMSProp(0.001, 0.9, -1); }, "[RMSProp] invalid epsilon: -1");
  refused([] { (void)RMSProp({.rho = 2}); }, "[RMSProp] invalid rho: 2");
  refused([] { (void)WeightDecay(NAN); }, "[WeightDecay] invalid weight decay lambda: nan");
  refused([] { (void)ClipGrad(-1); }, "[ClipGrad] invalid delta: -1");
  refused([] { (void)ClipNorm(NAN); }, "[ClipNorm] invalid omega: nan");
  refused([] { (void)ClipNorm(1, 0); }, "[ClipNorm] invalid norm p: 0");
  // limits that are allowed: zero rates, no clipping, the max norm
  EXPECT_NO_THROW((void)Adam(0.0));
  EXPECT_NO_THROW((void)ClipGrad(INFINITY));
  EXPECT_NO_THROW((void)ClipNorm(1, INFINITY));

  Param m = param_on(kX, Device());
  State s = setup(Adam(1e-3), m);
  // adjust: refused, and the rate stays what it was
  refused([&] { adjust(s, NAN); }, "[Adam] invalid learning rate: nan");
  refused([&] { adjust(s, -1e-3); }, "[Adam] invalid learning rate: -0.001");
  EXPECT_EQ(static_cast<Adam&>(*s.rule).eta, 1e-3);
  State chain = setup(OptimiserChain(ClipGrad(1), WeightDecay()), m);
  refused([&] { adjust(chain, NAN); }, "invalid learning rate: nan");
  // a field set to nonsense after construction: setup() and update() refuse it, the weights stay
  Adam raw;
  raw.eta = NAN;
  refused([&] { setup(raw, m); }, "[Adam] invalid learning rate: nan");
  static_cast<Adam&>(*s.rule).beta1 = 1.5;
  std::vector<float> w = m.w.to_vector<float>();
  refused([&] { update(s, m, m); }, "[Adam] invalid beta parameter at index 0: 1.5");
  EXPECT_EQ(m.w.to_vector<float>(), w);
}

// A user's rule that keeps a buffer of its own shape (not declared with buffer_count) still saves.
struct ScaledDescent : Rule {
  std::shared_ptr<Rule> clone() const override { return std::make_shared<ScaledDescent>(*this); }
  std::string name() const override { return "ScaledDescent()"; }
  void init(LeafState& s, const Tensor&) const override { s.buffers = {ones({1})}; }
  Tensor apply(LeafState& s, const Tensor&, const Tensor& dx) const override { return dx * s.buffers[0]; }
};

// save_checkpoint refuses a state of another model before writing; load_checkpoint refuses a negative
// step count before copying; a failed save leaves the previous file loadable.
TEST(OptimiserRules, CheckpointStateMustMatchTheModel) {
  const std::string path = ::testing::TempDir() + "flux_ckpt_match.safetensors";
  auto model = Chain(Dense(3, 4), Dense(4, 2));
  auto s = setup(Adam(), model);
  save_checkpoint(path, model, s);
  auto check_kept = [&] {
    auto again = Chain(Dense(3, 4), Dense(4, 2));
    auto s2 = setup(Adam(), again);
    EXPECT_NO_THROW(load_checkpoint(path, again, s2));
    EXPECT_EQ(pytorch_state(again)[0].second.to_vector<float>(), pytorch_state(model)[0].second.to_vector<float>());
  };
  auto other = Chain(Dense(3, 5), Dense(5, 2));
  auto other_state = setup(Adam(), other);
  EXPECT_THAT([&] { save_checkpoint(path, model, other_state); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[save_checkpoint] the optimiser state of array 0 (buffer 0: 5×3")));
  check_kept();
  auto fewer = setup(Adam(), Chain(Dense(3, 4)));
  EXPECT_THAT([&] { save_checkpoint(path, model, fewer); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[save_checkpoint] the model has 4 arrays but the optimiser state was set up for 2")));
  auto desc = setup(Descent(), model);
  desc.rule = Adam().clone();  // a rule that keeps buffers, a state made without them
  EXPECT_THAT([&] { save_checkpoint(path, model, desc); },
              ::testing::ThrowsMessage<Error>(HasSubstr("has 0 buffers but Adam(0.001, (0.9, 0.999), 1e-08) keeps 2")));
  auto f64_state = setup(Adam(), f64(model));
  EXPECT_THAT([&] { save_checkpoint(path, model, f64_state); }, ::testing::ThrowsMessage<Error>(HasSubstr("does not match its array")));
  auto negative = setup(Adam(), model);
  negative.leaves[1].t = -5;
  EXPECT_THAT([&] { save_checkpoint(path, model, negative); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[save_checkpoint] the optimiser state of array 1 has step count -5")));
  check_kept();
  // a file whose step count is -5 (hand-made or corrupt) is refused at load, nothing changed
  TensorMap t = load_state(path);
  t["optimiser.0.t"] = Tensor(std::vector<int64_t>{-5}, Shape{});
  save_state(path + ".bad", t, load_metadata(path));
  auto target = Chain(Dense(3, 4), Dense(4, 2));
  auto target_state = setup(Adam(), target);
  auto w = pytorch_state(target)[0].second.to_vector<float>();
  EXPECT_THAT([&] { load_checkpoint(path + ".bad", target, target_state); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'optimiser.0.t' (a step count) is -5; expected >= 0 (nothing was loaded)")));
  EXPECT_EQ(pytorch_state(target)[0].second.to_vector<float>(), w);
  EXPECT_EQ(target_state.leaves[0].t, 0);
  auto user = setup(ScaledDescent(), model);
  EXPECT_NO_THROW(save_checkpoint(path + ".user", model, user));
  std::remove(path.c_str());
  std::remove((path + ".bad").c_str());
  std::remove((path + ".user").c_str());
}
