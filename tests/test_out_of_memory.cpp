// Device out-of-memory: an allocation that does not fit makes the backend free its cached blocks and
// try once more; if it still does not fit, flux::OutOfMemory (a flux::Error) names the device, the
// requested size and the memory figures, and the device stays usable. The limited devices need their
// own process (ctest entries in tests/device.cmake and tests/opencl.cmake set the environment):
//   OutOfMemoryEnv.OpenCLLimitedDevice  PoCL with POCL_MEMORY_LIMIT=1 (its global memory is 1 GB)
//   OutOfMemoryEnv.CpuLimitedPool       the CPU pool under FLUX_CPU_MEMORY_LIMIT=64M
//   OutOfMemoryEnv.CpuLimitMalformed    FLUX_CPU_MEMORY_LIMIT=lots: a clear error at the first allocation
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "flux/out_of_memory.hpp"

using namespace flux;

namespace {

bool in_env(const char* which) {
  const char* e = std::getenv("FLUX_OOM_TEST_ENV");
  return e && std::string(e) == which;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr size_t MiB = size_t(1) << 20;

TEST(OutOfMemory, IsAnErrorThatNamesTheDeviceSizeAndFigures) {
  OutOfMemory e("OpenCL:1 (pthread-cpu)", 3 * MiB / 2, 100 * MiB, 0, 1024 * MiB, "clCreateBuffer failed");
  const Error& as_error = e;  // caught by the library's own error type
  const std::string msg = as_error.what();
  EXPECT_TRUE(contains(msg, "[allocate] out of memory on OpenCL:1 (pthread-cpu)")) << msg;
  EXPECT_TRUE(contains(msg, "1.50 MiB (1572864 bytes)")) << msg;
  EXPECT_TRUE(contains(msg, "used by tensors 100.00 MiB (104857600 bytes)")) << msg;
  EXPECT_TRUE(contains(msg, "cached 0 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "total 1.00 GiB (1073741824 bytes)")) << msg;
  EXPECT_TRUE(contains(msg, "clCreateBuffer failed")) << msg;
  EXPECT_EQ(e.device(), "OpenCL:1 (pthread-cpu)");
  EXPECT_EQ(e.requested(), 3 * MiB / 2);
  EXPECT_EQ(e.used(), 100 * MiB);
  EXPECT_EQ(e.total(), 1024 * MiB);
  EXPECT_TRUE(contains(OutOfMemory("CPU", 1, 0, 0, 0).what(), "total unknown"));
}

/// The shared scenario on a device whose memory (or pool) holds at most `limit` bytes, in blocks of a
/// fifth and of 1/4.5 of it (PoCL's largest buffer is a quarter of its memory): freed blocks stay
/// cached; requests that fit only without the cache empty it and succeed; the first request that does
/// not fit at all throws OutOfMemory with the figures; afterwards the device works as before.
void check_limited_device(const Device& dev, size_t limit) {
  SCOPED_TRACE(to_string(dev));
  backend::Backend& b = detail::backend_for(dev);
  dev.synchronize();
  b.release_cache(dev.index());
  ASSERT_EQ(dev.memory().used, 0u) << "the test needs the device to itself";
  const int64_t fifth = int64_t(limit / 5 / 4), larger = int64_t(double(limit) / 4.5 / 4);  // Float32 elements
  {
    std::vector<Tensor> held;
    for (int i = 0; i < 3; ++i) held.push_back(Tensor::empty({fifth}, DType::f32, dev));
  }
  const backend::MemoryInfo cached = dev.memory();
  EXPECT_EQ(cached.used, 0u);
  EXPECT_GE(cached.reserved, 3 * size_t(fifth) * 4) << "the freed blocks are cached";
  // Blocks of another size class: the second no longer fits beside the cache, which is given back.
  std::vector<Tensor> held;
  size_t thrown = 0;
  for (int i = 0; i < 10 && !thrown; ++i) {
    try {
      held.push_back(Tensor::empty({larger}, DType::f32, dev));
    } catch (const OutOfMemory& e) {
      thrown = held.size() + 1;
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "[allocate] out of memory on " + to_string(dev))) << msg;
      EXPECT_TRUE(contains(msg, std::to_string(larger * 4) + " bytes")) << msg;
      EXPECT_TRUE(contains(msg, "used by tensors")) << msg;
      EXPECT_EQ(e.requested(), size_t(larger) * 4);
      EXPECT_GE(e.used(), 4 * size_t(larger) * 4);
      EXPECT_EQ(e.cached(), 0u) << "the cache was emptied before giving up";
      EXPECT_EQ(e.total(), limit);
    }
  }
  EXPECT_EQ(thrown, 5u) << "four blocks of 1/4.5 of the memory fit once the cache is emptied; the fifth cannot";
  EXPECT_EQ(dev.memory().reserved, dev.memory().used) << "nothing stays cached after the retry";
  // Still usable: free the blocks; the same requests succeed and compute.
  held.clear();
  Tensor x = full({larger}, 2.0, DType::f32, dev);
  Tensor y = full({larger}, 3.0, DType::f32, dev);
  EXPECT_NEAR(sum(x * y).item<double>() / (6.0 * double(larger)), 1.0, 1e-3);
}

TEST(OutOfMemoryEnv, OpenCLLimitedDevice) {
  if (!in_env("opencl")) GTEST_SKIP() << "runs under POCL_MEMORY_LIMIT=1 (ctest opencl.out_of_memory)";
  ASSERT_TRUE(functional("OpenCL"));
  Device dev("OpenCL", 0);
  const size_t total = dev.memory().total;
  ASSERT_EQ(total, size_t(1) << 30) << "POCL_MEMORY_LIMIT=1 gives a 1 GiB device";
  check_limited_device(dev, total);
}

TEST(OutOfMemoryEnv, CpuLimitedPool) {
  if (!in_env("cpu")) GTEST_SKIP() << "runs under FLUX_CPU_MEMORY_LIMIT=64M (ctest device_env.cpu_memory_limit)";
  Device cpu;
  ASSERT_EQ(cpu.memory().total, size_t(64) << 20) << "the limit is the CPU's total";
  check_limited_device(cpu, size_t(64) << 20);
}

TEST(OutOfMemoryEnv, CpuLimitMalformed) {
  if (!in_env("cpu_malformed")) GTEST_SKIP() << "runs under FLUX_CPU_MEMORY_LIMIT=lots (ctest device_env.cpu_memory_limit_malformed)";
  try {
    Tensor t = zeros({4});
    ADD_FAILURE() << "allocated under a malformed FLUX_CPU_MEMORY_LIMIT";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "FLUX_CPU_MEMORY_LIMIT='lots' is not allowed: expected bytes")) << e.what();
  }
}

}  // namespace
