// The API a Flux user reaches for when porting a model-zoo program (issue 32): device strings,
// activations by their plain names beside <cmath>, optimiser options by name, *_like, outputsize and
// autosize, Chain slicing, train(), chunk / batchseq, sample_logits and learning-rate schedules.
// <cmath> comes first and `using namespace flux` is in force, as in a user's program: `tanh` then
// names both ::tanh and flux::tanh.
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using ::testing::HasSubstr;
using flux::testing::error_of;
using flux::testing::max_rel_error;
using flux::testing::uniform_tensor;

namespace {

// ---- device strings ----

TEST(DeviceStrings, ParseDeviceReadsToStringsFormInAnyCase) {
  EXPECT_EQ(parse_device("CPU"), Device());
  EXPECT_EQ(parse_device("cpu"), Device());
  EXPECT_EQ(parse_device("CPU:0"), Device());
  EXPECT_EQ(parse_device("OpenCL:0"), Device("OpenCL", 0));
  EXPECT_EQ(parse_device("opencl:3"), Device("OpenCL", 3));
  EXPECT_EQ(parse_device("cuda"), Device("CUDA", 0));
  EXPECT_EQ(parse_device("AmdGpu:1"), Device("AMDGPU", 1));
  EXPECT_EQ(parse_device("metal"), Device("Metal", 0));
  // round trip through to_string
  for (const Device& d : {Device(), Device("OpenCL", 2), Device("CUDA", 1)}) EXPECT_EQ(parse_device(to_string(d)), d);
  EXPECT_THAT(error_of([] { (void)parse_device("TPU:0"); }),
              HasSubstr("[parse_device] unknown backend \"TPU\" in \"TPU:0\"; expected NAME or NAME:i"));
  EXPECT_THAT(error_of([] { (void)parse_device("OpenCL:x"); }),
              HasSubstr("[parse_device] \"OpenCL:x\": the index after ':' must be a non-negative integer"));
  EXPECT_THAT(error_of([] { (void)parse_device("OpenCL:"); }), HasSubstr("must be a non-negative integer"));
  EXPECT_THAT(error_of([] { (void)parse_device("OpenCL:-1"); }), HasSubstr("must be a non-negative integer"));
  EXPECT_THAT(error_of([] { (void)parse_device(""); }), HasSubstr("[parse_device] unknown backend \"\""));
  EXPECT_THAT(error_of([] { (void)parse_device("CPU:1"); }), HasSubstr("CPU has one device"));
}

TEST(DeviceStrings, GetDeviceTakesTheIndexInTheNameAndAnyCase) {
  EXPECT_EQ(get_device("cpu"), Device());
  EXPECT_EQ(get_device("CPU:0"), Device());
  EXPECT_TRUE(loaded("cpu"));
  EXPECT_TRUE(functional("Cpu"));
  if (functional("OpenCL")) {
    EXPECT_EQ(get_device("OpenCL:0"), Device("OpenCL", 0));
    EXPECT_EQ(get_device("opencl"), Device("OpenCL", 0));
    EXPECT_EQ(get_device("OPENCL", 0), Device("OpenCL", 0));
    EXPECT_TRUE(functional("opencl"));
    EXPECT_THAT(error_of([] { (void)get_device("OpenCL:0", 1); }),
                HasSubstr("[get_device] \"OpenCL:0\" names its index already, and index 1 was passed too"));
    EXPECT_THAT(error_of([] { (void)get_device("OpenCL:999"); }), HasSubstr("device index 999 is out of range for OpenCL"));
  }
  EXPECT_THAT(error_of([] { (void)get_device("TPU"); }), HasSubstr("[get_device] unsupported backend \"TPU\""));
  // gpu_backend writes the preference file and keeps Flux's exact names, but says which one was meant
  EXPECT_THAT(error_of([] { gpu_backend("opencl"); }),
              HasSubstr("[gpu_backend] unknown backend \"opencl\"; supported are CUDA, AMDGPU, Metal, OpenCL, CPU (names are "
                        "case-sensitive here: did you mean \"OpenCL\"?)"));
  EXPECT_THAT(error_of([] { (void)get_device("OpenCL:zero"); }), HasSubstr("[parse_device]"));
}

// ---- activations by their plain names ----

TEST(PlainActivations, TanhBesideCmathIsFluxsInAChain) {
  seed(1);
  auto m = Chain(Dense(2, 3), tanh, Dense(3, 1));  // `tanh` is ::tanh and flux::tanh here
  static_assert(std::is_same_v<decltype(m), Chain<Dense, FunctionLayer, Dense>>);
  Tensor x = uniform_tensor({5, 2}, 1).f32();
  Tensor h = m.get<0>()(x);
  std::vector<double> want;
  for (double v : h.to_vector<double>()) want.push_back(std::tanh(v));
  EXPECT_LT(max_rel_error(m.get<1>()(h), want), 1e-6);
  EXPECT_EQ(m(x).shape(), Shape({5, 1}));
  EXPECT_EQ(repr(m), "Chain(Dense(2 => 3), tanh, Dense(3 => 1))  # 13 parameters");
  // ::tanh on doubles still works, and so do the other spellings
  EXPECT_DOUBLE_EQ(tanh(0.5), std::tanh(0.5));
  auto m2 = Chain(Dense(2, 3, tanh), flux::tanh, tanh_act, relu, sigmoid, Dense(3, 1));
  EXPECT_EQ(m2(x).shape(), Shape({5, 1}));
  EXPECT_EQ(repr(Chain(Dense(2, 3, tanh))), "Chain(Dense(2 => 3, tanh))  # 9 parameters");
  // it trains: gradients flow through the FunctionLayer
  auto g = gradient([&](auto& model) { return sum(model(x)); }, m);
  EXPECT_GT(sum(abs(g.get<0>().weight)).item<double>(), 0);
  // it moves and copies like any layer
  auto copy = deepcopy(m);
  EXPECT_EQ(copy(x).to_vector<float>(), m(x).to_vector<float>());
}

// ---- optimiser options by name ----

TEST(OptimiserOptions, ByNameEqualsPositional) {
  using namespace optimisers;
  EXPECT_EQ(Adam({.eta = 3e-4, .beta = {0.8, 0.99}}).name(), Adam(3e-4, 0.8, 0.99).name());
  EXPECT_EQ(Adam({.eps = 1e-6}).name(), Adam(0.001, 0.9, 0.999, 1e-6).name());
  EXPECT_EQ(AdamW({.eta = 1e-3, .lambda = 1e-4}).name(), AdamW(1e-3, 0.9, 0.999, 1e-4).name());
  EXPECT_EQ(Descent({.eta = 0.05}).name(), Descent(0.05).name());
  EXPECT_EQ(Momentum({.rho = 0.5}).name(), Momentum(0.01, 0.5).name());
  EXPECT_EQ(Nesterov({.eta = 0.1}).name(), Nesterov(0.1).name());
  EXPECT_EQ(RMSProp({.eta = 0.01, .eps = 1e-5}).name(), RMSProp(0.01, 0.9, 1e-5).name());
  EXPECT_EQ(WeightDecay({.lambda = 1e-3}).name(), WeightDecay(1e-3).name());
  EXPECT_EQ(ClipGrad({.delta = 1}).name(), ClipGrad(1).name());
  EXPECT_EQ(ClipNorm({.omega = 5, .p = 1}).name(), ClipNorm(5, 1).name());
  // the defaults agree
  EXPECT_EQ(Adam(AdamOptions{}).name(), Adam().name());
  EXPECT_EQ(AdamW(AdamWOptions{}).name(), AdamW().name());
  EXPECT_EQ(RMSProp(RMSPropOptions{}).name(), RMSProp().name());
  // and the step is the same
  Tensor w1 = Tensor({1.0f, -2.0f, 3.0f}), w2 = Tensor({1.0f, -2.0f, 3.0f}), g = Tensor({0.5f, 0.1f, -0.3f});
  auto s1 = setup(Adam({.eta = 0.1, .beta = {0.5, 0.9}}), w1), s2 = setup(Adam(0.1, 0.5, 0.9), w2);
  update(s1, w1, g), update(s2, w2, g);
  EXPECT_EQ(w1.to_vector<float>(), w2.to_vector<float>());
}

// ---- *_like ----

class LikeConstructors : public ::testing::TestWithParam<Device> {};

TEST_P(LikeConstructors, ShapeDtypeDeviceAndValues) {
  const Device dev = GetParam();
  Tensor x = to(zeros({200, 50}), dev);
  for (const Tensor& t : {zeros_like(x), ones_like(x), fill_like(x, 2.5), rand_like(x), randn_like(x)}) {
    EXPECT_EQ(t.shape(), x.shape());
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_EQ(t.device(), dev);
  }
  EXPECT_EQ(max(abs(fill_like(x, 2.5) - 2.5)).item<double>(), 0.0);
  EXPECT_EQ(fill_like(to(zeros({3}, DType::f64), dev), 1.5).dtype(), DType::f64);
  // randn_like: standard normal moments over 10,000 draws (mean within 5 sigma of 0, var near 1)
  seed(3);
  Tensor z = randn_like(x).f64();
  double m = mean(z).item<double>(), var = mean(square(z - m)).item<double>();
  EXPECT_LT(std::abs(m), 5.0 / 100.0);
  EXPECT_NEAR(var, 1.0, 0.06);
  double tail = mean((abs(z) > 1.96).f64()).item<double>();  // P(|z| > 1.96) = 0.05
  EXPECT_NEAR(tail, 0.05, 0.012);
  // the same seed gives the same values on every device (rand_like's counter-based stream)
  seed(4);
  std::vector<double> here = randn_like(x).to_vector<double>();
  seed(4);
  std::vector<double> cpu = randn_like(zeros({200, 50})).to_vector<double>();
  EXPECT_LT(max_rel_error(Tensor(here, Shape{200, 50}), cpu), 1e-4);
  EXPECT_THAT(error_of([&] { (void)randn_like(to(zeros({2}, DType::i64), dev)); }),
              HasSubstr("[randn_like] needs a floating-point tensor"));
}

FLUX_DEVICE_SUITE(LikeConstructors);

// ---- outputsize, autosize, Chain slicing ----

auto lenet_with_placeholders() {
  return Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}), Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
               Dense(_, 120, relu), Dense(_, 84, relu), Dense(_, 10));
}

class Sizes : public ::testing::TestWithParam<Device> {};

TEST_P(Sizes, OutputsizeAutosizeAndSlices) {
  const Device dev = GetParam();
  seed(5);
  auto conv_part = Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}), Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten) | dev;
  EXPECT_EQ(outputsize(conv_part, {1, 1, 28, 28}), Shape({1, 256}));
  EXPECT_EQ(outputsize(conv_part, {3, 1, 32, 32}), Shape({3, 400}));

  auto pending = lenet_with_placeholders();
  EXPECT_EQ(repr(pending.get<5>()), "Dense(_ => 120, relu)");
  EXPECT_THAT(error_of([&] { (void)pending(zeros({1, 1, 28, 28})); }),
              HasSubstr("[Dense] Dense(_ => 120) has no input size yet: build the model with autosize(input_shape, model)"));
  auto lenet = autosize({1, 1, 28, 28}, pending) | dev;
  EXPECT_EQ(lenet.get<5>().in_features(), 256);
  EXPECT_EQ(lenet.get<6>().in_features(), 120);
  EXPECT_EQ(lenet.get<7>().in_features(), 84);
  EXPECT_EQ(parameter_count(lenet), 44426);  // Flux's LeNet-5 for 28x28 MNIST
  Tensor x = to(rand({2, 1, 28, 28}), dev);
  EXPECT_EQ(lenet(x).shape(), Shape({2, 10}));
  EXPECT_EQ(outputsize(lenet, {7, 1, 28, 28}), Shape({7, 10}));
  // autosize on a model already on a device keeps the new layers there
  auto on_dev = autosize({1, 1, 28, 28}, lenet_with_placeholders() | dev);
  EXPECT_EQ(on_dev.get<5>().weight.device(), dev);

  // slices share the layers' arrays: lenet[1:5] in Flux is slice<0, 5>
  auto features = lenet.slice<0, 5>();
  auto head = slice<5, 8>(lenet);
  EXPECT_EQ(decltype(features)::size(), 5u);
  EXPECT_EQ(features(x).shape(), Shape({2, 256}));
  EXPECT_LT(max_rel_error(head(features(x)), lenet(x).to_vector<double>()), 1e-6);
  EXPECT_EQ(head.get<0>().weight.impl(), lenet.get<5>().weight.impl());
  // a step on the slice changes the whole model's arrays
  auto opt = optimisers::setup(optimisers::Descent(0.1), head);
  auto g = gradient([&](auto& m) { return sum(m(features(x))); }, head);
  std::vector<float> before = lenet.get<7>().bias.to_vector<float>();
  optimisers::update(opt, head, g);
  EXPECT_NE(lenet.get<7>().bias.to_vector<float>(), before);
  // outputsize never changes BatchNorm's running statistics
  auto bn = Chain(Dense(3, 4), BatchNorm(4)) | dev;
  trainmode(bn);
  std::vector<float> stats = bn.get<1>().running_mean.to_vector<float>();
  EXPECT_EQ(outputsize(bn, {5, 3}), Shape({5, 4}));
  EXPECT_EQ(bn.get<1>().running_mean.to_vector<float>(), stats);
}

FLUX_DEVICE_SUITE(Sizes);

// ---- train ----

class TrainLoop : public ::testing::TestWithParam<Device> {};

TEST_P(TrainLoop, LossFallsCallbackSeesEveryStepAndScheduleSetsTheRate) {
  const Device dev = GetParam();
  seed(6);
  Tensor X = rand({64, 3}), Y = matmul(X, Tensor(std::vector<float>{1.0f, -2.0f, 0.5f}, Shape{3, 1}));
  auto model = Chain(Dense(3, 1)) | dev;
  auto loader = DataLoader({X, Y}, {.batchsize = 16, .shuffle = true}) | dev;
  auto opt_state = optimisers::setup(optimisers::Adam({.eta = 0.05}), model);
  std::vector<TrainEvent> events;
  std::vector<double> rates;
  std::ostringstream log;
  auto loss = [](auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); };
  TrainResult r = train(loss, model, loader, opt_state,
                        {.epochs = 30,
                         .callback = [&](const TrainEvent& e) {
                           events.push_back(e);
                           rates.push_back(static_cast<optimisers::Adam&>(*opt_state.rule).eta);
                         },
                         .schedule = schedules::Step{.start = 0.05, .decay = 0.5, .step_size = 60},
                         .out = &log});
  ASSERT_EQ(r.epoch_loss.size(), 30u);
  EXPECT_EQ(r.steps, 120);
  ASSERT_EQ(events.size(), 120u);
  EXPECT_EQ(events[0].epoch, 1);
  EXPECT_EQ(events[5].batch, 2);
  EXPECT_EQ(events[5].batches, 4);
  EXPECT_EQ(events[119].step, 119);
  EXPECT_DOUBLE_EQ(rates[0], 0.05);
  EXPECT_DOUBLE_EQ(rates[119], 0.025);
  EXPECT_LT(r.epoch_loss.back(), 0.1 * r.epoch_loss.front());
  EXPECT_NEAR(events[3].epoch_loss, r.epoch_loss[0], 1e-12);
  // the progress log: one line per epoch when not a terminal
  EXPECT_THAT(log.str(), HasSubstr("epoch 1/30: 4 batches, mean loss"));
  EXPECT_THAT(log.str(), HasSubstr("epoch 30/30: 4 batches"));
  // a single-tensor batch goes to the loss as one argument
  auto ae = Chain(Dense(3, 3)) | dev;
  auto ae_state = optimisers::setup(optimisers::Adam(), ae);
  std::vector<Tensor> plain{to(X, dev)};
  TrainResult r2 = train([](auto& m, const Tensor& x) { return mse(m(x), x); }, ae, plain, ae_state, {.progress = false});
  EXPECT_EQ(r2.steps, 1);
}

TEST_P(TrainLoop, NonFiniteLossStopsWithTheBatch) {
  const Device dev = GetParam();
  auto model = Chain(Dense(2, 1)) | dev;
  auto s = optimisers::setup(optimisers::Descent(), model);
  std::vector<std::array<Tensor, 2>> data{{to(ones({2, 2}), dev), to(ones({2, 1}), dev)},
                                          {to(ones({2, 2}), dev), to(full({2, 1}, NAN), dev)}};
  EXPECT_THAT(error_of([&] {
                train([](auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); }, model, data, s, {.progress = false});
              }),
              HasSubstr("[train] the loss is nan at epoch 1, batch 2; stopping"));
}

TEST_P(TrainLoop, NonFiniteLearningRateStopsAtItsStepEmptyEpochHasNaNLoss) {
  const Device dev = GetParam();
  auto model = Chain(Dense(2, 1)) | dev;
  auto s = optimisers::setup(optimisers::Adam(), model);
  std::vector<std::array<Tensor, 2>> data{{to(ones({2, 2}), dev), to(ones({2, 1}), dev)},
                                          {to(ones({2, 2}), dev), to(ones({2, 1}), dev)}};
  auto loss = [](auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); };
  auto before = pytorch_state(model);
  std::vector<std::vector<float>> kept;
  int64_t steps_seen = 0;
  for (double bad : std::vector<double>{NAN, INFINITY, -1e-3}) {
    EXPECT_THAT(error_of([&] {
                  train(loss, model, data, s,
                        {.progress = false,
                         .callback = [&](const TrainEvent&) {
                           kept.clear();
                           for (auto& [n, t] : pytorch_state(model)) kept.push_back(t.to_vector<float>());
                           ++steps_seen;
                         },
                         .schedule = [bad](int64_t t) { return t == 1 ? bad : 1e-3; }});
                }),
                HasSubstr("[train] the schedule gives the learning rate " + (std::isnan(bad) ? std::string("nan") : std::isinf(bad) ? std::string("inf") : std::string("-0.001")) + " at step 1 (epoch 1, batch 2)"));
    // the step that met the rate changed nothing: the model holds the first step's update
    size_t i = 0;
    for (auto& [n, t] : pytorch_state(model)) {
      for (float v : t.to_vector<float>()) EXPECT_TRUE(std::isfinite(v)) << n;
      EXPECT_EQ(t.to_vector<float>(), kept[i++]) << n;
    }
  }
  EXPECT_EQ(steps_seen, 3);
  // an epoch without batches has no mean loss: NaN, never 0
  std::vector<std::array<Tensor, 2>> none;
  TrainResult r = train(loss, model, none, s, {.epochs = 2, .progress = false});
  ASSERT_EQ(r.epoch_loss.size(), 2u);
  EXPECT_TRUE(std::isnan(r.epoch_loss[0]) && std::isnan(r.epoch_loss[1]));
  EXPECT_EQ(r.steps, 0);
}

FLUX_DEVICE_SUITE(TrainLoop);

// ---- chunk, batchseq ----

class SequenceHelpers : public ::testing::TestWithParam<Device> {};

TEST_P(SequenceHelpers, ChunkAndBatchseq) {
  const Device dev = GetParam();
  Tensor x = to(arange(0, 20).reshape({10, 2}), dev);
  std::vector<Tensor> parts = data::chunk(x, 3);
  ASSERT_EQ(parts.size(), 3u);  // ceil(10 / 3) = 4: 4, 4, 2 rows
  EXPECT_EQ(parts[0].shape(), Shape({4, 2}));
  EXPECT_EQ(parts[2].shape(), Shape({2, 2}));
  EXPECT_EQ(parts[2].to_vector<float>(), (std::vector<float>{16, 17, 18, 19}));
  EXPECT_EQ(parts[1].device(), dev);
  std::vector<Tensor> cols = data::chunk(x, 2, -1);
  EXPECT_EQ(cols[1].to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19}));
  EXPECT_THAT(error_of([&] { (void)data::chunk(x, 11); }), HasSubstr("[chunk] n must be in 1..10"));
  // the parts are differentiable slices
  Tensor g = gradient([](const Tensor& t) { return sum(data::chunk(t, 2)[1] * 3.0); }, x);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3}));

  // batchseq: (T_i, F) -> (N, T_max, F), padded
  Tensor a = to(Tensor({{1.0f, 2.0f}, {3.0f, 4.0f}, {5.0f, 6.0f}}), dev), b = to(Tensor({{7.0f, 8.0f}}), dev);
  Tensor batch = data::batchseq({a, b}, -1);
  EXPECT_EQ(batch.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(batch.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, -1, -1, -1, -1}));
  EXPECT_EQ(batch.device(), dev);
  // integer token sequences (T_i,) -> (N, T_max)
  Tensor ids = data::batchseq({to(Tensor(std::vector<int64_t>{1, 2, 3}, Shape{3}), dev),
                               to(Tensor(std::vector<int64_t>{4, 5}, Shape{2}), dev)});
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 0}));
  EXPECT_THAT(error_of([&] { (void)data::batchseq({a, to(zeros({2, 3}), dev)}); }),
              HasSubstr("[batchseq] sequence 1 is"));
}

FLUX_DEVICE_SUITE(SequenceHelpers);

// ---- sample_logits ----

class Sampling : public ::testing::TestWithParam<Device> {};

TEST_P(Sampling, FrequenciesFollowSoftmaxOverTemperature) {
  const Device dev = GetParam();
  const std::vector<double> logits{1.0, 0.0, -1.0, 2.0};
  const int64_t rows = 4000;
  std::vector<double> tiled;
  for (int64_t r = 0; r < rows; ++r) tiled.insert(tiled.end(), logits.begin(), logits.end());
  Tensor l = to(Tensor(tiled, Shape{rows, 4}).f32(), dev);
  for (double temperature : {1.0, 0.5, 2.0}) {
    seed(7);
    Tensor s = sample_logits(l, {.temperature = temperature});
    ASSERT_EQ(s.shape(), Shape({rows}));
    EXPECT_EQ(s.dtype(), DType::i64);
    EXPECT_EQ(s.device(), dev);
    std::vector<double> count(4, 0.0);
    for (int64_t k : s.to_vector<int64_t>()) count[size_t(k)] += 1;
    double z = 0;
    for (double v : logits) z += std::exp(v / temperature);
    for (size_t k = 0; k < 4; ++k) {
      double p = std::exp(logits[k] / temperature) / z, sd = std::sqrt(p * (1 - p) / double(rows));
      EXPECT_NEAR(count[k] / double(rows), p, 5 * sd + 1e-9) << "temperature " << temperature << " class " << k;
    }
  }
  // temperature 0 is the argmax; top_k keeps only the k best
  EXPECT_EQ(sample_logits(l, {.temperature = 0}).to_vector<int64_t>(), std::vector<int64_t>(size_t(rows), 3));
  for (int64_t k : sample_logits(l, {.top_k = 2}).to_vector<int64_t>()) EXPECT_TRUE(k == 0 || k == 3);
  // one row (C,) -> a 0-d index; the same seed repeats the draws
  seed(8);
  int64_t first = sample_logits(to(Tensor({0.1f, 0.2f, 0.3f}), dev)).item<int64_t>();
  seed(8);
  EXPECT_EQ(sample_logits(to(Tensor({0.1f, 0.2f, 0.3f}), dev)).item<int64_t>(), first);
  EXPECT_THAT(error_of([&] { (void)sample_logits(l, {.temperature = -1}); }), HasSubstr("[sample_logits] temperature"));
}

FLUX_DEVICE_SUITE(Sampling);

// ---- schedules ----

TEST(Schedules, StepExpCosineWithWarmup) {
  using namespace schedules;
  using namespace optimisers;
  Step step{.start = 0.1, .decay = 0.5, .step_size = 3};
  EXPECT_DOUBLE_EQ(step(0), 0.1);
  EXPECT_DOUBLE_EQ(step(2), 0.1);
  EXPECT_DOUBLE_EQ(step(3), 0.05);
  EXPECT_DOUBLE_EQ(step(7), 0.025);
  Exp e{.start = 1.0, .decay = 0.9};
  EXPECT_DOUBLE_EQ(e(0), 1.0);
  EXPECT_NEAR(e(10), std::pow(0.9, 10), 1e-15);
  CosAnneal cos{.l0 = 1.0, .l1 = 0.1, .period = 10, .warmup = 4};
  EXPECT_DOUBLE_EQ(cos(0), 0.25);  // warm-up: l0 (t + 1) / warmup
  EXPECT_DOUBLE_EQ(cos(3), 1.0);
  EXPECT_DOUBLE_EQ(cos(4), 1.0);   // cosine starts at l0
  EXPECT_NEAR(cos(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 5 / 10)), 1e-12);
  EXPECT_DOUBLE_EQ(cos(14), 0.1);  // then stays at l1
  EXPECT_DOUBLE_EQ(cos(100), 0.1);
  CosAnneal sgdr{.l0 = 1.0, .l1 = 0.0, .period = 4, .restart = true};
  EXPECT_DOUBLE_EQ(sgdr(4), 1.0);
  EXPECT_NEAR(sgdr(6), 0.5, 1e-12);
  EXPECT_THAT(error_of([] { (void)Step{.start = 1, .decay = 0.5, .step_size = 0}(1); }), HasSubstr("[Step] step_size must be positive"));
  EXPECT_THAT(error_of([] { (void)Exp{.start = 1, .decay = 0.5}(-1); }), HasSubstr("[Exp] the step must be >= 0"));
  // driven through optimisers::adjust: the rule's rate follows the schedule
  Tensor w = Tensor({1.0f});
  auto s = setup(OptimiserChain(ClipGrad(1.0), Descent(1.0)), w);
  for (int64_t t = 0; t < 8; ++t) {
    adjust(s, step(t));
    float before = w.item<float>();
    update(s, w, Tensor({1.0f}));
    EXPECT_NEAR(before - w.item<float>(), step(t), 1e-6) << t;
  }
}

}  // namespace
