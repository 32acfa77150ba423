// The counter-based generator (rand_like) against backend.hpp's formula computed here on the host,
// the same values and dropout masks on every device for one seed, mask statistics, the dropout
// gradient, Dropout's modes, printing and errors.
#include <cmath>
#include <sstream>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

namespace {

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const flux::Error& e) {
    return e.what();
  }
  return "no error";
}

// backend.hpp: z = splitmix64(seed + (offset + i) * 0x9E3779B97F4A7C15); f32 (z >> 40) 2^-24,
// f64 (z >> 11) 2^-53. Written out independently of src/backends/cpu/random.cpp.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::vector<float> formula_f32(uint64_t s, uint64_t offset, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(mix(s + (offset + i) * 0x9E3779B97F4A7C15ull) >> 40) / 16777216.0f;
  return v;
}
std::vector<double> formula_f64(uint64_t s, uint64_t offset, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(double(mix(s + (offset + i) * 0x9E3779B97F4A7C15ull) >> 11), -53);
  return v;
}

class Random : public ::testing::TestWithParam<Device> {};

}  // namespace

TEST_P(Random, RandLikeFollowsTheCounterFormulaExactly) {
  Device d = GetParam();
  seed(1234);
  Tensor a = rand_like(to(zeros({300, 7}), d));  // counter 0 .. 2099 (several threads on the CPU)
  Tensor b = rand_like(to(zeros({5}), d));       // counter 2100 .. 2104
  Tensor c = rand_like(to(zeros({3, 4}, DType::f64), d));
  EXPECT_EQ(a.device(), d);
  EXPECT_EQ(a.shape(), (Shape{300, 7}));
  EXPECT_EQ(a.to_vector<float>(), formula_f32(1234, 0, 2100));
  EXPECT_EQ(b.to_vector<float>(), formula_f32(1234, 2100, 5));
  EXPECT_EQ(c.dtype(), DType::f64);
  EXPECT_EQ(c.to_vector<double>(), formula_f64(1234, 2105, 12));
  // every value in [0, 1)
  std::vector<float> av = a.to_vector<float>();
  EXPECT_GE(*std::min_element(av.begin(), av.end()), 0.0f);
  EXPECT_LT(*std::max_element(av.begin(), av.end()), 1.0f);
}

TEST_P(Random, SameMaskOnCpuAndDevice) {
  Device d = GetParam();
  Tensor x = randn({64, 33});
  seed(99);
  Tensor on_cpu = dropout(x, 0.4);
  Tensor u_cpu = rand_like(x);
  seed(99);
  Tensor on_dev = dropout(to(x, d), 0.4);
  Tensor u_dev = rand_like(to(x, d));
  EXPECT_EQ(on_dev.device(), d);
  EXPECT_EQ(on_dev.to_vector<float>(), on_cpu.to_vector<float>());
  EXPECT_EQ(u_dev.to_vector<float>(), u_cpu.to_vector<float>());
}

TEST_P(Random, MaskStatistics) {
  Device d = GetParam();
  seed(5);
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.8}) {
    SCOPED_TRACE(p);
    Tensor y = dropout(to(ones({n}), d), p);
    std::vector<float> v = y.to_vector<float>();
    int64_t kept = 0;
    float scale = float(1.0 / (1.0 - p));
    for (float e : v) {
      ASSERT_TRUE(e == 0.0f || e == scale) << e;
      kept += e != 0.0f;
    }
    double frac = double(kept) / double(n);
    double sigma = std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(frac, 1 - p, 5 * sigma);
    // the mean is preserved in expectation
    EXPECT_NEAR(mean(y).item<double>(), 1.0, 5 * sigma * scale);
  }
}

TEST_P(Random, GradientIsTheScaledMask) {
  Device d = GetParam();
  Tensor x = to(randn({40, 25}), d);
  Tensor w = to(randn({40, 25}), d);
  seed(11);
  Tensor g = gradient([&](const Tensor& t) { return sum(dropout(t, 0.3) * w); }, x);
  seed(11);
  Tensor mask = dropout(to(ones({40, 25}), d), 0.3);  // the same draw: mask / (1 - p)
  EXPECT_EQ(g.device(), d);
  std::vector<float> gv = g.to_vector<float>(), mv = mask.to_vector<float>(), wv = w.to_vector<float>();
  for (size_t i = 0; i < gv.size(); ++i) ASSERT_EQ(gv[i], mv[i] * wv[i]) << i;
  // float64: the same identity, and the value is x * mask
  Tensor x64 = to(randn({10, 10}, DType::f64), d);
  seed(12);
  auto [y, g64] = withgradient([&](const Tensor& t) { return sum(dropout(t, 0.5)); }, x64);
  seed(12);
  Tensor m64 = dropout(to(ones({10, 10}, DType::f64), d), 0.5);
  EXPECT_EQ(g64.to_vector<double>(), m64.to_vector<double>());
  EXPECT_NEAR(y.item<double>(), sum(x64 * m64).item<double>(), 1e-12);
}

TEST_P(Random, DimsShareTheMaskAlongOtherAxes) {
  Device d = GetParam();
  seed(21);
  Tensor y = dropout(to(ones({6, 4, 3, 3}), d), 0.5, {0, 1});  // whole (n, c) channels kept or dropped
  std::vector<float> v = y.to_vector<float>();
  int zeros_seen = 0, kept_seen = 0;
  for (size_t ch = 0; ch < 24; ++ch) {
    for (size_t k = 1; k < 9; ++k) ASSERT_EQ(v[ch * 9 + k], v[ch * 9]);
    (v[ch * 9] == 0 ? zeros_seen : kept_seen)++;
  }
  EXPECT_GT(zeros_seen, 0);
  EXPECT_GT(kept_seen, 0);
  // negative axes count from the end: dims = {-1} varies along the last axis only
  Tensor z = dropout(to(ones({5, 8}), d), 0.5, {-1});
  std::vector<float> zv = z.to_vector<float>();
  for (size_t r = 1; r < 5; ++r)
    for (size_t c = 0; c < 8; ++c) ASSERT_EQ(zv[r * 8 + c], zv[c]);
}

TEST_P(Random, DropoutLayerFollowsTheMode) {
  Device d = GetParam();
  Tensor x = to(randn({30, 20}), d);
  Dropout drop(0.5);
  EXPECT_FALSE(drop.training());
  Tensor same = drop(x);  // automatic, outside gradient: identity
  EXPECT_TRUE(same.same_storage(x));
  // inside gradient: drops, and the gradient is the mask
  seed(31);
  Tensor g = gradient([&](const Tensor& t) { return sum(drop(t)); }, x);
  seed(31);
  Tensor mask = dropout(to(ones({30, 20}), d), 0.5);
  EXPECT_EQ(g.to_vector<float>(), mask.to_vector<float>());
  // testmode: identity inside gradient too
  testmode(drop);
  Tensor gi = gradient([&](const Tensor& t) { return sum(drop(t)); }, x);
  EXPECT_EQ(gi.to_vector<float>(), std::vector<float>(600, 1.0f));
  // trainmode: drops outside gradient
  trainmode(drop);
  seed(32);
  Tensor y = drop(x);
  seed(32);
  EXPECT_EQ(y.to_vector<float>(), dropout(x, 0.5).to_vector<float>());
  // in a Chain, p = 0 and automatic mode
  auto model = Chain(Dense(20, 5), Dropout(0.0), Dropout(0.9)) | d;
  Tensor a = model(x), b = model(x);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(parameter_count(model), 105);
}

TEST_P(Random, SeedReproducesTheSequence) {
  Device d = GetParam();
  Tensor x = to(ones({1000}), d);
  seed(7);
  std::vector<float> a = dropout(x, 0.5).to_vector<float>(), b = dropout(x, 0.5).to_vector<float>();
  seed(7);
  std::vector<float> a2 = dropout(x, 0.5).to_vector<float>(), b2 = dropout(x, 0.5).to_vector<float>();
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
  EXPECT_NE(a, b);  // the counter moved on
  seed(8);
  EXPECT_NE(dropout(x, 0.5).to_vector<float>(), a);
  // p == 0 returns x itself
  EXPECT_TRUE(dropout(x, 0.0).same_storage(x));
}

TEST(Dropout, HalfPrecisionKeepsItsDtype) {
  seed(41);
  Tensor x = ones({100}).cast(DType::f16);
  Tensor y = dropout(x, 0.25);
  EXPECT_EQ(y.dtype(), DType::f16);
  seed(41);
  EXPECT_EQ(y.to_vector<float>(), dropout(ones({100}), 0.25).cast(DType::f16).to_vector<float>());
  EXPECT_EQ(rand_like(x).dtype(), DType::f16);
}

TEST(Dropout, PrintsAsFlux) {
  EXPECT_EQ(layer_string(Dropout(0.5)), "Dropout(0.5)");
  EXPECT_EQ(layer_string(Dropout(0.25, {.dims = {1}})), "Dropout(0.25, dims = 1)");
  EXPECT_EQ(layer_string(Dropout(0.1, {.dims = {0, 1}})), "Dropout(0.1, dims = (0, 1))");
  std::ostringstream os;
  os << Dropout(0.5);
  EXPECT_EQ(os.str(), "Dropout(0.5)");
  EXPECT_EQ(repr(Chain(Dense(2, 3), Dropout(0.5))), "Chain(Dense(2 => 3), Dropout(0.5))  # 9 parameters");
}

TEST(Dropout, Errors) {
  EXPECT_EQ(error_of([] { Dropout(1.5); }), "[Dropout] p must be in [0, 1); got 1.5");
  EXPECT_EQ(error_of([] { Dropout(1.0); }), "[Dropout] p must be in [0, 1); got 1");
  EXPECT_EQ(error_of([] { Dropout(-0.1); }), "[Dropout] p must be in [0, 1); got -0.1");
  EXPECT_EQ(error_of([] { dropout(ones({3}), 1.0); }), "[dropout] p must be in [0, 1); got 1");
  EXPECT_EQ(error_of([] { dropout(ones({3}), std::nan("")); }), "[dropout] p must be in [0, 1); got nan");
  EXPECT_THAT(error_of([] { dropout(ones({3}, DType::i32), 0.5); }), HasSubstr("[dropout] needs a floating-point tensor"));
  EXPECT_THAT(error_of([] { dropout(ones({3, 2}), 0.5, {2}); }), HasSubstr("[dropout]"));
  EXPECT_THAT(error_of([] { rand_like(ones({3}, DType::i64)); }), HasSubstr("[rand_like] needs a floating-point tensor"));
  EXPECT_THAT(error_of([] { rand_like(Tensor()); }), HasSubstr("[rand_like]"));
}

FLUX_DEVICE_SUITE(Random);
