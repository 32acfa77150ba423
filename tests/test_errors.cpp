// Bad input gives flux::Error with an "[api]"-prefixed message that names the shapes; nothing crashes.
#include <functional>
#include <random>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;
using ::testing::StartsWith;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {
Tensor i64(std::vector<int64_t> v) {
  int64_t n = int64_t(v.size());
  return Tensor(v, Shape{n});
}
}  // namespace

TEST(Errors, ElementwiseShapes) {
  EXPECT_FLUX_ERROR(add(ones({3, 4}), ones({5})), "[add] shapes (3, 4) and (5,) cannot be broadcast together");
  EXPECT_FLUX_ERROR(ones({2, 3}) * ones({3, 2}), "[mul] shapes (2, 3) and (3, 2) cannot be broadcast together");
  EXPECT_FLUX_ERROR(ones({2}) - ones({3}), "[sub] shapes (2,) and (3,)");
  EXPECT_FLUX_ERROR(ones({2}) / ones({3}), "[div] shapes (2,) and (3,)");
  EXPECT_FLUX_ERROR(maximum(ones({2}), ones({3})), "[maximum] shapes (2,) and (3,)");
  EXPECT_FLUX_ERROR(ones({2}) < ones({3}), "[lt] shapes (2,) and (3,)");
  EXPECT_FLUX_ERROR(where(ones({2}) > 0.0, ones({3}), ones({2})), "[where] shapes (2,) and (3,)");
  EXPECT_FLUX_ERROR(where(ones({2}), ones({2}), ones({2})), "[where] the condition must be a Bool tensor, got Float32");
  EXPECT_FLUX_ERROR(clamp(ones({2}), 1.0, 0.0), "[clamp] lower bound 1 is above upper bound 0");
}

TEST(Errors, UndefinedTensors) {
  Tensor u;
  EXPECT_FLUX_ERROR(add(u, ones({2})), "[add] got an undefined (default-constructed) tensor");
  EXPECT_FLUX_ERROR(relu(u), "[relu] got an undefined");
  EXPECT_FLUX_ERROR(exp(u), "[exp] got an undefined");
  EXPECT_FLUX_ERROR(sum(u), "[sum] got an undefined");
  EXPECT_FLUX_ERROR(matmul(u, ones({2})), "[matmul] got an undefined");
  EXPECT_FLUX_ERROR(u.shape(), "[shape] the tensor is undefined");
  EXPECT_FLUX_ERROR(u.to_vector<float>(), "[to_vector] the tensor is undefined");
  EXPECT_FLUX_ERROR(u.cast(DType::f64), "[cast] got an undefined");
  EXPECT_FLUX_ERROR(to(u, Device()), "[to] got an undefined");
  EXPECT_FLUX_ERROR(mse(u, ones({2})), "[mse] got an undefined");
}

TEST(Errors, Matmul) {
  EXPECT_FLUX_ERROR(matmul(ones({3, 4}), ones({5, 2})), "[matmul] shapes (3, 4) and (5, 2) do not compose (inner dimensions 4 and 5)");
  EXPECT_FLUX_ERROR(matmul(ones({3, 4}), ones({3, 4}), false, true).numel() + matmul(ones({3, 4}), ones({3, 4})).numel(),
                    "[matmul] shapes (3, 4) and (3, 4) do not compose");
  EXPECT_FLUX_ERROR(matmul(ones({4, 3}), ones({4, 2}), false, false), "(4, 3) and (4, 2) do not compose");
  EXPECT_FLUX_ERROR(matmul(ones({3, 4}), ones({3, 2}), true, true), "[matmul] shapes (3, 4)ᵀ and (3, 2)ᵀ do not compose (inner dimensions 3 and 2)");
  EXPECT_FLUX_ERROR(matmul(ones({3}), ones({4})), "[matmul] shapes (3,) and (4,) do not compose (inner dimensions 3 and 4)");
  EXPECT_FLUX_ERROR(matmul(ones({2, 3}), ones({4})), "[matmul] shapes (2, 3) and (4,) do not compose");
  EXPECT_FLUX_ERROR(matmul(ones({2, 3, 4}), ones({3, 4, 5})),
                    "[matmul] the batch dimensions of shapes (2, 3, 4) and (3, 4, 5) cannot be broadcast together");
  EXPECT_FLUX_ERROR(matmul(Tensor::scalar(1), ones({3})), "[matmul] needs tensors of at least 1 dimension; got shapes () and (3,)");
}

TEST(Errors, Reductions) {
  EXPECT_FLUX_ERROR(sum(ones({3}), 2), "[sum] axis 2 is out of range for a 1-dimensional tensor");
  EXPECT_FLUX_ERROR(sum(ones({3}), -2), "[sum] axis -2 is out of range");
  EXPECT_FLUX_ERROR(sum(ones({2, 3}), std::vector<int>{1, -1}), "[sum] repeated axis");
  EXPECT_FLUX_ERROR(mean(zeros({0})), "[mean] cannot take the mean of an empty tensor");
  EXPECT_FLUX_ERROR(mean(zeros({2, 0}), 1), "[mean] cannot take the mean over an empty axis of shape (2, 0)");
  EXPECT_FLUX_ERROR(max(zeros({0})), "[max] cannot reduce an empty axis of shape (0,)");
  EXPECT_FLUX_ERROR(min(zeros({3, 0}), 1), "[min] cannot reduce an empty axis of shape (3, 0)");
  EXPECT_FLUX_ERROR(argmax(zeros({2, 0}), 1), "[argmax] cannot reduce an empty axis of shape (2, 0)");
  EXPECT_FLUX_ERROR(argmin(ones({2}), 1), "[argmin] axis 1 is out of range");
  EXPECT_FLUX_ERROR(softmax(arange(3)), "[softmax] needs a floating-point tensor, got Int64");
  EXPECT_FLUX_ERROR(softmax(Tensor::scalar(1)), "[softmax] needs at least one dimension");
  EXPECT_FLUX_ERROR(logsoftmax(ones({2, 2}), 2), "[logsoftmax] axis 2 is out of range for a 2-dimensional tensor");
  EXPECT_FLUX_ERROR(logsumexp(zeros({2, 0}), 1), "[logsumexp] cannot reduce an empty axis of shape (2, 0)");
  EXPECT_FLUX_ERROR(logsumexp(arange(3), 0), "[logsumexp] needs a floating-point tensor, got Int64");
}

TEST(Errors, ShapesAndIndexing) {
  EXPECT_FLUX_ERROR(ones({6}).reshape({4, -1}), "[reshape] cannot reshape (6,) into (4, -1)");
  EXPECT_FLUX_ERROR(ones({6}).reshape({4, 2}), "[reshape] cannot reshape (6,) (6 elements) into (4, 2) (8 elements)");
  EXPECT_FLUX_ERROR(ones({6}).reshape({-1, -1}), "[reshape] only one axis may be -1");
  EXPECT_FLUX_ERROR(ones({6}).reshape({-2, -3}), "[reshape] negative dimension in (-2, -3)");
  EXPECT_FLUX_ERROR(ones({3, 2}).slice(2, 5), "[slice] range [2, 5) is out of bounds for axis 0 of shape (3, 2)");
  EXPECT_FLUX_ERROR(slice(ones({3, 2}), 1, 1, 0), "[slice] range [1, 0) is out of bounds for axis 1 of shape (3, 2)");
  EXPECT_FLUX_ERROR(slice(Tensor::scalar(1), 0, 0, 1), "[slice] cannot slice a 0-dimensional tensor");
  EXPECT_FLUX_ERROR(ones({3, 2})[3], "[index] index 3 is out of range for first axis of length 3");
  EXPECT_FLUX_ERROR(ones({3, 2})[-4], "[index] index -1 is out of range");
  EXPECT_FLUX_ERROR(Tensor::scalar(1)[0], "[index] cannot index a 0-dimensional tensor");
  EXPECT_FLUX_ERROR(ones({2}).transpose(), "[transpose] needs at least 2 dimensions; got shape (2,)");
  EXPECT_FLUX_ERROR(ones({2}).size(3), "[size] axis 3 is out of range for shape (2,)");
  EXPECT_FLUX_ERROR(permute(ones({2, 3}), {0, 0}), "[permute] axis 0 appears twice");
  EXPECT_FLUX_ERROR(permute(ones({2, 3}), {0}), "[permute] got 1 axes for a 2-dimensional tensor of shape (2, 3)");
  EXPECT_FLUX_ERROR(broadcast_to(ones({3}), Shape{2, 4}), "[broadcast_to] shapes (3,) and (2, 4) cannot be broadcast together");
  EXPECT_FLUX_ERROR(broadcast_to(ones({2, 3}), Shape{3}), "[broadcast_to] cannot broadcast shape (2, 3) to (3,)");
  EXPECT_FLUX_ERROR(sum_to(ones({2, 3}), Shape{4}), "[sum_to] cannot sum shape (2, 3) down to (4,)");
  EXPECT_FLUX_ERROR(sum_to(ones({3}), Shape{2, 3}), "[sum_to] cannot sum shape (3,) down to the larger shape (2, 3)");
  EXPECT_FLUX_ERROR(concat({ones({2, 3}), ones({2, 4})}), "[concat] shapes (2, 3) and (2, 4) differ outside axis 0");
  EXPECT_FLUX_ERROR(concat({ones({2, 3}), ones({3})}), "[concat] tensor 1 has shape (3,) but tensor 0 has shape (2, 3)");
  EXPECT_FLUX_ERROR(concat({}), "[concat] needs at least one tensor");
  EXPECT_FLUX_ERROR(concat({Tensor::scalar(1)}), "[concat] cannot concatenate 0-dimensional tensors");
  EXPECT_FLUX_ERROR(concat({ones({2})}, 1), "[concat] axis 1 is out of range");
  EXPECT_FLUX_ERROR(stack({ones({2}), ones({3})}), "[stack] shapes (2,) and (3,) differ");
  EXPECT_FLUX_ERROR(stack({}), "[stack] needs at least one tensor");
  EXPECT_FLUX_ERROR(stack({ones({2})}, 2), "[stack] axis 2 is out of range");
  EXPECT_FLUX_ERROR(index_select(ones({3, 2}), 0, i64({3})), "[index_select] index 3 is out of range for axis 0 of length 3 (0-based)");
  EXPECT_FLUX_ERROR(index_select(ones({3, 2}), 1, i64({-1})), "[index_select] index -1 is out of range for axis 1 of length 2");
  EXPECT_FLUX_ERROR(index_select(ones({3, 2}), 0, Tensor({1})), "[index_select] indices must be Int32 or Int64, got Float32");
  EXPECT_FLUX_ERROR(index_select(ones({3, 2}), 0, Tensor(std::vector<int64_t>{0, 1}, Shape{1, 2})),
                    "[index_select] indices must be 1-dimensional, got shape (1, 2)");
  EXPECT_FLUX_ERROR(index_select(ones({3, 2}), 2, i64({0})), "[index_select] axis 2 is out of range");
  EXPECT_FLUX_ERROR(onehot(i64({5}), 3), "[onehot] label 5 is outside 0..2");
  EXPECT_FLUX_ERROR(onehot(Tensor({1}), 3), "[onehot] labels must be an integer tensor, got Float32");
  EXPECT_FLUX_ERROR(onehot(i64({1}), 0), "[onehot] nclasses must be positive, got 0");
  EXPECT_FLUX_ERROR(onecold(Tensor::scalar(1)), "[onecold] needs at least one dimension");
  Tensor dst = ones({2});
  EXPECT_FLUX_ERROR(copy_(dst, ones({3})), "[copy_] shapes (2,) (destination) and (3,) (source) differ");
  EXPECT_FLUX_ERROR(sub_(dst, ones({3})), "[sub_] needs equal shapes and dtypes");
}

TEST(Errors, Construction) {
  EXPECT_FLUX_ERROR(Tensor({{1, 2}, {3}}), "[Tensor] ragged rows: expected 2 values per row, got 1");
  EXPECT_FLUX_ERROR(Tensor(std::vector<float>{1, 2, 3}, Shape{2, 2}), "[Tensor] 3 values do not fill shape (2, 2) (4 elements)");
  EXPECT_FLUX_ERROR(Tensor(std::vector<uint8_t>{1}, Shape{1}, DType::f32), "[Tensor] a uint8 vector makes a UInt8 or Bool tensor, not Float32");
  EXPECT_FLUX_ERROR(zeros({-1}), "[zeros] negative dimension in shape (-1,)");
  EXPECT_FLUX_ERROR(rand({2, -3}), "[rand] negative dimension in shape (2, -3)");
  EXPECT_FLUX_ERROR(randn({2}, DType::i32), "[randn] needs a floating-point dtype, got Int32");
  EXPECT_FLUX_ERROR(zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), "[Shape] at most 8 dimensions are supported");
  EXPECT_FLUX_ERROR(arange(0, 1, 0), "[arange] step must be non-zero");
  EXPECT_FLUX_ERROR(randperm(-1), "[randperm] needs a non-negative length, got -1");
  EXPECT_FLUX_ERROR(ones({3}).item<float>(), "[item] needs a one-element tensor; got shape (3,)");
  EXPECT_FLUX_ERROR(zeros({0}).item<float>(), "[item] needs a one-element tensor; got shape (0,)");
  EXPECT_FLUX_ERROR(zeros({int64_t(1) << 50}), "out of memory");
}

TEST(Errors, Devices) {
  EXPECT_FLUX_ERROR(zeros({2}, DType::f32, Device("CPU", 3)), "[device] CPU has one device (index 0); got CPU:3");
  EXPECT_FLUX_ERROR(get_device("NoSuchBackend"), "NoSuchBackend");
  if (!functional("CUDA")) {
    EXPECT_FLUX_ERROR(to(ones({2}), Device("CUDA", 0)), "CUDA");
  }
}

TEST(Errors, MixedDevicesNameBothDevices) {
  const auto& devices = flux::testing::test_devices();
  auto other = std::find_if(devices.begin(), devices.end(), [](const Device& d) { return !d.is_cpu(); });
  if (other == devices.end()) GTEST_SKIP() << "only the CPU is present";
  Tensor a = ones({2}), b = to(ones({2}), *other);
  std::string names = "tensors on CPU and " + to_string(*other) + "; move one with to(x, device)";
  EXPECT_FLUX_ERROR(add(a, b), "[add] " + names);
  EXPECT_FLUX_ERROR(matmul(a, b), "[matmul] " + names);
  EXPECT_FLUX_ERROR(where(a > 0.0, a, b), "[where] tensors on CPU and ");
  EXPECT_FLUX_ERROR(concat({a, b}), "[concat] " + names);
  EXPECT_FLUX_ERROR(mse(a, b), "[mse] " + names);
  EXPECT_FLUX_ERROR(index_select(b, 0, i64({0})), "[index_select] tensors on ");
  EXPECT_FLUX_ERROR(Dense(2, 2)(b), "[Dense] input on " + to_string(*other) + " but the layer's weight on CPU");
  Tensor dst = ones({2});
  EXPECT_FLUX_ERROR(sub_(dst, b), "[sub_] " + names);
}

TEST(Errors, LayersLossesAndGradients) {
  EXPECT_FLUX_ERROR(Dense(3, 2)(ones({4, 5})),
                    "[Dense] expected input with last dimension 3 (Dense(3 => 2)); got shape (4, 5). Observations go along "
                    "the first axis: (N, 3)");
  EXPECT_FLUX_ERROR(Dense(3, 2)(Tensor::scalar(1)), "[Dense] expected input with last dimension 3");
  EXPECT_FLUX_ERROR(Dense(0, 2), "[Dense] sizes must be positive; got Dense(0 => 2)");
  EXPECT_FLUX_ERROR(Dense(ones({2, 3}), ones({3})), "[Dense] bias must have shape (2,) to match weight (2, 3); got (3,)");
  EXPECT_FLUX_ERROR(Dense(ones({3}), Tensor()), "[Dense] weight must be a 2-dimensional (out, in) tensor; got 3-element Tensor{Float32, CPU}");
  EXPECT_FLUX_ERROR(Dense()(ones({2})), "[Dense] the layer is empty (default-constructed)");
  EXPECT_FLUX_ERROR(glorot_uniform(0, 3), "[glorot_uniform] dimensions must be positive; got (0, 3)");
  EXPECT_FLUX_ERROR(mse(ones({3}), ones({4})), "[mse] prediction shape (3,) and target shape (4,) differ");
  EXPECT_FLUX_ERROR(mae(ones({3, 1}), ones({3})), "[mae] prediction shape (3, 1) and target shape (3,) differ");
  EXPECT_FLUX_ERROR(crossentropy(ones({2, 3}), ones({3, 2})), "[crossentropy] prediction shape (2, 3) and target shape (3, 2) differ");
  EXPECT_FLUX_ERROR(logitcrossentropy(ones({2, 3}), ones({2, 2})), "[logitcrossentropy] prediction shape (2, 3)");
  EXPECT_FLUX_ERROR(binarycrossentropy(ones({2}), ones({3})), "[binarycrossentropy] prediction shape (2,)");
  EXPECT_FLUX_ERROR(logitbinarycrossentropy(ones({2}), ones({3})), "[logitbinarycrossentropy] prediction shape (2,)");
  EXPECT_FLUX_ERROR(kldivergence(ones({2}), ones({3})), "[kldivergence] prediction shape (2,)");
  EXPECT_FLUX_ERROR(huber(ones({2}), ones({2}), {}, -1), "[huber] delta must be positive, got -1");
  EXPECT_FLUX_ERROR(mse(arange(3), arange(3)), "[mse] needs floating-point predictions, got Int64");
  EXPECT_FLUX_ERROR(mse(zeros({0}), zeros({0})), "[mse] got empty tensors of shape (0,)");
  EXPECT_FLUX_ERROR(gradient([](const Tensor& x) { return x * 2.0; }, ones({3})),
                    "[gradient] the function must return a scalar (one-element) tensor; got shape (3,)");
  EXPECT_FLUX_ERROR(gradient([](const Tensor&) { return Tensor(); }, ones({2})), "[gradient] the function returned an undefined tensor");
  EXPECT_FLUX_ERROR(gradient([](const Tensor& x) { return sum(x > 0.0); }, ones({2})),
                    "[gradient] the function returned a tensor of dtype Int64; a floating-point loss is needed");
}

TEST(Errors, EveryMessageStartsWithTheApiName) {
  std::vector<std::function<void()>> bad = {
      [] { add(ones({2}), ones({3})); },       [] { matmul(ones({2}), ones({3})); },
      [] { sum(ones({2}), 5); },               [] { ones({2}).reshape({3}); },
      [] { mse(ones({2}), ones({3})); },       [] { DataLoader<1>({Tensor()}); },
      [] { concat({}); },                      [] { onehot(i64({9}), 2); },
  };
  for (auto& f : bad) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), ::testing::MatchesRegex("\\[[A-Za-z_]+\\] .*"));
    }
  }
}

TEST(Errors, ErrorsLeaveNoTapeBehind) {
  // a failing op inside gradient() propagates, and a later gradient() works normally
  EXPECT_FLUX_ERROR(gradient([](const Tensor& x) { return sum(x + ones({3})); }, ones({2})), "[add] shapes (2,) and (3,)");
  Tensor g = gradient([](const Tensor& x) { return sum(x * 3.0); }, ones({2}));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{3, 3}));
  EXPECT_EQ((ones({2}) * 2.0).impl()->tape_id, -1);
}

TEST(Errors, RandomShapesGiveResultsOrFluxErrorsOnly) {
  // Every op on random (often incompatible, sometimes empty) shapes either works or throws flux::Error.
  std::mt19937 gen(2024);
  auto random_shape = [&] {
    std::vector<int64_t> s(std::uniform_int_distribution<int>(0, 3)(gen));
    for (auto& d : s) d = std::uniform_int_distribution<int>(0, 3)(gen);
    return Shape(s);
  };
  auto ops = std::vector<std::function<Tensor(const Tensor&, const Tensor&)>>{
      [](auto& a, auto& b) { return a + b; },
      [](auto& a, auto& b) { return a / b; },
      [](auto& a, auto& b) { return pow(a, b); },
      [](auto& a, auto& b) { return where(a > 0.5, a, b); },
      [](auto& a, auto& b) { return matmul(a, b); },
      [](auto& a, auto& b) { return matmul(a, b, true, false); },
      [](auto& a, auto& b) { return matmul(a, b, false, true); },
      [](auto& a, auto& b) { return concat({a, b}); },
      [](auto& a, auto& b) { return concat({a, b}, -1); },
      [](auto& a, auto& b) { return stack({a, b}, 1); },
      [](auto& a, auto& b) { return broadcast_to(a, b.shape()); },
      [](auto& a, auto& b) { return sum_to(a, b.shape()); },
      [](auto& a, auto&) { return sum(a, 1, true); },
      [](auto& a, auto&) { return mean(a, -1); },
      [](auto& a, auto&) { return max(a); },
      [](auto& a, auto&) { return argmax(a, 0); },
      [](auto& a, auto&) { return softmax(a, 0); },
      [](auto& a, auto&) { return logsumexp(a, -1); },
      [](auto& a, auto&) { return a.transpose(); },
      [](auto& a, auto&) { return slice(a, -1, 1, 2); },
      [](auto& a, auto&) { return a[1]; },
      [](auto& a, auto&) { return a.reshape({-1, 2}); },
      [](auto& a, auto&) { return index_select(a, 0, Tensor(std::vector<int64_t>{0, 1}, Shape{2})); },
      [](auto& a, auto& b) { return mse(a, b); },
      [](auto& a, auto& b) { return logitcrossentropy(a, b); },
      [](auto& a, auto&) { return onecold(a); },
      [](auto& a, auto& b) { return gradient([&](const Tensor& x) { return sum(matmul(x, b)); }, a); },
      [](auto& a, auto& b) { return gradient([&](const Tensor& x) { return mean(x * b); }, a); },
  };
  int ok = 0, errors = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Shape sa = random_shape(), sb = random_shape();
    Tensor a = rand(sa), b = rand(sb);
    for (size_t k = 0; k < ops.size(); ++k) {
      try {
        Tensor r = ops[k](a, b);
        if (r.defined() && r.numel()) (void)r.to_vector<double>();
        ++ok;
      } catch (const Error& e) {
        EXPECT_THAT(std::string(e.what()), StartsWith("[")) << "op " << k;
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "op " << k << " on " << to_string(sa) << " and " << to_string(sb) << " threw a non-flux exception: " << e.what();
      }
    }
  }
  EXPECT_GT(ok, 500);
  EXPECT_GT(errors, 500);
}
