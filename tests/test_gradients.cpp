// Finite-difference checks of every differentiable op, loss and layer: central differences in float64
// on random inputs against gradient(). The same table then runs on every device in float32 against
// the float64 CPU gradient.
#include <cmath>
#include <functional>
#include <random>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Range {
  double lo = -2, hi = 2;
};

struct GradCase {
  std::string name;
  std::vector<Shape> shapes;
  Fn f;
  std::vector<Range> ranges = {};  // per input; default [-2, 2]
  double step = 1e-5;              // finite-difference step
  double tol = 1e-6;
};

Device dev_of(const std::vector<Tensor>& v) { return v[0].device(); }
Tensor idx64(std::vector<int64_t> v, Device d) {
  int64_t n = int64_t(v.size());
  return to(Tensor(v, Shape{n}), d);
}

std::vector<double> uniform(int64_t n, Range r, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> dist(r.lo, r.hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

Range range_of(const GradCase& c, size_t i) { return i < c.ranges.size() ? c.ranges[i] : Range{}; }

std::vector<std::vector<double>> case_inputs(const GradCase& c) {
  std::mt19937_64 gen(std::hash<std::string>{}(c.name));
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < c.shapes.size(); ++i) out.push_back(uniform(c.shapes[i].numel(), range_of(c, i), gen));
  return out;
}

// The scalar L = sum(f(x) .* W) with W fixed and random, so that every entry of the Jacobian counts.
struct Objective {
  const GradCase& c;
  std::vector<double> weights;
  Shape out_shape;

  explicit Objective(const GradCase& c) : c(c) {
    std::vector<Tensor> xs;
    auto in = case_inputs(c);
    for (size_t i = 0; i < in.size(); ++i) xs.emplace_back(in[i], c.shapes[i]);
    Tensor y = c.f(xs);
    out_shape = y.shape();
    std::mt19937_64 gen(42);
    weights = uniform(y.numel(), Range{0.5, 1.5}, gen);
  }
  Tensor operator()(const std::vector<Tensor>& xs) const {
    Tensor y = c.f(xs);
    Tensor w = to(Tensor(weights, out_shape).cast(y.dtype()), y.device());
    return sum(y * w);
  }
  double host(const std::vector<std::vector<double>>& in) const {
    std::vector<Tensor> xs;
    for (size_t i = 0; i < in.size(); ++i) xs.emplace_back(in[i], c.shapes[i]);
    return (*this)(xs).item<double>();
  }
};

std::vector<Tensor> analytic_gradient(const GradCase& c, DType t, Device d) {
  Objective obj(c);
  auto in = case_inputs(c);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < in.size(); ++i) xs.push_back(to(Tensor(in[i], c.shapes[i]).cast(t), d));
  return gradient([&](const std::vector<Tensor>& v) { return obj(v); }, xs);
}

void check_case(const GradCase& c) {
  SCOPED_TRACE(c.name);
  Objective obj(c);
  auto in = case_inputs(c);
  std::vector<Tensor> grads = analytic_gradient(c, DType::f64, Device());
  ASSERT_EQ(grads.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(grads[i].shape(), c.shapes[i]) << "input " << i;
    ASSERT_EQ(grads[i].dtype(), DType::f64);
    std::vector<double> g = grads[i].to_vector<double>();
    for (size_t k = 0; k < in[i].size(); ++k) {
      auto plus = in, minus = in;
      plus[i][k] += c.step;
      minus[i][k] -= c.step;
      double numeric = (obj.host(plus) - obj.host(minus)) / (2 * c.step);
      EXPECT_NEAR(g[k], numeric, c.tol * (1 + std::abs(numeric))) << "input " << i << " element " << k;
    }
  }
}

Range positive{0.5, 2.0};
Range probability{0.1, 0.9};

std::vector<GradCase> op_cases() {
  using V = const std::vector<Tensor>&;
  std::vector<GradCase> cs = {
      {"add", {{3, 4}, {3, 4}}, [](V v) { return v[0] + v[1]; }},
      {"add_broadcast_row", {{3, 4}, {4}}, [](V v) { return add(v[0], v[1]); }},
      {"add_broadcast_both", {{2, 1, 4}, {3, 1}}, [](V v) { return add(v[0], v[1]); }},
      {"add_scalar", {{3}}, [](V v) { return v[0] + 2.5; }},
      {"sub_broadcast", {{3, 1}, {1, 4}}, [](V v) { return sub(v[0], v[1]); }},
      {"sub_scalar_left", {{3}}, [](V v) { return 2.0 - v[0]; }},
      {"mul_broadcast", {{2, 3}, {3}}, [](V v) { return mul(v[0], v[1]); }},
      {"mul_scalar", {{2, 2}}, [](V v) { return 3.0 * v[0]; }},
      {"div", {{2, 3}, {2, 3}}, [](V v) { return div(v[0], v[1]); }, {{}, positive}},
      {"div_broadcast", {{2, 3}, {2, 1}}, [](V v) { return v[0] / v[1]; }, {{}, positive}},
      {"div_scalar_left", {{4}}, [](V v) { return 1.0 / v[0]; }, {positive}},
      {"pow_tensor", {{2, 3}, {2, 3}}, [](V v) { return pow(v[0], v[1]); }, {positive, {-1.5, 1.5}}},
      {"pow_broadcast_exponent", {{2, 3}, {1}}, [](V v) { return pow(v[0], v[1]); }, {positive, {-1.5, 1.5}}},
      {"pow_scalar_3", {{5}}, [](V v) { return pow(v[0], 3.0); }},
      {"pow_scalar_half", {{5}}, [](V v) { return pow(v[0], 0.5); }, {positive}},
      {"pow_scalar_2", {{5}}, [](V v) { return pow(v[0], 2.0); }},
      {"maximum", {{3, 4}, {3, 4}}, [](V v) { return maximum(v[0], v[1]); }},
      {"maximum_broadcast", {{3, 4}, {4}}, [](V v) { return maximum(v[0], v[1]); }},
      {"minimum", {{3, 4}, {3, 4}}, [](V v) { return minimum(v[0], v[1]); }},
      {"minimum_broadcast", {{3, 1}, {3, 4}}, [](V v) { return minimum(v[0], v[1]); }},
      {"neg", {{6}}, [](V v) { return neg(v[0]); }},
      {"neg_operator", {{6}}, [](V v) { return -v[0]; }},
      {"exp", {{6}}, [](V v) { return exp(v[0]); }},
      {"log", {{6}}, [](V v) { return log(v[0]); }, {positive}},
      {"sqrt", {{6}}, [](V v) { return sqrt(v[0]); }, {positive}},
      {"abs", {{8}}, [](V v) { return abs(v[0]); }},
      {"square", {{6}}, [](V v) { return square(v[0]); }},
      {"sin", {{6}}, [](V v) { return sin(v[0]); }},
      {"cos", {{6}}, [](V v) { return cos(v[0]); }},
      {"log1p", {{6}}, [](V v) { return log1p(v[0]); }, {{-0.5, 2.0}}},
      {"tanh", {{6}}, [](V v) { return flux::tanh(v[0]); }},
      {"sigmoid", {{6}}, [](V v) { return sigmoid(v[0]); }, {{-6, 6}}},
      {"relu", {{8}}, [](V v) { return relu(v[0]); }},
      {"leakyrelu", {{8}}, [](V v) { return leakyrelu(v[0]); }},
      {"leakyrelu_slope", {{8}}, [](V v) { return leakyrelu(v[0], 0.2); }},
      {"elu", {{8}}, [](V v) { return elu(v[0]); }},
      {"elu_alpha", {{8}}, [](V v) { return elu(v[0], 0.5); }},
      {"gelu", {{8}}, [](V v) { return gelu(v[0]); }, {{-3, 3}}},
      {"softplus", {{8}}, [](V v) { return softplus(v[0]); }, {{-5, 5}}},
      {"swish", {{8}}, [](V v) { return swish(v[0]); }, {{-4, 4}}},
      {"clamp", {{10}}, [](V v) { return clamp(v[0], -1.0, 0.5); }},
      {"where", {{3, 4}, {3, 4}}, [](V v) { return where(v[0] > 0.0, v[0] * v[1], v[1]); }},
      {"where_broadcast", {{3, 4}, {4}}, [](V v) { return where(v[0] > 0.0, v[0], v[1]); }},
      // matmul: 2-D with every transpose combination
      {"matmul_nn", {{3, 4}, {4, 5}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_tn", {{4, 3}, {4, 5}}, [](V v) { return matmul(v[0], v[1], true, false); }},
      {"matmul_nt", {{3, 4}, {5, 4}}, [](V v) { return matmul(v[0], v[1], false, true); }},
      {"matmul_tt", {{4, 3}, {5, 4}}, [](V v) { return matmul(v[0], v[1], true, true); }},
      // batched
      {"matmul_batched_nn", {{2, 3, 4}, {2, 4, 5}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_batched_tn", {{2, 4, 3}, {2, 4, 5}}, [](V v) { return matmul(v[0], v[1], true, false); }},
      {"matmul_batched_nt", {{2, 3, 4}, {2, 5, 4}}, [](V v) { return matmul(v[0], v[1], false, true); }},
      {"matmul_batched_tt", {{2, 4, 3}, {2, 5, 4}}, [](V v) { return matmul(v[0], v[1], true, true); }},
      {"matmul_batch_times_matrix", {{2, 3, 4}, {4, 5}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_batch_times_matrix_nt", {{2, 3, 4}, {5, 4}}, [](V v) { return matmul(v[0], v[1], false, true); }},
      {"matmul_batch_times_matrix_tn", {{2, 4, 3}, {4, 5}}, [](V v) { return matmul(v[0], v[1], true, false); }},
      {"matmul_matrix_times_batch", {{3, 4}, {2, 4, 5}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_broadcast_batch", {{2, 1, 3, 4}, {3, 4, 2}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_broadcast_batch_tt", {{1, 2, 4, 3}, {3, 1, 2, 4}}, [](V v) { return matmul(v[0], v[1], true, true); }},
      // 1-D operands
      {"matmul_vec_mat", {{4}, {4, 5}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_vec_matT", {{4}, {5, 4}}, [](V v) { return matmul(v[0], v[1], false, true); }},
      {"matmul_mat_vec", {{3, 4}, {4}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_matT_vec", {{4, 3}, {4}}, [](V v) { return matmul(v[0], v[1], true, false); }},
      {"matmul_vec_vec", {{4}, {4}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul_batch_vec", {{2, 3, 4}, {4}}, [](V v) { return matmul(v[0], v[1]); }},
      // reductions
      {"sum_all", {{3, 4}}, [](V v) { return sum(v[0]); }},
      {"sum_axis0", {{3, 4}}, [](V v) { return sum(v[0], 0); }},
      {"sum_axis1_keepdims", {{3, 4}}, [](V v) { return sum(v[0], 1, true); }},
      {"sum_axis_neg", {{2, 3, 4}}, [](V v) { return sum(v[0], -2); }},
      {"sum_axes", {{2, 3, 4}}, [](V v) { return sum(v[0], std::vector<int>{0, 2}); }},
      {"sum_axes_keepdims", {{2, 3, 4}}, [](V v) { return sum(v[0], std::vector<int>{0, 2}, true); }},
      {"mean_all", {{3, 4}}, [](V v) { return mean(v[0]); }},
      {"mean_axis0", {{3, 4}}, [](V v) { return mean(v[0], 0); }},
      {"mean_axis1_keepdims", {{3, 4}}, [](V v) { return mean(v[0], 1, true); }},
      {"max_all", {{3, 4}}, [](V v) { return max(v[0]); }},
      {"max_axis0", {{3, 4}}, [](V v) { return max(v[0], 0); }},
      {"max_axis1_keepdims", {{3, 4}}, [](V v) { return max(v[0], 1, true); }},
      {"min_all", {{3, 4}}, [](V v) { return min(v[0]); }},
      {"min_axis_neg", {{2, 3, 4}}, [](V v) { return min(v[0], -1); }},
      {"min_axis1_keepdims", {{2, 3, 4}}, [](V v) { return min(v[0], 1, true); }},
      // softmax family
      {"softmax_last", {{3, 5}}, [](V v) { return softmax(v[0]); }},
      {"softmax_axis0", {{3, 5}}, [](V v) { return softmax(v[0], 0); }},
      {"softmax_middle", {{2, 3, 4}}, [](V v) { return softmax(v[0], 1); }},
      {"logsoftmax_last", {{3, 5}}, [](V v) { return logsoftmax(v[0]); }},
      {"logsoftmax_axis0", {{3, 5}}, [](V v) { return logsoftmax(v[0], 0); }},
      {"logsumexp", {{3, 5}}, [](V v) { return logsumexp(v[0], 1); }},
      {"logsumexp_keepdims_axis0", {{3, 5}}, [](V v) { return logsumexp(v[0], 0, true); }},
      // shapes and indexing
      {"broadcast_to", {{3, 1}}, [](V v) { return broadcast_to(v[0], Shape{2, 3, 4}); }},
      {"sum_to", {{2, 3, 4}}, [](V v) { return sum_to(v[0], Shape{3, 1}); }},
      {"permute", {{2, 3, 4}}, [](V v) { return permute(v[0], {2, 0, 1}); }},
      {"transpose", {{3, 4}}, [](V v) { return v[0].transpose(); }},
      {"transpose_batched", {{2, 3, 4}}, [](V v) { return v[0].transpose(); }},
      {"reshape", {{3, 4}}, [](V v) { return square(v[0].reshape(Shape{2, -1})); }},
      {"slice_axis0", {{5, 3}}, [](V v) { return slice(v[0], 0, 1, 4); }},
      {"slice_axis1", {{3, 5}}, [](V v) { return slice(v[0], 1, 1, 3); }},
      {"slice_method", {{5, 2}}, [](V v) { return v[0].slice(2, 5); }},
      {"index_row", {{4, 3}}, [](V v) { return v[0][2]; }},
      {"concat_axis0", {{2, 3}, {1, 3}}, [](V v) { return concat({v[0], v[1]}, 0); }},
      {"concat_axis1", {{2, 3}, {2, 2}, {2, 1}}, [](V v) { return concat({v[0], v[1], v[2]}, 1); }},
      {"concat_same_tensor", {{2, 3}}, [](V v) { return concat({v[0], v[0]}, 0); }},
      {"stack_axis0", {{2, 3}, {2, 3}}, [](V v) { return stack({v[0], v[1]}, 0); }},
      {"stack_axis1", {{2, 3}, {2, 3}}, [](V v) { return stack({v[0], v[1]}, 1); }},
      {"stack_last", {{2, 3}, {2, 3}}, [](V v) { return stack({v[0], v[1]}, -1); }},
      {"index_select_axis0", {{4, 3}}, [](V v) { return index_select(v[0], 0, idx64({2, 0, 2, 3}, dev_of(v))); }},
      {"index_select_axis1", {{3, 4}}, [](V v) { return index_select(v[0], 1, idx64({1, 1, 3}, dev_of(v))); }},
      {"gather_axis_neg", {{2, 3, 4}}, [](V v) { return gather(v[0], -1, idx64({3, 0}, dev_of(v))); }},
      {"cast_roundtrip", {{5}}, [](V v) { return square(v[0].cast(DType::f32)).cast(v[0].dtype()); }, {}, 1e-2, 1e-4},
      {"composite_mlp", {{4, 3}, {5, 3}, {5}},
       [](V v) { return flux::tanh(matmul(v[0], v[1], false, true) + v[2]); }},
  };
  return cs;
}

std::vector<GradCase> loss_cases() {
  using V = const std::vector<Tensor>&;
  return {
      {"mse", {{4, 3}, {4, 3}}, [](V v) { return mse(v[0], v[1]); }},
      {"mse_sum", {{4, 3}, {4, 3}}, [](V v) { return mse(v[0], v[1], {.agg = Agg::sum}); }},
      {"mse_none", {{4, 3}, {4, 3}}, [](V v) { return mse(v[0], v[1], {.agg = Agg::none}); }},
      {"mae", {{4, 3}, {4, 3}}, [](V v) { return mae(v[0], v[1]); }},
      {"crossentropy", {{4, 3}, {4, 3}}, [](V v) { return crossentropy(v[0], v[1]); }, {probability, probability}},
      {"crossentropy_of_softmax", {{4, 3}, {4, 3}}, [](V v) { return crossentropy(softmax(v[0]), softmax(v[1])); }},
      {"logitcrossentropy", {{4, 3}, {4, 3}}, [](V v) { return logitcrossentropy(v[0], v[1]); }, {{}, probability}},
      {"binarycrossentropy", {{6}, {6}}, [](V v) { return binarycrossentropy(v[0], v[1]); }, {probability, probability}},
      {"logitbinarycrossentropy", {{6}, {6}}, [](V v) { return logitbinarycrossentropy(v[0], v[1]); }, {{-4, 4}, probability}},
      {"huber", {{8}, {8}}, [](V v) { return huber(v[0], v[1]); }, {{-3, 3}, {-3, 3}}},
      {"huber_delta", {{8}, {8}}, [](V v) { return huber(v[0], v[1], {}, 0.5); }, {{-2, 2}, {-2, 2}}},
      {"kldivergence", {{4, 3}, {4, 3}}, [](V v) { return kldivergence(softmax(v[0]), softmax(v[1])); }},
  };
}

}  // namespace

TEST(Gradients, OpsAgainstFiniteDifferences) {
  for (const GradCase& c : op_cases()) check_case(c);
}

TEST(Gradients, LossesAgainstFiniteDifferences) {
  for (const GradCase& c : loss_cases()) check_case(c);
}

// ---- the same table on every device, float32 against the float64 CPU gradient ----
class DeviceGradients : public ::testing::TestWithParam<Device> {};

TEST_P(DeviceGradients, MatchFloat64CpuGradients) {
  Device d = GetParam();
  std::vector<GradCase> cases = op_cases();
  for (const GradCase& c : loss_cases()) cases.push_back(c);
  for (const GradCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> want = analytic_gradient(c, DType::f64, Device());
    std::vector<Tensor> got = analytic_gradient(c, DType::f32, d);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].device(), d);
      EXPECT_EQ(got[i].dtype(), DType::f32);
      EXPECT_EQ(got[i].shape(), want[i].shape());
      EXPECT_LE(max_rel_error(got[i], want[i].to_vector<double>()), 1e-4) << "input " << i;
    }
  }
}
FLUX_DEVICE_SUITE(DeviceGradients);

// ---- gradients with a model argument ----
namespace {
struct TwoBranch {
  Dense used;
  Dense unused;
  Tensor operator()(const Tensor& x) const { return used(x); }
};
FLUX_LAYER(TwoBranch, used, unused)

// Central difference of loss(model) w.r.t. every element of `param` (a leaf of `model`, modified in place).
template <class M, class L> std::vector<double> numeric_grad(M& model, Tensor param, L loss, double h = 1e-6) {
  std::vector<double> values = param.to_vector<double>(), out(values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    auto v = values;
    v[k] += h;
    copy_(param, Tensor(v, param.shape()));
    double up = loss(model).template item<double>();
    v[k] -= 2 * h;
    copy_(param, Tensor(v, param.shape()));
    double down = loss(model).template item<double>();
    out[k] = (up - down) / (2 * h);
  }
  copy_(param, Tensor(values, param.shape()));
  return out;
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-6) {
  std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size());
  for (size_t k = 0; k < g.size(); ++k) EXPECT_NEAR(g[k], want[k], tol * (1 + std::abs(want[k]))) << "element " << k;
}
}  // namespace

TEST(ModelGradients, DenseHasDenseTypeAndMatchesFiniteDifferences) {
  seed(1);
  Dense d(3, 4, flux::tanh, {.dtype = DType::f64});
  d.bias = randn({4}, DType::f64);
  Tensor x = randn({5, 3}, DType::f64), y = randn({5, 4}, DType::f64);
  auto loss = [&](const Dense& m) { return mse(m(x), y); };
  auto [value, g] = withgradient(loss, d);
  static_assert(std::is_same_v<decltype(g), Dense>);
  EXPECT_NEAR(value.item<double>(), loss(d).item<double>(), 1e-12);
  EXPECT_EQ(g.weight.shape(), (Shape{4, 3}));
  EXPECT_EQ(g.bias.shape(), (Shape{4}));
  EXPECT_EQ(g.activation.name(), "tanh");
  expect_close(g.weight, numeric_grad(d, d.weight, loss));
  expect_close(g.bias, numeric_grad(d, d.bias, loss));
}

TEST(ModelGradients, DenseWithoutBias) {
  seed(2);
  Dense d(3, 2, relu, {.bias = false, .dtype = DType::f64});
  Tensor x = randn({4, 3}, DType::f64);
  auto loss = [&](const Dense& m) { return sum(square(m(x))); };
  Dense g = gradient(loss, d);
  EXPECT_FALSE(g.bias.defined());
  expect_close(g.weight, numeric_grad(d, d.weight, loss));
}

TEST(ModelGradients, ChainHasChainTypeAndMatchesFiniteDifferences) {
  seed(3);
  auto model = Chain(Dense(4, 6, relu, {.dtype = DType::f64}), Dense(6, 3, {.dtype = DType::f64}), softmax);
  model.get<0>().bias = randn({6}, DType::f64) * 0.1;
  Tensor x = randn({5, 4}, DType::f64), y = onehot(Tensor(std::vector<int64_t>{0, 2, 1, 1, 0}, Shape{5}), 3, DType::f64);
  auto loss = [&](const auto& m) { return crossentropy(m(x), y); };
  auto g = gradient(loss, model);
  static_assert(std::is_same_v<decltype(g), decltype(model)>);
  expect_close(g.get<0>().weight, numeric_grad(model, model.get<0>().weight, loss));
  expect_close(g.get<0>().bias, numeric_grad(model, model.get<0>().bias, loss));
  expect_close(g.get<1>().weight, numeric_grad(model, model.get<1>().weight, loss));
  expect_close(g.get<1>().bias, numeric_grad(model, model.get<1>().bias, loss));
}

TEST(ModelGradients, UnusedParametersGetZeros) {
  seed(4);
  TwoBranch m{Dense(3, 2, {.dtype = DType::f64}), Dense(3, 5, {.dtype = DType::f64})};
  Tensor x = randn({4, 3}, DType::f64);
  TwoBranch g = gradient([&](const TwoBranch& mm) { return sum(mm(x)); }, m);
  ASSERT_TRUE(g.unused.weight.defined());
  EXPECT_EQ(g.unused.weight.shape(), (Shape{5, 3}));
  EXPECT_EQ(g.unused.weight.to_vector<double>(), std::vector<double>(15, 0.0));
  EXPECT_EQ(g.unused.bias.to_vector<double>(), std::vector<double>(5, 0.0));
  // d/db sum(x W' + b) = number of rows
  EXPECT_EQ(g.used.bias.to_vector<double>(), std::vector<double>(2, 4.0));
}

TEST(ModelGradients, OutputIndependentOfModelGivesZeros) {
  Dense d(2, 2, {.dtype = DType::f64});
  Dense g = gradient([](const Dense&) { return sum(ones({3}, DType::f64)); }, d);
  EXPECT_EQ(g.weight.to_vector<double>(), std::vector<double>(4, 0.0));
}

TEST(ModelGradients, TiedParametersAccumulate) {
  seed(5);
  Tensor w = randn({3, 3}, DType::f64);
  auto model = Chain(Dense(w, randn({3}, DType::f64), flux::tanh), Dense(w, zeros({3}, DType::f64)));
  ASSERT_TRUE(model.get<0>().weight.same_storage(model.get<1>().weight));
  Tensor x = randn({4, 3}, DType::f64);
  auto loss = [&](const auto& m) { return sum(square(m(x))); };
  auto g = gradient(loss, model);
  // Both layers report the total gradient of the shared array.
  std::vector<double> want = numeric_grad(model, model.get<0>().weight, loss);
  expect_close(g.get<0>().weight, want);
  expect_close(g.get<1>().weight, want);
  EXPECT_EQ(params(g).size(), 3u);  // the tie survives into the gradient
}

TEST(ModelGradients, SeveralArgumentsGiveATuple) {
  Tensor a({1, 2, 3}), b({4, 5, 6});
  auto [ga, gb] = gradient([](const Tensor& x, const Tensor& y) { return sum(x * y); }, a, b);
  EXPECT_EQ(ga.to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(gb.to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(ModelGradients, SameTensorUsedTwiceAccumulates) {
  Tensor a({1, 2, 3});
  Tensor g = gradient([](const Tensor& x) { return sum(x * x + x); }, a);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{3, 5, 7}));
}

TEST(ModelGradients, TapeOnlyInsideGradient) {
  Tensor a({1, 2, 3});
  Tensor y = a * 2.0;
  EXPECT_EQ(y.impl()->tape_id, -1);
  auto r = withgradient([](const Tensor& x) { return sum(x * 2.0); }, a);
  EXPECT_EQ(r.value.impl()->tape_id, -1);
  EXPECT_FLOAT_EQ(r.value.item<float>(), 12.0f);
  EXPECT_EQ(r.grad.to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(ModelGradients, NestedGradientCallsAreIndependent) {
  Tensor a({1, 2}), b({3, 4});
  Tensor outer = gradient(
      [&](const Tensor& x) {
        Tensor inner = gradient([](const Tensor& y) { return sum(y * y); }, b);
        EXPECT_EQ(inner.to_vector<float>(), (std::vector<float>{6, 8}));
        return sum(x * 3.0);
      },
      a);
  EXPECT_EQ(outer.to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST(ModelGradients, KinksAndSingularPointsFollowChainRules) {
  auto g = [](auto f, std::vector<float> v) {
    return gradient(f, Tensor(v, Shape{int64_t(v.size())})).template to_vector<float>();
  };
  EXPECT_EQ(g([](const Tensor& x) { return sum(relu(x)); }, {0, -4, 3}), (std::vector<float>{0, 0, 1}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(abs(x)); }, {0, -4, 3}), (std::vector<float>{0, -1, 1}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(clamp(x, 0.0, 1.0)); }, {0, 0.5, 1, 2, -1}), (std::vector<float>{1, 1, 1, 0, 0}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(pow(x, 0.0)); }, {0, 2}), (std::vector<float>{0, 0}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(pow(x, 2.5)); }, {0, 4}), (std::vector<float>{0, 20}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(pow(x, x * 0.0)); }, {0, 3}), (std::vector<float>{0, 0}));
  EXPECT_EQ(g([](const Tensor& x) { return sum(maximum(x, x * 0.0)); }, {-1, 2}), (std::vector<float>{0, 1}));
  // a function that returns its (scalar) argument
  EXPECT_EQ(gradient([](const Tensor& x) { return x; }, Tensor::scalar(3)).item<float>(), 1.0f);
}

TEST(ModelGradients, HalfPrecisionGradientsKeepTheirDtype) {
  Tensor a = Tensor({1, 2, 3}).cast(DType::f16);
  Tensor g = gradient([](const Tensor& x) { return sum(square(x)); }, a);
  EXPECT_EQ(g.dtype(), DType::f16);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

// ---- model gradients on every device, float32 against the float64 CPU gradient ----
class DeviceModelGradients : public ::testing::TestWithParam<Device> {};

TEST_P(DeviceModelGradients, ChainGradientMatchesFloat64Cpu) {
  Device d = GetParam();
  seed(8);
  auto model64 = Chain(Dense(5, 7, gelu, {.dtype = DType::f64}), Dense(7, 3, {.dtype = DType::f64}));
  model64.get<0>().bias = randn({7}, DType::f64) * 0.1;
  Tensor x = randn({6, 5}, DType::f64);
  Tensor y = onehot(Tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2}, Shape{6}), 3, DType::f64);
  auto loss = [](const Tensor& xx, const Tensor& yy) {
    return [&xx, &yy](const auto& m) { return logitcrossentropy(m(xx), yy); };
  };
  auto want = gradient(loss(x, y), model64);
  auto model32 = fmap([&](const Tensor& t) { return to(t.f32(), d); }, model64);
  Tensor x32 = to(x.f32(), d), y32 = to(y.f32(), d);
  auto [value, got] = withgradient(loss(x32, y32), model32);
  EXPECT_EQ(value.device(), d);
  EXPECT_LE(max_rel_error(value, {logitcrossentropy(model64(x), y).item<double>()}), 1e-5);
  auto gp = params(got), wp = params(want);
  ASSERT_EQ(gp.size(), wp.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    EXPECT_EQ(gp[i].device(), d);
    EXPECT_EQ(gp[i].dtype(), DType::f32);
    EXPECT_LE(max_rel_error(gp[i], wp[i].to_vector<double>()), 1e-4) << "array " << i;
  }
}
FLUX_DEVICE_SUITE(DeviceModelGradients);
