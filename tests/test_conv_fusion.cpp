// Inference fusion of Conv -> BatchNorm (-> relu) (-> + residual -> relu) into one convolution
// (include/flux/nn/conv_fusion.hpp; oneDNN post-ops on the CPU). On every device the fused result is
// checked against a float64 reference written here (conv2d loops, then the BatchNorm on its running
// statistics) and against the same model with fusion switched off; on the CPU the fused kernel must
// actually run, elsewhere (OpenCL) the unfused composition runs and agrees. Inside gradient(), in
// training mode, with FLUX_LIBRARY_KERNELS=0, Float64, or a Conv with its own activation nothing is
// fused: values, gradients and running statistics equal the unfused path's exactly.
#include <cmath>

#include <gmock/gmock.h>

#include "flux/models/resnet.hpp"
#include "library_kernels.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;
using ::testing::HasSubstr;

namespace flux::detail {
// src/backends/cpu/isa.cpp (flux.hpp's flux::cpu is the mover, so not flux::cpu_backend::force_isa): the ISA
// level of the CPU kernels, capped at `level` (0 baseline, 1 AVX2, 2 AVX-512; never above the CPU's).
const char* cpu_isa_name();
int cpu_force_isa(int level);
}  // namespace flux::detail

namespace {

using flux::testing::ConvFusion;

/// Whether conv + BatchNorm runs fused on `d`: the CPU of a build with oneDNN, unless the process
/// runs with FLUX_LIBRARY_KERNELS=0 or FLUX_CONV_FUSION=0.
bool fuses(const Device& d) {
  return FLUX_TEST_HAVE_ONEDNN != 0 && d.backend() == "CPU" && detail::library_kernels() && detail::conv_fusion();
}

// fused: whether the CPU runs this case fused. oneDNN's blocked layouts fuse (C/G * k * k >= 64, or a
// 1-3 channel first layer), and so does the few-pixel kernel (C * k * k >= 64 and <= 32 output pixels
// over the batch); plain layouts (less work per pixel) run oneDNN's gemm kernel unfused
// (src/backends/cpu/conv.cpp).
struct Case {
  const char* name;
  int64_t batch, in, out, h, w, k, stride, pad, groups;
  bool conv_bias, relu, fused;
};

const Case kCases[] = {
    {"relu_3x3", 2, 16, 32, 9, 10, 3, 1, 1, 1, false, true, true},
    {"identity_3x3", 2, 16, 32, 9, 10, 3, 1, 1, 1, false, false, true},
    {"stride2_pad3_7x7_stem", 2, 3, 16, 20, 18, 7, 2, 3, 1, false, true, true},
    {"pointwise_stride2", 3, 24, 40, 8, 8, 1, 2, 0, 1, false, false, false},
    {"pointwise_wide", 2, 128, 64, 6, 6, 1, 1, 0, 1, false, true, true},
    {"groups4_bias", 2, 16, 32, 7, 7, 3, 1, 1, 4, true, true, false},
    {"groups2_wide_bias", 2, 32, 32, 7, 7, 3, 1, 1, 2, true, true, true},
    {"depthwise", 2, 16, 16, 7, 7, 3, 1, 1, 16, false, true, false},
    {"conv_bias_no_pad", 4, 8, 16, 6, 6, 3, 1, 0, 1, true, false, true},
    {"batch1_wide", 1, 64, 64, 16, 16, 3, 1, 1, 1, false, true, true},  // batch 1: output channels split
    {"batch1_stride2", 1, 32, 64, 14, 14, 3, 2, 1, 1, false, false, true},
    {"batch1_few_pixels", 1, 64, 64, 4, 4, 3, 1, 1, 1, false, true, true},  // 16 pixels: few-pixel kernel
    {"few_pixels_stride2_bias", 2, 48, 40, 7, 7, 3, 2, 1, 1, true, true, true},  // 2 x 4x4 = 32 pixels
    {"few_pixels_pointwise_stride2", 1, 96, 24, 7, 7, 1, 2, 0, 1, false, false, true},
    {"few_pixels_odd_batch3", 3, 70, 33, 3, 3, 3, 1, 1, 1, true, true, true},  // 27 pixels, 33 rows
    {"batch8_large", 8, 32, 48, 14, 14, 3, 1, 1, 1, true, true, true},  // batch split over threads
};

/// Random BatchNorm state: weight, bias, running statistics (var in [0.5, 1.5)).
void randomise(BatchNorm& bn) {
  int64_t c = bn.channels;
  copy_(bn.weight, randn(Shape{c}));
  copy_(bn.bias, randn(Shape{c}));
  copy_(bn.running_mean, randn(Shape{c}) * 0.5);
  copy_(bn.running_var, rand(Shape{c}) + 0.5);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

/// float64 conv2d (cross-correlation, PyTorch's), symmetric padding: y (N, O, OH, OW).
std::vector<double> conv_ref(const Conv& c, const std::vector<double>& x, const Shape& xs, Shape& ys) {
  const std::vector<double> w = values(c.weight);
  const std::vector<double> b = c.bias.defined() ? values(c.bias) : std::vector<double>();
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = c.weight.size(0), Cg = c.weight.size(1);
  const int64_t K = c.weight.size(2), s = c.stride[0], p = c.pad[0], Og = O / c.groups;
  const int64_t OH = (H + 2 * p - K) / s + 1, OW = (W + 2 * p - K) / s + 1;
  ys = Shape{N, O, OH, OW};
  std::vector<double> y(size_t(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[size_t(o)];
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t i = 0; i < K; ++i)
              for (int64_t j = 0; j < K; ++j) {
                int64_t ih = oh * s - p + i, iw = ow * s - p + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t ch = o / Og * Cg + cg;
                acc += x[size_t(((n * C + ch) * H + ih) * W + iw)] * w[size_t(((o * Cg + cg) * K + i) * K + j)];
              }
          y[size_t(((n * O + o) * OH + oh) * OW + ow)] = acc;
        }
  return y;
}

/// float64 BatchNorm on running statistics over y (N, C, S...), then relu if asked.
void batchnorm_ref(const BatchNorm& bn, std::vector<double>& y, const Shape& ys, bool relu) {
  const std::vector<double> w = values(bn.weight), b = values(bn.bias), m = values(bn.running_mean),
                            v = values(bn.running_var);
  const int64_t C = ys[1], S = int64_t(y.size()) / (ys[0] * C);
  for (size_t i = 0; i < y.size(); ++i) {
    size_t c = size_t((int64_t(i) / S) % C);
    double z = (y[i] - m[c]) / std::sqrt(v[c] + bn.eps) * w[c] + b[c];
    y[i] = relu ? std::max(z, 0.0) : z;
  }
}

/// max |a - b| / max(1, |b|) over two tensors of one shape.
double max_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return 1e300;
  return max_rel_error(a, values(b));
}

class ConvFusionDevices : public ::testing::TestWithParam<Device> {};

}  // namespace

// Chain(Conv, BatchNorm(relu or identity)) over every case: fused on the CPU, unfused elsewhere,
// both equal to the float64 reference and to the model with fusion off.
TEST_P(ConvFusionDevices, ChainConvBatchNormMatchesReferenceAndUnfusedPath) {
  const Device dev = GetParam();
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.name);
    seed(3);
    Conv conv({k.k, k.k}, k.in, k.out, {.stride = k.stride, .pad = k.pad, .groups = k.groups, .bias = k.conv_bias});
    if (k.conv_bias) copy_(conv.bias, randn(Shape{k.out}));
    BatchNorm bn(k.out, k.relu ? Activation(relu) : Activation());
    randomise(bn);
    auto model = Chain(conv, bn) | dev;
    Tensor x_host = randn(Shape{k.batch, k.in, k.h, k.w});
    Tensor x = to(x_host, dev);

    Shape ys;
    std::vector<double> want = conv_ref(conv, values(x_host), x_host.shape(), ys);
    batchnorm_ref(bn, want, ys, k.relu);

    Tensor fused = model(x);
    Tensor direct = detail::conv_batchnorm(model.get<0>(), model.get<1>(), x);
    EXPECT_EQ(direct.defined(), fuses(dev) && k.fused) << "fused kernel on " << to_string(dev);
    Tensor unfused;
    {
      ConvFusion off(false);
      EXPECT_FALSE(detail::conv_batchnorm(model.get<0>(), model.get<1>(), x).defined());
      unfused = model(x);
    }
    ASSERT_EQ(fused.shape(), ys);
    EXPECT_LT(max_rel_error(fused, want), 5e-5);
    EXPECT_LT(max_rel_error(unfused, want), 5e-5);
    EXPECT_LT(max_diff(fused, unfused), 5e-5);
    if (direct.defined()) {
      EXPECT_EQ(values(direct), values(fused));  // Chain took the fused path
    }
  }
}

// The residual form relu(bn(conv(x)) + r), and r + bn(conv(x)) without the final relu, with and
// without the BatchNorm's own relu.
TEST_P(ConvFusionDevices, ResidualAddAndReluMatchReference) {
  const Device dev = GetParam();
  for (int64_t batch : {1, 3})
    for (bool bn_relu : {false, true})
      for (bool relu_after : {false, true}) {
        SCOPED_TRACE("batch " + std::to_string(batch) + (bn_relu ? " bn relu" : "") + (relu_after ? " relu after" : ""));
        seed(5);
        Conv conv({3, 3}, 32, 32, {.pad = 1, .bias = false});
        BatchNorm bn(32, bn_relu ? Activation(relu) : Activation());
        randomise(bn);
        Tensor x_host = randn(Shape{batch, 32, 10, 10}), r_host = randn(Shape{batch, 32, 10, 10});
        Shape ys;
        std::vector<double> want = conv_ref(conv, values(x_host), x_host.shape(), ys);
        batchnorm_ref(bn, want, ys, bn_relu);
        std::vector<double> r = values(r_host);
        for (size_t i = 0; i < want.size(); ++i) {
          want[i] += r[i];
          if (relu_after) want[i] = std::max(want[i], 0.0);
        }
        Conv c = conv | dev;
        BatchNorm b = bn | dev;
        Tensor x = to(x_host, dev), res = to(r_host, dev);
        Tensor fused = detail::conv_batchnorm(c, b, x, res, relu_after);
        EXPECT_EQ(fused.defined(), fuses(dev));
        Tensor unfused = b(c(x)) + res;
        if (relu_after) unfused = relu(unfused);
        EXPECT_LT(max_rel_error(unfused, want), 5e-5);
        if (fused.defined()) {
          EXPECT_LT(max_rel_error(fused, want), 5e-5);
          EXPECT_LT(max_diff(fused, unfused), 5e-5);
        }
        // A residual the kernel does not take (broadcast over the batch) is added as the layers would.
        if (batch > 1) {
          Tensor one = to(randn(Shape{1, 32, 10, 10}), dev);
          Tensor got = detail::conv_batchnorm(c, b, x, one, relu_after);
          Tensor expect = b(c(x)) + one;
          if (relu_after) expect = relu(expect);
          if (got.defined()) {
            EXPECT_LT(max_diff(got, expect), 5e-5);
          }
        }
      }
}

// models::BasicBlock with and without the downsampling shortcut, and a small ResNet18: fused
// (inference) against the same model with fusion off, on every device.
TEST_P(ConvFusionDevices, ResNetBlocksMatchUnfusedPath) {
  const Device dev = GetParam();
  seed(7);
  models::BasicBlock<models::Downsample> down(16, 32, 2);
  models::BasicBlock<models::NoDownsample> same(32, 32);
  for (BatchNorm* bn : {&down.bn1, &down.bn2, &down.downsample.get<1>(), &same.bn1, &same.bn2}) randomise(*bn);
  auto d = down | dev;
  auto s = same | dev;
  for (int64_t batch : {1, 2}) {
    Tensor x = to(randn(Shape{batch, 16, 12, 12}), dev);
    Tensor fused = s(d(x));
    Tensor unfused;
    {
      ConvFusion off(false);
      unfused = s(d(x));
    }
    EXPECT_EQ(fused.shape(), (Shape{batch, 32, 6, 6}));
    EXPECT_LT(max_diff(fused, unfused), 1e-4);
    EXPECT_GT(values(fused).size(), 0u);
  }
  models::ResNet18 net(10);
  testmode(net);
  for (BatchNorm* bn : {&net.bn1, &net.layer1.get<0>().bn2, &net.layer3.get<0>().downsample.get<1>()}) randomise(*bn);
  auto n = net | dev;
  Tensor x = to(randn(Shape{2, 3, 32, 32}), dev);
  Tensor fused = n(x), unfused;
  {
    ConvFusion off(false);
    unfused = n(x);
  }
  EXPECT_LT(max_diff(fused, unfused), 1e-4);
  if (dev.backend() != "CPU") {  // OpenCL runs the unfused composition: it must agree with the CPU's fusion
    auto on_cpu = n | cpu;
    EXPECT_LT(max_diff(fused, on_cpu(to(x, Device()))), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ConvFusionDevices, ::testing::ValuesIn(flux::testing::test_devices()),
                         flux::testing::device_test_name);

// Inside gradient(), with BatchNorm in automatic mode (training) and in testmode (running statistics,
// but recorded on a tape): nothing fuses; value, gradients and running statistics equal the unfused path's.
TEST(ConvFusion, InsideGradientTheUnfusedPathRuns) {
  for (bool test_mode : {false, true}) {
    SCOPED_TRACE(test_mode ? "testmode" : "automatic (training)");
    auto make = [&] {  // the same model twice (layers share storage when copied)
      seed(9);
      auto m = Chain(Conv({3, 3}, 8, 16, {.pad = 1, .bias = false}), BatchNorm(16, relu), Conv({1, 1}, 16, 4),
                     BatchNorm(4));
      randomise(m.get<1>());
      randomise(m.get<3>());
      if (test_mode) testmode(m);
      return m;
    };
    auto fused_model = make(), unfused_model = make();
    Tensor x = randn(Shape{4, 8, 6, 6});
    auto loss = [&](auto& m) {
      EXPECT_FALSE(detail::conv_batchnorm(m.template get<0>(), m.template get<1>(), x).defined());
      return sum(square(m(x)));
    };
    auto with = withgradient(loss, fused_model);
    auto without = [&] {
      ConvFusion off(false);
      return withgradient(loss, unfused_model);
    }();
    EXPECT_EQ(with.value.item<double>(), without.value.item<double>());
    std::vector<Tensor> g1 = params(with.grad), g2 = params(without.grad);
    ASSERT_EQ(g1.size(), g2.size());
    for (size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(values(g1[i]), values(g2[i])) << "gradient " << i;
    auto s1 = state(fused_model), s2 = state(unfused_model);
    for (size_t i = 0; i < s1.size(); ++i) EXPECT_EQ(values(s1[i].second), values(s2[i].second)) << s1[i].first;
    // Training (automatic mode inside gradient) moved the running statistics; testmode did not.
    EXPECT_EQ(values(fused_model.get<1>().running_mean) == values(make().get<1>().running_mean), test_mode);
  }
}

// trainmode outside gradient(): batch statistics, never fused; equal to the unfused path exactly,
// and the running statistics move the same way.
TEST(ConvFusion, TrainModeBatchNormIsNeverFused) {
  auto make = [] {
    seed(11);
    auto m = Chain(Conv({3, 3}, 4, 8, {.pad = 1}), BatchNorm(8, relu));
    randomise(m.get<1>());
    trainmode(m);
    return m;
  };
  auto a_model = make(), b_model = make();
  Tensor x = randn(Shape{3, 4, 5, 5});
  EXPECT_FALSE(detail::conv_batchnorm(a_model.get<0>(), a_model.get<1>(), x).defined());
  Tensor a = a_model(x);
  Tensor b = [&] {
    ConvFusion off(false);
    return b_model(x);
  }();
  EXPECT_EQ(values(a), values(b));
  EXPECT_EQ(values(a_model.get<1>().running_mean), values(b_model.get<1>().running_mean));
  EXPECT_NE(values(a_model.get<1>().running_mean), values(make().get<1>().running_mean));  // training moved it
}

// What is never fused: the portable path (FLUX_LIBRARY_KERNELS=0), Float64, a Conv with its own
// activation (relu between conv and BatchNorm), a BatchNorm without running statistics.
TEST(ConvFusion, CasesThatAreNotFused) {
  seed(13);
  Conv conv({3, 3}, 8, 8, {.pad = 1});
  BatchNorm bn(8, relu);
  randomise(bn);
  Tensor x = randn(Shape{2, 8, 6, 6});
  {
    flux::testing::LibraryKernels portable(false);
    EXPECT_FALSE(detail::conv_batchnorm(conv, bn, x).defined());
    Shape ys;
    std::vector<double> want = conv_ref(conv, values(x), x.shape(), ys);
    batchnorm_ref(bn, want, ys, true);
    EXPECT_LT(max_rel_error(Chain(conv, bn)(x), want), 5e-5);
  }
  EXPECT_EQ(detail::conv_batchnorm(conv, bn, x).defined(), fuses(Device()));
  auto m64 = fmap([](const Tensor& t) { return is_floating(t.dtype()) ? t.f64() : t; }, Chain(conv, bn));
  EXPECT_FALSE(detail::conv_batchnorm(m64.get<0>(), m64.get<1>(), x.f64()).defined());
  Conv with_relu({3, 3}, 8, 8, relu, {.pad = 1});
  EXPECT_FALSE(detail::conv_batchnorm(with_relu, bn, x).defined());
  BatchNorm no_stats(8, {.track_stats = false});
  EXPECT_FALSE(detail::conv_batchnorm(conv, no_stats, x).defined());
  // Each of these still computes what the layers compute.
  EXPECT_LT(max_diff(Chain(with_relu, bn)(x), bn(with_relu(x))), 1e-6);
  EXPECT_LT(max_diff(m64(x.f64()), Chain(conv, bn)(x)), 5e-5);
}

// 1-D and 3-D convolutions fuse too (oneDNN's ncw / ncdhw).
TEST(ConvFusion, OneAndThreeSpatialAxes) {
  seed(15);
  auto m1 = Chain(Conv({3}, 32, 16, {.pad = 1, .bias = false}), BatchNorm(16, relu));
  auto m3 = Chain(Conv({3, 3, 3}, 4, 16, {.stride = 2, .pad = 1}), BatchNorm(16));
  randomise(m1.get<1>());
  randomise(m3.get<1>());
  Tensor x1 = randn(Shape{3, 32, 20}), x3 = randn(Shape{2, 4, 6, 7, 5});
  EXPECT_EQ(detail::conv_batchnorm(m1.get<0>(), m1.get<1>(), x1).defined(), fuses(Device()));
  EXPECT_EQ(detail::conv_batchnorm(m3.get<0>(), m3.get<1>(), x3).defined(), fuses(Device()));
  Tensor a1 = m1(x1), a3 = m3(x3);
  ConvFusion off(false);
  EXPECT_LT(max_diff(a1, m1(x1)), 5e-5);
  EXPECT_LT(max_diff(a3, m3(x3)), 5e-5);
}

// The few-pixel forwards (<= 32 output pixels over the batch, C * prod(kernel) >= 64: the weights
// streamed once through a register-blocked kernel, src/backends/cpu/conv.cpp) on every ISA level this
// CPU has (their vector widths give 1..8 vectors a row), 1-3 spatial axes, stride, padding, dilation,
// and rows that do not fill a kernel's block: the fused Conv + BatchNorm (+ residual, relu), and the
// Conv alone with bias and relu, against the same layers in float64 (the portable reference loops).
TEST(ConvFusion, FewPixelForwardsMatchFloat64OnEveryIsa) {
  if (!fuses(Device())) GTEST_SKIP() << "no oneDNN fast path in this build";
  struct FewCase {
    const char* name;
    int64_t batch, in, out;
    std::vector<int64_t> size, kernel;
    int64_t stride, pad, dilation;
  };
  const FewCase cases[] = {
      {"1x1_on_one_pixel", 1, 64, 37, {1, 1}, {1, 1}, 1, 0, 1},           // 1 pixel
      {"3x3_on_2x3", 1, 16, 20, {2, 3}, {3, 3}, 1, 1, 1},                 // 6
      {"3x3_stride2_batch2", 2, 24, 35, {7, 7}, {3, 3}, 2, 1, 1},         // 32
      {"3x3_dilation2_batch2", 2, 8, 19, {5, 6}, {3, 3}, 1, 1, 2},        // 24
      {"3x3_batch3", 3, 32, 50, {3, 3}, {3, 3}, 1, 1, 1},                 // 27
      {"3x3_batch5_on_2x2", 5, 16, 16, {2, 2}, {3, 3}, 1, 1, 1},          // 20
      {"1d_stride2", 2, 32, 24, {9}, {3}, 2, 1, 1},                       // 10
      {"3d_stride2", 1, 4, 18, {3, 4, 5}, {3, 3, 3}, 2, 1, 1},            // 12
  };
  const int old = detail::cpu_force_isa(2);
  std::string previous;
  for (int level : {0, 1, 2}) {
    detail::cpu_force_isa(level);
    const std::string isa = detail::cpu_isa_name();
    if (isa == previous) continue;  // capped: the CPU has no higher level
    previous = isa;
    for (const FewCase& k : cases) {
      SCOPED_TRACE(std::string(k.name) + " at " + isa);
      seed(17);
      Conv conv(Dims(k.kernel), k.in, k.out, {.stride = k.stride, .pad = k.pad, .dilation = k.dilation});
      copy_(conv.bias, randn(Shape{k.out}));
      BatchNorm bn(k.out, relu);
      randomise(bn);
      std::vector<int64_t> xs{k.batch, k.in};
      xs.insert(xs.end(), k.size.begin(), k.size.end());
      Tensor x = randn(Shape(xs));
      auto to64 = [](const auto& m) { return fmap([](const Tensor& t) { return is_floating(t.dtype()) ? t.f64() : t; }, m); };
      auto model = Chain(conv, bn);
      Tensor want = to64(model)(x.f64());
      Tensor fused = detail::conv_batchnorm(conv, bn, x);
      ASSERT_TRUE(fused.defined()) << "the few-pixel forward fuses";
      EXPECT_EQ(fused.shape(), want.shape());
      EXPECT_LT(max_rel_error(fused, values(want)), 5e-5);
      EXPECT_LT(max_rel_error(model(x), values(want)), 5e-5);
      // The residual form, with the final relu.
      Tensor r = randn(want.shape());
      Tensor got = detail::conv_batchnorm(conv, bn, x, r, true);
      ASSERT_TRUE(got.defined());
      EXPECT_LT(max_rel_error(got, values(relu(want + r.f64()))), 5e-5);
      // Conv alone: bias and relu (the forward that training runs too).
      Conv with_relu(conv.weight, conv.bias, relu, ConvParams{.stride = k.stride, .pad = k.pad, .dilation = k.dilation});
      EXPECT_LT(max_rel_error(with_relu(x), values(to64(with_relu)(x.f64()))), 5e-5);
    }
  }
  detail::cpu_force_isa(old);
}

// Bad input gives the layers' own errors through the fused Chain.
TEST(ConvFusion, BadInputGivesTheLayersErrors) {
  auto model = Chain(Conv({3, 3}, 3, 8, {.pad = 1}), BatchNorm(8));
  EXPECT_THAT([&] { (void)model(randn(Shape{1, 4, 8, 8})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[Conv] input has 4 channels, layer expects 3")));
  auto wrong = Chain(Conv({3, 3}, 3, 8, {.pad = 1}), BatchNorm(6));
  EXPECT_THAT([&] { (void)wrong(randn(Shape{1, 3, 8, 8})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[BatchNorm] input has 8 channels, layer expects 6")));
  auto big = Chain(Conv({5, 5}, 3, 8), BatchNorm(8));
  EXPECT_THROW((void)big(randn(Shape{1, 3, 3, 3})), Error);
}
