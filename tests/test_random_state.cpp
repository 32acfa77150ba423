// Random state as a value and resuming a run (random_state.hpp, train's start_step, the checkpoint's
// "flux.steps" / "flux.random_state"): draws repeat after set_random_state on every device, a
// checkpoint restores the step and the generators, and a run resumed mid-epoch in the same process
// ends with the uninterrupted run's parameters bit for bit. tests/resume/ does it across a SIGKILL.
#include <cstdio>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::error_of;
using ::testing::HasSubstr;

namespace {
class RandomStateDevices : public ::testing::TestWithParam<Device> {};

std::vector<float> values(const Tensor& t) { return t.cast(DType::f32).to_vector<float>(); }

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + stem + "-" + std::to_string(::getpid()) + ".safetensors";
}

// Every kind of draw: host uniforms and normals, a permutation, device uniforms and a dropout mask.
std::vector<std::vector<float>> draws(const Device& d) {
  std::vector<std::vector<float>> out;
  out.push_back(values(rand({5}, DType::f32, d)));
  out.push_back(values(randn({4}, DType::f32, d)));
  std::vector<int64_t> p = randperm(6);
  out.emplace_back(p.begin(), p.end());
  out.push_back(values(rand_like(zeros({7}, DType::f32, d))));
  out.push_back(values(dropout(ones({9}, DType::f32, d), 0.5)));
  return out;
}
}  // namespace

TEST_P(RandomStateDevices, SetRandomStateRepeatsEveryDraw) {
  const Device d = GetParam();
  seed(11);
  (void)rand({3});  // some draws before the state is taken
  (void)rand_like(zeros({2}, DType::f32, d));
  const RandomState g = random_state();
  const auto first = draws(d);
  EXPECT_NE(random_state(), g);
  set_random_state(g);
  EXPECT_EQ(random_state(), g);
  EXPECT_EQ(draws(d), first);
  // Through the text form, as a checkpoint stores it.
  set_random_state(parse_random_state(to_string(g)));
  EXPECT_EQ(draws(d), first);
}

TEST(RandomState, TextFormRoundTripsAndRefusesMalformedText) {
  seed(3);
  (void)randn({10});
  const RandomState g = random_state();
  const std::string text = to_string(g);
  EXPECT_EQ(text.rfind("flux-random/1 3 0 ", 0), 0u) << text.substr(0, 40);
  EXPECT_EQ(parse_random_state(text), g);
  EXPECT_THAT(error_of([] { parse_random_state("mt19937 1 2 3"); }), HasSubstr("[parse_random_state] expected text starting with 'flux-random/1'"));
  EXPECT_THAT(error_of([] { parse_random_state("flux-random/1 x 2"); }), HasSubstr("not two unsigned integers"));
  EXPECT_THAT(error_of([&] { parse_random_state(text.substr(0, text.size() / 2)); }), HasSubstr("truncated or not numeric"));
  EXPECT_THAT(error_of([&] { parse_random_state(text + " 5"); }), HasSubstr("unexpected text after"));
}

TEST_P(RandomStateDevices, CheckpointRestoresStepsAndGenerators) {
  const Device d = GetParam();
  seed(5);
  auto model = Chain(Dense(3, 4, tanh_act), Dense(4, 2)) | d;
  auto opt = optimisers::setup(optimisers::Adam(1e-2), model);
  EXPECT_EQ(opt.steps, 0);
  for (int i = 0; i < 3; ++i) {
    auto [l, g] = withgradient([&](auto& m) { return sum(m(to(randn({2, 3}), d))); }, model);
    optimisers::update(opt, model, g);
  }
  EXPECT_EQ(opt.steps, 3);
  const std::string path = temp_path("random-state-ckpt");
  save_checkpoint(path, model, opt);
  const auto after_save = draws(d);
  Metadata meta = load_metadata(path);
  EXPECT_EQ(meta.at("flux.steps"), "3");
  auto opt2 = optimisers::setup(optimisers::Adam(1e-2), model);
  load_checkpoint(path, model, opt2);
  EXPECT_EQ(opt2.steps, 3);
  EXPECT_EQ(draws(d), after_save);

  // A checkpoint whose resume state is corrupt is refused before anything is loaded.
  for (auto [key, value, expected] : std::vector<std::array<std::string, 3>>{
           {"flux.steps", "-5", "\"flux.steps\" is '-5'; expected a non-negative integer"},
           {"flux.steps", "12abc", "\"flux.steps\" is '12abc'"},
           {"flux.random_state", "flux-random/1 1 2 3", "\"flux.random_state\" is malformed"}}) {
    TensorMap tensors = load_state(path);
    Metadata bad = meta;
    bad[key] = value;
    const std::string bad_path = temp_path("random-state-bad");
    save_state(bad_path, tensors, bad);
    opt2.steps = 42;
    EXPECT_THAT(error_of([&] { load_checkpoint(bad_path, model, opt2); }), HasSubstr(expected)) << key;
    EXPECT_EQ(opt2.steps, 42) << "nothing is loaded from a refused checkpoint";
    std::remove(bad_path.c_str());
  }
  std::remove(path.c_str());
}

// The in-process form of tests/resume: checkpoint mid-epoch, rebuild everything the natural way,
// resume with start_step; shuffles, dropout and Adam's state all match the uninterrupted run.
TEST_P(RandomStateDevices, TrainResumedFromACheckpointMatchesTheUninterruptedRun) {
  const Device d = GetParam();
  const std::string path = temp_path("random-state-resume");
  auto run = [&](int64_t save_at, bool resume) {
    seed(77);
    auto model = Chain(Dense(4, 8, relu), Dropout(0.25), Dense(8, 2)) | d;
    DataLoader<2> loader({to(randn({17, 4}), d), to(randn({17, 2}), d)}, {.batchsize = 4, .shuffle = true});
    auto opt = optimisers::setup(optimisers::Adam(1e-2), model);
    if (resume) load_checkpoint(path, model, opt);
    auto loss = [](auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); };
    TrainResult r = train(loss, model, loader, opt,
                          {.epochs = 3, .progress = false,
                           .callback = [&](const TrainEvent& e) {
                             if (e.step + 1 == save_at) save_checkpoint(path, model, opt);
                           },
                           .start_step = opt.steps});
    EXPECT_EQ(r.steps, 15);  // 5 batches of 17 observations, 3 epochs
    std::vector<std::vector<float>> out;
    for (const Tensor& p : params(model)) out.push_back(values(p));
    return out;
  };
  const auto full = run(7, false);  // saves after step 7 (epoch 2, batch 3), runs on to the end
  const auto resumed = run(-1, true);
  EXPECT_EQ(resumed, full);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Devices, RandomStateDevices, ::testing::ValuesIn(flux::testing::test_devices()),
                         flux::testing::device_test_name);

TEST(RandomState, DataLoaderEpochOrderFollowsSetEpoch) {
  Tensor x = arange(int64_t(10)).reshape({10, 1});
  seed(9);
  DataLoader<1> a({x}, {.batchsize = 3, .shuffle = true});
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < 3; ++e) orders.push_back(a.epoch_order());
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_EQ(a.epoch(), 3);
  seed(9);
  DataLoader<1> b({x}, {.batchsize = 3, .shuffle = true});
  (void)rand({4});  // draws after the loader is made do not change its epochs' orders
  b.set_epoch(2);
  EXPECT_EQ(b.epoch_order(), orders[2]);
  b.set_epoch(0);
  EXPECT_EQ(b.epoch_order(), orders[0]);
  EXPECT_THAT(error_of([&] { b.set_epoch(-1); }), HasSubstr("[DataLoader::set_epoch] the epoch must be >= 0, got -1"));
}

TEST(RandomState, TrainStartStepErrors) {
  auto model = Dense(2, 1);
  auto opt = optimisers::setup(optimisers::Descent(0.1), model);
  auto loss = [](auto& m, const Tensor& x) { return sum(m(x)); };
  std::vector<Tensor> batches{ones({1, 2})};
  EXPECT_THAT(error_of([&] { train(loss, model, batches, opt, {.progress = false, .start_step = -1}); }),
              HasSubstr("[train] start_step must be >= 0, got -1"));
  // A step past the run's end runs nothing.
  TrainResult r = train(loss, model, batches, opt, {.epochs = 2, .progress = false, .start_step = 2});
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(r.epoch_loss.empty());
  // Resuming in the second epoch of a one-batch data set runs one step.
  r = train(loss, model, batches, opt, {.epochs = 2, .progress = false, .start_step = 1});
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.epoch_loss.size(), 1u);
}
