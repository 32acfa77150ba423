// One model served from many threads (issue 37): user threads call ONE model at once, in test mode,
// and every output must be bitwise a single caller's; different models at once likewise; independent
// training runs (each thread its own deepcopy and optimiser) bitwise equal to the same runs done one
// after another. On every device (CPU, OpenCL on PoCL). The models are sized so that the CPU runs its
// inference paths: Dense at batch >= 8 (prepared weights), Conv fused with BatchNorm, MaxPool, a
// residual block, a whole ResNet-18, an LSTM. Also run under ThreadSanitizer (scripts/test --tsan).
#include <atomic>
#include <cstring>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flux/models/resnet.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {

class Concurrency : public ::testing::TestWithParam<Device> {};

constexpr int kThreadCounts[] = {2, 4};

// Under ThreadSanitizer (scripts/test --tsan: -O0, every access checked) one ResNet-18 forward takes
// seconds, so that test is skipped there; the CNN test covers its layers (fused Conv + BatchNorm,
// MaxPool, a residual block) under ThreadSanitizer.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Runs body(thread, call) for `calls` calls in each of `threads` threads released together; returns
/// the first exception's message ("" when none was thrown).
template <class Body> std::string run_threads(int threads, int calls, Body body) {
  std::latch start(threads);
  std::mutex m;
  std::string error;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        for (int c = 0; c < calls; ++c) body(t, c);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        if (error.empty()) error = "thread " + std::to_string(t) + ": " + e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  return error;
}

/// `forward` called from 2 and 4 threads at once, `calls` times each: every output's bits equal the
/// single caller's `want` (computed before the threads start, so it is the first call's).
template <class Forward> void expect_concurrent_calls_match(Forward forward, int calls) {
  const std::vector<float> want = forward().template to_vector<float>();
  ASSERT_FALSE(want.empty());
  for (int threads : kThreadCounts) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::atomic<int> differing{0};
    const std::string error = run_threads(threads, calls, [&](int, int) {
      if (!same_bits(forward().template to_vector<float>(), want)) differing.fetch_add(1);
    });
    EXPECT_EQ(error, "");
    EXPECT_EQ(differing.load(), 0) << "of " << threads * calls << " calls";
  }
  EXPECT_TRUE(same_bits(forward().template to_vector<float>(), want)) << "a single caller after the threads";
}

/// BatchNorm running statistics and scale away from their initial 0 / 1, so a fused conv + BatchNorm
/// has something to fold.
void randomise_batchnorm(BatchNorm& bn, const Device& dev) {
  const int64_t c = bn.weight.numel();
  copy_(bn.running_mean, to(randn(Shape{c}) * 0.1, dev));
  copy_(bn.running_var, to(rand(Shape{c}) + 0.5, dev));
  copy_(bn.weight, to(rand(Shape{c}) + 0.5, dev));
  copy_(bn.bias, to(randn(Shape{c}) * 0.1, dev));
}

auto make_mlp(const Device& dev) { return Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10)) | dev; }

/// Conv + BatchNorm (fused at inference), MaxPool, a residual block (two fused convs, the second with
/// the residual add), global pooling and a Dense head.
auto make_cnn(const Device& dev) {
  auto m = Chain(Conv({3, 3}, 3, 16, {.pad = 1, .bias = false}), BatchNorm(16, relu), MaxPool({2, 2}),
                 models::BasicBlock<models::NoDownsample>(16, 16), GlobalMeanPool(), flatten, Dense(16, 10)) |
           dev;
  randomise_batchnorm(m.get<1>(), dev);
  randomise_batchnorm(m.get<3>().bn1, dev);
  randomise_batchnorm(m.get<3>().bn2, dev);
  return m;
}

/// LSTM followed by a Dense on every step (N, T, hidden) -> (N, T, 10).
struct LstmHead {
  LSTM lstm;
  Dense head;
  Tensor operator()(const Tensor& x) const { return head(lstm(x)); }
};
FLUX_LAYER(LstmHead, lstm, head)

LstmHead make_lstm(const Device& dev) { return LstmHead{LSTM(32, 64), Dense(64, 10)} | dev; }

}  // namespace

TEST_P(Concurrency, MlpInferenceFromManyThreads) {
  const Device dev = GetParam();
  seed(3701);
  auto model = make_mlp(dev);
  testmode(model);
  const Tensor x = to(randn(Shape{32, 784}), dev);  // batch 32: the CPU's prepared-weights Dense
  expect_concurrent_calls_match([&] { return model(x); }, 6);
}

TEST_P(Concurrency, ConvBatchNormPoolResidualFromManyThreads) {
  const Device dev = GetParam();
  seed(3702);
  auto model = make_cnn(dev);
  testmode(model);
  const Tensor x = to(randn(Shape{4, 3, 16, 16}), dev);
  expect_concurrent_calls_match([&] { return model(x); }, 4);
}

TEST_P(Concurrency, ResNet18FromManyThreads) {
  if (kThreadSanitizer) GTEST_SKIP() << "too slow under ThreadSanitizer; the CNN test covers its layers there";
  const Device dev = GetParam();
  seed(3703);
  auto model = models::ResNet18(10) | dev;
  testmode(model);
  const Tensor x = to(randn(Shape{2, 3, 32, 32}), dev);
  expect_concurrent_calls_match([&] { return model(x); }, 1);
}

TEST_P(Concurrency, LstmDenseFromManyThreads) {
  const Device dev = GetParam();
  seed(3704);
  LstmHead model = make_lstm(dev);
  testmode(model);
  const Tensor x = to(randn(Shape{4, 12, 32}), dev);
  expect_concurrent_calls_match([&] { return model(x); }, 3);
}

// Every thread's first call at once, nothing run before: whatever a backend builds or chooses on a
// shape's first call (the CPU's kernel choice and prepared weights; OpenCL's programs, kernel objects
// and CLBlast's GEMM program, Float32 and Float64) is made by several threads together. Every output
// bitwise equal to a single caller's afterwards. (ctest runs each test in its own process, so these
// really are the process's first calls there.)
TEST_P(Concurrency, FirstCallsFromManyThreadsAtOnce) {
  const Device dev = GetParam();
  seed(3709);
  auto model32 = Chain(Dense(48, 96, relu), Dense(96, 12)) | dev;
  auto model64 = fmap([](const Tensor& t) { return t.f64(); }, model32);
  testmode(model32);
  testmode(model64);
  const Tensor x32 = to(randn(Shape{16, 48}), dev), x64 = x32.f64();
  const int threads = 4;
  std::vector<std::vector<float>> got(static_cast<size_t>(threads));
  const std::string error = run_threads(threads, 1, [&](int t, int) {
    got[size_t(t)] = (t % 2 ? model64(x64).f32() : model32(x32)).to_vector<float>();
  });
  ASSERT_EQ(error, "");
  const std::vector<float> want32 = model32(x32).to_vector<float>(), want64 = model64(x64).f32().to_vector<float>();
  for (int t = 0; t < threads; ++t)
    EXPECT_TRUE(same_bits(got[size_t(t)], t % 2 ? want64 : want32)) << "thread " << t;
}

// Thread t runs model t % 3 (MLP, CNN, LSTM): different models, different kernels, at once.
TEST_P(Concurrency, DifferentModelsAtOnce) {
  const Device dev = GetParam();
  seed(3705);
  auto mlp = make_mlp(dev);
  auto cnn = make_cnn(dev);
  LstmHead lstm = make_lstm(dev);
  testmode(mlp);
  testmode(cnn);
  testmode(lstm);
  const Tensor xm = to(randn(Shape{32, 784}), dev), xc = to(randn(Shape{4, 3, 16, 16}), dev),
               xl = to(randn(Shape{4, 12, 32}), dev);
  auto forward = [&](int which) {
    return which == 0 ? mlp(xm) : which == 1 ? cnn(xc) : lstm(xl);
  };
  const std::vector<float> want[3] = {forward(0).to_vector<float>(), forward(1).to_vector<float>(),
                                      forward(2).to_vector<float>()};
  for (int threads : {3, 6}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::atomic<int> differing[3] = {0, 0, 0};
    const std::string error = run_threads(threads, 3, [&](int t, int) {
      if (!same_bits(forward(t % 3).to_vector<float>(), want[t % 3])) differing[t % 3].fetch_add(1);
    });
    EXPECT_EQ(error, "");
    EXPECT_EQ(differing[0].load(), 0) << "MLP";
    EXPECT_EQ(differing[1].load(), 0) << "CNN";
    EXPECT_EQ(differing[2].load(), 0) << "LSTM";
  }
}

namespace {

/// `steps` Adam steps of mse(model(x), y) on `model` (the caller's own copy); returns each step's
/// loss, then every parameter and non-trainable (BatchNorm running statistics) after the last step.
template <class M> std::vector<float> train_run(M model, const Tensor& x, const Tensor& y, int steps) {
  auto state = optimisers::setup(optimisers::Adam(1e-2), model);
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
    optimisers::update(state, model, grads);
    out.push_back(loss.template item<float>());
  }
  for (const Tensor& p : params(model)) {
    const std::vector<float> v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  for (const Tensor& p : nontrainables(model)) {
    const std::vector<float> v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// Independent training runs of deepcopies of `base`: one after another, then 2 and 4 at once in
/// threads; every thread's losses and final state bitwise equal the sequential run's.
template <class M> void expect_concurrent_training_matches(const M& base, const Tensor& x, const Tensor& y, int steps) {
  const std::vector<float> want = train_run(deepcopy(base), x, y, steps);
  ASSERT_GT(want.size(), size_t(steps));
  EXPECT_TRUE(same_bits(train_run(deepcopy(base), x, y, steps), want)) << "two sequential runs differ";
  for (int threads : kThreadCounts) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::vector<std::vector<float>> got(static_cast<size_t>(threads));
    const std::string error = run_threads(threads, 1, [&](int t, int) { got[size_t(t)] = train_run(deepcopy(base), x, y, steps); });
    EXPECT_EQ(error, "");
    for (int t = 0; t < threads; ++t) EXPECT_TRUE(same_bits(got[size_t(t)], want)) << "thread " << t;
  }
}

}  // namespace

TEST_P(Concurrency, IndependentMlpTrainingInThreads) {
  const Device dev = GetParam();
  seed(3706);
  auto base = Chain(Dense(64, 128, relu), Dense(128, 128, relu), Dense(128, 10)) | dev;
  const Tensor x = to(randn(Shape{16, 64}), dev), y = to(randn(Shape{16, 10}), dev);
  expect_concurrent_training_matches(base, x, y, 3);
}

TEST_P(Concurrency, IndependentCnnTrainingInThreads) {
  const Device dev = GetParam();
  seed(3707);
  auto base = make_cnn(dev);  // BatchNorm in training: batch statistics, running statistics updated
  const Tensor x = to(randn(Shape{4, 3, 12, 12}), dev), y = to(randn(Shape{4, 10}), dev);
  expect_concurrent_training_matches(base, x, y, 2);
}

TEST_P(Concurrency, IndependentLstmTrainingInThreads) {
  const Device dev = GetParam();
  seed(3708);
  LstmHead base = make_lstm(dev);
  const Tensor x = to(randn(Shape{4, 6, 32}), dev), y = to(randn(Shape{4, 6, 10}), dev);
  expect_concurrent_training_matches(base, x, y, 2);
}

FLUX_DEVICE_SUITE(Concurrency);
