// Loss values on every device against float64 host formulas (Flux's definitions).
#include <cmath>
#include <functional>
#include <random>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;

namespace {
constexpr double kEps = 0x1p-23;  // Flux's default eps for Float32 predictions: epseltype = eps(Float32)
constexpr int64_t N = 5, C = 4;

std::vector<double> random_vec(size_t n, double lo, double hi, uint64_t s) {
  std::mt19937_64 gen(s);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}
// Rows of `v` (N, C) normalised to probabilities.
std::vector<double> normalise_rows(std::vector<double> v) {
  for (int64_t i = 0; i < N; ++i) {
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += v[i * C + j];
    for (int64_t j = 0; j < C; ++j) v[i * C + j] /= s;
  }
  return v;
}
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
std::vector<double> elementwise(const std::vector<double>& a, const std::vector<double>& b,
                                const std::function<double(double, double)>& f) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size(); ++i) out.push_back(f(a[i], b[i]));
  return out;
}
std::vector<double> row_sums(const std::vector<double>& v) {
  std::vector<double> out(N, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < C; ++j) out[i] += v[i * C + j];
  return out;
}
Tensor on(const std::vector<double>& v, Device d) { return to(Tensor(v, Shape{N, C}).f32(), d); }

class Losses : public ::testing::TestWithParam<Device> {};

// Each loss: its value with agg = mean, sum and none against the host formula.
struct LossCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&, LossOptions)> loss;
  std::vector<double> yhat, y;
  std::vector<double> per_element;  // elementwise losses, or per observation when per_observation
  bool per_observation;
};

std::vector<LossCase> loss_cases() {
  auto yhat = random_vec(N * C, -2, 2, 1), y = random_vec(N * C, -2, 2, 2);
  auto p = normalise_rows(random_vec(N * C, 0.05, 1, 3)), q = normalise_rows(random_vec(N * C, 0.05, 1, 4));
  auto prob = random_vec(N * C, 0.05, 0.95, 5), target = random_vec(N * C, 0, 1, 6);
  std::vector<double> onehot_y(N * C, 0.0);
  for (int64_t i = 0; i < N; ++i) onehot_y[i * C + (i % C)] = 1;
  auto logits = random_vec(N * C, -10, 10, 7);
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  // logsoftmax of logits row by row
  std::vector<double> lsm(N * C);
  for (int64_t i = 0; i < N; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < C; ++j) m = std::max(m, logits[i * C + j]);
    for (int64_t j = 0; j < C; ++j) s += std::exp(logits[i * C + j] - m);
    for (int64_t j = 0; j < C; ++j) lsm[i * C + j] = logits[i * C + j] - m - std::log(s);
  }
  auto huber_ref = [](double delta) {
    return [delta](double a, double b) {
      double e = std::abs(a - b);
      return e < delta ? 0.5 * e * e : delta * (e - 0.5 * delta);
    };
  };
  return {
      {"mse", [](auto& a, auto& b, auto o) { return mse(a, b, o); }, yhat, y,
       elementwise(yhat, y, [](double a, double b) { return (a - b) * (a - b); }), false},
      {"mae", [](auto& a, auto& b, auto o) { return mae(a, b, o); }, yhat, y,
       elementwise(yhat, y, [](double a, double b) { return std::abs(a - b); }), false},
      {"crossentropy", [](auto& a, auto& b, auto o) { return crossentropy(a, b, o); }, p, q,
       row_sums(elementwise(p, q, [](double a, double b) { return -b * std::log(a + kEps); })), true},
      {"crossentropy_onehot", [](auto& a, auto& b, auto o) { return crossentropy(a, b, o); }, p, onehot_y,
       row_sums(elementwise(p, onehot_y, [](double a, double b) { return -b * std::log(a + kEps); })), true},
      {"logitcrossentropy", [](auto& a, auto& b, auto o) { return logitcrossentropy(a, b, o); }, logits, onehot_y,
       row_sums(elementwise(lsm, onehot_y, [](double l, double b) { return -b * l; })), true},
      {"binarycrossentropy", [](auto& a, auto& b, auto o) { return binarycrossentropy(a, b, o); }, prob, target,
       elementwise(prob, target, [](double a, double b) { return -b * std::log(a + kEps) - (1 - b) * std::log(1 - a + kEps); }), false},
      {"logitbinarycrossentropy", [](auto& a, auto& b, auto o) { return logitbinarycrossentropy(a, b, o); }, logits, target,
       elementwise(logits, target, [&](double x, double b) { return -b * std::log(sig(x)) - (1 - b) * std::log(1 - sig(x)); }), false},
      {"huber", [](auto& a, auto& b, auto o) { return huber(a, b, o); }, yhat, y, elementwise(yhat, y, huber_ref(1.0)), false},
      {"huber_delta_0.5", [](auto& a, auto& b, auto o) { return huber(a, b, o, 0.5); }, yhat, y,
       elementwise(yhat, y, huber_ref(0.5)), false},
      {"kldivergence", [](auto& a, auto& b, auto o) { return kldivergence(a, b, o); }, p, q,
       row_sums(elementwise(p, q, [](double a, double b) { return b * std::log(b) - b * std::log(a); })), true},
  };
}
}  // namespace

TEST_P(Losses, MatchHostFormulasForEveryAggregation) {
  Device d = GetParam();
  for (const LossCase& c : loss_cases()) {
    SCOPED_TRACE(c.name);
    Tensor yhat = on(c.yhat, d), y = on(c.y, d);
    Tensor m = c.loss(yhat, y, {});
    EXPECT_EQ(m.ndim(), 0);
    EXPECT_EQ(m.device(), d);
    EXPECT_EQ(m.dtype(), DType::f32);
    EXPECT_LE(max_rel_error(m, {mean_of(c.per_element)}), 1e-4);
    EXPECT_LE(max_rel_error(c.loss(yhat, y, {.agg = Agg::sum}), {sum_of(c.per_element)}), 1e-4);
    Tensor none = c.loss(yhat, y, {.agg = Agg::none});
    EXPECT_EQ(none.shape(), (c.per_observation ? Shape{N} : Shape{N, C}));
    EXPECT_LE(max_rel_error(none, c.per_element), 1e-4);
    // float64 on the CPU agrees closely
    if (d.is_cpu()) {
      Tensor m64 = c.loss(Tensor(c.yhat, Shape{N, C}), Tensor(c.y, Shape{N, C}), {});
      EXPECT_EQ(m64.dtype(), DType::f64);
      EXPECT_LE(max_rel_error(m64, {mean_of(c.per_element)}), 1e-6);
    }
  }
}

TEST_P(Losses, KnownValues) {
  Device d = GetParam();
  Tensor a = to(Tensor({1, 2, 3}), d), b = to(Tensor({1, 4, 0}), d);
  EXPECT_FLOAT_EQ(mse(a, b).item<float>(), (0 + 4 + 9) / 3.0f);
  EXPECT_FLOAT_EQ(mae(a, b).item<float>(), (0 + 2 + 3) / 3.0f);
  EXPECT_FLOAT_EQ(mse(a, a).item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(huber(a, b).item<float>(), (0 + 1.5f + 2.5f) / 3.0f);
  // crossentropy of a perfect one-hot prediction is ~0; uniform prediction gives log(C)
  Tensor y = to(Tensor({{0, 1, 0}, {1, 0, 0}}), d);
  EXPECT_NEAR(crossentropy(y, y).item<float>(), 0.0f, 1e-6);
  EXPECT_NEAR(crossentropy(to(full({2, 3}, 1.0 / 3), d), y).item<float>(), std::log(3.0f), 1e-5);
  EXPECT_NEAR(logitcrossentropy(to(zeros({2, 3}), d), y).item<float>(), std::log(3.0f), 1e-5);
  EXPECT_NEAR(kldivergence(y, y).item<float>(), 0.0f, 1e-5);
  // logit losses stay finite for huge logits
  Tensor big = to(Tensor({{1000, -1000, 0}, {-1000, 1000, 0}}), d);
  EXPECT_TRUE(std::isfinite(logitcrossentropy(big, y).item<float>()));
  EXPECT_NEAR(logitcrossentropy(big, y).item<float>(), 2000.0f, 1e-2);  // both targets sit at logit -1000
  Tensor lb = logitbinarycrossentropy(to(Tensor({100, -100}), d), to(Tensor({1, 0}), d));
  EXPECT_NEAR(lb.item<float>(), 0.0f, 1e-6);
  Tensor lb2 = logitbinarycrossentropy(to(Tensor({-100}), d), to(Tensor({1}), d));
  EXPECT_NEAR(lb2.item<float>(), 100.0f, 1e-3);
  // integer targets are accepted and converted
  Tensor yi = to(Tensor(std::vector<int64_t>{1, 4, 0}, Shape{3}), d);
  EXPECT_FLOAT_EQ(mse(a, yi).item<float>(), (0 + 4 + 9) / 3.0f);
}

// The gradient with respect to a one-hot target, as Flux's (Zygote through LogExpFunctions' xlogy rule,
// d/dx xlogy(x, y) = log y also where x == 0): -log(yhat + eps) / N for crossentropy's zeros too, not 0.
// Checked against the closed form in float64 and against central differences of the loss itself.
TEST_P(Losses, TargetGradientFollowsFluxXlogyRuleAtZeroTargets) {
  Device d = GetParam();
  const std::vector<double> p = normalise_rows(random_vec(N * C, 0.1, 1.0, 11));
  std::vector<double> t(N * C, 0.0), u = random_vec(N * C, 0.1, 0.9, 12);
  for (int64_t i = 0; i < N; ++i) t[size_t(i * C + i % C)] = 1.0;  // one-hot: most entries exactly 0
  Tensor yhat = to(Tensor(p, Shape{N, C}), d), target = to(Tensor(t, Shape{N, C}), d);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> loss;
    std::function<double(double, double)> dloss_dt;  // per element, before the mean over N
    double scale;
  };
  const std::vector<Case> cases = {
      {"crossentropy", [](auto& a, auto& b) { return crossentropy(a, b); },
       [](double q, double) { return -std::log(q + kEps); }, 1.0 / double(N)},
      {"binarycrossentropy", [](auto& a, auto& b) { return binarycrossentropy(a, b); },
       [](double q, double) { return -std::log(q + kEps) + std::log(1 - q + kEps); }, 1.0 / double(N * C)},
      // kldivergence = sum(xlogy(t, t) - xlogy(t, yhat)): d/dt = log t + 1 - log(yhat + eps) where t > 0;
      // at t == 0, Flux's rule gives log 0 = -inf for the first term: checked at the ones only.
      {"kldivergence", [](auto& a, auto& b) { return kldivergence(a, b); },
       [](double q, double tt) { return tt > 0 ? std::log(tt) + 1 - std::log(q + kEps) : 0.0; }, 1.0 / double(N)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor g = gradient([&](const Tensor& tt) { return c.loss(yhat, tt); }, target);
    ASSERT_EQ(g.shape(), (Shape{N, C})) << to_string(g.shape());
    std::vector<double> got = g.to_vector<double>();
    // finite differences of the float64 loss on the CPU, with respect to each target entry
    Tensor p64 = Tensor(p, Shape{N, C}).cast(Float64);
    const double h = 1e-6;
    for (size_t k = 0; k < t.size(); ++k) {
      if (std::string(c.name) == "kldivergence" && t[k] == 0) continue;
      const double want = c.dloss_dt(p[k], t[k]) * c.scale;
      EXPECT_NEAR(got[k], want, 1e-4 * std::max(1.0, std::abs(want))) << "element " << k;
      std::vector<double> hi = t, lo = t;
      hi[k] += h, lo[k] -= h;
      const double fd = (c.loss(p64, Tensor(hi, Shape{N, C}).cast(Float64)).item<double>() -
                         c.loss(p64, Tensor(lo, Shape{N, C}).cast(Float64)).item<double>()) / (2 * h);
      EXPECT_NEAR(fd, c.dloss_dt(p[k], t[k]) * c.scale, 1e-5 * std::max(1.0, std::abs(fd))) << "element " << k;
    }
  }
}

FLUX_DEVICE_SUITE(Losses);
