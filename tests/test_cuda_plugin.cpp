// The CUDA and AMDGPU plugins load, and report honestly whether they are functional: on a machine
// without a GPU (CI) they must be "loaded, not functional" with the runtime's error and get_device()
// must fall back with Flux's warning; where a GPU is present they must be functional instead, and the
// device-parameterised suites (test_devices.hpp) then run every op on it.
// Entries with a special environment (preference file, CUDA_VISIBLE_DEVICES=-1) come from cuda.cmake.
// FLUX_EXPECT_GPU=CUDA (scripts/gpu-check.sh) turns "not functional" into a failure.
#include <cstdlib>
#include <string>

#include "test_devices.hpp"

using namespace flux;

namespace {

struct GpuPlugin {
  const char* backend;
  bool built;  // this build tree produced the plugin
};

#ifndef FLUX_TEST_CUDA_PLUGIN
#define FLUX_TEST_CUDA_PLUGIN 0
#endif
#ifndef FLUX_TEST_AMDGPU_PLUGIN
#define FLUX_TEST_AMDGPU_PLUGIN 0
#endif

bool expected_functional(const std::string& backend) {
  const char* v = std::getenv("FLUX_EXPECT_GPU");
  return v && std::string(v).find(backend) != std::string::npos;
}

// Another backend would be picked by automatic selection (a functional non-CPU device).
bool other_gpu_present(const std::string& except) {
  for (const char* name : {"CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    if (except == name || !functional(name)) continue;
    backend::Backend& b = detail::backend_for(name);
    for (int i = 0; i < b.device_count(); ++i)
      if (!b.device_is_cpu(i)) return true;
  }
  return false;
}

class GpuPluginTest : public ::testing::TestWithParam<GpuPlugin> {
 protected:
  void SetUp() override {
    if (!GetParam().built) GTEST_SKIP() << GetParam().backend << " plugin is not built in this configuration";
  }
};

TEST_P(GpuPluginTest, LoadsAndReportsFunctionalState) {
  const std::string name = GetParam().backend;
  ASSERT_TRUE(loaded(name)) << name << " plugin was built but does not load";
  backend::Backend& b = detail::backend_for(name);
  EXPECT_EQ(std::string(b.name()), name);
  EXPECT_FALSE(b.version_info().empty());
  if (functional(name)) {
    // A GPU is here: the plugin must really work.
    ASSERT_GT(b.device_count(), 0);
    EXPECT_TRUE(b.not_functional_reason().empty());
    Device d = get_device(name, 0);
    EXPECT_FALSE(d.name().empty());
    Tensor x = to(Tensor({1, 2, 3}), d);
    EXPECT_EQ((x + x).to_vector<float>(), (std::vector<float>{2, 4, 6}));
    backend::MemoryInfo m = d.memory();
    EXPECT_GT(m.total, 0u);
    EXPECT_GE(m.reserved, m.used);
    EXPECT_GT(m.used, 0u);  // x and x + x are alive
    EXPECT_THROW(get_device(name, b.device_count()), Error);
  } else {
    EXPECT_FALSE(expected_functional(name)) << name << " is not functional but FLUX_EXPECT_GPU says a GPU is present: "
                                            << b.not_functional_reason();
    EXPECT_EQ(b.device_count(), 0);
    std::string why = b.not_functional_reason();
    EXPECT_FALSE(why.empty());
    // the runtime's own error: "cudaGetDeviceCount failed: cudaErrorInsufficientDriver (35): ..."
    EXPECT_TRUE(why.find("GetDeviceCount failed") != std::string::npos || why.find("no device") != std::string::npos)
        << why;
    EXPECT_THROW(get_device(name, 0), Error);
    std::ostringstream info;
    versioninfo(info);
    EXPECT_NE(info.str().find(name + ": loaded, not functional"), std::string::npos) << info.str();
  }
}

// Run by cuda.cmake with FLUX_PREFERENCES holding `[flux] gpu_backend = "<backend>"`.
TEST_P(GpuPluginTest, PreferredBackendFallsBackWithWarning) {
  const std::string name = GetParam().backend;
  const char* prefs = std::getenv("FLUX_PREFERENCES");  // GPU_BACKEND() is "CUDA" also when none is set
  if (!prefs || !*prefs || GPU_BACKEND() != name) GTEST_SKIP() << "needs FLUX_PREFERENCES with gpu_backend = \"" << name << "\" (cuda.cmake)";
  ::testing::internal::CaptureStderr();
  Device d = get_device();
  std::fflush(stderr);
  std::string err = ::testing::internal::GetCapturedStderr();
  if (functional(name)) {
    EXPECT_EQ(d.backend(), name);
    EXPECT_EQ(err.find("Warning"), std::string::npos) << err;
  } else {
    EXPECT_NE(d.backend(), name);
    if (!other_gpu_present(name)) {
      EXPECT_EQ(to_string(d), "CPU");
    }
    EXPECT_NE(err.find("Warning: Trying to use backend: " + name + " but it is not functional"), std::string::npos) << err;
    EXPECT_NE(err.find("Falling back to automatic device selection"), std::string::npos) << err;
  }
}

// Run by cuda.cmake with CUDA_VISIBLE_DEVICES=-1: no device is visible, even on a GPU machine.
TEST_P(GpuPluginTest, HiddenByVisibleDevices) {
  const std::string name = GetParam().backend;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (name != "CUDA" || !visible || std::string(visible) != "-1") GTEST_SKIP() << "needs CUDA_VISIBLE_DEVICES=-1";
  ASSERT_TRUE(loaded(name));
  EXPECT_FALSE(functional(name));
  EXPECT_NE(detail::backend_for(name).not_functional_reason().find("CUDA_VISIBLE_DEVICES=-1"), std::string::npos);
  EXPECT_EQ(to_string(get_device("CPU")), "CPU");
}

INSTANTIATE_TEST_SUITE_P(Plugins, GpuPluginTest,
                         ::testing::Values(GpuPlugin{"CUDA", FLUX_TEST_CUDA_PLUGIN != 0},
                                           GpuPlugin{"AMDGPU", FLUX_TEST_AMDGPU_PLUGIN != 0}),
                         [](const ::testing::TestParamInfo<GpuPlugin>& info) { return std::string(info.param.backend); });

}  // namespace
