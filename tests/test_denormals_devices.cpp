// The subnormal policy (flux/denormals.hpp) through the public ops on every device: float32 subnormal
// inputs and results are flushed to zero by default (CPU: FTZ|DAZ around the kernel; OpenCL: programs
// built with -cl-denorms-are-zero; CUDA: kernels compiled with -ftz=true) and kept, as IEEE gives them,
// after flush_denormals(false) (not CUDA, whose compiled kernels always flush float32); float64 keeps
// its subnormals either way. Kernel-level checks per CPU kernel family are in test_denormals.cpp.
#include <cmath>
#include <vector>

#include "test_devices.hpp"

namespace {

using namespace flux;

class DenormalsOnDevice : public ::testing::TestWithParam<Device> {};

struct PolicyGuard {
  bool f32 = flushes_denormals(DType::f32), f64 = flushes_denormals(DType::f64);
  ~PolicyGuard() { flush_denormals(f32, f64); }
};

TEST_P(DenormalsOnDevice, Float32FollowsThePolicy) {
  const Device dev = GetParam();
  PolicyGuard guard;
  const float sub = 1e-39f;
  for (bool flush : {true, false}) {
    SCOPED_TRACE(flush ? "flushing" : "IEEE");
    if (!flush_denormals(flush)) GTEST_SKIP() << "this CPU has no flush-to-zero mode";
    if (!flush && dev.backend() == "CUDA") GTEST_SKIP() << "CUDA kernels are compiled flushing float32 (-ftz=true)";
    Tensor x = full({256}, sub, DType::f32, dev);
    std::vector<float> half = (x * 0.5).to_vector<float>(), total = sum(x).to_vector<float>(),
                       squashed = sigmoid(full({256}, -100.0, DType::f32, dev)).to_vector<float>();
    for (float v : half) ASSERT_EQ(v, flush ? 0.f : sub * 0.5f);
    if (flush) {
      EXPECT_EQ(total[0], 0.f);
      for (float v : squashed) ASSERT_EQ(v, 0.f);
    } else {
      EXPECT_NEAR(total[0], 256 * double(sub), 1e-3 * 256 * double(sub));
      for (float v : squashed) ASSERT_NEAR(v, std::exp(-100.0), 3e-45);  // 2 subnormal steps (1.4e-45)
    }
  }
}

TEST_P(DenormalsOnDevice, Float64KeepsSubnormalsByDefault) {
  const Device dev = GetParam();
  PolicyGuard guard;
  flush_denormals(true);
  Tensor x;
  try {
    x = full({64}, 1e-310, DType::f64, dev);
  } catch (const Error&) {
    GTEST_SKIP() << to_string(dev) << " has no float64";
  }
  const double want = 1e-310 * 0.5;
  ASSERT_EQ(std::fpclassify(want), FP_SUBNORMAL);
  for (double v : (x * 0.5).to_vector<double>()) ASSERT_EQ(v, want);
}

FLUX_DEVICE_SUITE(DenormalsOnDevice);

}  // namespace
