// Prepared weights: the CPU backend keeps a forward's weights in its kernel's layout (reordered conv
// weights, prepacked Dense weights, Winograd transforms) in the weight tensor's cache, which the core
// empties on every write to the tensor. These tests change the weights between forwards by every
// in-place writer a user has (copy_, sub_, optimiser updates, loading a state, BatchNorm's running
// statistics in training mode, a BatchNorm's eps) and by freeing a layer and making another of the
// same shape; after each, the forward must equal a float64 reference of the new weights. Chains of
// convs and pools check that writes to activations are seen too. On devices that keep nothing
// (OpenCL) the same sequence runs and must agree too.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <gmock/gmock.h>

#include "flux/models/resnet.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;

namespace {

class WeightCacheDevices : public ::testing::TestWithParam<Device> {};

constexpr double kTol = 5e-5;

/// float64 reference of a 2-D Conv layer with stride 1 and padding 1 on x (CPU, float64: the
/// im2col + GEMM path, which keeps nothing).
std::vector<double> conv_want(const Conv& c, const Tensor& x) {
  Tensor b = c.bias.defined() ? to(c.bias, Device()).f64() : Tensor();
  ConvParams p;
  p.pad = 1;
  return conv(to(x, Device()).f64(), to(c.weight, Device()).f64(), b, p).to_vector<double>();
}

/// float64 reference of a Dense layer (identity or relu) on x (N, in).
std::vector<double> dense_want(const Dense& d, const Tensor& x, bool relu_after) {
  Tensor y = matmul(to(x, Device()).f64(), to(d.weight, Device()).f64(), false, true);
  if (d.bias.defined()) y = y + to(d.bias, Device()).f64();
  std::vector<double> v = y.to_vector<double>();
  if (relu_after)
    for (double& e : v) e = std::max(e, 0.0);
  return v;
}

/// c(x) against conv_want, twice (the second call reuses whatever the first kept).
void expect_conv_matches(const Conv& c, const Tensor& x) {
  const std::vector<double> want = conv_want(c, x);
  EXPECT_LT(max_rel_error(c(x), want), kTol);
  EXPECT_LT(max_rel_error(c(x), want), kTol);
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("flux_weight_cache_") + name)).string();
}

}  // namespace

// One Conv, every way a user writes its weights, a forward after each (twice: the second reuses
// whatever the first kept).
TEST_P(WeightCacheDevices, ConvSeesEveryInPlaceWrite) {
  const Device dev = GetParam();
  seed(11);
  Conv c = Conv({3, 3}, 16, 32, {.pad = 1}) | dev;
  Tensor x = to(randn(Shape{2, 16, 9, 10}), dev);
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    expect_conv_matches(c, x);
  };
  check("new layer");
  copy_(c.weight, to(randn(c.weight.shape()), dev));
  check("copy_ into the weight");
  sub_(c.weight, full_like(c.weight, 0.25));
  check("sub_ from the weight");
  Tensor view = c.weight.slice(5, 6);  // a view shares the storage: writing it changes the weight
  copy_(view, zeros_like(view));
  check("copy_ into a slice of the weight");
  for (int rule = 0; rule < 2; ++rule) {
    auto loss = [&](Conv& m) { return sum(m(x) * m(x)); };
    auto [l, g] = withgradient(loss, c);
    (void)l;
    if (rule == 0) {
      auto st = optimisers::setup(optimisers::Adam(0.05), c);
      optimisers::update(st, c, g);
      check("Adam update");
    } else {
      auto st = optimisers::setup(optimisers::Descent(1e-4), c);
      optimisers::update(st, c, g);
      check("Descent update");
    }
  }
  const std::string path = temp_path("conv.safetensors");
  Conv other = Conv({3, 3}, 16, 32, {.pad = 1});
  save(path, other);
  load(path, c);
  std::filesystem::remove(path);
  EXPECT_EQ(c.weight.to_vector<float>(), other.weight.to_vector<float>());
  check("state loaded from a file");
}

// Layers of one geometry share the backend's cached primitive; each must keep its own weights.
// Freed layers' memory is reused by new ones of the same shape: the new weights must be used.
TEST_P(WeightCacheDevices, ConvsOfOneShapeAndReusedMemory) {
  const Device dev = GetParam();
  seed(12);
  std::vector<Conv> convs;  // more than the kept copies per shape (KeptWeights::kMax = 64): refills
  for (int i = 0; i < 70; ++i) convs.push_back(Conv({3, 3}, 16, 16, {.pad = 1, .bias = false}) | dev);
  Tensor x = to(randn(Shape{1, 16, 8, 8}), dev);  // batch 1: output channels split over threads
  Tensor x2 = to(randn(Shape{3, 16, 8, 8}), dev);
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < convs.size(); ++i) {
      SCOPED_TRACE("conv " + std::to_string(i) + ", round " + std::to_string(round));
      EXPECT_LT(max_rel_error(convs[i](x), conv_want(convs[i], x)), kTol);
      EXPECT_LT(max_rel_error(convs[i](x2), conv_want(convs[i], x2)), kTol);
    }
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE("fresh layer " + std::to_string(i));
    Conv c = Conv({3, 3}, 16, 16, {.pad = 1, .bias = false}) | dev;
    EXPECT_LT(max_rel_error(c(x2), conv_want(c, x2)), kTol);
  }
}

// More Dense layers of one shape than the CPU keeps copies for (KeptWeights::kMax = 64), run in a
// cycle at a batch that takes the kept-weights kernel: every output right in each round (refills).
TEST_P(WeightCacheDevices, DenseLayersOfOneShapeBeyondTheKeptCopies) {
  const Device dev = GetParam();
  seed(19);
  std::vector<Dense> layers;
  for (int i = 0; i < 70; ++i) layers.push_back(Dense(24, 20) | dev);
  Tensor x = to(randn(Shape{9, 24}), dev);
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < layers.size(); ++i) {
      SCOPED_TRACE("layer " + std::to_string(i) + ", round " + std::to_string(round));
      EXPECT_LT(max_rel_error(layers[i](x), dense_want(layers[i], x, false)), kTol);
    }
}

// Conv -> BatchNorm in test mode runs fused on the CPU: the BatchNorm's scale is multiplied into the
// kept weights and the folded scale and shift are kept too (src/nn/conv.cpp), so changing any of the
// BatchNorm's tensors or its eps must show.
TEST_P(WeightCacheDevices, ConvBatchNormSeesBatchNormChanges) {
  const Device dev = GetParam();
  seed(13);
  auto model = Chain(Conv({3, 3}, 16, 32, {.pad = 1, .bias = false}), BatchNorm(32, relu)) | dev;
  testmode(model);
  Tensor x = to(randn(Shape{2, 16, 9, 9}), dev);
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    const Conv& c = model.get<0>();
    const BatchNorm& bn = model.get<1>();
    std::vector<double> y = conv_want(c, x);
    const std::vector<double> w = bn.weight.to_vector<double>(), b = bn.bias.to_vector<double>(),
                              m = bn.running_mean.to_vector<double>(), v = bn.running_var.to_vector<double>();
    const size_t per_channel = y.size() / (2 * 32);
    for (size_t i = 0; i < y.size(); ++i) {
      size_t ch = (i / per_channel) % 32;
      y[i] = std::max(0.0, (y[i] - m[ch]) / std::sqrt(v[ch] + bn.eps) * w[ch] + b[ch]);
    }
    EXPECT_LT(max_rel_error(model(x), y), kTol);
    EXPECT_LT(max_rel_error(model(x), y), kTol);
  };
  check("fresh BatchNorm");
  copy_(model.get<1>().running_var, to(rand(Shape{32}) + 0.5, dev));
  check("running_var written");
  copy_(model.get<1>().weight, to(randn(Shape{32}), dev));
  check("BatchNorm weight written");
  copy_(model.get<1>().running_mean, to(randn(Shape{32}), dev));
  check("running_mean written");
  sub_(model.get<1>().bias, to(randn(Shape{32}), dev));
  check("BatchNorm bias written");
  model.get<1>().eps = 0.3;
  check("eps changed");
  trainmode(model);
  model(x * 2.0 + 1.0);  // training mode: the running statistics move
  testmode(model);
  check("running statistics updated in training mode");
}

// Dense at batch sizes that run as a GEMM (the CPU may keep its weight prepacked) and as a GEMV.
TEST_P(WeightCacheDevices, DenseSeesEveryInPlaceWrite) {
  const Device dev = GetParam();
  seed(14);
  Dense d = Dense(96, 80, relu) | dev;
  Tensor xs[] = {to(randn(Shape{64, 96}), dev), to(randn(Shape{1, 96}), dev), to(randn(Shape{5, 96}), dev)};
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    for (const Tensor& x : xs) {
      std::vector<double> want = dense_want(d, x, true);
      EXPECT_LT(max_rel_error(d(x), want), kTol) << "batch " << x.size(0);
      EXPECT_LT(max_rel_error(d(x), want), kTol) << "batch " << x.size(0);
    }
  };
  check("new layer");
  copy_(d.weight, to(randn(d.weight.shape()), dev));
  check("copy_ into the weight");
  sub_(d.weight, full_like(d.weight, 0.125));
  check("sub_ from the weight");
  copy_(d.bias, to(randn(d.bias.shape()), dev));
  check("copy_ into the bias");
  auto loss = [&](Dense& m) { return sum(m(xs[0])); };
  {
    auto [l, g] = withgradient(loss, d);
    (void)l;
    auto st = optimisers::setup(optimisers::Adam(0.05), d);
    optimisers::update(st, d, g);
    check("Adam update");
  }
  {
    auto [l, g] = withgradient(loss, d);
    (void)l;
    auto st = optimisers::setup(optimisers::Momentum(0.01, 0.9), d);
    optimisers::update(st, d, g);
    check("Momentum update");
  }
  const std::string path = temp_path("dense.safetensors");
  Dense other(96, 80, relu);
  save(path, other);
  load(path, d);
  std::filesystem::remove(path);
  check("state loaded from a file");
  // Layers of one shape, and fresh layers in freed memory.
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE("fresh layer " + std::to_string(i));
    Dense e = Dense(96, 80) | dev;
    EXPECT_LT(max_rel_error(e(xs[0]), dense_want(e, xs[0], false)), kTol);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, WeightCacheDevices, ::testing::ValuesIn(flux::testing::test_devices()),
                         flux::testing::device_test_name);

namespace {

/// float64 reference of BatchNorm `bn` (test mode) on y (N, C, ...), then relu when asked.
std::vector<double> batchnorm_want(const BatchNorm& bn, std::vector<double> y, int64_t channels, int64_t batch,
                                   bool relu_after) {
  const std::vector<double> w = bn.weight.to_vector<double>(), b = bn.bias.to_vector<double>(),
                            m = bn.running_mean.to_vector<double>(), v = bn.running_var.to_vector<double>();
  const size_t per_channel = y.size() / size_t(batch * channels);
  for (size_t i = 0; i < y.size(); ++i) {
    size_t ch = (i / per_channel) % size_t(channels);
    y[i] = (y[i] - m[ch]) / std::sqrt(v[ch] + bn.eps) * w[ch] + b[ch];
    if (relu_after) y[i] = std::max(y[i], 0.0);
  }
  return y;
}

Tensor f32_on(const std::vector<double>& v, const Shape& shape, const Device& dev) {
  return to(Tensor(v, shape).f32(), dev);
}

}  // namespace

// A conv's output feeds the next conv: the CPU keeps it in the blocked layout under its stamp and
// the next conv reads that copy. Every in-place write into the output between the two convs must
// show, as must outputs in freed and reused memory; batch 1 splits output channels over threads.
TEST_P(WeightCacheDevices, ConvChainSeesWritesToItsActivations) {
  const Device dev = GetParam();
  seed(15);
  Conv c1 = Conv({3, 3}, 16, 32, {.pad = 1}) | dev, c2 = Conv({3, 3}, 32, 32, {.pad = 1}) | dev;
  for (int64_t batch : {3, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Tensor x = to(randn(Shape{batch, 16, 12, 11}), dev);
    Tensor y = c1(x);
    auto check = [&](const char* what) {
      SCOPED_TRACE(what);
      expect_conv_matches(c2, y);
    };
    check("conv output");
    copy_(y, to(randn(y.shape()), dev));
    check("copy_ into the output");
    y = c1(x);
    sub_(y, full_like(y, 0.5));
    check("sub_ from the output");
    y = c1(x);
    Tensor first = y.slice(0, 1);
    copy_(first, zeros_like(first));
    check("copy_ into a slice of the output");
    for (int i = 0; i < 8; ++i) {
      y = c1(to(randn(x.shape()), dev));
      check("a new output in reused memory");
    }
  }
}

// At inference the CPU conv may leave its plain output unwritten while its blocked copy is kept
// (ConvGeometry::output_deferred): the output is written when anything reads it (here the host),
// when its copy is refilled for a later output (six outputs alive, four copies kept), and a freed
// deferred output must never be written into memory that holds another tensor since.
TEST_P(WeightCacheDevices, DeferredConvOutputsAreWrittenWhenNeeded) {
  const Device dev = GetParam();
  seed(17);
  Conv c = Conv({3, 3}, 32, 32, {.pad = 1}) | dev;
  for (int64_t batch : {3, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    std::vector<Tensor> ys{to(randn(Shape{batch, 32, 9, 10}), dev)};
    for (int i = 0; i < 6; ++i) ys.push_back(c(ys.back()));  // nothing read in between
    for (int i = 0; i < 6; ++i)
      EXPECT_LT(max_rel_error(ys[size_t(i + 1)], conv_want(c, ys[size_t(i)])), kTol) << "output " << i + 1;
    // A conv on a part of a deferred output (the last sample: not where the output starts).
    Tensor x = ys[0];
    {
      Tensor part = c(x).slice(batch - 1, batch);
      Tensor got = c(part);
      EXPECT_LT(max_rel_error(got, conv_want(c, part)), kTol) << "a slice of an output";
    }
    // A deferred output freed, its memory reused by a filled tensor, then more outputs than copies.
    ys.clear();
    for (int i = 0; i < 4; ++i) {
      Tensor gone = c(x);
      gone = Tensor();
      Tensor filled = full(Shape{batch, 32, 9, 10}, 3.0, DType::f32, dev);
      Tensor y = x;
      for (int j = 0; j < 6; ++j) y = c(y);
      std::vector<float> v = filled.to_vector<float>();
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float e) { return e == 3.0f; })) << "round " << i;
    }
  }
}

// ResNet's block in test mode runs each conv fused with its BatchNorm, relu and residual: the block's
// input is read by conv1 and added by conv2, on the CPU from the kept blocked copy of the conv output
// it is; writes into it must show in both.
TEST_P(WeightCacheDevices, ResidualBlockSeesWritesToItsInput) {
  const Device dev = GetParam();
  seed(16);
  const int64_t batch = 2, c = 32, hw = 10;
  Conv stem = Conv({3, 3}, 16, c, {.pad = 1}) | dev;
  auto block = models::BasicBlock<models::NoDownsample>(c, c) | dev;
  for (BatchNorm* bn : {&block.bn1, &block.bn2}) {
    copy_(bn->running_mean, to(randn(Shape{c}) * 0.1, dev));
    copy_(bn->running_var, to(rand(Shape{c}) + 0.5, dev));
    copy_(bn->weight, to(rand(Shape{c}) + 0.5, dev));
  }
  testmode(block);
  Tensor x = stem(to(randn(Shape{batch, 16, hw, hw}), dev));
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    const Shape shape = x.shape();
    std::vector<double> h = batchnorm_want(block.bn1, conv_want(block.conv1, x), c, batch, true);
    std::vector<double> y = batchnorm_want(block.bn2, conv_want(block.conv2, f32_on(h, shape, dev)), c, batch, false);
    const std::vector<double> in = x.to_vector<double>();
    for (size_t i = 0; i < y.size(); ++i) y[i] = std::max(y[i] + in[i], 0.0);
    EXPECT_LT(max_rel_error(block(x), y), 1e-4);
    EXPECT_LT(max_rel_error(block(x), y), 1e-4);
  };
  check("conv output as the block's input");
  copy_(x, to(randn(x.shape()), dev));
  check("copy_ into the input");
  x = stem(to(randn(Shape{batch, 16, hw, hw}), dev));
  sub_(x, full_like(x, 0.25));
  check("sub_ from the input");
}

namespace flux::detail {
// src/backends/cpu/isa.cpp (flux.hpp's flux::cpu is the mover): the CPU kernels' ISA level, capped at
// `level` (0 baseline, 1 AVX2, 2 AVX-512; never above the CPU's).
const char* cpu_isa_name();
int cpu_force_isa(int level);
}  // namespace flux::detail

// Max pooling at inference on the CPU reads a conv's kept blocked output and keeps its own output
// blocked and unwritten for the next conv (conv.cpp's onednn_pool_forward, pooling.cpp's kernel).
// Against float64 references, for three windows, two batch sizes and every ISA level of the CPU: the
// pooled values read directly, through the next conv (which reads the kept copy where oneDNN's blocked
// kernel runs it: batch 3, or stride 1; at batch 1 the stride-2 pools leave <= 30 pixels and the
// few-pixel kernel reads the pool's output written out), and with a NaN in the input; a write into
// the conv output before the pool is seen; inside gradient() the plain path runs and its gradient is
// right. (tests/onednn_avx2.cmake runs it again with oneDNN's 8-channel blocks.)
TEST_P(WeightCacheDevices, MaxPoolOnConvOutputs) {
  const Device dev = GetParam();
  seed(18);
  Conv c = Conv({3, 3}, 16, 40, {.pad = 1}) | dev;  // 40 channels: a partial channel block
  Conv after = Conv({3, 3}, 40, 24, {.pad = 1}) | dev;
  struct Window {
    int64_t k, stride, pad;
  };
  auto pool64 = [](const std::vector<double>& v, const Shape& shape, const Window& w) {
    return maxpool(Tensor(v, shape), {w.k, w.k}, {.stride = w.stride, .pad = w.pad});
  };
  // NaN-aware: the same positions NaN, the rest within kTol.
  auto expect_near = [](const Tensor& got, const Tensor& want, const char* what) {
    const std::vector<double> g = got.to_vector<double>(), e = want.to_vector<double>();
    ASSERT_EQ(g.size(), e.size()) << what;
    double worst = 0;
    size_t nan_mismatch = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::isnan(g[i]) || std::isnan(e[i])) {
        nan_mismatch += std::isnan(g[i]) != std::isnan(e[i]);
        continue;
      }
      worst = std::max(worst, std::abs(g[i] - e[i]) / std::max(1.0, std::abs(e[i])));
    }
    EXPECT_EQ(nan_mismatch, 0u) << what;
    EXPECT_LT(worst, kTol) << what;
  };
  const int old = detail::cpu_force_isa(2);
  std::string previous;
  for (int level : {0, 1, 2}) {
    detail::cpu_force_isa(level);
    const std::string isa = detail::cpu_isa_name();
    if (isa == previous) continue;
    previous = isa;
    for (const Window& w : {Window{3, 2, 1}, Window{2, 2, 0}, Window{3, 1, 1}})
      for (int64_t batch : {1, 3}) {
        SCOPED_TRACE(isa + ", window " + std::to_string(w.k) + " stride " + std::to_string(w.stride) + ", batch " +
                     std::to_string(batch));
        Tensor x = to(randn(Shape{batch, 16, 11, 10}), dev);
        const Shape hs{batch, 40, 11, 10};
        Tensor want = pool64(conv_want(c, x), hs, w);
        Tensor p = maxpool(c(x), {w.k, w.k}, {.stride = w.stride, .pad = w.pad});
        Tensor y = after(p);  // before anything reads p
        expect_near(y, Tensor(conv_want(after, f32_on(want.to_vector<double>(), want.shape(), dev)), y.shape()),
                    "the next conv");
        expect_near(p, want, "the pooled values");
        // A write into the conv output before the pool.
        Tensor h = c(x);
        copy_(h, to(randn(hs), dev));
        expect_near(maxpool(h, {w.k, w.k}, {.stride = w.stride, .pad = w.pad}), pool64(h.to_vector<double>(), hs, w),
                    "after copy_ into the conv output");
        // A NaN in the conv input reaches every output channel of its neighbours; the pool keeps it.
        std::vector<float> xv = x.to_vector<float>();
        xv[size_t(5 * 10 + 4)] = std::nanf("");
        Tensor xn = to(Tensor(xv, x.shape()), dev);
        expect_near(maxpool(c(xn), {w.k, w.k}, {.stride = w.stride, .pad = w.pad}), pool64(conv_want(c, xn), hs, w),
                    "a NaN in the input");
      }
  }
  detail::cpu_force_isa(old);
  // Recorded: the plain kernels; d sum(maxpool(conv(x))) / dx against float64.
  Tensor x = to(randn(Shape{2, 16, 11, 10}), dev);
  auto loss = [&](const Tensor& in) { return sum(maxpool(c(in), {3, 3}, {.stride = 2, .pad = 1})); };
  Tensor g = gradient(loss, x)[0];
  Tensor x64 = to(x, Device()).f64(), w64 = to(c.weight, Device()).f64(), b64 = to(c.bias, Device()).f64();
  Tensor g64 = gradient([&](const Tensor& in) { return sum(maxpool(conv(in, w64, b64, {.pad = 1}), {3, 3}, {.stride = 2, .pad = 1})); }, x64)[0];
  EXPECT_LT(max_rel_error(g, g64.to_vector<double>()), 1e-4);
}
