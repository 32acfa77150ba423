// Moving tensors and models between devices: to, gpu, cpu, x | dev, fmap; gradients through moves;
// errors when an op mixes devices. TEST_Ps run on every test device; TwoDevices.* need two OpenCL
// devices (tests/device.cmake runs them with POCL_DEVICES="pthread pthread").
#include <cstdlib>
#include <string>
#include <vector>

#include "test_devices.hpp"

using namespace flux;

namespace {

struct TiedLayer {
  Tensor encoder;
  Tensor decoder;  // the same tensor as encoder (weight tying)
  Tensor scale;
};
FLUX_LAYER(TiedLayer, encoder, decoder, scale)

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const flux::Error& e) {
    return e.what();
  }
  return "<no flux::Error thrown>";
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// One tensor of every dtype, with values each dtype can hold exactly.
std::vector<Tensor> one_of_each_dtype() {
  std::vector<double> v{0, 1, 2, 3, 4, 5};
  Tensor f64(v, Shape{2, 3});
  return {f64.cast(DType::f32), f64,
          f64.cast(DType::f16), f64.cast(DType::bf16),
          f64.cast(DType::i32), f64.cast(DType::i64),
          f64.cast(DType::u8),  Tensor(std::vector<uint8_t>{0, 1, 1, 0, 1, 0}, Shape{2, 3}, DType::boolean)};
}

}  // namespace

class Move : public ::testing::TestWithParam<Device> {};

TEST_P(Move, ToKeepsDtypeAndValues) {
  Device d = GetParam();
  for (const Tensor& x : one_of_each_dtype()) {
    Tensor y = to(x, d);
    EXPECT_EQ(y.device(), d);
    EXPECT_EQ(y.dtype(), x.dtype()) << dtype_name(x.dtype());
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(values(y), values(x)) << dtype_name(x.dtype());
    Tensor back = to(y, Device());
    EXPECT_EQ(back.dtype(), x.dtype());
    EXPECT_EQ(values(back), values(x));
  }
}

TEST_P(Move, ToTheDeviceItIsOnReturnsTheSameStorage) {
  Device d = GetParam();
  Tensor x = to(rand({4, 3}), d);
  EXPECT_TRUE(to(x, d).same_storage(x));
  EXPECT_TRUE((x | d).same_storage(x));
  auto model = to(Chain(Dense(3, 4, relu), Dense(4, 2)), d);
  auto again = to(model, d);
  std::vector<Tensor> a = params(model), b = params(again);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].same_storage(b[i])) << i;
}

TEST_P(Move, ModelRoundTripGivesTheSameOutputs) {
  Device d = GetParam();
  seed(7);
  auto model = Chain(Dense(3, 5, relu), Dense(5, 2));
  Tensor x = rand({6, 3});
  std::vector<double> want = values(model(x));
  auto moved = model | d;
  for (const Tensor& p : params(moved)) EXPECT_EQ(p.device(), d);
  Tensor y = moved(x | d);
  EXPECT_EQ(y.device(), d);
  EXPECT_LE(flux::testing::max_rel_error(y, want), 1e-5);
  auto back = cpu(moved);
  for (const Tensor& p : params(back)) EXPECT_EQ(p.device(), Device());
  auto back_pipe = moved | cpu;
  EXPECT_LE(flux::testing::max_rel_error(back_pipe(x), want), 1e-5);
  std::vector<Tensor> before = params(model), after = params(back);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(values(before[i]), values(after[i]));
}

TEST_P(Move, TiedTensorsStayTied) {
  Device d = GetParam();
  Tensor shared = rand({3, 3});
  TiedLayer layer{shared, shared, rand({3})};
  TiedLayer moved = to(layer, d);
  EXPECT_EQ(moved.encoder.device(), d);
  EXPECT_EQ(moved.encoder.impl(), moved.decoder.impl()) << "one tensor, moved once";
  EXPECT_TRUE(moved.encoder.same_storage(moved.decoder));
  EXPECT_FALSE(moved.scale.same_storage(moved.encoder));
  EXPECT_EQ(params(moved).size(), 2u);

  std::vector<Tensor> list{shared, shared};
  std::vector<Tensor> moved_list = list | d;
  EXPECT_TRUE(moved_list[0].same_storage(moved_list[1]));

  TiedLayer back = cpu(moved);
  EXPECT_TRUE(back.encoder.same_storage(back.decoder));
}

TEST_P(Move, GradientReturnsToTheSourceDevice) {
  Device d = GetParam();
  Tensor x({1, 2, 3});
  Tensor g = gradient([&](const Tensor& v) { return sum(to(v, d) * 2.0); }, x);
  EXPECT_EQ(g.device(), Device());
  EXPECT_EQ(values(g), (std::vector<double>{2, 2, 2}));

  // And back: a tensor on d, a loss computed on the CPU.
  Tensor xd = to(Tensor({1, 2, 3}), d);
  Tensor gd = gradient([&](const Tensor& v) { return sum(to(v, Device()) * to(v, Device())); }, xd);
  EXPECT_EQ(gd.device(), d);
  EXPECT_EQ(values(gd), (std::vector<double>{2, 4, 6}));

  // Through a model moved to d, gradients have the model's type and live on d.
  auto model = to(Chain(Dense(3, 2)), d);
  auto grads = gradient([&](auto& m) { return sum(m(to(Tensor(std::vector<float>{1, 2, 3}, Shape{1, 3}), d))); }, model);
  for (const Tensor& p : params(grads)) EXPECT_EQ(p.device(), d);
}

TEST_P(Move, GpuConversionKeepsIntegers) {
  Device d = GetParam();
  for (const Tensor& x : one_of_each_dtype()) {
    Tensor y = detail::to_gpu_tensor(x, d);
    EXPECT_EQ(y.device(), d);
    if (d.is_cpu()) {
      EXPECT_TRUE(y.same_storage(x)) << "gpu without a GPU is a no-op";
    } else if (x.dtype() == DType::f64) {
      EXPECT_EQ(y.dtype(), DType::f32) << "gpu converts Float64 to Float32, as Flux does";
    } else {
      EXPECT_EQ(y.dtype(), x.dtype()) << dtype_name(x.dtype());
    }
    EXPECT_EQ(values(y), values(x));
  }
}

TEST_P(Move, OpsOnTwoDevicesNameBoth) {
  Device d = GetParam();
  if (d.is_cpu()) GTEST_SKIP() << "needs a second device";
  Tensor a({1, 2, 3});
  Tensor b = to(Tensor({1, 2, 3}), d);
  std::string msg = error_of([&] { (void)(a + b); });
  EXPECT_TRUE(contains(msg, "[add]") || contains(msg, "add")) << msg;
  EXPECT_TRUE(contains(msg, "CPU")) << msg;
  EXPECT_TRUE(contains(msg, to_string(d))) << msg;
  msg = error_of([&] { (void)matmul(a.reshape({1, 3}), b.reshape({3, 1})); });
  EXPECT_TRUE(contains(msg, "CPU") && contains(msg, to_string(d))) << msg;
  msg = error_of([&] { (void)mse(a, b); });
  EXPECT_TRUE(contains(msg, "CPU") && contains(msg, to_string(d))) << msg;
  auto model = Chain(Dense(3, 2));
  msg = error_of([&] { (void)model(b.reshape({1, 3})); });
  EXPECT_TRUE(contains(msg, "CPU") && contains(msg, to_string(d))) << msg;
}
FLUX_DEVICE_SUITE(Move);

// ---------------- gpu / cpu without parameters ----------------

TEST(MoveGpu, FollowsGetDeviceAndConvertsFloat64) {
  ::testing::internal::CaptureStderr();
  const Device& g = detail::default_gpu();
  Tensor x64(std::vector<double>{1.5, 2.5}, Shape{2});
  Tensor y = gpu(x64);
  Tensor y2 = x64 | gpu;
  Tensor i = gpu(Tensor(std::vector<int64_t>{1, 2}, Shape{2}));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(y.device(), g);
  EXPECT_EQ(y2.device(), g);
  EXPECT_EQ(i.dtype(), DType::i64);
  if (g.is_cpu()) {
    EXPECT_TRUE(y.same_storage(x64)) << "no functional GPU: gpu is a no-op";
    EXPECT_LE(err.size(), 200u) << "at most one info line:\n" << err;
  } else {
    EXPECT_EQ(y.dtype(), DType::f32);
  }
  EXPECT_EQ(values(y), (std::vector<double>{1.5, 2.5}));
  ::testing::internal::CaptureStderr();
  (void)gpu(x64);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "the info line is printed once";
  EXPECT_EQ(cpu(y).device(), Device());
  EXPECT_EQ((y | cpu).device(), Device());
}

TEST(MoveGpu, WholeModelsMove) {
  auto model = Chain(Dense(2, 3, relu), Dense(3, 1)) | gpu;
  for (const Tensor& p : params(model)) {
    EXPECT_EQ(p.device(), detail::default_gpu());
    EXPECT_EQ(p.dtype(), DType::f32);
  }
}

// ---------------- two devices of one backend ----------------

namespace {
// Two OpenCL devices, or a skip; with POCL_DEVICES naming two drivers, too few is a failure.
bool two_opencl_devices() {
  int n = functional("OpenCL") ? detail::backend_for("OpenCL").device_count() : 0;
  const char* pocl = std::getenv("POCL_DEVICES");
  if (pocl && std::string(pocl).find(' ') != std::string::npos && loaded("OpenCL")) {
    EXPECT_GE(n, 2) << "POCL_DEVICES=\"" << pocl << "\" should show two devices (a wrong driver name shows none)";
  }
  return n >= 2;
}
}  // namespace

TEST(TwoDevices, GetDeviceSecondIndex) {
  if (!two_opencl_devices()) GTEST_SKIP() << "needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")";
  Device d1 = get_device("OpenCL", 1);
  EXPECT_EQ(d1, Device("OpenCL", 1));
  EXPECT_EQ(to_string(d1), "OpenCL:1");
  EXPECT_FALSE(d1.name().empty());
}

TEST(TwoDevices, MovesBetweenDevicesKeepValues) {
  if (!two_opencl_devices()) GTEST_SKIP() << "needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")";
  Device d0("OpenCL", 0), d1("OpenCL", 1);
  for (const Tensor& x : one_of_each_dtype()) {
    Tensor a = to(x, d0);
    Tensor b = to(a, d1);
    EXPECT_EQ(b.device(), d1);
    EXPECT_EQ(b.dtype(), x.dtype());
    EXPECT_EQ(values(b), values(x)) << dtype_name(x.dtype());
  }
  Tensor big = rand({512, 256});
  EXPECT_EQ(values(to(to(big, d0), d1)), values(big));
  Tensor a = to(Tensor({1, 2, 3}), d0), b = to(Tensor({10, 20, 30}), d1);
  EXPECT_EQ(values(to(a, d1) + b), (std::vector<double>{11, 22, 33}));
}

TEST(TwoDevices, OpsOnTwoDevicesNameBoth) {
  if (!two_opencl_devices()) GTEST_SKIP() << "needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")";
  Tensor a = to(Tensor({1, 2, 3}), Device("OpenCL", 0));
  Tensor b = to(Tensor({1, 2, 3}), Device("OpenCL", 1));
  std::string msg = error_of([&] { (void)(a * b); });
  EXPECT_TRUE(contains(msg, "OpenCL:0")) << msg;
  EXPECT_TRUE(contains(msg, "OpenCL:1")) << msg;
}

TEST(TwoDevices, GradientReturnsToTheFirstDevice) {
  if (!two_opencl_devices()) GTEST_SKIP() << "needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")";
  Tensor x = to(Tensor({1, 2, 3}), Device("OpenCL", 0));
  Tensor g = gradient([&](const Tensor& v) { return sum(to(v, Device("OpenCL", 1)) * 2.0); }, x);
  EXPECT_EQ(g.device(), Device("OpenCL", 0));
  EXPECT_EQ(values(g), (std::vector<double>{2, 2, 2}));
}
