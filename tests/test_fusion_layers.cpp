// Maxout, Bilinear and PairwiseFusion: forward on every device against float64 host loops,
// gradients against the float64 CPU, finite differences in float64, Flux printing, PyTorch state
// names (nn.Bilinear's weight (out, in1, in2), bias), and bad input.
#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;

namespace {
class FusionDevices : public ::testing::TestWithParam<Device> {};
}  // namespace

TEST(FusionLayers, PrintingStateAndInitialisation) {
  seed(2);
  auto mo = Maxout(Dense(2, 3), Dense(2, 3));
  EXPECT_EQ(repr(mo), "Maxout(Dense(2 => 3), Dense(2 => 3))  # 18 parameters");
  EXPECT_EQ(state(mo)[2].first, "layers.1.weight");
  EXPECT_EQ(to_text(mo), "Maxout(\n  Dense(2 => 3),                        # 9 parameters\n  Dense(2 => 3),                        # 9 "
                         "parameters\n)                   # Total: 4 arrays, 18 parameters, 72 bytes.");
  Bilinear b(5, 6, 7);
  EXPECT_EQ(b.weight.shape(), (Shape{7, 5, 6}));  // PyTorch's nn.Bilinear layout
  EXPECT_EQ(to_text(b), "Bilinear((5, 6) => 7)  # 217 parameters");
  EXPECT_EQ(layer_string(Bilinear(4, 4, 2, relu, {.bias = false})), "Bilinear(4 => 2, relu; bias=false)");
  auto st = state(b);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "weight");
  EXPECT_EQ(st[1].first, "bias");
  // Flux's glorot_uniform(out, in1, in2): U(-l, l), l = sqrt(6 / (out (in1 + in2)))
  Bilinear big(30, 40, 50);
  double l = std::sqrt(6.0 / (50.0 * 70.0));
  EXPECT_LE(max(abs(big.weight)).item<double>(), l);
  EXPECT_NEAR(mean(square(big.weight)).item<double>(), l * l / 3, 0.03 * l * l / 3);
  auto pf = PairwiseFusion(plus, Dense(2, 2), Dense(2, 2));
  EXPECT_EQ(repr(pf), "PairwiseFusion(+, Dense(2 => 2), Dense(2 => 2))  # 12 parameters");
  EXPECT_EQ(state(pf)[0].first, "layers.0.weight");
}

TEST_P(FusionDevices, ForwardAndGradientsMatchFloat64) {
  Device d = GetParam();
  seed(3);
  Tensor x = uniform_tensor(Shape{4, 3}, 1), z = uniform_tensor(Shape{4, 5}, 2);
  // Bilinear against a float64 loop
  Bilinear b(3, 5, 2);
  b.bias = uniform_tensor(Shape{2}, 3).f32();
  std::vector<double> w = b.weight.to_vector<double>(), bs = b.bias.to_vector<double>();
  std::vector<double> xs = x.to_vector<double>(), zs = z.to_vector<double>(), want(8, 0.0);
  for (int n = 0; n < 4; ++n)
    for (int o = 0; o < 2; ++o) {
      double acc = bs[size_t(o)];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) acc += xs[size_t(n * 3 + i)] * w[size_t((o * 3 + i) * 5 + j)] * zs[size_t(n * 5 + j)];
      want[size_t(n * 2 + o)] = acc;
    }
  Bilinear bd = b | d;
  EXPECT_LT(max_rel_error(bd(to(x.f32(), d), to(z.f32(), d)), want), 1e-5);
  auto [g64, gx64, gz64] = gradient([&](const Bilinear& m, const Tensor& p, const Tensor& q) { return sum(square(m(p, q))); },
                                    to_f64_cpu(b), x, z);
  auto [g, gx, gz] = gradient([&](const Bilinear& m, const Tensor& p, const Tensor& q) { return sum(square(m(p, q))); }, bd,
                              to(x.f32(), d), to(z.f32(), d));
  EXPECT_LT(max_rel_error(g.weight, g64.weight.to_vector<double>()), 1e-5);
  EXPECT_LT(max_rel_error(gx, gx64.to_vector<double>()), 1e-5);
  EXPECT_LT(max_rel_error(gz, gz64.to_vector<double>()), 1e-5);
  // Maxout: the elementwise max of its layers
  auto mo = Maxout(Dense(3, 4), Dense(3, 4), Dense(3, 4));
  auto mo64 = to_f64_cpu(mo);
  std::vector<double> a0 = std::get<0>(mo64.layers)(x).to_vector<double>(), a1 = std::get<1>(mo64.layers)(x).to_vector<double>(),
                      a2 = std::get<2>(mo64.layers)(x).to_vector<double>(), mx(a0.size());
  for (size_t i = 0; i < mx.size(); ++i) mx[i] = std::max({a0[i], a1[i], a2[i]});
  auto mod = mo | d;
  EXPECT_LT(max_rel_error(mod(to(x.f32(), d)), mx), 1e-5);
  auto gm64 = gradient([&](const auto& m) { return sum(m(x)); }, mo64);
  auto gm = gradient([&](const auto& m) { return sum(m(to(x.f32(), d))); }, mod);
  EXPECT_LT(max_rel_error(std::get<1>(gm.layers).weight, std::get<1>(gm64.layers).weight.to_vector<double>()), 1e-5);
  // PairwiseFusion: y1 = l1(x1), y2 = l2(y1 + x2)
  auto pf = PairwiseFusion(plus, Dense(3, 3), Dense(3, 2));
  auto pf64 = to_f64_cpu(pf);
  Tensor x2 = uniform_tensor(Shape{4, 3}, 4);
  std::vector<Tensor> ys = (pf | d)(std::vector<Tensor>{to(x.f32(), d), to(x2.f32(), d)});
  ASSERT_EQ(ys.size(), 2u);
  Tensor y1 = std::get<0>(pf64.layers)(x);
  EXPECT_LT(max_rel_error(ys[0], y1.to_vector<double>()), 1e-5);
  EXPECT_LT(max_rel_error(ys[1], std::get<1>(pf64.layers)(y1 + x2).to_vector<double>()), 1e-5);
  EXPECT_EQ((pf | d)(to(x.f32(), d)).size(), 2u);  // one input for every layer
}

FLUX_DEVICE_SUITE(FusionDevices);

TEST(FusionLayers, FiniteDifferenceGradientsFloat64) {
  using V = const std::vector<Tensor>&;
  seed(4);
  Bilinear b(3, 2, 2, flux::tanh, {.dtype = DType::f64});
  b.bias = uniform_tensor(Shape{2}, 5);
  expect_finite_difference_gradient([&](V v) { Bilinear m = b; m.weight = v[2]; return m(v[0], v[1]); },
                                    {uniform_tensor(Shape{3, 3}, 6), uniform_tensor(Shape{3, 2}, 7), b.weight});
  expect_finite_difference_gradient([&](V v) { Bilinear m(2, 2, 3, {.dtype = DType::f64}); m.weight = v[1]; return m(v[0]); },
                                    {uniform_tensor(Shape{2, 2}, 8), uniform_tensor(Shape{3, 2, 2}, 9)});
  expect_finite_difference_gradient([](V v) { return Maxout(Dense(v[1], Tensor()), Dense(v[2], Tensor()))(v[0]); },
                                    {uniform_tensor(Shape{3, 2}, 10), uniform_tensor(Shape{4, 2}, 11), uniform_tensor(Shape{4, 2}, 12)});
}

TEST(FusionLayers, BadInputNamesTheProblem) {
  Bilinear b(3, 5, 2);
  EXPECT_THAT(error_of([&] { b(zeros(Shape{4, 3}), zeros(Shape{4, 4})); }),
              HasSubstr("[Bilinear] expects x (N, 3) and z (N, 5) (Bilinear((3, 5) => 2)); got (4, 3) and (4, 4)"));
  EXPECT_THAT(error_of([&] { b(zeros(Shape{4, 3})); }), HasSubstr("got (4, 3) and (4, 3)"));
  EXPECT_THAT(error_of([] { Bilinear(0, 2, 2); }), HasSubstr("[Bilinear] sizes must be positive; got Bilinear((0, 2) => 2)"));
  auto pf = PairwiseFusion(plus, Dense(2, 2), Dense(2, 2));
  EXPECT_THAT(error_of([&] { pf(std::vector<Tensor>{zeros(Shape{1, 2})}); }),
              HasSubstr("[PairwiseFusion] got 1 inputs for 2 layers"));
  EXPECT_THAT(error_of([] { Maxout(Dense(2, 3), Dense(2, 4))(zeros(Shape{1, 2})); }), HasSubstr("[maximum]"));
}
