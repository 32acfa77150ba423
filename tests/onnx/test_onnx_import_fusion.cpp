// The importer's load-time fusions (src/onnx/import.cpp: Conv chains, Gemm + Relu, attention) on every
// test device: a ResNet-18 and a pre-norm transformer encoder exported by onnx::save and imported again
// give the native model's outputs in Float32 and under bf16 autocast (to bf16 rounding, against the
// Float32 CPU outputs as reference), the encoder's gradients equal the native ones, and the attention
// chain's members run one by one (the same values) where the fused kernel is off.
#include <unistd.h>

#include <cmath>
#include <map>

#include "flux/flux.hpp"
#include "flux/models/resnet.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::device_test_name;
using flux::testing::test_devices;

namespace {

class OnnxImportFusion : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  }
};

template <class M> flux::onnx::Model round_trip(const M& model, const Tensor& x, const std::string& name) {
  std::string dir = ::testing::TempDir() + "flux-onnx-fusion-XXXXXX";
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  flux::onnx::save(dir + "/" + name + ".onnx", model, x);
  return flux::onnx::load(dir + "/" + name + ".onnx");
}

std::vector<double> host(const Tensor& t) { return to(t, Device()).cast(DType::f64).to_vector<double>(); }

/// max |a - b| over max |reference|.
double relative_error(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& reference) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
  for (double r : reference) scale = std::max(scale, std::abs(r));
  return err / scale;
}

// Float32: the imported model within 1e-5 of the native one on this device. bf16 autocast: the imported
// model's outputs within bf16 rounding (2^-8 relative per op, `bf16_tol` over the whole model) of the
// Float32 CPU reference, and of the native model's under autocast: equal on the CPU (the same fused
// kernels run), within one bf16 rounding (2^-7) elsewhere, where the graph's composed ops round apart.
template <class M>
void expect_native_outputs(const M& model, const flux::onnx::Model& imported, const Tensor& x, const Device& dev,
                           double bf16_tol) {
  const std::vector<double> reference = host(model(x));  // Float32 on the CPU
  auto native = model | dev;
  auto net = imported | dev;
  const Tensor xd = to(x, dev);
  EXPECT_LT(relative_error(host(net(xd)), host(native(xd)), reference), 1e-5);
  const std::vector<double> a = host(autocast(DType::bf16, [&] { return native(xd); }));
  const std::vector<double> b = host(autocast(DType::bf16, [&] { return net(xd); }));
  EXPECT_LT(relative_error(b, reference, reference), bf16_tol);
  EXPECT_LT(relative_error(b, a, reference), dev.is_cpu() ? 1e-6 : 1.0 / 128);
  EXPECT_LT(relative_error(a, reference, reference), bf16_tol);
}

// bench/flux_bench.cpp's encoder layer at small sizes: x + MHA(LayerNorm(x)), x + FFN(LayerNorm(x)).
auto encoder_layer(int64_t d, int64_t heads, int64_t ffn) {
  return Chain(SkipConnection(Chain(LayerNorm(d), MultiHeadAttention(d, {.nheads = heads})), plus),
               SkipConnection(Chain(LayerNorm(d), Dense(d, ffn, relu), Dense(ffn, d)), plus));
}

TEST_P(OnnxImportFusion, ResNet18UnderBf16AutocastGivesTheNativeOutputs) {
  const Device dev = GetParam();
  seed(5);
  models::ResNet18 model(10);
  for (auto& [name, t] : state(model))
    if (name.find("running_var") != std::string::npos) copy_(t, rand(t.shape()) + 0.5);
    else if (name.find("running_mean") != std::string::npos) copy_(t, rand(t.shape()) * 0.2 - 0.1);
  testmode(model);
  Tensor x = rand({2, 3, 32, 32});
  auto net = round_trip(model, x, "resnet18");
  EXPECT_NE(net.summary().find("20 Conv fused"), std::string::npos) << net.summary();
  expect_native_outputs(model, net, x, dev, 0.05);
}

TEST_P(OnnxImportFusion, EncoderUnderBf16AutocastGivesTheNativeOutputsAndGradients) {
  const Device dev = GetParam();
  seed(6);
  auto model = Chain(encoder_layer(32, 4, 64), encoder_layer(32, 4, 64), LayerNorm(32));
  testmode(model);
  Tensor x = rand({3, 8, 32}) * 2 - 1;
  auto imported = round_trip(model, rand({2, 8, 32}), "encoder");
  EXPECT_NE(imported.summary().find("2 attention fused, 2 Gemm fused with their Relu"), std::string::npos)
      << imported.summary();
  expect_native_outputs(model, imported, x, dev, 0.03);

  // Gradients (the fused attention's backward into the projection it reads in place) equal the layers'.
  auto native = model | dev;
  auto net = imported | dev;
  const Tensor xd = to(x, dev);
  auto loss = [&](const auto& m) { return sum(square(m(xd))); };
  auto g_net = gradient(loss, net);
  std::map<std::string, Tensor> want;
  for (auto& [name, t] : state(gradient(loss, native))) want[name] = t;
  int compared = 0;
  for (auto& [name, t] : g_net.parameters) {
    ASSERT_TRUE(want.count(name)) << name;
    const std::vector<double> a = host(t), b = host(want[name]);
    EXPECT_LT(relative_error(a, b, b), 1e-4) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 * 12 + 2);

  // Without the fused kernel the chains' members run one by one: the same values.
  const std::vector<double> fused = host(net(xd));
  detail::set_fused_attention(false);
  const std::vector<double> composed = host(net(xd));
  detail::set_fused_attention(true);
  EXPECT_LT(relative_error(composed, fused, fused), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Devices, OnnxImportFusion, ::testing::ValuesIn(test_devices()), device_test_name);

}  // namespace
