// BatchNorm on every device against a float64 host reference (training and inference), running
// statistics after two steps by hand, finite-difference gradients in float64, Flux's automatic and
// forced modes, non-trainable state (params, optimisers, fmap/| dev, save/load), printing, errors.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>

#include <unistd.h>

#include <gmock/gmock.h>

#include "library_kernels.hpp"
#include "src/ops/ops_internal.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::LibraryKernels;
using flux::testing::max_rel_error;
using ::testing::HasSubstr;

namespace {

template <class T> std::string to_text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const flux::Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<double> uniform(size_t n, double lo, double hi, uint64_t s) {
  std::mt19937_64 gen(s);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

// x (N, C, S) row-major as a flat vector, S = the product of the spatial axes (1 for (N, C)).
struct Layout {
  int64_t n, c, s;
  size_t at(int64_t i, int64_t ch, int64_t k) const { return size_t((i * c + ch) * s + k); }
};
Layout layout_of(const Shape& shape) {
  int64_t s = 1;
  for (int a = 2; a < shape.size(); ++a) s *= shape[a];
  return {shape[0], shape[1], s};
}

// Per-channel batch mean and biased variance, in float64.
void batch_stats(const std::vector<double>& x, Layout L, std::vector<double>& mean, std::vector<double>& var) {
  mean.assign(size_t(L.c), 0.0);
  var.assign(size_t(L.c), 0.0);
  double m = double(L.n * L.s);
  for (int64_t ch = 0; ch < L.c; ++ch) {
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) mean[ch] += x[L.at(i, ch, k)];
    mean[ch] /= m;
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) var[ch] += (x[L.at(i, ch, k)] - mean[ch]) * (x[L.at(i, ch, k)] - mean[ch]);
    var[ch] /= m;
  }
}

// y = act(w (x - mean) / sqrt(var + eps) + b), in float64.
std::vector<double> normalise_ref(const std::vector<double>& x, Layout L, const std::vector<double>& mean,
                                  const std::vector<double>& var, const std::vector<double>& w,
                                  const std::vector<double>& b, double eps, bool relu_act) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < L.n; ++i)
    for (int64_t ch = 0; ch < L.c; ++ch)
      for (int64_t k = 0; k < L.s; ++k) {
        size_t j = L.at(i, ch, k);
        double v = (x[j] - mean[ch]) / std::sqrt(var[ch] + eps);
        if (!w.empty()) v = v * w[ch] + b[ch];
        y[j] = relu_act && v < 0 ? 0.0 : v;
      }
  return y;
}

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

// A BatchNorm with random weight and bias (so that the affine part is exercised).
BatchNorm random_bn(int64_t c, Activation act = Activation(), BatchNormOptions o = {}) {
  BatchNorm bn(c, std::move(act), o);
  if (bn.weight.defined()) {
    bn.weight = Tensor(uniform(size_t(c), 0.5, 1.5, 11), Shape{c}).cast(o.dtype);
    bn.bias = Tensor(uniform(size_t(c), -0.5, 0.5, 12), Shape{c}).cast(o.dtype);
  }
  return bn;
}

class Norm : public ::testing::TestWithParam<Device> {};


}  // namespace

TEST_P(Norm, TrainingForwardMatchesFloat64Reference) {
  Device d = GetParam();
  for (Shape shape : {Shape{4, 3, 5, 5}, Shape{6, 3}, Shape{2, 3, 7}, Shape{2, 3, 2, 3, 2}}) {
    for (bool relu_act : {false, true}) {
      SCOPED_TRACE(to_string(shape) + (relu_act ? " relu" : ""));
      BatchNorm bn = random_bn(3, relu_act ? Activation(relu) : Activation());
      std::vector<double> xs = uniform(size_t(shape.numel()), -3, 5, 3);
      Tensor x = to(Tensor(xs, shape).f32(), d);
      BatchNorm m = trainmode(bn | d);
      Tensor y = m(x);
      EXPECT_EQ(y.shape(), shape);
      EXPECT_EQ(y.device(), d);
      Layout L = layout_of(shape);
      std::vector<double> mean, var;
      batch_stats(vec(x), L, mean, var);
      EXPECT_LE(max_rel_error(y, normalise_ref(vec(x), L, mean, var, vec(bn.weight), vec(bn.bias), 1e-5, relu_act)), 2e-5);
    }
  }
}

TEST_P(Norm, InferenceUsesRunningStatistics) {
  Device d = GetParam();
  Shape shape{5, 4, 3, 3};
  BatchNorm bn = random_bn(4, Activation(), {.eps = 1e-3});
  std::vector<double> rm = {0.5, -1.0, 2.0, 0.0}, rv = {1.5, 0.25, 4.0, 1.0};
  bn.running_mean = Tensor(rm, Shape{4}).f32();
  bn.running_var = Tensor(rv, Shape{4}).f32();
  BatchNorm m = bn | d;
  Tensor x = to(Tensor(uniform(size_t(shape.numel()), -2, 2, 5), shape).f32(), d);
  Tensor y = m(x);  // outside gradient: automatic mode is inference
  Layout L = layout_of(shape);
  EXPECT_LE(max_rel_error(y, normalise_ref(vec(x), L, rm, rv, vec(bn.weight), vec(bn.bias), 1e-3, false)), 1e-5);
  EXPECT_EQ(vec(m.running_mean), rm);  // untouched
  EXPECT_EQ(m.num_batches_tracked.item<int64_t>(), 0);
  // testmode gives the same; affine = false normalises only
  EXPECT_EQ(vec(testmode(m)(x)), vec(y));
  BatchNorm plain = BatchNorm(4, {.eps = 1e-3, .affine = false});
  plain.running_mean = Tensor(rm, Shape{4}).f32();
  plain.running_var = Tensor(rv, Shape{4}).f32();
  EXPECT_LE(max_rel_error((plain | d)(x), normalise_ref(vec(x), L, rm, rv, {}, {}, 1e-3, false)), 1e-5);
}

TEST_P(Norm, RunningStatisticsAfterTwoSteps) {
  Device d = GetParam();
  Shape shape{3, 2, 2, 2};
  BatchNorm bn = trainmode(BatchNorm(2, {.momentum = 0.25}) | d);
  std::vector<double> x1 = uniform(24, -1, 3, 21), x2 = uniform(24, 0, 6, 22);
  bn(to(Tensor(x1, shape).f32(), d));
  bn(to(Tensor(x2, shape).f32(), d));
  // By hand: running = (1 - 0.25) running + 0.25 batch, with the unbiased batch variance (m = 12).
  std::vector<double> want_mean = {0, 0}, want_var = {1, 1};
  for (const auto* x : {&x1, &x2}) {
    std::vector<double> xf;
    for (double v : *x) xf.push_back(double(float(v)));
    std::vector<double> mean, var;
    batch_stats(xf, layout_of(shape), mean, var);
    for (int c = 0; c < 2; ++c) {
      want_mean[c] = 0.75 * want_mean[c] + 0.25 * mean[c];
      want_var[c] = 0.75 * want_var[c] + 0.25 * var[c] * 12.0 / 11.0;
    }
  }
  EXPECT_LE(max_rel_error(bn.running_mean, want_mean), 1e-6);
  EXPECT_LE(max_rel_error(bn.running_var, want_var), 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::i64);
  EXPECT_EQ(bn.num_batches_tracked.shape(), Shape{});
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 2);
  EXPECT_EQ(bn.running_mean.device(), d);
}

TEST_P(Norm, AutomaticModeTrainsInsideGradientOnly) {
  Device d = GetParam();
  Shape shape{4, 3, 2, 2};
  BatchNorm bn = random_bn(3) | d;
  Tensor x = to(Tensor(uniform(48, -2, 4, 31), shape).f32(), d);
  EXPECT_FALSE(bn.training());
  // Outside gradient: running statistics (zeros/ones), so y = w x / sqrt(1 + eps) + b; no update.
  Layout L = layout_of(shape);
  EXPECT_LE(max_rel_error(bn(x), normalise_ref(vec(x), L, {0, 0, 0}, {1, 1, 1}, vec(bn.weight), vec(bn.bias), 1e-5, false)),
            1e-5);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  // Inside gradient: batch statistics, and the running statistics move (in the caller's model).
  std::vector<double> mean, var;
  batch_stats(vec(x), L, mean, var);
  auto want = normalise_ref(vec(x), L, mean, var, vec(bn.weight), vec(bn.bias), 1e-5, false);
  double want_sum = 0;
  for (double v : want) want_sum += v * v;
  bool inside = false;
  auto [loss, g] = withgradient(
      [&](const BatchNorm& m) {
        inside = m.training();
        return sum(square(m(x)));
      },
      bn);
  EXPECT_TRUE(inside);
  EXPECT_NEAR(loss.item<double>(), want_sum, 1e-4 * want_sum);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  std::vector<double> want_rm;
  for (double m : mean) want_rm.push_back(0.1 * m);
  EXPECT_LE(max_rel_error(bn.running_mean, want_rm), 1e-6);
  // The gradient has the model's type; weight/bias got gradients, the non-trainable fields are there too.
  static_assert(std::is_same_v<decltype(g), BatchNorm>);
  EXPECT_EQ(g.weight.shape(), Shape{3});
  EXPECT_GT(max(abs(g.weight)).item<double>(), 0);
  EXPECT_FALSE(bn.training());
}

TEST_P(Norm, TrainmodeAndTestmodeForceTheMode) {
  Device d = GetParam();
  Shape shape{4, 3};
  Tensor x = to(Tensor(uniform(12, -2, 2, 41), shape).f32(), d);
  auto model = Chain(Dense(3, 3), BatchNorm(3), Chain(Dropout(0.5), BatchNorm(3))) | d;
  // testmode: running statistics and no update even inside gradient
  testmode(model);
  EXPECT_EQ(model.get<1>().active, std::optional<bool>(false));
  EXPECT_EQ(model.get<2>().get<0>().active, std::optional<bool>(false));
  EXPECT_EQ(model.get<2>().get<1>().active, std::optional<bool>(false));
  gradient([&](const auto& m) { return sum(m(x)); }, model);
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 0);
  EXPECT_EQ(vec(model.get<1>().running_mean), std::vector<double>(3, 0.0));
  // trainmode: batch statistics and updates outside gradient too
  trainmode(model);
  EXPECT_EQ(model.get<2>().get<1>().active, std::optional<bool>(true));
  EXPECT_TRUE(model.get<2>().get<0>().training());
  model(x);
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(model.get<2>().get<1>().num_batches_tracked.item<int64_t>(), 1);
  // back to automatic: inference outside gradient
  automode(model);
  EXPECT_EQ(model.get<1>().active, std::nullopt);
  model(x);
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 1);
  trainmode(model, std::nullopt);
  EXPECT_EQ(model.get<2>().get<1>().active, std::nullopt);
  testmode(model, false);
  EXPECT_EQ(model.get<1>().active, std::optional<bool>(true));
  // rvalue forms return the model
  BatchNorm t = testmode(BatchNorm(2));
  EXPECT_EQ(t.active, std::optional<bool>(false));
  EXPECT_EQ(layer_string(t), "BatchNorm(2, active=false)");
}

namespace {
struct Block {  // a user layer: the mode walk reaches layers through FLUX_LAYER fields
  Dense dense;
  BatchNorm norm;
  std::vector<Dropout> drops;
  Tensor operator()(const Tensor& x) const { return drops[0](norm(dense(x))); }
};
FLUX_LAYER(Block, dense, norm, drops)
}  // namespace

namespace {
struct Scaled {  // a user layer with its own non-trainable state
  Tensor weight;
  NonTrainable scale;
  Tensor operator()(const Tensor& x) const { return x * weight * scale; }
};
FLUX_LAYER(Scaled, weight, scale)
}  // namespace

TEST_P(Norm, NonTrainableFieldsOfUserLayers) {
  Device d = GetParam();
  Scaled layer{ones({3}), full({3}, 2.0)};
  Scaled m = layer | d;
  EXPECT_EQ(m.scale.device(), d);
  EXPECT_EQ(params(m).size(), 1u);
  EXPECT_EQ(nontrainables(m).size(), 1u);
  ASSERT_EQ(state(m).size(), 2u);
  EXPECT_EQ(state(m)[1].first, "scale");
  Tensor x = to(Tensor(std::vector<float>{1, 2, 3}, Shape{3}), d);
  Scaled g = gradient([&](const Scaled& l) { return sum(l(x)); }, m);
  EXPECT_EQ(vec(g.weight), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(vec(g.scale), (std::vector<double>{1, 2, 3}));  // a gradient exists, but update ignores it
  auto opt = optimisers::setup(optimisers::Descent(0.5), m);
  optimisers::update(opt, m, g);
  EXPECT_EQ(vec(m.weight), (std::vector<double>{0, -1, -2}));
  EXPECT_EQ(vec(m.scale), (std::vector<double>{2, 2, 2}));
}

TEST(Normalisation, ModeWalkReachesUserLayersAndContainers) {
  Block b{Dense(2, 3), BatchNorm(3), {Dropout(0.1), Dropout(0.2)}};
  std::tuple<Block, BatchNorm> t{b, BatchNorm(1)};
  trainmode(t);
  EXPECT_EQ(std::get<0>(t).norm.active, std::optional<bool>(true));
  EXPECT_EQ(std::get<0>(t).drops[1].active, std::optional<bool>(true));
  EXPECT_EQ(std::get<1>(t).active, std::optional<bool>(true));
  testmode(t);
  EXPECT_EQ(std::get<0>(t).drops[0].active, std::optional<bool>(false));
  // state names of the user layer include the non-trainable leaves; params() does not
  auto names = state(b);
  ASSERT_EQ(names.size(), 7u);
  EXPECT_EQ(names[4].first, "norm.running_mean");
  EXPECT_EQ(names[5].first, "norm.running_var");
  EXPECT_EQ(names[6].first, "norm.num_batches_tracked");
  EXPECT_EQ(params(b).size(), 4u);
}

TEST(Normalisation, ModesAndStateThroughSkipConnectionAndParallel) {
  auto model = Chain(SkipConnection(Chain(Dense(3, 3), BatchNorm(3, relu), Dropout(0.5)), plus),
                     Parallel(vcat, BatchNorm(3), Dropout(0.25)));
  trainmode(model);
  EXPECT_EQ(model.get<0>().layers.get<1>().active, std::optional<bool>(true));
  EXPECT_EQ(model.get<0>().layers.get<2>().active, std::optional<bool>(true));
  EXPECT_EQ(model.get<1>().get<0>().active, std::optional<bool>(true));
  EXPECT_EQ(model.get<1>().get<1>().active, std::optional<bool>(true));
  automode(model);
  EXPECT_EQ(model.get<1>().get<0>().active, std::nullopt);
  EXPECT_EQ(params(model).size(), 6u);
  EXPECT_EQ(nontrainable_count(model), 12);
  std::vector<std::string> names;
  for (auto& [name, t] : pytorch_state(model)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.layers.0.weight", "0.layers.0.bias", "0.layers.1.weight",
                                             "0.layers.1.bias", "0.layers.1.running_mean", "0.layers.1.running_var",
                                             "0.layers.1.num_batches_tracked", "1.layers.0.weight", "1.layers.0.bias",
                                             "1.layers.0.running_mean", "1.layers.0.running_var",
                                             "1.layers.0.num_batches_tracked"}));
  // inside gradient both BatchNorms train: their counters move once per call
  Tensor x(uniform(12, -1, 1, 95), Shape{4, 3});
  gradient([&](const auto& m) { return sum(m(x.f32())); }, model);
  EXPECT_EQ(model.get<0>().layers.get<1>().num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(model.get<1>().get<0>().num_batches_tracked.item<int64_t>(), 1);
}

TEST(Normalisation, FiniteDifferenceGradientsInTraining) {
  // L = sum(y .* R) with y = BatchNorm(x) in training mode, float64, for x, weight and bias; on the
  // fused CPU kernels and on the portable path.
  for (bool fused_kernels : {true, false}) {
  SCOPED_TRACE(fused_kernels ? "fused" : "portable");
  LibraryKernels mode(fused_kernels);
  Shape shape{3, 2, 2, 2};
  std::vector<double> x0 = uniform(24, -2, 2, 51), r = uniform(24, 0.5, 1.5, 52);
  std::vector<double> w0 = {1.3, 0.7}, b0 = {0.2, -0.4};
  Tensor R(r, shape);
  auto loss = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    BatchNorm bn(2, relu, {.dtype = DType::f64});
    bn.weight = w;
    bn.bias = b;
    trainmode(bn);
    return sum(bn(x) * R);
  };
  auto value = [&](const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
    return loss(Tensor(x, shape), Tensor(w, Shape{2}), Tensor(b, Shape{2})).item<double>();
  };
  auto [gx, gw, gb] =
      gradient([&](const Tensor& x, const Tensor& w, const Tensor& b) { return loss(x, w, b); }, Tensor(x0, shape),
               Tensor(w0, Shape{2}), Tensor(b0, Shape{2}));
  const double h = 1e-6;
  // Central differences, one coordinate at a time.
  auto numeric = [&](int which, size_t i) {
    auto x = x0, w = w0, b = b0;
    std::vector<double>& v = which == 0 ? x : which == 1 ? w : b;
    v[i] += h;
    double plus = value(x, w, b);
    v[i] -= 2 * h;
    double minus = value(x, w, b);
    return (plus - minus) / (2 * h);
  };
  std::vector<double> gxs = gx.to_vector<double>(), gws = gw.to_vector<double>(), gbs = gb.to_vector<double>();
  for (size_t i = 0; i < x0.size(); ++i) EXPECT_NEAR(gxs[i], numeric(0, i), 1e-6) << "x[" << i << "]";
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(gws[i], numeric(1, i), 1e-6) << "weight[" << i << "]";
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(gbs[i], numeric(2, i), 1e-6) << "bias[" << i << "]";
  }
}

TEST(Normalisation, FiniteDifferenceGradientsInTestMode) {
  // testmode inside gradient: running statistics, gradients for x, weight and bias, both paths.
  Shape shape{2, 3, 4};
  std::vector<double> x0 = uniform(24, -2, 2, 91), r = uniform(24, 0.5, 1.5, 92);
  Tensor R(r, shape);
  auto loss = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    BatchNorm bn(3, {.dtype = DType::f64});
    bn.weight = w;
    bn.bias = b;
    bn.running_mean = Tensor(std::vector<double>{0.5, -0.2, 0.1}, Shape{3});
    bn.running_var = Tensor(std::vector<double>{2.0, 0.5, 1.0}, Shape{3});
    testmode(bn);
    return sum(bn(x) * R);
  };
  std::vector<double> w0 = {1.2, -0.8, 0.6}, b0 = {0.1, 0.2, -0.3};
  for (bool fused_kernels : {true, false}) {
    SCOPED_TRACE(fused_kernels ? "fused" : "portable");
    LibraryKernels mode(fused_kernels);
    auto [gx, gw, gb] = gradient(loss, Tensor(x0, shape), Tensor(w0, Shape{3}), Tensor(b0, Shape{3}));
    std::vector<std::vector<double>> args = {x0, w0, b0};
    std::vector<Tensor> grads = {gx, gw, gb};
    for (size_t which = 0; which < 3; ++which) {
      std::vector<double> g = grads[which].to_vector<double>();
      for (size_t i = 0; i < args[which].size(); ++i) {
        auto plus = args, minus = args;
        plus[which][i] += 1e-6;
        minus[which][i] -= 1e-6;
        auto value = [&](const std::vector<std::vector<double>>& a) {
          return loss(Tensor(a[0], shape), Tensor(a[1], Shape{3}), Tensor(a[2], Shape{3})).item<double>();
        };
        EXPECT_NEAR(g[i], (value(plus) - value(minus)) / 2e-6, 1e-6) << which << "[" << i << "]";
      }
    }
  }
}

TEST(Normalisation, FusedAndPortablePathsAgree) {
  for (DType t : {DType::f32, DType::f64}) {
    for (Shape shape : {Shape{8, 5, 6, 7}, Shape{16, 5}, Shape{3, 5, 11}, Shape{40, 150}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_string(shape));
      const int64_t ch = shape[1];
      const size_t nc = size_t(ch);
      Tensor x = Tensor(uniform(size_t(shape.numel()), -3, 4, 81), shape).cast(t);
      Tensor w = Tensor(uniform(nc, 0.5, 1.5, 82), Shape{ch}).cast(t), b = Tensor(uniform(nc, -1, 1, 83), Shape{ch}).cast(t);
      Tensor r = Tensor(uniform(size_t(shape.numel()), 0.5, 1.5, 84), shape).cast(t);
      auto run = [&](bool fused_kernels) {
        LibraryKernels mode(fused_kernels);
        Tensor mean, var;
        Tensor y = batchnorm(x, w, b, 1e-5, &mean, &var);
        auto [gx, gw, gb] = gradient([&](const Tensor& a, const Tensor& c, const Tensor& d) {
          return sum(batchnorm(a, c, d, 1e-5) * r);
        }, x, w, b);
        // inference form with given statistics, gradients for all five
        Tensor rm = Tensor(uniform(nc, -1, 1, 85), Shape{ch}).cast(t), rv = Tensor(uniform(nc, 0.5, 2, 86), Shape{ch}).cast(t);
        Tensor yi = batchnorm(x, w, b, rm, rv, 1e-3);
        auto [ix, iw, ib, im, iv] = gradient([&](const Tensor& a, const Tensor& c, const Tensor& d, const Tensor& e,
                                                 const Tensor& f) { return sum(batchnorm(a, c, d, e, f, 1e-3) * r); },
                                             x, w, b, rm, rv);
        return std::vector<Tensor>{y, mean, var, gx, gw, gb, yi, ix, iw, ib, im, iv};
      };
      auto fused = run(true), portable = run(false);
      double tol = t == DType::f32 ? 1e-5 : 1e-12;
      for (size_t i = 0; i < fused.size(); ++i) EXPECT_LE(max_rel_error(fused[i], vec(portable[i])), tol) << i;
    }
  }
}

TEST(Normalisation, BatchnormOpGradientsWithoutAffine) {
  // The op on (N, C) input, weight and bias undefined: central differences in float64.
  Shape shape{5, 3};
  std::vector<double> x0 = uniform(15, -2, 2, 55), r = uniform(15, 0.5, 1.5, 56);
  Tensor R(r, shape);
  auto value = [&](const std::vector<double>& x) { return sum(batchnorm(Tensor(x, shape), {}, {}, 1e-3) * R).item<double>(); };
  Tensor g = gradient([&](const Tensor& x) { return sum(batchnorm(x, {}, {}, 1e-3) * R); }, Tensor(x0, shape));
  std::vector<double> gv = g.to_vector<double>();
  for (size_t i = 0; i < x0.size(); ++i) {
    auto plus = x0, minus = x0;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    EXPECT_NEAR(gv[i], (value(plus) - value(minus)) / 2e-6, 1e-6) << i;
  }
  // statistics come back unrecorded, shape (C,)
  Tensor mean, var;
  batchnorm(Tensor(x0, shape), {}, {}, 1e-3, &mean, &var);
  std::vector<double> want_mean, want_var;
  batch_stats(x0, layout_of(shape), want_mean, want_var);
  EXPECT_EQ(mean.shape(), Shape{3});
  EXPECT_LE(max_rel_error(mean, want_mean), 1e-12);
  EXPECT_LE(max_rel_error(var, want_var), 1e-12);
  EXPECT_THAT(error_of([] { batchnorm(zeros({4, 3}), ones({2}), {}, 1e-5); }),
              HasSubstr("[batchnorm] weight and bias must have shape (3,) for input (4, 3); got (2,)"));
}

TEST_P(Norm, DeviceGradientsMatchFloat64Cpu) {
  Device d = GetParam();
  Shape shape{4, 3, 3, 2};
  std::vector<double> xs = uniform(72, -2, 2, 61), r = uniform(72, 0.5, 1.5, 62);
  BatchNorm bn = trainmode(random_bn(3, Activation(), {.dtype = DType::f64}));
  auto f = [](const Tensor& R) {
    return [R](const BatchNorm& m, const Tensor& x) { return sum(m(x) * R); };
  };
  auto [gm64, gx64] = gradient(f(Tensor(r, shape)), bn, Tensor(xs, shape));
  BatchNorm bn32 = trainmode(random_bn(3)) | d;
  auto [gm, gx] = gradient(f(to(Tensor(r, shape).f32(), d)), bn32, to(Tensor(xs, shape).f32(), d));
  EXPECT_EQ(gx.device(), d);
  EXPECT_LE(max_rel_error(gx, vec(gx64)), 1e-4);
  EXPECT_LE(max_rel_error(gm.weight, vec(gm64.weight)), 1e-4);
  EXPECT_LE(max_rel_error(gm.bias, vec(gm64.bias)), 1e-4);
}

TEST_P(Norm, OptimiserSkipsRunningStatistics) {
  Device d = GetParam();
  seed(3);
  auto model = Chain(Dense(4, 3), BatchNorm(3, relu), Dense(3, 1)) | d;
  EXPECT_EQ(params(model).size(), 6u);
  EXPECT_EQ(parameter_count(model), 15 + 6 + 4);
  EXPECT_EQ(nontrainable_count(model), 6);
  EXPECT_EQ(nontrainables(model).size(), 3u);
  auto opt = optimisers::setup(optimisers::Adam(0.1), model);
  EXPECT_EQ(opt.leaves.size(), 6u);
  Tensor x = to(randn({8, 4}), d), y = to(randn({8, 1}), d);
  for (int step = 0; step < 3; ++step) {
    auto [loss, g] = withgradient([&](const auto& m) { return mse(m(x), y); }, model);
    std::vector<double> rm = vec(model.get<1>().running_mean), rv = vec(model.get<1>().running_var);
    std::vector<double> w = vec(model.get<1>().weight);
    optimisers::update(opt, model, g);
    EXPECT_EQ(vec(model.get<1>().running_mean), rm);
    EXPECT_EQ(vec(model.get<1>().running_var), rv);
    EXPECT_NE(vec(model.get<1>().weight), w);  // the trainable part moved
  }
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 3);
  // Descent too (the unfused path), with a gradient whose running fields hold nonsense
  auto sgd = optimisers::setup(optimisers::Descent(0.1), model);
  auto [loss, g] = withgradient([&](const auto& m) { return mse(m(x), y); }, model);
  g.get<1>().running_mean = full({3}, 1e9, DType::f32, d);
  std::vector<double> rm = vec(model.get<1>().running_mean);
  optimisers::update(sgd, model, g);
  EXPECT_EQ(vec(model.get<1>().running_mean), rm);
}

TEST_P(Norm, MovedBySpellsOfFmapAndDev) {
  Device d = GetParam();
  BatchNorm bn(8);
  BatchNorm m = bn | d;
  EXPECT_EQ(m.running_mean.device(), d);
  EXPECT_EQ(m.running_var.device(), d);
  EXPECT_EQ(m.num_batches_tracked.device(), d);
  EXPECT_EQ(m.num_batches_tracked.dtype(), DType::i64);
  BatchNorm back = m | cpu;
  EXPECT_TRUE(back.running_var.device().is_cpu());
  EXPECT_EQ(vec(back.running_var), std::vector<double>(8, 1.0));
  // fmap visits the non-trainable leaves (all five), gpu keeps the Int64 counter an integer
  int visited = 0;
  fmap([&](const Tensor& t) { ++visited; return t; }, bn);
  EXPECT_EQ(visited, 5);
  BatchNorm f64 = fmap([](const Tensor& t) { return is_floating(t.dtype()) ? t.f64() : t; }, bn);
  EXPECT_EQ(f64.running_mean.dtype(), DType::f64);
  BatchNorm g = f64 | gpu;
  EXPECT_EQ(g.num_batches_tracked.dtype(), DType::i64);
  // tied state stays tied: two layers sharing one BatchNorm's tensors move them once
  std::tuple<BatchNorm, BatchNorm> tied{bn, bn};
  EXPECT_EQ(nontrainables(tied).size(), 3u);
  EXPECT_EQ(params(tied).size(), 2u);
  auto moved = tied | d;
  EXPECT_TRUE(std::get<0>(moved).running_mean.same_storage(std::get<1>(moved).running_mean));
  EXPECT_TRUE(std::get<0>(moved).num_batches_tracked.same_storage(std::get<1>(moved).num_batches_tracked));
  EXPECT_EQ(std::get<1>(moved).running_var.device(), d);
}

TEST_P(Norm, SaveLoadRoundTripIncludesRunningStatistics) {
  Device d = GetParam();
  seed(4);
  auto model = Chain(Dense(3, 4), BatchNorm(4)) | d;
  trainmode(model);
  model(to(randn({6, 3}), d));
  model(to(randn({6, 3}), d));
  automode(model);
  std::string path = (std::filesystem::temp_directory_path() / ("flux_bn_" + std::to_string(::getpid()) + ".safetensors")).string();
  save(path, model);
  TensorMap file = load_state(path);
  std::vector<std::string> names;
  for (auto& [name, t] : file) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean",
                                             "1.running_var", "1.weight"}));
  EXPECT_EQ(file.at("1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(file.at("1.num_batches_tracked").shape(), Shape{});
  EXPECT_EQ(file.at("1.num_batches_tracked").item<int64_t>(), 2);
  auto fresh = Chain(Dense(3, 4), BatchNorm(4)) | d;
  load(path, fresh);
  EXPECT_EQ(vec(fresh.get<1>().running_mean), vec(model.get<1>().running_mean));
  EXPECT_EQ(vec(fresh.get<1>().running_var), vec(model.get<1>().running_var));
  EXPECT_EQ(fresh.get<1>().num_batches_tracked.item<int64_t>(), 2);
  Tensor x = to(randn({5, 3}), d);
  EXPECT_EQ(vec(fresh(x)), vec(model(x)));
  // a checkpoint carries them too
  auto opt = optimisers::setup(optimisers::Adam(), model);
  save_checkpoint(path, model, opt);
  auto again = Chain(Dense(3, 4), BatchNorm(4)) | d;
  auto opt2 = optimisers::setup(optimisers::Adam(), again);
  load_checkpoint(path, again, opt2);
  EXPECT_EQ(vec(again.get<1>().running_var), vec(model.get<1>().running_var));
  EXPECT_EQ(again.get<1>().num_batches_tracked.item<int64_t>(), 2);
  std::filesystem::remove(path);
}

TEST(Normalisation, StateWithoutTrackingOrAffine) {
  BatchNorm plain(3, {.affine = false, .track_stats = false});
  EXPECT_TRUE(state(plain).empty());
  EXPECT_EQ(parameter_count(plain), 0);
  // batch statistics always (PyTorch's track_running_stats=False), also outside gradient
  Tensor x(uniform(12, -1, 1, 71), Shape{4, 3});
  std::vector<double> mean, var;
  batch_stats(vec(x), layout_of(x.shape()), mean, var);
  EXPECT_LE(max_rel_error(plain(x.f32()), normalise_ref(vec(x), layout_of(x.shape()), mean, var, {}, {}, 1e-5, false)), 1e-5);
  BatchNorm no_stats(3, {.track_stats = false});
  auto names = state(no_stats);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "bias");
}

TEST(Normalisation, PrintsAsFlux) {
  EXPECT_EQ(to_text(BatchNorm(32, relu)), "BatchNorm(32, relu)  # 64 parameters, plus 64 non-trainable");
  EXPECT_EQ(to_text(BatchNorm(32)), "BatchNorm(32)       # 64 parameters, plus 64 non-trainable");
  EXPECT_EQ(to_text(BatchNorm(3, {.affine = false})), "BatchNorm(3, affine=false)");
  EXPECT_EQ(repr(BatchNorm(32, relu)), "BatchNorm(32, relu)  # 64 parameters, plus 64 non-trainable");
  EXPECT_EQ(to_text(Chain(Dense(2, 16), BatchNorm(16, relu), Dropout(0.5), Dense(16, 1))),
            "Chain(\n"
            "  Dense(2 => 16),                       # 48 parameters\n"
            "  BatchNorm(16, relu),                  # 32 parameters, plus 32\n"
            "  Dropout(0.5),\n"
            "  Dense(16 => 1),                       # 17 parameters\n"
            ")         # Total: 6 trainable arrays, 97 parameters,\n"
            "          # plus 2 non-trainable, 32 parameters, summarysize 524 bytes.");
  EXPECT_EQ(repr(Chain(Dense(2, 4), BatchNorm(4))),
            "Chain(Dense(2 => 4), BatchNorm(4))  # 20 parameters, plus 8 non-trainable");
}

TEST(Normalisation, Errors) {
  BatchNorm bn(32);
  EXPECT_EQ(error_of([&] { bn(zeros({4, 3, 8, 8})); }),
            "[BatchNorm] input has 3 channels, layer expects 32 (BatchNorm(32)); got shape (4, 3, 8, 8). Channels go "
            "along axis 1: (N, C, ...)");
  EXPECT_EQ(error_of([&] { bn(zeros({32})); }),
            "[BatchNorm] expects input (N, C, ...) with at least 2 dimensions, channels on axis 1; got shape (32,)");
  EXPECT_EQ(error_of([&] { trainmode(bn)(zeros({1, 32})); }),
            "[BatchNorm] batch statistics need more than 1 value per channel; got input shape (1, 32)");
  EXPECT_EQ(error_of([] { BatchNorm(0); }), "[BatchNorm] channels must be positive; got BatchNorm(0)");
  EXPECT_EQ(error_of([] { BatchNorm(3, {.momentum = 1.5}); }), "[BatchNorm] momentum must be in [0, 1]; got 1.5");
  EXPECT_THAT(error_of([&] { bn(zeros({2, 32}, DType::i32)); }), HasSubstr("[BatchNorm] needs a floating-point input"));
}

TEST(Normalisation, InputOnAnotherDeviceIsAnError) {
  BatchNorm bn(3);  // on the CPU; every other device's input is refused with both names
  for (const Device& d : flux::testing::test_devices()) {
    if (d.is_cpu()) continue;
    EXPECT_THAT(error_of([&] { bn(to(zeros({2, 3}), d)); }),
                HasSubstr("[BatchNorm] input on " + to_string(d) + " but the layer's state on CPU"));
  }
}

FLUX_DEVICE_SUITE(Norm);
