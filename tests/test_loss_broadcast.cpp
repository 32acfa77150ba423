// Losses with targets that broadcast as Flux's do (ŷ .- y): a number, a 0-d tensor, one row (1, C) or
// (C,), a column (N, 1) for the elementwise losses. Oracle: the same loss with the target expanded to
// the prediction's shape in float64 on the CPU (the same-shape path is checked against host formulas
// in test_losses.cpp); gradients by central differences in float64, for predictions and targets.
// onehot on N-d labels (Flux's onehotbatch on a matrix of ids) is here too.
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using flux::testing::error_of;
using flux::testing::expect_finite_difference_gradient;
using flux::testing::max_rel_error;
using flux::testing::uniform_tensor;

namespace {
constexpr int64_t N = 4, C = 3;
using LossFn = std::function<Tensor(const Tensor&, const Tensor&, LossOptions)>;
struct Case {
  std::string name;
  LossFn loss;
  double lo, hi;      // range of the predictions (probabilities for the *crossentropy losses)
  bool class_losses;  // crossentropy-like: the class axis must match, so no (N, 1) column target
};
std::vector<Case> cases() {
  return {
      {"mse", [](auto& a, auto& b, auto o) { return mse(a, b, o); }, -2, 2, false},
      {"mae", [](auto& a, auto& b, auto o) { return mae(a, b, o); }, -2, 2, false},
      {"huber", [](auto& a, auto& b, auto o) { return huber(a, b, o, 0.7); }, -2, 2, false},
      {"binarycrossentropy", [](auto& a, auto& b, auto o) { return binarycrossentropy(a, b, o); }, 0.1, 0.9, false},
      {"logitbinarycrossentropy", [](auto& a, auto& b, auto o) { return logitbinarycrossentropy(a, b, o); }, -2, 2, false},
      {"crossentropy", [](auto& a, auto& b, auto o) { return crossentropy(a, b, o); }, 0.1, 0.9, true},
      {"logitcrossentropy", [](auto& a, auto& b, auto o) { return logitcrossentropy(a, b, o); }, -2, 2, true},
      {"kldivergence", [](auto& a, auto& b, auto o) { return kldivergence(a, b, o); }, 0.1, 0.9, true},
  };
}
// Targets that broadcast to (N, C), in [0.05, 0.95].
std::vector<std::pair<std::string, Tensor>> targets(bool class_losses) {
  std::vector<std::pair<std::string, Tensor>> t = {
      {"0-d", full(Shape{}, 0.3, DType::f64)},
      {"row (1, C)", uniform_tensor({1, C}, 7, 0.05, 0.95)},
      {"row (C,)", uniform_tensor({C}, 8, 0.05, 0.95)},
  };
  if (!class_losses) t.push_back({"column (N, 1)", uniform_tensor({N, 1}, 9, 0.05, 0.95)});
  return t;
}

class LossBroadcast : public ::testing::TestWithParam<Device> {};

TEST_P(LossBroadcast, ValuesMatchTheExpandedTargetForEveryAggregation) {
  const Device dev = GetParam();
  for (const Case& c : cases()) {
    Tensor yhat = uniform_tensor({N, C}, 3, c.lo, c.hi);
    for (auto& [tname, y] : targets(c.class_losses)) {
      Tensor expanded = broadcast_to(y, yhat.shape());
      for (Agg agg : {Agg::mean, Agg::sum, Agg::none}) {
        if (c.name == "kldivergence" && agg != Agg::mean) continue;  // Flux adds agg(entropy of y's own rows); below
        Tensor want = c.loss(yhat, expanded, {agg});
        Tensor got = c.loss(to(yhat.f32(), dev), to(y.f32(), dev), {agg});
        ASSERT_EQ(got.shape(), want.shape()) << c.name << " " << tname;
        EXPECT_EQ(got.device(), dev);
        EXPECT_LT(max_rel_error(got, want.to_vector<double>()), 1e-5) << c.name << " target " << tname;
      }
    }
  }
}

TEST_P(LossBroadcast, NumberTargetsAsFluxsScalarTarget) {
  const Device dev = GetParam();
  Tensor logits = uniform_tensor({N, 1}, 11);
  // logitbinarycrossentropy(ŷ, 1): the GAN generator's loss; mean(softplus(-x)).
  Tensor want = mean(softplus(-logits));
  Tensor got = logitbinarycrossentropy(to(logits.f32(), dev), 1);
  EXPECT_LT(max_rel_error(got, {want.item<double>()}), 1e-5);
  Tensor zeros_target = logitbinarycrossentropy(to(logits.f32(), dev), 0.0, {Agg::sum});
  EXPECT_LT(max_rel_error(zeros_target, {sum(softplus(logits)).item<double>()}), 1e-5);
  // every loss takes a number, with the value of the expanded target
  for (const Case& c : cases()) {
    Tensor yhat = uniform_tensor({N, C}, 5, c.lo, c.hi);
    double want_v = c.loss(yhat, full(yhat.shape(), 0.25, DType::f64), {}).item<double>();
    Tensor yd = to(yhat.f32(), dev);
    Tensor got_v;
    if (c.name == "mse") got_v = mse(yd, 0.25);
    else if (c.name == "mae") got_v = mae(yd, 0.25);
    else if (c.name == "huber") got_v = huber(yd, 0.25, {}, 0.7);
    else if (c.name == "binarycrossentropy") got_v = binarycrossentropy(yd, 0.25);
    else if (c.name == "logitbinarycrossentropy") got_v = logitbinarycrossentropy(yd, 0.25);
    else if (c.name == "crossentropy") got_v = crossentropy(yd, 0.25);
    else if (c.name == "logitcrossentropy") got_v = logitcrossentropy(yd, 0.25);
    else got_v = kldivergence(yd, 0.25);
    EXPECT_LT(max_rel_error(got_v, {want_v}), 1e-5) << c.name;
  }
}

TEST_P(LossBroadcast, GradientOfThePredictionMatchesTheCpuFloat64Gradient) {
  const Device dev = GetParam();
  for (const Case& c : cases()) {
    Tensor yhat = uniform_tensor({N, C}, 13, c.lo, c.hi), y = uniform_tensor({1, C}, 14, 0.05, 0.95);
    Tensor want = gradient([&](const Tensor& p) { return c.loss(p, y, {}); }, yhat);
    Tensor yd = to(y.f32(), dev);
    Tensor got = gradient([&](const Tensor& p) { return c.loss(p, yd, {}); }, to(yhat.f32(), dev));
    EXPECT_EQ(got.device(), dev);
    EXPECT_LT(max_rel_error(got, want.to_vector<double>()), 1e-4) << c.name;
  }
}

FLUX_DEVICE_SUITE(LossBroadcast);

// Central differences in float64 through the broadcast, for both arguments: the target's gradient is
// summed over the axes it was broadcast along.
TEST(LossBroadcastGradients, FiniteDifferencesForPredictionAndBroadcastTarget) {
  for (const Case& c : cases()) {
    for (auto& [tname, y] : targets(c.class_losses)) {
      if (y.ndim() == 0) continue;  // a 0-d target: below
      SCOPED_TRACE(c.name + " target " + tname);
      expect_finite_difference_gradient([&](const std::vector<Tensor>& v) { return c.loss(v[0], v[1], {}); },
                                        {uniform_tensor({N, C}, 21, c.lo, c.hi), y}, 1e-5);
    }
    SCOPED_TRACE(c.name + " 0-d target");
    expect_finite_difference_gradient([&](const std::vector<Tensor>& v) { return c.loss(v[0], v[1], {Agg::sum}); },
                                      {uniform_tensor({N, C}, 22, c.lo, c.hi), full(Shape{}, 0.4, DType::f64)}, 1e-5);
  }
}

TEST(LossBroadcastGradients, KldivergenceSumAddsTheTargetEntropyOnceAsFlux) {
  Tensor yhat = uniform_tensor({N, C}, 31, 0.1, 0.9), y = uniform_tensor({1, C}, 32, 0.1, 0.9);
  double entropy = sum(y * log(y)).item<double>();
  double cross = sum(-(broadcast_to(y, yhat.shape()) * log(yhat + 0x1p-52))).item<double>();
  EXPECT_NEAR(kldivergence(yhat, y, {Agg::sum}).item<double>(), entropy + cross, 1e-12);
}

TEST(LossBroadcastErrors, TargetsThatWouldEnlargeTheLossOrLookLikeLabelsAreErrors) {
  // (N, 1) predictions against (N,) targets would broadcast to (N, N): an error, not a silent N x N loss.
  EXPECT_THAT(error_of([] { (void)mse(zeros({4, 1}), zeros({4})); }),
              ::testing::HasSubstr("[mse] prediction shape (4, 1) and target shape (4,) differ (the target must have the "
                                   "prediction's shape or broadcast to it"));
  // A (N, 1) target to a class loss is labels, not a broadcast.
  EXPECT_THAT(error_of([] { (void)logitcrossentropy(zeros({4, 10}), zeros({4, 1})); }),
              ::testing::HasSubstr("target shape (4, 1) differ"));
  EXPECT_THAT(error_of([] { (void)mse(Tensor(), 1.0); }), ::testing::HasSubstr("[mse]"));
}

class OnehotNd : public ::testing::TestWithParam<Device> {};

TEST_P(OnehotNd, MatrixOfIdsGivesThreeDimensions) {
  const Device dev = GetParam();
  Tensor ids = to(Tensor(std::vector<int64_t>{0, 2, 1, 1, 0, 3}, Shape{2, 3}), dev);
  Tensor oh = onehot(ids, 4);
  ASSERT_EQ(oh.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(oh.device(), dev);
  std::vector<float> v = oh.to_vector<float>();
  std::vector<int64_t> want_ids{0, 2, 1, 1, 0, 3};
  for (size_t i = 0; i < want_ids.size(); ++i)
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(v[i * 4 + size_t(k)], k == want_ids[i] ? 1.0f : 0.0f) << i << " " << k;
  // onecold inverts it along the last axis, keeping the (2, 3) shape
  EXPECT_EQ(onecold(oh).to_vector<int64_t>(), want_ids);
  EXPECT_EQ(onecold(oh).shape(), Shape({2, 3}));
  // 0-d label -> (C,); 1-D unchanged
  EXPECT_EQ(onehot(to(Tensor(std::vector<int64_t>{2}, Shape{}), dev), 3).to_vector<float>(), (std::vector<float>{0, 0, 1}));
  EXPECT_EQ(onehot(to(Tensor(std::vector<int64_t>{1, 0}, Shape{2}), dev), 2).shape(), Shape({2, 2}));
  EXPECT_THAT(error_of([&] { (void)onehot(ids, 3); }), ::testing::HasSubstr("[onehot] label 3 is outside 0..2"));
}

FLUX_DEVICE_SUITE(OnehotNd);

}  // namespace
