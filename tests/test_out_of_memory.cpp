// Device out-of-memory: an allocation that does not fit makes the backend free its cached blocks and
// try once more; if it still does not fit, flux::OutOfMemory (a flux::Error) names the device, the
// requested size and the memory figures, and the device stays usable. The limited devices need their
// own process (ctest entries in tests/device.cmake and tests/opencl.cmake set the environment):
//   OutOfMemoryEnv.OpenCLLimitedDevice  PoCL with POCL_MEMORY_LIMIT=1 (its global memory is 1 GB)
//   OutOfMemoryEnv.CpuLimitedPool       the CPU pool under FLUX_CPU_MEMORY_LIMIT=64M
//   OutOfMemoryEnv.CpuScratchOverLimit  a kernel call's scratch (call_scratch.hpp) under FLUX_CPU_MEMORY_LIMIT=64M,
//   OutOfMemoryEnv.CpuWinogradScratchOverLimit  and Winograd's
//   OutOfMemoryEnv.CpuLimitMalformed    FLUX_CPU_MEMORY_LIMIT=lots: a clear error at the first allocation
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "flux/out_of_memory.hpp"
#include "src/backends/cpu/call_scratch.hpp"
#include "src/backends/cpu/kernel_choice.hpp"

using namespace flux;

namespace {

bool in_env(const char* which) {
  const char* e = std::getenv("FLUX_OOM_TEST_ENV");
  return e && std::string(e) == which;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr size_t MiB = size_t(1) << 20;

enum class Which : int { a = 0, b = 1 };
using Scratch = cpu_backend::CallScratch<Which, 2>;

// A kernel call's scratch comes from the CPU pool: counted as used while the call holds it, back in
// the pool's cache when it ends, 64-byte aligned, and asking again for a block replaces it.
TEST(OutOfMemory, CallScratchComesFromTheCpuPool) {
  Device cpu;
  const size_t before = cpu.memory().used;
  {
    Scratch s;
    char* a = static_cast<char*>(s.get(Which::a, 3 * MiB));
    char* b = static_cast<char*>(s.get(Which::b, 100));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
    std::memset(a, 1, 3 * MiB);
    std::memset(b, 2, 100);
    EXPECT_EQ(a[3 * MiB - 1], 1);
    EXPECT_EQ(b[0], 2) << "the blocks do not overlap";
    EXPECT_GE(cpu.memory().used, before + 3 * MiB + 100);
    s.get(Which::a, 5 * MiB);
    EXPECT_GE(cpu.memory().used, before + 5 * MiB + 100);
    EXPECT_LT(cpu.memory().used, before + 8 * MiB) << "the first block a went back";
  }
  EXPECT_EQ(cpu.memory().used, before) << "every block went back when the call's scratch ended";
  EXPECT_GE(cpu.memory().reserved, 5 * MiB) << "and stays in the pool's cache for the next call";
}

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

TEST(OutOfMemoryEnv, CpuScratchOverLimit) {
  if (!in_env("cpu_scratch")) GTEST_SKIP() << "runs under FLUX_CPU_MEMORY_LIMIT=64M (ctest device_env.cpu_scratch_memory_limit)";
  Device cpu;
  std::vector<Tensor> held{Tensor::empty({int64_t(40 * MiB / 4)}, DType::f32, cpu)};
  Scratch s;
  try {
    s.get(Which::a, 30 * MiB);
    ADD_FAILURE() << "30 MiB of scratch beside a 40 MiB tensor under a 64 MiB limit";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), 30 * MiB);
    EXPECT_GE(e.used(), 40 * MiB);
    EXPECT_TRUE(contains(e.what(), "FLUX_CPU_MEMORY_LIMIT=64M would be exceeded")) << e.what();
  }
  held.clear();  // the tensor gone, the same scratch fits and is usable
  char* p = static_cast<char*>(s.get(Which::a, 30 * MiB));
  std::memset(p, 3, 30 * MiB);
  EXPECT_EQ(p[30 * MiB - 1], 3);
  EXPECT_GE(cpu.memory().used, 30 * MiB);
  // A convolution large enough to need oneDNN's scratch still runs beside it, and right: 3x3 ones over
  // ones, padding 1, gives 9 C inside and fewer at the border.
  Tensor x = ones({2, 16, 32, 32}), w = ones({16, 16, 3, 3});
  ConvParams params;
  params.pad = 1;
  const std::vector<float> y = conv(x, w, Tensor(), params).to_vector<float>();
  ASSERT_EQ(y.size(), size_t(2 * 16 * 32 * 32));
  EXPECT_FLOAT_EQ(y[5 * 32 + 5], 9.0f * 16) << "inside";
  EXPECT_FLOAT_EQ(y[(1 * 16 + 15) * 32 * 32], 4.0f * 16) << "a corner";
}

// Winograd's scratch (winograd.cpp: ~8 MB a pool thread for 64 channels on 56x56) counts under the
// limit too: beside a 48 MiB tensor its conv (forced onto Winograd) throws OutOfMemory from the pool's
// tasks, and runs right once the tensor is gone.
TEST(OutOfMemoryEnv, CpuWinogradScratchOverLimit) {
  if (!in_env("cpu_scratch")) GTEST_SKIP() << "runs under FLUX_CPU_MEMORY_LIMIT=64M (ctest device_env.cpu_scratch_memory_limit)";
  struct Forced {
    Forced() { cpu_backend::force_kernel(cpu_backend::Site::conv_forward, cpu_backend::Kernel::winograd); }
    ~Forced() { cpu_backend::force_kernel(cpu_backend::Site::conv_forward, std::nullopt); }
  } forced;
  Device cpu;
  Tensor x = ones({8, 64, 56, 56}), w = ones({64, 64, 3, 3});
  ConvParams params;
  params.pad = 1;
  std::vector<Tensor> held{Tensor::empty({int64_t(48 * MiB / 4)}, DType::f32, cpu)};
  try {
    (void)conv(x, w, Tensor(), params);
    ADD_FAILURE() << "Winograd's scratch beside a 48 MiB tensor and 12 MiB of operands under a 64 MiB limit";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(contains(e.what(), "FLUX_CPU_MEMORY_LIMIT=64M would be exceeded")) << e.what();
  }
  held.clear();
  const std::vector<float> y = conv(x, w, Tensor(), params).to_vector<float>();
  ASSERT_EQ(y.size(), size_t(8 * 64 * 56 * 56));
  EXPECT_FLOAT_EQ(y[(7 * 64 + 63) * 56 * 56 + 20 * 56 + 30], 9.0f * 64) << "inside";
  EXPECT_FLOAT_EQ(y[56 * 56 - 1], 4.0f * 64) << "a corner";
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
