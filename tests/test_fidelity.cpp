// Numerical fidelity to Flux/NNlib (issue 16) on every device, float64 and float32:
//  * kldivergence's entropy term is xlogx(y) (0 log 0 = 0, no eps): finite for one-hot targets at eps = 0;
//  * the default eps of crossentropy, binarycrossentropy and kldivergence is epseltype(yhat);
//  * activation gradients stay exact where the forward saturates (gelu, tanh, elu, sigmoid, softplus,
//    swish), whatever the last ulp of the device's tanh/exp (PoCL's tanh stops one ulp short of 1).
// The PyTorch float64 differential suite is tests/reference/.
#include <cmath>
#include <vector>

#include "test_devices.hpp"

using namespace flux;

namespace {

class Fidelity : public ::testing::TestWithParam<Device> {};

Tensor on(const std::vector<double>& v, Shape s, DType t, const Device& d) { return to(Tensor(v, s).cast(t), d); }

double host_xlogy(double x, double y) { return x == 0 ? 0.0 : x * std::log(y); }

// The gradient of sum(f(x)) at x, on d in dtype t, as float64 values.
template <class F> std::vector<double> gradient_at(F f, const std::vector<double>& x, DType t, const Device& d) {
  Tensor xt = on(x, Shape{int64_t(x.size())}, t, d);
  Tensor g = gradient([&](const Tensor& v) { return sum(f(v)); }, xt);
  EXPECT_EQ(g.dtype(), t);
  return g.to_vector<double>();
}

}  // namespace

TEST(FidelityEps, EpseltypeIsMachineEpsilon) {
  EXPECT_EQ(epseltype(DType::f64), std::ldexp(1.0, -52));
  EXPECT_EQ(epseltype(DType::f32), std::ldexp(1.0, -23));
  EXPECT_EQ(epseltype(DType::f16), std::ldexp(1.0, -10));
  EXPECT_EQ(epseltype(DType::bf16), std::ldexp(1.0, -7));
  try {
    epseltype(DType::i64);
    ADD_FAILURE() << "epseltype(Int64) did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[epseltype] needs a floating-point dtype, got Int64");
  }
}

TEST_P(Fidelity, KlDivergenceEntropyTermIsXlogx) {
  const Device d = GetParam();
  // yhat (2, 3) probabilities, one-hot y: Flux gives mean(-log yhat[label]) at eps = 0 (was NaN)
  std::vector<double> p = {0.2, 0.5, 0.3, 0.6, 0.1, 0.3}, y = {0, 1, 0, 0, 0, 1};
  double want = -(std::log(0.5) + std::log(0.3)) / 2;
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor l = kldivergence(on(p, {2, 3}, t, d), on(y, {2, 3}, t, d), {}, 0.0);
    EXPECT_NEAR(l.item<double>(), want, t == DType::f64 ? 1e-15 : 1e-6);
    // its gradient is finite too: -y / yhat
    Tensor g = gradient([&](const Tensor& yh) { return kldivergence(yh, on(y, {2, 3}, t, d), {}, 0.0); }, on(p, {2, 3}, t, d));
    std::vector<double> gv = g.to_vector<double>();
    for (size_t i = 0; i < gv.size(); ++i) EXPECT_NEAR(gv[i], -y[i] / p[i] / 2, t == DType::f64 ? 1e-15 : 1e-6) << i;
  }
  // soft targets, eps = 1e-3: the entropy term has no eps (was y log(y + eps): 4th digit off)
  std::vector<double> q = {0.1, 0.7, 0.2, 0.25, 0.25, 0.5};
  double eps = 1e-3, ref = 0;
  for (size_t i = 0; i < q.size(); ++i) ref += host_xlogy(q[i], q[i]) - host_xlogy(q[i], p[i] + eps);
  Tensor l = kldivergence(on(p, {2, 3}, DType::f64, d), on(q, {2, 3}, DType::f64, d), {.agg = Agg::sum}, eps);
  EXPECT_NEAR(l.item<double>(), ref, 1e-15);
}

TEST_P(Fidelity, DefaultEpsIsEpseltypeOfThePrediction) {
  const Device d = GetParam();
  // yhat has an exact 0 and a tiny value where y = 1: the eps decides the value
  std::vector<double> p = {1e-20, 0.5, 0.5, 0.0, 0.25, 0.75}, y = {1, 0, 0, 1, 0, 0};
  std::vector<double> bp = {1e-20, 0.5, 0.9, 0.0, 0.25, 1.0}, by = {1, 0, 1, 1, 1, 0};
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const double e = t == DType::f64 ? 0x1p-52 : 0x1p-23;
    const double tol = t == DType::f64 ? 1e-14 : 2e-6;
    double ce = 0, bce = 0, kl = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      double pi = t == DType::f32 ? double(float(p[i])) : p[i], bpi = t == DType::f32 ? double(float(bp[i])) : bp[i];
      ce += -host_xlogy(y[i], pi + e) / 2;
      kl += (host_xlogy(y[i], y[i]) - host_xlogy(y[i], pi + e)) / 2;
      bce += (-host_xlogy(by[i], bpi + e) - host_xlogy(1 - by[i], 1 - bpi + e)) / 6;
    }
    auto rel = [](double got, double want) { return std::abs(got - want) / std::abs(want); };
    EXPECT_LE(rel(crossentropy(on(p, {2, 3}, t, d), on(y, {2, 3}, t, d)).item<double>(), ce), tol);
    EXPECT_LE(rel(kldivergence(on(p, {2, 3}, t, d), on(y, {2, 3}, t, d)).item<double>(), kl), tol);
    EXPECT_LE(rel(binarycrossentropy(on(bp, {6}, t, d), on(by, {6}, t, d)).item<double>(), bce), tol);
  }
  // y = 0 where yhat = 0 with eps = 0: xlogy(0, 0) = 0, as Flux (was 0 * -inf = NaN)
  Tensor l = crossentropy(on({0.0, 1.0}, {1, 2}, DType::f64, d), on({0.0, 1.0}, {1, 2}, DType::f64, d), {}, 0.0);
  EXPECT_EQ(l.item<double>(), 0.0);
}

TEST_P(Fidelity, GeluGradientIsExactWhereItSaturates) {
  const Device d = GetParam();
  std::vector<double> x = {-987, -30, -20, -12, 12, 20, 30, 987};
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<double> y = on(x, {8}, t, d).to_vector<double>();
    std::vector<double> value = gelu(on(x, {8}, t, d)).to_vector<double>();
    std::vector<double> g = gradient_at([](const Tensor& v) { return gelu(v); }, x, t, d);
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] < 0) {
        EXPECT_LE(std::abs(value[i]), 1e-30) << "gelu(" << x[i] << ")";
        EXPECT_LE(std::abs(g[i]), 1e-30) << "gelu'(" << x[i] << ")";  // was -1.3e-4 at -30, -6 at -987 on PoCL
      } else {
        EXPECT_EQ(value[i], y[i]) << "gelu(" << x[i] << ")";
        EXPECT_EQ(g[i], 1.0) << "gelu'(" << x[i] << ")";
      }
    }
  }
}

TEST_P(Fidelity, TanhGradientIsZeroWhereTanhIsOne) {
  const Device d = GetParam();
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    // beyond these, tanh rounds to +-1 in the dtype, so 1 - tanh^2 must be exactly 0
    std::vector<double> x = t == DType::f64 ? std::vector<double>{-40, -20, 20, 40} : std::vector<double>{-30, -10, 10, 30};
    std::vector<double> value = tanh(on(x, {4}, t, d)).to_vector<double>();
    std::vector<double> g = gradient_at([](const Tensor& v) { return tanh(v); }, x, t, d);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(value[i], x[i] > 0 ? 1.0 : -1.0) << "tanh(" << x[i] << ")";
      EXPECT_EQ(g[i], 0.0) << "tanh'(" << x[i] << ")";
    }
  }
}

TEST_P(Fidelity, ActivationGradientsInTheTailsMatchFloat64Derivatives) {
  const Device d = GetParam();
  std::vector<double> x = {-60, -30, -20, -9.5, 9.5, 20, 30, 60};
  auto sig = [](double v) { return v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v)); };
  struct Case {
    const char* name;
    Tensor (*f)(const Tensor&);
    std::function<double(double)> derivative;
    bool relative_in_negative_tail;  // the gradient keeps its relative accuracy as it decays
  };
  std::vector<Case> cases = {
      {"sigmoid", [](const Tensor& v) { return sigmoid(v); }, [&](double v) { return sig(v) * sig(-v); }, true},
      {"softplus", [](const Tensor& v) { return softplus(v); }, [&](double v) { return sig(v); }, true},
      {"swish", [](const Tensor& v) { return swish(v); }, [&](double v) { return sig(v) + v * sig(v) * sig(-v); }, false},
      {"elu", [](const Tensor& v) { return elu(v); }, [](double v) { return v > 0 ? 1.0 : std::exp(v); }, true},
      {"elu_0.5", [](const Tensor& v) { return elu(v, 0.5); }, [](double v) { return v > 0 ? 1.0 : 0.5 * std::exp(v); }, true},
  };
  for (DType t : {DType::f64, DType::f32}) {
    const double eps = t == DType::f64 ? 0x1p-52 : 0x1p-23;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(t));
      std::vector<double> g = gradient_at(c.f, x, t, d);
      for (size_t i = 0; i < x.size(); ++i) {
        double want = c.derivative(x[i]);
        EXPECT_LE(std::abs(g[i] - want), 4 * eps * std::max(1.0, std::abs(want))) << c.name << "'(" << x[i] << ")";
        if (c.relative_in_negative_tail && x[i] < 0 && want > 1e-30) {  // elu was y + a: no digit left at -30
          EXPECT_LE(std::abs(g[i] - want), 16 * eps * want) << c.name << "'(" << x[i] << ") relative";
        }
      }
    }
  }
}

FLUX_DEVICE_SUITE(Fidelity);
