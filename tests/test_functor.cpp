// Walking models: FLUX_LAYER on user structs, fmap, params, state names, tied tensors.
#include <array>
#include <sstream>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;

namespace functor_test {
// A user's own layer: y = scale * (x W') + shift; `steps` and `name` are not tensors and are skipped.
struct Affine {
  Tensor weight;
  Tensor shift;
  double scale = 1.0;
  int steps = 0;
  std::string name = "affine";
  Tensor operator()(const Tensor& x) const { return matmul(x, weight, false, true) * scale + shift; }
};
FLUX_LAYER(Affine, weight, shift, scale, steps)

// A layer holding containers of layers.
struct Blocks {
  std::vector<Dense> stack;
  std::array<Tensor, 2> pair;
  std::tuple<Dense, Tensor> mixed;
};
FLUX_LAYER(Blocks, stack, pair, mixed)
}  // namespace functor_test

TEST(Functor, UserLayerIsWalkedAndTrained) {
  functor_test::Affine a{Tensor({{1, 2}, {3, 4}}), Tensor({0.5, -0.5}), 2.0, 3};
  auto names = state(a);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "shift");
  EXPECT_EQ(params(a).size(), 2u);
  EXPECT_EQ(parameter_count(a), 6);
  // fmap maps every tensor leaf and keeps other fields
  functor_test::Affine b = fmap([](const Tensor& t) { return t * 10.0; }, a);
  EXPECT_EQ(b.weight.to_vector<float>(), (std::vector<float>{10, 20, 30, 40}));
  EXPECT_EQ(b.shift.to_vector<float>(), (std::vector<float>{5, -5}));
  EXPECT_EQ(b.scale, 2.0);
  EXPECT_EQ(b.steps, 3);
  EXPECT_EQ(a.weight.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));  // the original is untouched
  // gradient has the user's type
  functor_test::Affine g = gradient([](const functor_test::Affine& m) { return sum(m(Tensor({{1, 1}}))); }, a);
  EXPECT_EQ(g.weight.to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(g.shift.to_vector<float>(), (std::vector<float>{1, 1}));
  // and the optimisers train it
  auto s = optimisers::setup(optimisers::Descent(0.5), a);
  optimisers::update(s, a, g);
  EXPECT_EQ(a.weight.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(a.shift.to_vector<float>(), (std::vector<float>{0, -1}));
  // a user layer sits in a Chain
  auto model = Chain(Dense(3, 2), a);
  EXPECT_EQ(model(ones({4, 3})).shape(), (Shape{4, 2}));
  EXPECT_EQ(state(model)[2].first, "layers.1.weight");
}

TEST(Functor, StateNamesFollowPyTorchOrder) {
  auto model = Chain(Dense(2, 3, relu), softmax, Chain(Dense(3, 4), Dense(4, 1, {.bias = false})));
  std::vector<std::string> names;
  for (auto& [n, t] : state(model)) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.layers.0.weight",
                                             "layers.2.layers.0.bias", "layers.2.layers.1.weight"}));
  EXPECT_EQ(parameter_count(model), 9 + 16 + 4);
  functor_test::Blocks b{{Dense(1, 2), Dense(2, 1)}, {ones({2}), zeros({3})}, {Dense(1, 1), ones({5})}};
  names.clear();
  for (auto& [n, t] : state(b)) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"stack.0.weight", "stack.0.bias", "stack.1.weight", "stack.1.bias", "pair.0",
                                             "pair.1", "mixed.0.weight", "mixed.0.bias", "mixed.1"}));
  functor_test::Blocks doubled = fmap([](const Tensor& t) { return t + 1.0; }, b);
  EXPECT_EQ(std::get<1>(doubled.mixed).to_vector<float>(), std::vector<float>(5, 2.0f));
  EXPECT_EQ(doubled.pair[1].to_vector<float>(), std::vector<float>(3, 1.0f));
}

TEST(Functor, TiedTensorsStayTied) {
  Tensor w = Tensor({{1, 0}, {0, 1}});
  auto model = Chain(Dense(w, Tensor({0, 0})), Dense(w, Tensor({1, 1})));
  EXPECT_EQ(params(model).size(), 3u);  // w once
  EXPECT_EQ(state(model).size(), 4u);   // but named at both places
  EXPECT_EQ(parameter_count(model), 8);
  int calls = 0;
  auto mapped = fmap([&](const Tensor& t) { ++calls; return t.contiguous_copy(); }, model);
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(mapped.get<0>().weight.same_storage(mapped.get<1>().weight));
  EXPECT_FALSE(mapped.get<0>().weight.same_storage(w));
  auto moved = model | Device();
  EXPECT_TRUE(moved.get<0>().weight.same_storage(moved.get<1>().weight));
  // views of the same storage are distinct leaves
  Tensor base = arange(0, 4, 1);
  functor_test::Blocks b{{}, {base.slice(0, 2), base.slice(2, 4)}, {Dense(1, 1), base}};
  EXPECT_EQ(params(b).size(), 5u);
}

TEST(Functor, UndefinedTensorsAreSkipped) {
  Dense d(3, 2, {.bias = false});
  EXPECT_EQ(params(d).size(), 1u);
  EXPECT_EQ(state(d)[0].first, "weight");
  Dense m = fmap([](const Tensor& t) { return t * 0.0; }, d);
  EXPECT_FALSE(m.bias.defined());
}

class FunctorOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(FunctorOnDevice, MovingModelsKeepsDtypesAndTies) {
  Device d = GetParam();
  Tensor w = randn({2, 2});
  auto model = Chain(Dense(w, Tensor({0, 0})), Dense(w, Tensor({0, 0})), Dense(2, 1, {.dtype = DType::f64}));
  auto on_d = model | d;
  for (auto& [name, t] : state(on_d)) EXPECT_EQ(t.device(), d) << name;
  EXPECT_TRUE(on_d.get<0>().weight.same_storage(on_d.get<1>().weight));
  EXPECT_EQ(on_d.get<2>().weight.dtype(), DType::f64);  // to() keeps dtypes
  auto back = on_d | cpu;
  EXPECT_TRUE(back.get<0>().weight.device().is_cpu());
  EXPECT_EQ(back.get<0>().weight.to_vector<float>(), w.to_vector<float>());
}
FLUX_DEVICE_SUITE(FunctorOnDevice);

TEST(Functor, GpuMovesToTheDefaultDeviceOrIsANoOp) {
  Dense d(2, 3, {.dtype = DType::f64});
  Tensor labels(std::vector<int64_t>{1, 2}, Shape{2});
  Dense g = d | gpu;
  Tensor lg = gpu(labels);
  Device want = get_device();
  EXPECT_EQ(g.weight.device(), want);
  EXPECT_EQ(lg.dtype(), DType::i64);  // integers are never converted
  if (want.is_cpu()) {
    EXPECT_EQ(g.weight.dtype(), DType::f64);  // no GPU: nothing changes
    EXPECT_TRUE(g.weight.same_storage(d.weight));
  } else {
    EXPECT_EQ(g.weight.dtype(), DType::f32);  // as Flux: gpu converts Float64 to Float32
  }
  Dense back = g | cpu;
  EXPECT_TRUE(back.weight.device().is_cpu());
  EXPECT_LE(flux::testing::max_rel_error(back.weight, d.weight.to_vector<double>()), 1e-6);
}

// ---- issue 18: user layers that train and move; deepcopy ----
namespace functor_test {
// A user's layer with a constructor (not an aggregate), declared in its own namespace.
struct Residual {
  Dense inner;
  NonTrainable calls;  // a non-trainable tensor of the user's own
  Residual() = default;
  explicit Residual(int n) : inner(n, n, relu), calls(zeros({1})) {}
  Tensor operator()(const Tensor& x) const { return x + inner(x); }
};
FLUX_LAYER(Residual, inner, calls)

struct Tied {
  Tensor encoder, decoder;
  Tensor operator()(const Tensor& x) const { return matmul(matmul(x, encoder), decoder, false, true); }
};
FLUX_LAYER(Tied, encoder, decoder)
}  // namespace functor_test

TEST_P(FunctorOnDevice, UserLayerTrainsAndMoves) {
  Device d = GetParam();
  seed(3);
  auto model = Chain(functor_test::Residual(4), Dense(4, 1)) | d;
  for (auto& [name, t] : state(model)) EXPECT_EQ(t.device(), d) << name;
  ASSERT_EQ(state(model).size(), 5u);  // layers.0.inner.weight, .bias, layers.0.calls, layers.1.weight, .bias
  EXPECT_EQ(state(model)[2].first, "layers.0.calls");
  EXPECT_EQ(params(model).size(), 4u);  // calls is not trained
  Tensor x = to(randn({8, 4}), d), y = to(randn({8, 1}), d);
  auto grads = gradient([&](auto& m) { return mse(m(x), y); }, model);
  const Tensor& gw = grads.get<0>().inner.weight;
  EXPECT_EQ(gw.device(), d);
  EXPECT_FALSE(gw.same_storage(model.get<0>().inner.weight));  // a gradient, not the weight itself
  double gnorm = 0;
  for (double v : gw.to_vector<double>()) gnorm += v * v;
  EXPECT_GT(gnorm, 0.0);
  std::vector<double> before = model.get<0>().inner.weight.to_vector<double>();
  auto opt = optimisers::setup(optimisers::Descent(0.1), model);
  optimisers::update(opt, model, grads);
  std::vector<double> after = model.get<0>().inner.weight.to_vector<double>(), want = before;
  std::vector<double> g = gw.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) want[i] -= 0.1 * g[i];
  EXPECT_LE(flux::testing::max_rel_error(model.get<0>().inner.weight, want), 1e-6);
  EXPECT_NE(after, before);
  auto back = model | cpu;
  EXPECT_TRUE(back.get<0>().inner.weight.device().is_cpu());
  EXPECT_TRUE(back.get<0>().calls.device().is_cpu());
}

TEST_P(FunctorOnDevice, DeepcopyIsIndependentOfTheOriginal) {
  Device d = GetParam();
  seed(4);
  auto model = Chain(Dense(3, 4), BatchNorm(4, relu), Dense(4, 2)) | d;
  auto shared = model;            // a plain copy shares every tensor (documented in the README)
  auto copy = deepcopy(model);    // Flux's deepcopy: fresh tensors on the same device
  auto s_model = state(model), s_shared = state(shared), s_copy = state(copy);
  ASSERT_EQ(s_copy.size(), s_model.size());
  for (size_t i = 0; i < s_model.size(); ++i) {
    EXPECT_TRUE(s_shared[i].second.same_storage(s_model[i].second)) << s_model[i].first;
    EXPECT_FALSE(s_copy[i].second.same_storage(s_model[i].second)) << s_model[i].first;
    EXPECT_EQ(s_copy[i].second.device(), d) << s_model[i].first;
    EXPECT_EQ(s_copy[i].second.dtype(), s_model[i].second.dtype()) << s_model[i].first;
    EXPECT_EQ(s_copy[i].second.to_vector<double>(), s_model[i].second.to_vector<double>()) << s_model[i].first;
  }
  std::vector<std::vector<double>> original;
  for (auto& [name, t] : s_model) original.push_back(t.to_vector<double>());
  // Train the copy (this also updates its BatchNorm running statistics): the original is unchanged.
  Tensor x = to(randn({6, 3}), d), y = to(randn({6, 2}), d);
  auto opt = optimisers::setup(optimisers::Adam(0.1), copy);
  for (int step = 0; step < 3; ++step) {
    auto grads = gradient([&](auto& m) { return mse(m(x), y); }, copy);
    optimisers::update(opt, copy, grads);
  }
  for (size_t i = 0; i < s_model.size(); ++i) {
    EXPECT_EQ(s_model[i].second.to_vector<double>(), original[i]) << s_model[i].first;
    EXPECT_NE(s_copy[i].second.to_vector<double>(), original[i]) << s_model[i].first;
  }
  EXPECT_EQ(copy.get<1>().num_batches_tracked.item<int64_t>(), 3);
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 0);
}

TEST_P(FunctorOnDevice, DeepcopyKeepsTiedTensorsTied) {
  Device d = GetParam();
  Tensor w = randn({3, 2});
  functor_test::Tied m = functor_test::Tied{w, w} | d;
  ASSERT_TRUE(m.encoder.same_storage(m.decoder));
  functor_test::Tied c = deepcopy(m);
  EXPECT_TRUE(c.encoder.same_storage(c.decoder));   // tied inside the copy
  EXPECT_FALSE(c.encoder.same_storage(m.encoder));  // and apart from the original
  EXPECT_EQ(c.encoder.device(), d);
  EXPECT_EQ(params(c).size(), 1u);
}
