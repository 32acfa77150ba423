// The misuse suite (issue 35): what a careless user does, one case per ctest entry (tests/misuse.cmake),
// so a crash fails its case and nothing else. Seven families: overflowing shapes, NaN propagation,
// nested gradients, exceptions that must be flux::Error, configuration (threads, preferences), float
// to integer casts, and two threads on one model. Device cases run on every device (CPU, OpenCL).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))
#define EXPECT_OUT_OF_MEMORY(statement) EXPECT_THROW((void)(statement), ::flux::OutOfMemory)

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t k40 = int64_t(1) << 40, k62 = int64_t(1) << 62;

// A fresh folder under the build tree's temp area for one case.
std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("flux-misuse-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Tensor on(const std::vector<double>& v, const Device& d, DType t = DType::f32) {
  return to(Tensor(v, Shape{int64_t(v.size())}).cast(t), d);
}
}  // namespace

class Misuse : public ::testing::TestWithParam<Device> {};
FLUX_DEVICE_SUITE(Misuse);

// ---------------- 1. shape arithmetic ----------------

TEST_P(Misuse, OverflowingShapesAreErrors) {
  const Device d = GetParam();
  EXPECT_FLUX_ERROR(zeros({k40, k40}, DType::f32, d), "[zeros] shape (1099511627776, 1099511627776) has more elements than an int64 can count");
  EXPECT_FLUX_ERROR(zeros({3, k62}, DType::f32, d), "[zeros] shape (3, 4611686018427387904)");
  EXPECT_FLUX_ERROR(ones({int64_t(1) << 31, int64_t(1) << 31}, DType::f32, d), "[ones] shape (2147483648, 2147483648) has 4611686018427387904 elements: their bytes in Float32 exceed the address space");
  EXPECT_FLUX_ERROR(full({k40, k40, 2}, 1.0, DType::f32, d), "[full] shape");
  EXPECT_FLUX_ERROR(rand({k40, k40}, DType::f32, d), "[rand] shape");
  EXPECT_FLUX_ERROR(randn({k40, k40}, DType::f32, d), "[randn] shape");
  EXPECT_FLUX_ERROR(Tensor::empty({k62, 8}, DType::f32, d), "[empty] shape");
}

TEST_P(Misuse, NegativeDimensionNamesTheApi) {
  const Device d = GetParam();
  EXPECT_FLUX_ERROR(zeros({-2, 3}, DType::f32, d), "[zeros] negative dimension in shape (-2, 3)");
  EXPECT_FLUX_ERROR(ones({-1}, DType::f32, d), "[ones] negative dimension");
  EXPECT_FLUX_ERROR(full({2, -1}, 1.0, DType::f32, d), "[full] negative dimension");
  EXPECT_FLUX_ERROR(rand({-1}, DType::f32, d), "[rand] negative dimension");
  EXPECT_FLUX_ERROR(Tensor(std::vector<float>{1, 2}, Shape{-1, -2}), "[Tensor] negative dimension");
}

TEST_P(Misuse, HugeAllocationIsOutOfMemory) {
  const Device d = GetParam();
  // Representable sizes that no memory holds: flux::OutOfMemory (a flux::Error), never std::bad_alloc.
  EXPECT_OUT_OF_MEMORY(rand({k40, 1 << 12}, DType::f32, d));
  EXPECT_OUT_OF_MEMORY(zeros({k40, 1 << 12}, DType::f64, d));
  EXPECT_OUT_OF_MEMORY(arange(0.0, 1e15, 1.0, DType::f32, d));
}

TEST_P(Misuse, ReshapeAndBroadcastOverflow) {
  const Device d = GetParam();
  Tensor x = ones({4}, DType::f32, d);
  EXPECT_FLUX_ERROR(x.reshape({k40, k40}), "[reshape]");
  EXPECT_FLUX_ERROR(x.reshape({-1, k62, 8}), "[reshape]");
  EXPECT_FLUX_ERROR(x.reshape({k62, 4}), "[reshape]");
  EXPECT_FLUX_ERROR(broadcast_to(ones({1, 1}, DType::f32, d), Shape{k40, k40}), "[broadcast_to]");
  EXPECT_FLUX_ERROR(broadcast_to(ones({1, 1}, DType::f32, d), Shape{3, k62}), "[broadcast_to]");
}

TEST_P(Misuse, ConvAndPoolGeometryOverflow) {
  const Device d = GetParam();
  Tensor x = ones({1, 1, 4, 4}, DType::f32, d), w = ones({1, 1, 3, 3}, DType::f32, d);
  EXPECT_FLUX_ERROR(conv(x, w, Tensor(), {.pad = k62}), "[conv]");
  EXPECT_FLUX_ERROR(conv(x, w, Tensor(), {.pad = k40}), "[conv]");
  EXPECT_FLUX_ERROR(conv(x, w, Tensor(), {.pad = std::numeric_limits<int64_t>::max()}), "[conv]");
  EXPECT_FLUX_ERROR(conv(x, w, Tensor(), {.dilation = k62}), "[conv]");
  EXPECT_FLUX_ERROR(conv(x, w, Tensor(), {.pad = SamePad(), .dilation = k62}), "[conv]");
  EXPECT_FLUX_ERROR(conv_transpose(x, w, Tensor(), {.stride = k62}), "[conv_transpose]");
  EXPECT_FLUX_ERROR(conv_transpose(x, w, Tensor(), {.dilation = k62}), "[conv_transpose]");
  EXPECT_FLUX_ERROR(maxpool(x, {2, 2}, {.pad = k62}), "[maxpool]");
  EXPECT_FLUX_ERROR(meanpool(x, {2, 2}, {.pad = std::numeric_limits<int64_t>::max()}), "[meanpool]");
  EXPECT_FLUX_ERROR(maxpool(x, {k62, 2}), "[maxpool]");
}

TEST(MisuseLayers, HugeLayersAreErrors) {
  EXPECT_FLUX_ERROR(Dense(k62, 4), "[Dense] shape (4, 4611686018427387904)");
  EXPECT_FLUX_ERROR(Embedding(k62, 4), "[Embedding] shape (4611686018427387904, 4)");
  EXPECT_FLUX_ERROR(Conv({int64_t(1) << 31, int64_t(1) << 31}, int64_t(1) << 20, 4), "[Conv] shape");
  EXPECT_FLUX_ERROR(LSTM(k62, 4), "[LSTMCell] shape (16, 4611686018427387904)");
  EXPECT_FLUX_ERROR(LSTM(4, k62), "[LSTMCell] the gate count (gates × hidden) overflows");
  // Countable but far beyond any memory: OutOfMemory naming the size.
  EXPECT_OUT_OF_MEMORY(Dense(int64_t(1) << 30, int64_t(1) << 30));
  EXPECT_OUT_OF_MEMORY(Embedding(k40, 1 << 12));
}

TEST(MisuseLayers, HostBuffersAreOutOfMemory) {
  EXPECT_OUT_OF_MEMORY(randperm(k62));
  EXPECT_FLUX_ERROR(randperm(-1), "[randperm] needs a non-negative length");
}

TEST(MisuseLayers, DataLoaderWithHugeBatchsize) {
  Tensor X = rand({10, 3});
  DataLoader whole({X}, {.batchsize = std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(whole.size(), 1);
  int64_t rows = 0;
  for (auto [x] : whole) rows += x.shape()[0];
  EXPECT_EQ(rows, 10);
  DataLoader dropped({X}, {.batchsize = std::numeric_limits<int64_t>::max(), .partial = false});
  EXPECT_EQ(dropped.size(), 0);
  DataLoader three({X}, {.batchsize = 4});
  EXPECT_EQ(three.size(), 3);
}

TEST_P(Misuse, ArangeAbsurdRange) {
  const Device d = GetParam();
  EXPECT_FLUX_ERROR(arange(0.0, 1e30, 1.0, DType::f32, d), "[arange] arange(0, 1e+30, 1) would have 1e+30 elements");
  EXPECT_FLUX_ERROR(arange(0.0, kNaN, 1.0, DType::f32, d), "[arange] start, stop and step must be finite");
  EXPECT_FLUX_ERROR(arange(0.0, kInf, 1.0, DType::f32, d), "[arange] start, stop and step must be finite");
  EXPECT_FLUX_ERROR(arange(0.0, 1.0, kNaN, DType::f32, d), "[arange]");
  EXPECT_EQ(arange(0.0, 5.0, 1.0, DType::f32, d).numel(), 5);
  EXPECT_EQ(arange(5.0, 0.0, 1.0, DType::f32, d).numel(), 0);
}

TEST_P(Misuse, OnehotAbsurdClassCount) {
  const Device d = GetParam();
  Tensor labels = to(Tensor(std::vector<int64_t>{0, 1}, Shape{2}), d);
  EXPECT_FLUX_ERROR(onehot(labels, k62), "[onehot]");
  EXPECT_OUT_OF_MEMORY(onehot(labels, k40 * 64));
}

// ---------------- 2. NaN propagation ----------------

namespace {
// f(x) at x = (NaN, -1.5, 0.5, 2): the NaN stays NaN, the rest stay finite; and the gradient of
// sum(f(x)) is NaN at the NaN (the rule: a NaN input has a NaN derivative, never a silent 0).
template <class F> void expect_nan_through(const char* name, F f, const Device& d, DType t) {
  Tensor x = on({kNaN, -1.5, 0.5, 2.0}, d, t);
  std::vector<double> y = f(x).template to_vector<double>();
  ASSERT_EQ(y.size(), 4u) << name;
  EXPECT_TRUE(std::isnan(y[0])) << name << " of NaN gave " << y[0] << " on " << to_string(d) << " " << dtype_name(t);
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(std::isfinite(y[i])) << name << " element " << i;
  Tensor g = gradient([&](const Tensor& v) { return sum(f(v)); }, x);
  std::vector<double> gv = g.to_vector<double>();
  EXPECT_TRUE(std::isnan(gv[0])) << name << "'s gradient at NaN gave " << gv[0] << " on " << to_string(d) << " " << dtype_name(t);
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(std::isfinite(gv[i])) << name << "'s gradient, element " << i;
}
}  // namespace

TEST_P(Misuse, NaNPropagatesThroughEveryActivation) {
  const Device d = GetParam();
  for (DType t : {DType::f32, DType::f64}) {
    expect_nan_through("relu", [](const Tensor& x) { return relu(x); }, d, t);
    expect_nan_through("leakyrelu", [](const Tensor& x) { return leakyrelu(x); }, d, t);
    expect_nan_through("elu", [](const Tensor& x) { return elu(x); }, d, t);
    expect_nan_through("gelu", [](const Tensor& x) { return gelu(x); }, d, t);
    expect_nan_through("softplus", [](const Tensor& x) { return softplus(x); }, d, t);
    expect_nan_through("swish", [](const Tensor& x) { return swish(x); }, d, t);
    expect_nan_through("sigmoid", [](const Tensor& x) { return sigmoid(x); }, d, t);
    expect_nan_through("tanh", [](const Tensor& x) { return flux::tanh(x); }, d, t);
    expect_nan_through("abs", [](const Tensor& x) { return abs(x); }, d, t);
    expect_nan_through("clamp", [](const Tensor& x) { return clamp(x, -1.0, 1.0); }, d, t);
    expect_nan_through("maximum(x, 0)", [](const Tensor& x) { return maximum(x, zeros_like(x)); }, d, t);
    expect_nan_through("maximum(0, x)", [](const Tensor& x) { return maximum(zeros_like(x), x); }, d, t);
    expect_nan_through("minimum(x, 0)", [](const Tensor& x) { return minimum(x, zeros_like(x)); }, d, t);
    expect_nan_through("minimum(0, x)", [](const Tensor& x) { return minimum(zeros_like(x), x); }, d, t);
    expect_nan_through("maximum(x, scalar)", [](const Tensor& x) { return maximum(x, Tensor::scalar(0.25, x.dtype(), x.device())); }, d, t);
  }
}

TEST_P(Misuse, NaNPropagatesOnLongVectors) {
  // Long enough for every vectorised main loop (and its tail) of the CPU kernels.
  const Device d = GetParam();
  for (int64_t n : {7, 64, 1000, 4099}) {
    std::vector<double> v(size_t(n), -0.5);
    for (int64_t i = 0; i < n; i += 5) v[size_t(i)] = kNaN;
    Tensor x = on(v, d);
    for (auto& [name, y] : std::vector<std::pair<const char*, Tensor>>{
             {"relu", relu(x)}, {"clamp", clamp(x, 0.0, 1.0)}, {"maximum", maximum(x, zeros_like(x))},
             {"maximum(0, x)", maximum(zeros_like(x), x)}, {"minimum", minimum(zeros_like(x), x)},
             {"sigmoid", sigmoid(x)}, {"tanh", flux::tanh(x)}, {"gelu", gelu(x)}, {"swish", swish(x)}}) {
      std::vector<float> out = y.to_vector<float>();
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(std::isnan(out[size_t(i)]), i % 5 == 0) << name << " n=" << n << " at " << i << " on " << to_string(d);
    }
  }
}

TEST_P(Misuse, ArgmaxTreatsNaNAsTheExtreme) {
  const Device d = GetParam();
  // Rows: NaN in the middle, NaN first, two NaNs, none. PyTorch: argmax and argmin give the first NaN.
  Tensor x = to(Tensor(std::vector<float>{1, NAN, 3, NAN, 5, 0, 2, NAN, NAN, 4, 9, 1}, Shape{4, 3}), d);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 1}));
  EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 2}));
  // Along the first axis (strided reduction): columns (1, NaN, 2, 4), (NaN, 5, NaN, 9), (3, 0, NaN, 1).
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(argmin(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(onecold(x).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 1}));
  std::vector<float> m = max(x, 1).to_vector<float>();
  EXPECT_TRUE(std::isnan(m[0]) && std::isnan(m[1]) && std::isnan(m[2]) && m[3] == 9.f);
  EXPECT_TRUE(std::isnan(min(x).item<float>()));
}

TEST_P(Misuse, NaNThroughLayersWithRelu) {
  const Device d = GetParam();
  seed(3);
  // Inference (the fused bias + relu kernels) and inside gradient: a NaN in a row makes that row NaN.
  auto dense = Dense(5, 7, relu) | d;
  std::vector<float> xv(4 * 5, 0.25f);
  xv[7] = NAN;
  Tensor x = to(Tensor(xv, Shape{4, 5}), d);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> y = dense(x).to_vector<float>();
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 7; ++c) EXPECT_EQ(std::isnan(y[size_t(r * 7 + c)]), r == 1) << "Dense row " << r << " col " << c;
  }
  auto g = gradient([&](auto& m) { return sum(m(x)); }, dense);
  EXPECT_TRUE(std::isnan(sum(g.weight).item<float>()));
  auto conv_layer = Conv({3, 3}, 2, 3, relu, {.pad = 1}) | d;
  std::vector<float> iv(2 * 2 * 5 * 5, 0.5f);
  iv[25 + 12] = NAN;  // image 0, channel 1, the centre pixel
  Tensor img = to(Tensor(iv, Shape{2, 2, 5, 5}), d);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> y = conv_layer(img).to_vector<float>();
    int nan0 = 0, nan1 = 0;
    for (size_t i = 0; i < y.size(); ++i) (i < y.size() / 2 ? nan0 : nan1) += std::isnan(y[i]);
    EXPECT_EQ(nan0, 3 * 9) << "every output channel's 3x3 neighbourhood of the NaN pixel";
    EXPECT_EQ(nan1, 0);
  }
  // Conv + BatchNorm(relu) at inference: one fused kernel (scale, shift and relu in the conv) on the CPU.
  auto block = Chain(Conv({3, 3}, 2, 4, {.pad = 1, .bias = false}), BatchNorm(4, relu)) | d;
  testmode(block);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> y = block(img).to_vector<float>();
    int nan0 = 0, nan1 = 0;
    for (size_t i = 0; i < y.size(); ++i) (i < y.size() / 2 ? nan0 : nan1) += std::isnan(y[i]);
    EXPECT_EQ(nan0, 4 * 9) << "Conv + BatchNorm(relu), pass " << pass;
    EXPECT_EQ(nan1, 0);
  }
}

// ---------------- 3. nested gradient ----------------

TEST_P(Misuse, NestedGradientIsAClearError) {
  const Device d = GetParam();
  Tensor x = to(Tensor::scalar(2.0), d);
  auto inner = [](const Tensor& v) { return gradient([](const Tensor& u) { return sum(u * u * u); }, v); };
  EXPECT_FLUX_ERROR(gradient([&](const Tensor& v) { return sum(inner(v)); }, x), "[gradient] nested differentiation");
  EXPECT_FLUX_ERROR(withgradient([&](const Tensor& v) { return sum(inner(v)); }, x), "[gradient] nested differentiation");
  // A gradient penalty's shape: the inner function closes over the outer variable.
  Tensor b = to(Tensor::scalar(1.0), d);
  EXPECT_FLUX_ERROR(gradient([&](const Tensor& v) {
    return sum(gradient([&](const Tensor& u) { return sum(u * v); }, b));
  }, x), "[gradient] nested differentiation");
  // An inner gradient of tensors the outer one does not track is independent: allowed and right.
  Tensor outer = gradient([&](const Tensor& v) {
    Tensor inner = gradient([](const Tensor& u) { return sum(u * u); }, b);  // 2 b = 2
    return sum(v * inner.item<float>());
  }, x);
  EXPECT_FLOAT_EQ(outer.item<float>(), 2.f);
  // The inner gradient as a constant, under NoGrad: allowed, and the outer gradient is that of v * c.
  Tensor g = gradient([&](const Tensor& v) {
    Tensor c;
    {
      autodiff::NoGrad constant;
      c = inner(v);  // 3 v^2 = 12, not differentiated
    }
    return sum(v * c);
  }, x);
  EXPECT_FLOAT_EQ(g.item<float>(), 12.f);
  // And gradient still works after the refused nesting.
  EXPECT_FLOAT_EQ(gradient([](const Tensor& v) { return sum(v * v * v); }, x).item<float>(), 12.f);
}

// ---------------- 4. every exception is a flux::Error ----------------

TEST(MisuseFiles, ReadingDirectoriesAndDeviceFiles) {
  auto dir = scratch("files");
  EXPECT_FLUX_ERROR(data::read_csv(dir.string()), "[read_csv]");
  EXPECT_FLUX_ERROR(data::read_csv("/dev/zero"), "[read_csv] cannot read '/dev/zero': not a regular file");
  EXPECT_FLUX_ERROR(data::load_text("/dev/zero"), "[load_text] cannot read '/dev/zero'");
  EXPECT_FLUX_ERROR(data::read_csv("/dev/null"), "[read_csv]");
  EXPECT_FLUX_ERROR(load_state(dir.string()), "[load_state]");
  EXPECT_FLUX_ERROR(load_state("/dev/zero"), "[load_state]");
  auto model = Chain(Dense(2, 2));
  EXPECT_FLUX_ERROR(load("/dev/zero", model), "[load]");
  std::filesystem::remove_all(dir);
}

TEST(MisuseFiles, SaveNamesTheProblem) {
  auto model = Chain(Dense(2, 2));
  EXPECT_FLUX_ERROR(save("", model), "[save] the path is empty");
  auto dir = scratch("save");
  EXPECT_FLUX_ERROR(save(dir.string(), model), "is a directory");
  EXPECT_FLUX_ERROR(save(dir.string() + "/", model), "is a directory");
  EXPECT_FLUX_ERROR(save((dir / "missing" / "m.safetensors").string(), model), "[save]");
  std::filesystem::remove_all(dir);
}

// ---------------- 6. float to integer casts ----------------

TEST_P(Misuse, FloatToIntegerCastsRefuseNaNInfAndOutOfRange) {
  const Device d = GetParam();
  for (DType from : {DType::f32, DType::f64}) {
    EXPECT_FLUX_ERROR(on({1, kNaN}, d, from).cast(DType::i32), "[cast] cannot convert NaN to Int32");
    EXPECT_FLUX_ERROR(on({kInf}, d, from).cast(DType::i64), "[cast] cannot convert Inf to Int64");
    EXPECT_FLUX_ERROR(on({-kInf}, d, from).cast(DType::i64), "[cast] cannot convert -Inf to Int64");
    EXPECT_FLUX_ERROR(on({300}, d, from).cast(DType::u8), "[cast] cannot convert 300 to UInt8");
    EXPECT_FLUX_ERROR(on({-1}, d, from).cast(DType::u8), "[cast] cannot convert -1 to UInt8");
    EXPECT_FLUX_ERROR(on({3e9}, d, from).cast(DType::i32), "to Int32");
    EXPECT_FLUX_ERROR(on({1e19}, d, from).cast(DType::i64), "to Int64");
    // In range: truncation toward zero, as C++, NumPy's astype and PyTorch's to().
    EXPECT_EQ(on({2.7, -2.7, 255.9, 0}, d, from).cast(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 255, 0}));
    EXPECT_EQ(on({255.9, 0.5, -0.9}, d, from).cast(DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{255, 0, 0}));
    EXPECT_EQ(on({-9.2e18, 9.2e18}, d, DType::f64).cast(DType::i64).to_vector<int64_t>(),
              (std::vector<int64_t>{-9200000000000000000, 9200000000000000000}));
  }
  EXPECT_FLUX_ERROR(on({kNaN}, d, DType::f16).cast(DType::i32), "[cast] cannot convert NaN");
  // Bool is x != 0 (NaN is true), as C++ and NumPy.
  EXPECT_EQ(on({0, 2, kNaN}, d).cast(DType::boolean).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1}));
}

TEST_P(Misuse, ItemAndToVectorOfNaNAsIntegers) {
  const Device d = GetParam();
  EXPECT_FLUX_ERROR(on({kNaN}, d).item<int64_t>(), "[item] cannot convert NaN to int64");
  EXPECT_FLUX_ERROR(on({kInf}, d).item<int32_t>(), "[item] cannot convert Inf to int32");
  EXPECT_FLUX_ERROR(on({300}, d).item<uint8_t>(), "[item] cannot convert 300 to uint8");
  EXPECT_FLUX_ERROR(on({1, kNaN}, d).to_vector<int64_t>(), "[to_vector] cannot convert NaN to int64");
  EXPECT_FLUX_ERROR(on({1e19}, d, DType::f64).item<int64_t>(), "[item] cannot convert 1e+19 to int64");
  EXPECT_EQ(on({-2.5}, d).item<int64_t>(), -2);
  EXPECT_EQ(on({kNaN}, d).item<bool>(), true);
  EXPECT_TRUE(std::isnan(on({kNaN}, d).item<float>()));
}

// ---------------- 7. two threads on one model ----------------

TEST(MisuseThreads, ConcurrentUpdatesOfOneOptimiserStateAreDetected) {
  // Training one model from two threads is a user error (README, Threads); update() detects the
  // overlap on one optimiser state and throws in (at least) one of the threads.
  seed(1);
  auto model = Chain(Dense(64, 256, relu), Dense(256, 64));
  auto state = optimisers::setup(optimisers::Adam(1e-3), model);
  Tensor x = rand({32, 64}), y = rand({32, 64});
  auto grads = gradient([&](auto& m) { return mse(m(x), y); }, model);
  std::atomic<int> errors{0}, others{0};
  std::atomic<bool> go{false};
  // Both threads update until one sees the overlap (10 s at most): a fixed count of updates can end
  // before the other thread is scheduled at all on a loaded machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto worker = [&] {
    while (!go.load()) std::this_thread::yield();
    while (errors.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      try {
        optimisers::update(state, model, grads);
      } catch (const flux::Error& e) {
        if (std::string(e.what()).find("[update] another thread") != std::string::npos) ++errors;
        else ++others;
      }
    }
  };
  std::thread a(worker), b(worker);
  go.store(true);
  a.join();
  b.join();
  EXPECT_GT(errors.load(), 0) << "10 s of overlapping updates from two threads went undetected";
  EXPECT_EQ(others.load(), 0);
  // One thread alone: no error.
  EXPECT_NO_THROW(optimisers::update(state, model, grads));
}

// ---------------- 5. configuration (run by tests/misuse.cmake with the environment set) ----------------

namespace {
const char* misuse_env() {
  const char* e = std::getenv("FLUX_MISUSE_ENV");
  return e ? e : "";
}
}  // namespace

TEST(MisuseEnv, ThreadCount) {
  const std::string env = misuse_env();
  if (env.rfind("threads_", 0) != 0) GTEST_SKIP() << "run by tests/misuse.cmake with FLUX_NUM_THREADS set";
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int cap = int(std::max(64u, 8 * hw));
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  versioninfo();  // "... threads: N (FLUX_NUM_THREADS)"
  const std::string info = ::testing::internal::GetCapturedStdout();
  const size_t at = info.find("threads: ");
  ASSERT_NE(at, std::string::npos) << info;
  const int n = std::atoi(info.c_str() + at + 9);
  Tensor y = matmul(ones({256, 256}), ones({256, 256}));  // runs on the pool
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FLOAT_EQ(y.to_vector<float>()[0], 256.f);
  const std::string value = std::getenv("FLUX_NUM_THREADS");
  if (env == "threads_absurd") {
    EXPECT_EQ(n, cap);
    EXPECT_THAT(err, HasSubstr("FLUX_NUM_THREADS=" + value + " is more than " + std::to_string(cap)));
  } else if (env == "threads_valid") {
    EXPECT_EQ(n, 3);
    EXPECT_EQ(err, "");
  } else {
    EXPECT_EQ(n, int(hw));
    EXPECT_THAT(err, HasSubstr("FLUX_NUM_THREADS=\"" + value + "\" is not a thread count"));
  }
  // One warning, not one per use.
  size_t first = err.find("FLUX_NUM_THREADS"), second = err.find("FLUX_NUM_THREADS", first + 1);
  EXPECT_TRUE(env == "threads_valid" || (first != std::string::npos && (second == std::string::npos || err.find("Warning", first) == std::string::npos)));
}

TEST(MisuseEnv, Preferences) {
  const std::string env = misuse_env();
  if (env.rfind("prefs_", 0) != 0) GTEST_SKIP() << "run by tests/misuse.cmake with FLUX_PREFERENCES set";
  const std::string path = std::getenv("FLUX_PREFERENCES");
  if (env == "prefs_number") {
    std::ofstream(path) << "[flux]\ngpu_backend = 42\n";
  } else if (env == "prefs_directory") {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  } else if (env == "prefs_device") {
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/dev/zero", path);
  }
  ::testing::internal::CaptureStderr();
  Device d = get_device();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(d.is_cpu() || d.backend() != "");
  if (env == "prefs_number") {
    EXPECT_THAT(err, HasSubstr("gpu_backend must be a string such as \"OpenCL\"; got integer"));
  } else {
    EXPECT_THAT(err, HasSubstr("cannot read " + path));
    EXPECT_THAT(err, HasSubstr(env == "prefs_directory" ? "it is a directory" : "not a regular file"));
    EXPECT_FLUX_ERROR(gpu_backend("CPU"), "[gpu_backend] cannot read " + path);
  }
  std::filesystem::remove_all(path);
}
