// Every public write path into a layer's tensors is seen by the next forward (issue 37): the CPU keeps
// weights prepared in a kernel's layout (Dense at batch >= 8, Conv, Conv fused with BatchNorm at
// inference, the LSTM's gate weights), and no way of writing them may leave a stale prepared copy.
// After a first forward (which prepares), the weights change by copy_, sub_, copy_ into a view, a
// write through Tensor::buffer() (raw pointer on the CPU, the backend's copy_from_host on a device),
// a write through a view's buffer(), an optimiser update, load() of a safetensors file, fmap replacing
// the tensor and plain assignment of a new tensor; the next forward (and the one after it) must equal
// a float64 CPU copy of the model made from the new weights. On every device.
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;

namespace {

class WeightWrites : public ::testing::TestWithParam<Device> {};

constexpr double kTol = 1e-4;

/// A float64 copy of `m` on the CPU: fresh tensors, so nothing prepared from the old ones can be used.
template <class M> M f64_cpu_copy(const M& m) {
  return fmap([](const Tensor& t) { return to(t, Device()).f64(); }, m);
}

/// Writes `values` into t's memory through t.buffer(): a raw pointer on the CPU, the backend's
/// copy_from_host elsewhere (what a user filling a tensor from their own memory does).
void write_through_buffer(const Tensor& t, const std::vector<float>& values) {
  ASSERT_EQ(t.dtype(), DType::f32);
  ASSERT_EQ(int64_t(values.size()), t.numel());
  const backend::Buffer b = t.buffer();
  if (t.device().backend() == "CPU")
    std::memcpy(static_cast<unsigned char*>(b.handle) + b.offset, values.data(), t.nbytes());
  else
    t.backend().copy_from_host(t.device().index(), b, values.data(), t.nbytes());
}

std::vector<float> random_values(const Tensor& like) { return randn(like.shape()).to_vector<float>(); }

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("flux_weight_writes_" + name + ".safetensors")).string();
}

/// model(x) twice (the second reuses whatever the first prepared) against the float64 CPU copy.
template <class M> void expect_forward_matches(const M& model, const Tensor& x, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<double> want = f64_cpu_copy(model)(to(x, Device()).f64()).template to_vector<double>();
  EXPECT_LT(max_rel_error(model(x), want), kTol) << "first forward after the write";
  EXPECT_LT(max_rel_error(model(x), want), kTol) << "second forward after the write";
}

/// Runs a forward, then changes the tensor `target(model)` by every public write path, checking the
/// next forward after each. `loss` gives the optimiser a gradient; `fresh` makes another model of
/// the same structure (on the CPU) whose file load() reads.
template <class M, class Target, class Fresh>
void check_every_write_path(M& model, const Tensor& x, const Device& dev, Target target, Fresh fresh,
                            const std::string& name) {
  expect_forward_matches(model, x, "before any write");
  copy_(target(model), to(randn(target(model).shape()), dev));
  expect_forward_matches(model, x, "copy_ into it");
  sub_(target(model), full_like(target(model), 0.25));
  expect_forward_matches(model, x, "sub_ from it");
  {
    Tensor view = target(model).slice(1, 2);  // shares the storage
    copy_(view, zeros_like(view));
  }
  expect_forward_matches(model, x, "copy_ into a view of it");
  write_through_buffer(target(model), random_values(target(model)));
  expect_forward_matches(model, x, "a write through buffer()");
  {
    Tensor view = target(model).slice(0, 1);
    write_through_buffer(view, std::vector<float>(size_t(view.numel()), 0.5f));
  }
  expect_forward_matches(model, x, "a write through a view's buffer()");
  write_through_buffer(target(model), random_values(target(model)));
  expect_forward_matches(model, x, "a second write through buffer()");
  {
    auto [loss, grads] = withgradient([&](auto& m) { return sum(m(x) * m(x)); }, model);
    (void)loss;
    auto state = optimisers::setup(optimisers::Descent(1e-4), model);
    optimisers::update(state, model, grads);
  }
  expect_forward_matches(model, x, "an optimiser update");
  {
    auto other = fresh();
    const std::string path = temp_path(name);
    save(path, other);
    load(path, model);
    std::filesystem::remove(path);
    EXPECT_EQ(target(model).template to_vector<float>(), target(other).template to_vector<float>());
  }
  expect_forward_matches(model, x, "load() of a safetensors file");
  {
    const TensorImpl* old = target(model).impl();
    model = fmap([&](const Tensor& t) { return t.impl() == old ? to(randn(t.shape()), dev) : t; }, model);
  }
  expect_forward_matches(model, x, "fmap replacing it");
  target(model) = to(randn(target(model).shape()), dev);
  expect_forward_matches(model, x, "assigning a new tensor");
  copy_(target(model), to(randn(target(model).shape()), dev));
  expect_forward_matches(model, x, "copy_ into the assigned tensor");
}

/// The cheaper paths (copy_, buffer()) on a second tensor of the model.
template <class M, class Target> void check_copy_and_buffer(M& model, const Tensor& x, const Device& dev, Target target) {
  copy_(target(model), to(randn(target(model).shape()), dev));
  expect_forward_matches(model, x, "copy_ into a second tensor");
  write_through_buffer(target(model), random_values(target(model)));
  expect_forward_matches(model, x, "a write through a second tensor's buffer()");
}

}  // namespace

// Dense at batch 16: the CPU runs it with prepared (packed) weights.
TEST_P(WeightWrites, Dense) {
  const Device dev = GetParam();
  seed(3721);
  Dense d = Dense(96, 80, relu) | dev;
  const Tensor x = to(randn(Shape{16, 96}), dev);
  {
    SCOPED_TRACE("weight");
    check_every_write_path(d, x, dev, [](Dense& m) -> Tensor& { return m.weight; }, [] { return Dense(96, 80, relu); },
                           "dense");
  }
  SCOPED_TRACE("bias");
  check_copy_and_buffer(d, x, dev, [](Dense& m) -> Tensor& { return m.bias; });
}

// A Dense in a Chain at inference, at batch 8 (the smallest batch of the prepared path).
TEST_P(WeightWrites, DenseInAChainAtBatch8) {
  const Device dev = GetParam();
  seed(3722);
  auto model = Chain(Dense(64, 128, relu), Dense(128, 32)) | dev;
  testmode(model);
  const Tensor x = to(randn(Shape{8, 64}), dev);
  SCOPED_TRACE("second Dense's weight");
  check_every_write_path(model, x, dev, [](auto& m) -> Tensor& { return m.template get<1>().weight; },
                         [] { return Chain(Dense(64, 128, relu), Dense(128, 32)); }, "chain");
}

TEST_P(WeightWrites, Conv) {
  const Device dev = GetParam();
  seed(3723);
  Conv c = Conv({3, 3}, 16, 32, {.pad = 1}) | dev;
  const Tensor x = to(randn(Shape{2, 16, 9, 10}), dev);
  {
    SCOPED_TRACE("weight");
    check_every_write_path(c, x, dev, [](Conv& m) -> Tensor& { return m.weight; },
                           [] { return Conv({3, 3}, 16, 32, {.pad = 1}); }, "conv");
  }
  SCOPED_TRACE("bias");
  check_copy_and_buffer(c, x, dev, [](Conv& m) -> Tensor& { return m.bias; });
}

// Conv -> BatchNorm in test mode: fused on the CPU (the BatchNorm folded into prepared weights).
TEST_P(WeightWrites, ConvBatchNormFused) {
  const Device dev = GetParam();
  seed(3724);
  auto make = [] { return Chain(Conv({3, 3}, 16, 32, {.pad = 1, .bias = false}), BatchNorm(32, relu)); };
  auto model = make() | dev;
  copy_(model.get<1>().running_var, to(rand(Shape{32}) + 0.5, dev));
  copy_(model.get<1>().running_mean, to(randn(Shape{32}) * 0.1, dev));
  testmode(model);
  const Tensor x = to(randn(Shape{2, 16, 9, 9}), dev);
  {
    SCOPED_TRACE("conv weight");
    check_every_write_path(model, x, dev, [](auto& m) -> Tensor& { return m.template get<0>().weight; }, make,
                           "conv_bn");
  }
  {
    SCOPED_TRACE("BatchNorm weight");
    check_every_write_path(model, x, dev, [](auto& m) -> Tensor& { return m.template get<1>().weight; }, make,
                           "conv_bn_scale");
  }
  for (const char* which : {"running_var", "running_mean", "bias"}) {
    SCOPED_TRACE(which);
    check_copy_and_buffer(model, x, dev, [which](auto& m) -> Tensor& {
      BatchNorm& bn = m.template get<1>();
      return std::string(which) == "running_var" ? bn.running_var : std::string(which) == "running_mean" ? bn.running_mean : bn.bias;
    });
    // running_var must stay positive: the reference takes its square root.
    copy_(model.get<1>().running_var, to(rand(Shape{32}) + 0.5, dev));
  }
}

// LSTM at batch 8 (its gate GEMMs in the prepared path on the CPU), then a Dense on every step.
TEST_P(WeightWrites, Lstm) {
  const Device dev = GetParam();
  seed(3725);
  auto make = [] { return Chain(LSTM(16, 32), Dense(32, 8)); };
  auto model = make() | dev;
  testmode(model);
  const Tensor x = to(randn(Shape{8, 5, 16}), dev);
  {
    SCOPED_TRACE("weight_ih");
    check_every_write_path(model, x, dev, [](auto& m) -> Tensor& { return m.template get<0>().layers[0].weight_ih; },
                           make, "lstm_ih");
  }
  {
    SCOPED_TRACE("weight_hh");
    check_every_write_path(model, x, dev, [](auto& m) -> Tensor& { return m.template get<0>().layers[0].weight_hh; },
                           make, "lstm_hh");
  }
  SCOPED_TRACE("bias_hh");
  check_copy_and_buffer(model, x, dev, [](auto& m) -> Tensor& { return m.template get<0>().layers[0].bias_hh; });
}

FLUX_DEVICE_SUITE(WeightWrites);
