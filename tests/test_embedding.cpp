// Embedding on every device: lookups of (N) and (N, T) Int32/Int64 indices against the table read on
// the host, the scatter-add gradient (repeated ids accumulate) against a float64 count, finite
// differences in float64, one-hot input as Flux, printing, state names, and bad input.
#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;

namespace {
class EmbeddingDevices : public ::testing::TestWithParam<Device> {};

// A (vocab, dim) table with distinct seeded values.
Embedding table(int64_t vocab, int64_t dim) { return Embedding(uniform_tensor(Shape{vocab, dim}, 7).f32()); }
}  // namespace

TEST(Embedding, ConstructionPrintingAndState) {
  seed(1);
  Embedding e(10, 3);
  EXPECT_EQ(e.weight.shape(), (Shape{10, 3}));
  EXPECT_EQ(e.weight.dtype(), DType::f32);
  EXPECT_EQ(layer_string(e), "Embedding(10 => 3)");
  EXPECT_EQ(to_text(e), "Embedding(10 => 3)  # 30 parameters");
  auto st = state(e);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "weight");  // PyTorch's nn.Embedding
  auto c = Chain(Embedding(5, 4), Dense(4, 2));
  EXPECT_EQ(state(c)[0].first, "layers.0.weight");
  EXPECT_EQ(repr(c), "Chain(Embedding(5 => 4), Dense(4 => 2))  # 30 parameters");
  // N(0, 1) as Flux's randn32: mean ~0, variance ~1 over 20,000 values.
  Embedding big(200, 100);
  double m = mean(big.weight).item<double>(), v = mean(square(big.weight - m)).item<double>();
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(v, 1.0, 0.05);
  Embedding f64(4, 2, {.dtype = DType::f64});
  EXPECT_EQ(f64.weight.dtype(), DType::f64);
}

TEST_P(EmbeddingDevices, LookupMatchesTableRows) {
  Device d = GetParam();
  Embedding e = table(7, 5);
  std::vector<double> w = e.weight.to_vector<double>();
  Embedding m = e | d;
  std::vector<int64_t> ids{3, 0, 6, 3, 1, 5};
  for (DType it : {DType::i64, DType::i32}) {
    for (Shape s : {Shape{6}, Shape{2, 3}}) {
      SCOPED_TRACE(std::string(dtype_name(it)) + " " + to_string(s));
      Tensor x = to(Tensor(ids, s).cast(it), d);
      Tensor y = m(x);
      std::vector<int64_t> want_shape = s.vec();
      want_shape.push_back(5);
      EXPECT_EQ(y.shape(), Shape(want_shape));
      EXPECT_EQ(y.device(), d);
      std::vector<double> want;
      for (int64_t id : ids)
        for (int64_t j = 0; j < 5; ++j) want.push_back(w[size_t(id * 5 + j)]);
      EXPECT_EQ(max_rel_error(y, want), 0.0);  // a copy: exact
    }
  }
}

TEST_P(EmbeddingDevices, GradientScatterAddsRepeatedRows) {
  Device d = GetParam();
  Embedding m = table(6, 4) | d;
  // ids with repeats; gradient of sum(y * r) is, per row v, the sum of r over the positions reading v.
  std::vector<int64_t> ids{2, 5, 2, 0, 2, 5};
  Tensor r = uniform_tensor(Shape{2, 3, 4}, 3);
  std::vector<double> rs = r.to_vector<double>();
  Tensor x = to(Tensor(ids, Shape{2, 3}), d);
  Tensor rd = to(r.f32(), d);
  auto g = gradient([&](const Embedding& e) { return sum(e(x) * rd); }, m);
  std::vector<double> want(24, 0.0);
  for (size_t p = 0; p < ids.size(); ++p)
    for (size_t j = 0; j < 4; ++j) want[size_t(ids[p]) * 4 + j] += rs[p * 4 + j];
  EXPECT_EQ(g.weight.shape(), (Shape{6, 4}));
  EXPECT_EQ(g.weight.device(), d);
  EXPECT_LT(max_rel_error(g.weight, want), 1e-6);
}

TEST_P(EmbeddingDevices, OneHotInputGivesTheSameRows) {
  Device d = GetParam();
  Embedding m = table(5, 3) | d;
  Tensor labels = to(Tensor(std::vector<int64_t>{4, 1, 1, 0}, Shape{4}), d);
  Tensor by_index = m(labels);
  Tensor by_onehot = m(onehot(labels, 5));
  EXPECT_EQ(by_onehot.shape(), (Shape{4, 3}));
  EXPECT_LT(max_rel_error(by_onehot, by_index.to_vector<double>()), 1e-6);
  Tensor by_bool = m(onehot(labels, 5, DType::boolean));
  EXPECT_LT(max_rel_error(by_bool, by_index.to_vector<double>()), 1e-6);
  // (N, T, vocab) one-hot -> (N, T, dim)
  Tensor oh3 = onehot(labels, 5).reshape(Shape{2, 2, 5});
  EXPECT_EQ(m(oh3).shape(), (Shape{2, 2, 3}));
  // gradients agree too
  auto g1 = gradient([&](const Embedding& e) { return sum(square(e(labels))); }, m);
  auto g2 = gradient([&](const Embedding& e) { return sum(square(e(onehot(labels, 5)))); }, m);
  EXPECT_LT(max_rel_error(g2.weight, g1.weight.to_vector<double>()), 1e-6);
}

FLUX_DEVICE_SUITE(EmbeddingDevices);

TEST(Embedding, FiniteDifferenceGradientFloat64) {
  Tensor ids = Tensor(std::vector<int64_t>{1, 3, 1, 0, 2, 3}, Shape{3, 2});
  expect_finite_difference_gradient([&](const std::vector<Tensor>& v) { return square(embedding(v[0], ids)); },
                                    {uniform_tensor(Shape{4, 3}, 5)});
  expect_finite_difference_gradient([&](const std::vector<Tensor>& v) { return Embedding(v[0])(onehot(ids.reshape(Shape{6}), 4, DType::f64)); },
                                    {uniform_tensor(Shape{4, 3}, 6)});
}

TEST(Embedding, BadInputNamesTheProblem) {
  Embedding e = table(10, 3);
  EXPECT_THAT(error_of([&] { e(Tensor(std::vector<int64_t>{1, 10, 2}, Shape{3})); }),
              HasSubstr("[Embedding] index 10 (at flat position 1 of indices (3,)) is out of range for vocabulary size "
                        "10; indices are 0-based, 0..9 (Embedding(10 => 3))"));
  EXPECT_THAT(error_of([&] { e(Tensor(std::vector<int64_t>{-1}, Shape{1})); }), HasSubstr("index -1"));
  EXPECT_THAT(error_of([&] { e(Tensor(std::vector<double>{1, 2}, Shape{2}).f32()); }),
              HasSubstr("[Embedding] a Float32 input is taken as one-hot with the vocabulary (10) on the last axis, e.g. "
                        "onehot(labels, 10); got shape (2,). Token ids must be Int32 or Int64"));
  EXPECT_THAT(error_of([&] { e(Tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, Shape{2, 2, 2})); }),
              HasSubstr("[Embedding] expects indices (N) or (N, T); got shape (2, 2, 2)"));
  EXPECT_THAT(error_of([&] { e(Tensor(std::vector<int64_t>{1}, Shape{1}).cast(DType::u8)); }),
              HasSubstr("[Embedding] indices must be Int32 or Int64 (0-based token ids); got"));
  EXPECT_THAT(error_of([&] { embedding(e.weight, Tensor(std::vector<double>{1}, Shape{1})); }),
              HasSubstr("[embedding] indices must be Int32 or Int64"));
  EXPECT_THAT(error_of([] { Embedding(0, 3); }), HasSubstr("[Embedding] sizes must be positive; got Embedding(0 => 3)"));
  EXPECT_THAT(error_of([] { Embedding(3, 3, {.dtype = DType::i32}); }),
              HasSubstr("[Embedding] needs a floating-point dtype; got Int32"));
  for (Device d : test_devices()) {
    if (d == Device()) continue;
    Embedding m = e | d;
    EXPECT_THAT(error_of([&] { m(Tensor(std::vector<int64_t>{1}, Shape{1})); }),
                HasSubstr("[Embedding] input on CPU but the layer's weight on " + to_string(d)));
  }
  // A state of the wrong shape does not load.
  std::string path = ::testing::TempDir() + "/embedding_state.safetensors";
  save(path, Embedding(4, 3));
  Embedding other(5, 3);
  EXPECT_THAT(error_of([&] { load(path, other); }), HasSubstr("weight"));
}
