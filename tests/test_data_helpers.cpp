// Small data helpers (issue 18): data::splitobs / split_indices (seeded, stratified) and
// data::Standardiser (fit on training rows, apply to any rows), on every device; the free
// functions item<T>(t) and to_vector<T>(t) inside generic lambdas.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {

/// x[i] = (i, 10 i) as (n, 2) Float32: each row names its observation.
Tensor numbered_rows(int64_t n) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.insert(v.end(), {float(i), float(10 * i)});
  return Tensor(v, Shape{n, 2});
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST(SplitObs, IndicesPartitionTheObservations) {
  data::SplitIndices s = data::split_indices(10, {.at = 0.7, .seed = 3});
  EXPECT_EQ(s.train.size(), 7u);
  EXPECT_EQ(s.test.size(), 3u);
  std::vector<int64_t> all = s.train;
  all.insert(all.end(), s.test.begin(), s.test.end());
  EXPECT_EQ(sorted(all), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // round(at * n): 0.8 * 1797 = 1437.6 -> 1438, as MLUtils.
  EXPECT_EQ(data::split_indices(1797, {.at = 0.8, .seed = 1}).train.size(), 1438u);
  // No shuffle: the first part is the first rows, in order.
  data::SplitIndices k = data::split_indices(5, {.at = 0.6, .shuffle = false});
  EXPECT_EQ(k.train, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(k.test, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(data::split_indices(4, {.at = 0.0}).train.size(), 0u);
  EXPECT_EQ(data::split_indices(4, {.at = 1.0}).test.size(), 0u);
}

TEST(SplitObs, TheSameSeedGivesTheSameSplitWhateverTheGlobalGenerator) {
  seed(1);
  data::SplitIndices a = data::split_indices(100, {.seed = 42});
  seed(2);
  (void)rand({3});
  data::SplitIndices b = data::split_indices(100, {.seed = 42});
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.test, b.test);
  EXPECT_NE(a.train, data::split_indices(100, {.seed = 43}).train);
  // Unseeded: drawn from the global generator, so flux::seed repeats it.
  seed(7);
  data::SplitIndices c = data::split_indices(100);
  seed(7);
  EXPECT_EQ(c.train, data::split_indices(100).train);
  EXPECT_NE(sorted(c.train), c.train);  // shuffled
}

TEST(SplitObs, StratifiedKeepsEveryClassInProportion) {
  // 60 of class 0, 30 of class 1, 10 of class 2, sorted by class (the worst case for a plain split).
  std::vector<int64_t> labels;
  for (auto [label, count] : std::vector<std::pair<int64_t, int>>{{0, 60}, {1, 30}, {2, 10}})
    labels.insert(labels.end(), size_t(count), label);
  Tensor y(labels, Shape{100});
  for (bool shuffle : {true, false}) {
    data::SplitIndices s = data::split_indices(100, {.at = 0.8, .shuffle = shuffle, .seed = 5, .stratified = y});
    std::map<int64_t, int> train_count, test_count;
    for (int64_t i : s.train) ++train_count[labels[size_t(i)]];
    for (int64_t i : s.test) ++test_count[labels[size_t(i)]];
    EXPECT_EQ(train_count[0], 48);
    EXPECT_EQ(train_count[1], 24);
    EXPECT_EQ(train_count[2], 8);
    EXPECT_EQ(test_count[0], 12);
    EXPECT_EQ(test_count[1], 6);
    EXPECT_EQ(test_count[2], 2);
    std::vector<int64_t> all = s.train;
    all.insert(all.end(), s.test.begin(), s.test.end());
    EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 100u);
    if (!shuffle) {
      EXPECT_EQ(sorted(s.train), s.train);
    } else {
      EXPECT_NE(sorted(s.train), s.train);  // the classes are mixed again
    }
  }
  // (N, 1) labels and labels on another layout of the same values give the same split.
  EXPECT_EQ(data::split_indices(100, {.seed = 5, .stratified = y.reshape({100, 1})}).train,
            data::split_indices(100, {.seed = 5, .stratified = y}).train);
}

class SplitObsOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(SplitObsOnDevice, TensorsAreSplitAlikeOnTheirDevice) {
  const Device d = GetParam();
  Tensor X = to(numbered_rows(20), d);
  Tensor y = to(Tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
                       Shape{20}),
                d);
  auto [train, test] = data::splitobs({X, y}, {.at = 0.75, .seed = 11, .stratified = to(y, d) > 9.5});
  auto [Xtr, ytr] = train;
  auto [Xte, yte] = test;
  EXPECT_EQ(Xtr.shape(), (Shape{16, 2}));  // round(0.75 * 10) = 8 of each class
  EXPECT_EQ(Xte.shape(), (Shape{4, 2}));
  EXPECT_EQ(Xtr.device(), d);
  EXPECT_EQ(yte.device(), d);
  EXPECT_EQ(ytr.dtype(), DType::i64);
  const data::SplitIndices idx = data::split_indices(20, {.at = 0.75, .seed = 11, .stratified = to(y, d) > 9.5});
  EXPECT_EQ(ytr.to_vector<int64_t>(), idx.train);
  EXPECT_EQ(yte.to_vector<int64_t>(), idx.test);
  std::vector<float> xv = Xtr.to_vector<float>();
  for (size_t r = 0; r < idx.train.size(); ++r) {  // the same rows of X as of y
    EXPECT_EQ(xv[2 * r], float(idx.train[r]));
    EXPECT_EQ(xv[2 * r + 1], float(10 * idx.train[r]));
  }
  auto [a, b] = data::splitobs(X, {.at = 0.5, .shuffle = false});
  EXPECT_EQ(a.to_vector<float>(), numbered_rows(10).to_vector<float>());
  EXPECT_EQ(b.shape(), (Shape{10, 2}));
  auto [all, none] = data::splitobs(X, {.at = 1.0});
  EXPECT_EQ(all.shape(), (Shape{20, 2}));
  EXPECT_EQ(none.shape(), (Shape{0, 2}));
}

TEST(SplitObs, BadInputsAreErrors) {
  Tensor X = numbered_rows(10);
  EXPECT_FLUX_ERROR(data::split_indices(10, {.at = 1.5}), "[splitobs] .at = 1.5 is not a fraction in [0, 1]");
  EXPECT_FLUX_ERROR(data::splitobs({X, numbered_rows(9)}),
                    "[splitobs] tensor 2 has shape (9, 2) but tensor 1 has (10, 2); every tensor needs the same "
                    "number of observations");
  EXPECT_FLUX_ERROR(data::splitobs(Tensor::scalar(1)), "[splitobs] tensor 1 is a scalar");
  EXPECT_FLUX_ERROR(data::split_indices(10, {.stratified = zeros({10})}),
                    "[splitobs] .stratified expects integer class labels (Int32, Int64, UInt8 or Bool) of shape (10,) or (10, "
                    "1), got Float32 of shape (10,)");
  EXPECT_FLUX_ERROR(data::split_indices(10, {.stratified = onehot(arange(int64_t(10)), 10, DType::f32)}),
                    "for one-hot labels pass onecold(y)");
  EXPECT_FLUX_ERROR(data::split_indices(10, {.stratified = arange(int64_t(9))}),
                    "[splitobs] .stratified has shape (9,); expected (10,) or (10, 1)");
}

class StandardiserOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(StandardiserOnDevice, FitsOnTrainingRowsAndAppliesToOthers) {
  const Device d = GetParam();
  // Three features: spread, offset, constant.
  const std::vector<double> train = {1, 100, 5, 2, 102, 5, 3, 104, 5, 6, 106, 5};
  const std::vector<double> test = {0, 101, 5, 10, 90, 7};
  for (DType t : {DType::f32, DType::f64}) {
    Tensor Xtr = to(Tensor(train, Shape{4, 3}).cast(t), d), Xte = to(Tensor(test, Shape{2, 3}).cast(t), d);
    auto scaler = data::Standardiser::fit(Xtr);
    // float64 reference: population mean and standard deviation per column; a constant column
    // gets scale 1.
    std::vector<double> mean(3, 0), sd(3, 0);
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < 4; ++i) mean[j] += train[size_t(3 * i + j)] / 4;
      for (int i = 0; i < 4; ++i) sd[j] += std::pow(train[size_t(3 * i + j)] - mean[j], 2) / 4;
      sd[j] = sd[j] == 0 ? 1 : std::sqrt(sd[j]);
    }
    EXPECT_EQ(scaler.mean().dtype(), DType::f64);
    EXPECT_EQ(scaler.mean().shape(), (Shape{3}));
    EXPECT_LT(flux::testing::max_rel_error(scaler.mean(), mean), 1e-15);
    EXPECT_LT(flux::testing::max_rel_error(scaler.scale(), sd), 1e-15);
    Tensor Z = scaler.transform(Xte);
    EXPECT_EQ(Z.device(), d);
    EXPECT_EQ(Z.dtype(), t);
    std::vector<double> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) want.push_back((test[size_t(3 * i + j)] - mean[j]) / sd[j]);
    const double tol = t == DType::f32 ? 1e-6 : 1e-14;
    EXPECT_LT(flux::testing::max_rel_error(Z, want), tol);
    EXPECT_LT(flux::testing::max_rel_error(scaler.reconstruct(Z), test), tol);
    // The training rows come out with mean 0 and standard deviation 1 (the constant column: 0).
    std::vector<double> ztr = scaler(Xtr).to_vector<double>();
    for (int j = 0; j < 2; ++j) {
      double m = 0, v = 0;
      for (int i = 0; i < 4; ++i) m += ztr[size_t(3 * i + j)] / 4;
      for (int i = 0; i < 4; ++i) v += std::pow(ztr[size_t(3 * i + j)] - m, 2) / 4;
      EXPECT_NEAR(m, 0, tol);
      EXPECT_NEAR(v, 1, 10 * tol);
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ztr[size_t(3 * i + 2)], 0);
  }
  // Features past the first axis: (N, 2, 2) images, one statistic per pixel.
  Tensor imgs = to(Tensor(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, Shape{2, 2, 2}), d);
  auto s = data::Standardiser::fit(imgs);
  EXPECT_EQ(s.mean().shape(), (Shape{2, 2}));
  EXPECT_EQ(s.mean().to_vector<double>(), (std::vector<double>{2, 3, 4, 5}));
  EXPECT_EQ(s.transform(imgs).to_vector<float>(), (std::vector<float>{-1, -1, -1, -1, 1, 1, 1, 1}));
}

TEST(Standardiser, BadInputsAreErrors) {
  auto scaler = data::Standardiser::fit(zeros({4, 3}));
  EXPECT_FLUX_ERROR(scaler.transform(zeros({4, 2})),
                    "[Standardiser::transform] x has shape (4, 2) but the Standardiser was fitted on observations of "
                    "shape (3,); expected (N, 3)");
  EXPECT_FLUX_ERROR(scaler.reconstruct(zeros({4, 3}, DType::i64)), "[Standardiser::reconstruct] expects floating-point");
  EXPECT_FLUX_ERROR(data::Standardiser::fit(zeros({4, 3}, DType::i32)),
                    "[Standardiser::fit] expects floating-point features, got Int32 of shape (4, 3); cast first");
  EXPECT_FLUX_ERROR(data::Standardiser::fit(zeros({0, 3})), "expects at least one observation");
  EXPECT_FLUX_ERROR(data::Standardiser().transform(zeros({1, 3})), "the Standardiser is not fitted");
}

FLUX_DEVICE_SUITE(SplitObsOnDevice);
FLUX_DEVICE_SUITE(StandardiserOnDevice);

TEST(Values, FreeItemAndToVectorWorkInGenericLambdas) {
  seed(4);
  Dense model(2, 3);
  Tensor x = rand({4, 2});
  // m(x) depends on the lambda's `auto` parameter: m(x).item<float>() would need `.template`.
  auto summarise = [&](auto& m) {
    const float total = item<float>(sum(m(x)));
    const std::vector<double> values = to_vector<double>(m(x));
    const std::vector<int64_t> classes = to_vector<int64_t>(onecold(m(x)));
    return std::tuple{total, values, classes};
  };
  auto [total, values, classes] = summarise(model);
  EXPECT_EQ(total, sum(model(x)).item<float>());
  EXPECT_EQ(values, model(x).to_vector<double>());
  EXPECT_EQ(classes, onecold(model(x)).to_vector<int64_t>());
  EXPECT_EQ(classes.size(), 4u);
  auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), zeros({4, 3})); }, model);
  EXPECT_EQ(item<double>(loss), loss.item<double>());
  EXPECT_EQ(to_vector<float>(grads.weight).size(), 6u);
  EXPECT_FLUX_ERROR(item<float>(zeros({2})), "item");  // the member's own check
}
