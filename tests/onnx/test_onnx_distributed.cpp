// distributed::withgradient on an imported onnx::Model, in one process on every test device: the
// one-rank communicator gives plain withgradient's loss and gradients, and the pieces the multi-rank
// path runs on the model (fmap of tape leaves over its initialisers, the tape's report of each final
// gradient, backward from a 1/ranks seed) give the same gradients, each reported once and final.
#include <stdlib.h>

#include <map>
#include <set>

#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::device_test_name;
using flux::testing::test_devices;

namespace {

class OnnxDistributed : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  }
};

// Conv -> BatchNorm -> Relu (fused at load), a reshape (integer shape constants: NonTrainable), Dense.
flux::onnx::Model imported_model(Tensor& x) {
  seed(11);
  auto model = Chain(Conv({3, 3}, 2, 3, relu, {.pad = 1}), BatchNorm(3, relu), flatten, Dense(48, 4, tanh), Dense(4, 2));
  testmode(model);
  x = rand({3, 2, 4, 4});
  std::string dir = ::testing::TempDir() + "flux-onnx-distributed-XXXXXX";
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  flux::onnx::save(dir + "/m.onnx", model, x);
  return flux::onnx::load(dir + "/m.onnx");
}

std::vector<double> host(const Tensor& t) { return to(t, Device()).to_vector<double>(); }

TEST_P(OnnxDistributed, WithGradientOnOneRankEqualsWithGradient) {
  const Device dev = GetParam();
  Tensor x0;
  auto net = imported_model(x0) | dev;
  Tensor x = to(x0, dev), y = to(randn({3, 2}), dev);
  auto f = [&](const auto& m) { return mse(m(x), y); };
  auto comm = distributed::initialize();
  ASSERT_EQ(comm.size(), 1);
  auto [l1, g1] = withgradient(f, net);
  auto [l2, g2] = distributed::withgradient(comm, f, net);
  EXPECT_EQ(l1.item<float>(), l2.item<float>());
  ASSERT_EQ(g1.parameters.size(), net.parameters.size());
  ASSERT_EQ(g2.parameters.size(), net.parameters.size());
  for (size_t i = 0; i < g1.parameters.size(); ++i) {
    EXPECT_EQ(g2.parameters[i].first, net.parameters[i].first);
    EXPECT_EQ(host(g1.parameters[i].second), host(g2.parameters[i].second)) << g1.parameters[i].first;
  }
  // The gradient is a model of its own: a small descent step with it lowers the loss.
  auto opt = optimisers::setup(optimisers::Descent(0.01), net);
  optimisers::update(opt, net, g2);
  EXPECT_LT(f(net).item<double>(), l1.item<double>());
}

TEST_P(OnnxDistributed, MultiRankPiecesOnTheImportedModel) {
  const Device dev = GetParam();
  Tensor x0;
  auto net = imported_model(x0) | dev;
  Tensor x = to(x0, dev), y = to(randn({3, 2}), dev);
  auto f = [&](const auto& m) { return mse(m(x), y); };
  auto want = gradient(f, net);

  // As distributed::withgradient does for two ranks: leaves over every tensor, the trainable ones
  // handed to the reducer, backward from 1/2.
  autodiff::Tape tape;
  auto tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, net);
  std::vector<Tensor> leaves = params(tracked);
  ASSERT_EQ(leaves.size(), net.parameters.size());
  std::map<int64_t, size_t> leaf_of;
  for (size_t i = 0; i < leaves.size(); ++i) leaf_of[leaves[i].impl()->tape_id] = i;
  std::vector<size_t> order;
  std::vector<std::vector<double>> at_report(leaves.size());
  tape.on_gradient_final([&](int64_t id) {
    auto it = leaf_of.find(id);
    if (it == leaf_of.end()) return;  // a NonTrainable leaf (BatchNorm statistics, shape constants)
    order.push_back(it->second);
    at_report[it->second] = host(tape.grad(leaves[it->second]));
  });
  Tensor loss = f(tracked);
  tape.backward(loss, 0.5);
  ASSERT_EQ(order.size(), leaves.size());
  EXPECT_EQ(std::set<size_t>(order.begin(), order.end()).size(), leaves.size());
  ASSERT_EQ(want.parameters.size(), leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const std::string& name = want.parameters[i].first;
    std::vector<double> w = host(want.parameters[i].second), got = host(tape.grad(leaves[i]));
    EXPECT_EQ(at_report[i], got) << name << ": reported before its gradient was final";
    ASSERT_EQ(got.size(), w.size()) << name;
    double scale = 1e-6;
    for (double v : w) scale = std::max(scale, std::abs(v));
    for (size_t k = 0; k < w.size(); ++k) EXPECT_NEAR(got[k], 0.5 * w[k], 1e-5 * scale) << name << "[" << k << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OnnxDistributed, ::testing::ValuesIn(test_devices()), device_test_name);

}  // namespace
