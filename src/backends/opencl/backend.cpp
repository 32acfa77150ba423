// The OpenCL backend object: device discovery, contexts and queues, a caching buffer pool per device,
// copies, program building, and dispatch to the kernel files. Exported as libflux-opencl.so.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <memory>
#include <sstream>

#include "flux/out_of_memory.hpp"
#include "src/backends/caching_pool.hpp"
#include "src/backends/opencl/opencl_backend.hpp"
#include "src/environment.hpp"

#ifndef FLUX_CLBLAST_VERSION
#define FLUX_CLBLAST_VERSION "unknown"
#endif

namespace flux::opencl {

const char* cl_error_name(cl_int err) {
  switch (err) {
#define FLUX_CL_ERR(x) case x: return #x;
    FLUX_CL_ERR(CL_SUCCESS) FLUX_CL_ERR(CL_DEVICE_NOT_FOUND) FLUX_CL_ERR(CL_DEVICE_NOT_AVAILABLE)
    FLUX_CL_ERR(CL_COMPILER_NOT_AVAILABLE) FLUX_CL_ERR(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    FLUX_CL_ERR(CL_OUT_OF_RESOURCES) FLUX_CL_ERR(CL_OUT_OF_HOST_MEMORY) FLUX_CL_ERR(CL_MEM_COPY_OVERLAP)
    FLUX_CL_ERR(CL_BUILD_PROGRAM_FAILURE) FLUX_CL_ERR(CL_MAP_FAILURE) FLUX_CL_ERR(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    FLUX_CL_ERR(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) FLUX_CL_ERR(CL_INVALID_VALUE)
    FLUX_CL_ERR(CL_INVALID_DEVICE_TYPE) FLUX_CL_ERR(CL_INVALID_PLATFORM) FLUX_CL_ERR(CL_INVALID_DEVICE)
    FLUX_CL_ERR(CL_INVALID_CONTEXT) FLUX_CL_ERR(CL_INVALID_QUEUE_PROPERTIES) FLUX_CL_ERR(CL_INVALID_COMMAND_QUEUE)
    FLUX_CL_ERR(CL_INVALID_HOST_PTR) FLUX_CL_ERR(CL_INVALID_MEM_OBJECT) FLUX_CL_ERR(CL_INVALID_BINARY)
    FLUX_CL_ERR(CL_INVALID_BUILD_OPTIONS) FLUX_CL_ERR(CL_INVALID_PROGRAM) FLUX_CL_ERR(CL_INVALID_PROGRAM_EXECUTABLE)
    FLUX_CL_ERR(CL_INVALID_KERNEL_NAME) FLUX_CL_ERR(CL_INVALID_KERNEL_DEFINITION) FLUX_CL_ERR(CL_INVALID_KERNEL)
    FLUX_CL_ERR(CL_INVALID_ARG_INDEX) FLUX_CL_ERR(CL_INVALID_ARG_VALUE) FLUX_CL_ERR(CL_INVALID_ARG_SIZE)
    FLUX_CL_ERR(CL_INVALID_KERNEL_ARGS) FLUX_CL_ERR(CL_INVALID_WORK_DIMENSION) FLUX_CL_ERR(CL_INVALID_WORK_GROUP_SIZE)
    FLUX_CL_ERR(CL_INVALID_WORK_ITEM_SIZE) FLUX_CL_ERR(CL_INVALID_GLOBAL_OFFSET) FLUX_CL_ERR(CL_INVALID_EVENT_WAIT_LIST)
    FLUX_CL_ERR(CL_INVALID_EVENT) FLUX_CL_ERR(CL_INVALID_OPERATION) FLUX_CL_ERR(CL_INVALID_BUFFER_SIZE)
    FLUX_CL_ERR(CL_INVALID_GLOBAL_WORK_SIZE) FLUX_CL_ERR(CL_INVALID_PROPERTY)
#undef FLUX_CL_ERR
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "unknown OpenCL error";
  }
}

void fail_cl(cl_int err, const char* api, const std::string& context) {
  ::flux::detail::fail("[OpenCL] ", api, " failed with ", cl_error_name(err), " (", err, ")", context);
}

const char* const kPreamble = R"CLC(
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define AT(type, base, off) ((__global type*)((__global uchar*)(base) + (off)))
#define GRID_LOOP(i, n) for (long i = get_global_id(0); i < (n); i += get_global_size(0))
// The window o along one axis that covers input position i at kernel offset k: o = (i + lo - k * dil) / st
// when that is a whole number in [0, out), else -1 (conv's col2im, pooling's backward).
inline long window_of(long i, long lo, long k, long dil, long st, long out) {
  long t = i + lo - k * dil;
  if (t < 0) return -1;
  long o = st == 1 ? t : t / st;
  return (o * st == t && o < out) ? o : -1;
}
// Element offsets of up to three operands for flat output index i over `shape` (ndim <= 8).
inline void offsets(long i, int ndim, long8 shape, long8 s0, long8 s1, long8 s2, long* o0, long* o1, long* o2) {
  long sh[8], a[8], b[8], c[8];
  vstore8(shape, 0, sh); vstore8(s0, 0, a); vstore8(s1, 0, b); vstore8(s2, 0, c);
  long r = i, x = 0, y = 0, z = 0;
  for (int k = ndim - 1; k > 0; --k) {
    long q = r / sh[k], j = r - q * sh[k];
    r = q;
    x += j * a[k]; y += j * b[k]; z += j * c[k];
  }
  if (ndim > 0) { x += r * a[0]; y += r * b[0]; z += r * c[0]; }
  *o0 = x; *o1 = y; *o2 = z;
}
)CLC";

const char* cl_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int";
    case DType::i64: return "long";
    case DType::u8: case DType::boolean: return "uchar";
    case DType::f16: case DType::bf16: return "ushort";
  }
  return "?";
}

const char* bits_type(size_t es) {
  switch (es) {
    case 1: return "uchar";
    case 2: return "ushort";
    case 4: return "uint";
    default: return "ulong";
  }
}

namespace {
// flux's subnormal policy (flux/denormals.hpp), from libflux's C entry (the plugin does not link
// libflux): bit 0 float32 flushes, bit 1 float64 too. Not found (libflux loaded privately): the default.
int denormal_flush_mask() {
  using Mask = int (*)();
  static const Mask mask = reinterpret_cast<Mask>(dlsym(RTLD_DEFAULT, "flux_denormal_flush_mask"));
  return mask ? mask() : 1;
}
}  // namespace

// -cl-denorms-are-zero where the policy flushes the dtype: PoCL then runs the kernel with FTZ|DAZ on
// its threads (without it PoCL keeps IEEE subnormals, float and double); a GPU may flush regardless.
// The option is part of the program's cache key, so a policy change builds the program anew.
std::string type_options(DeviceState& dev, DType t, const char* api) {
  std::string o = dev.fp64 ? "-DFP64" : "";
  const int flush = denormal_flush_mask();
  switch (t) {
    case DType::f32:
      return o + (flush & 1 ? " -cl-denorms-are-zero" : "") + " -DT=float -DIS_FLOAT -DACC=" +
             (dev.fp64 ? "double" : "float");
    case DType::f64:
      if (!dev.fp64)
        ::flux::detail::fail("[", api, "] OpenCL device ", dev.name, " does not support Float64 (no cl_khr_fp64)");
      return o + (flush & 2 ? " -cl-denorms-are-zero" : "") + " -DT=double -DIS_FLOAT -DACC=double";
    case DType::i32: return o + " -DT=int -DIS_SIGNED -DACC=long";
    case DType::i64: return o + " -DT=long -DIS_SIGNED -DACC=long";
    case DType::u8: case DType::boolean: return o + " -DT=uchar -DACC=long";
    default: ::flux::detail::fail("[", api, "] OpenCL kernel does not support ", dtype_name(t));
  }
}

Scalar scalar_of(DType t, double v) {
  Scalar s;
  auto put = [&](auto x) {
    static_assert(sizeof(x) <= 8);
    std::memcpy(s.bytes, &x, sizeof(x));
    s.size = sizeof(x);
  };
  switch (t) {
    case DType::f32: put(cl_float(v)); break;
    case DType::f64: put(cl_double(v)); break;
    case DType::i32: put(cl_int(v)); break;
    case DType::i64: put(cl_long(v)); break;
    case DType::boolean: put(cl_uchar(v != 0 ? 1 : 0)); break;
    case DType::u8: put(cl_uchar(v)); break;
    case DType::f16: put(cl_ushort(float_to_half(float(v)))); break;
    case DType::bf16: put(cl_ushort(float_to_bfloat16(float(v)))); break;
  }
  return s;
}

namespace {
void finish_queues_at_exit();  // below: registered after each program build
}

// ---- the first-run compile note (issue 18) ----
// PoCL compiles every program from source on its first use and keeps the binaries in its cache
// folder; a cold cache makes the first run slow (seconds per program, more for CLBlast's first GEMM;
// PLATFORM.md). One info line says so, once per process, when it is about to happen.

namespace {
std::atomic<bool> compile_noted{false};

/// PoCL's kernel cache folder, resolved as PoCL does: $POCL_CACHE_DIR, else
/// $XDG_CACHE_HOME/pocl/kcache, else $HOME/.cache/pocl/kcache.
std::filesystem::path pocl_cache_dir() {
  if (const char* d = std::getenv("POCL_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "pocl" / "kcache";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "pocl" / "kcache";
  return {};
}

/// True when the folder is missing or holds no cached program (PoCL keeps one sub-folder per
/// program hash prefix; its tempfile_* files are not programs).
bool cache_is_cold(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return true;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_directory(ec)) return false;
  return true;
}

void say_compile(const std::string& line) {
  if (!compile_noted.exchange(true)) std::fprintf(stderr, "[ Info: %s\n", line.c_str());
}
}  // namespace

void note_kernel_compile(DeviceState& dev) {
  static std::once_flag once;
  std::call_once(once, [&] {
    if (dev.platform_name.find("Portable Computing Language") == std::string::npos) return;
    const std::filesystem::path dir = pocl_cache_dir();
    if (!cache_is_cold(dir)) return;
    say_compile("OpenCL on PoCL (" + dev.name + "): the kernel cache " + (dir.empty() ? "" : dir.string() + " ") +
                "is empty, so this first run compiles flux's and CLBlast's kernels (about 11 s, once); later runs " +
                "load them from the cache in well under a second");
  });
}

CompileWatch::CompileWatch(const DeviceState& dev, std::string what) {
  if (compile_noted.load()) return;  // said already: no thread
  watcher_ = std::thread([this, name = dev.name, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_cv_.wait_for(lock, std::chrono::seconds(2), [this] { return done_; })) return;
    say_compile("OpenCL (" + name + "): compiling " + what + " (not in the kernel cache yet); this call waits for " +
                "it, once per program, and later runs load it from the cache");
  });
}

CompileWatch::~CompileWatch() {
  if (!watcher_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_one();
  watcher_.join();
}

DeviceState::KernelEntry& kernel(DeviceState& dev, const char* family, const char* source, const std::string& options,
                                 const char* name) {
  std::string key = std::string(family) + "|" + options + "|" + name;
  {
    std::shared_lock<std::shared_mutex> lock(dev.kernels_mutex);
    auto it = dev.kernels.find(key);
    if (it != dev.kernels.end()) return *it->second;
  }
  // First use of this kernel: build its program unless built, one build at a time.
  std::lock_guard<std::mutex> build(dev.build_mutex);
  {
    std::shared_lock<std::shared_mutex> lock(dev.kernels_mutex);
    auto it = dev.kernels.find(key);
    if (it != dev.kernels.end()) return *it->second;  // another thread made it meanwhile
  }
  std::string pkey = std::string(family) + "|" + options;
  cl_program& program = dev.programs[pkey];
  if (!program) {
    const char* sources[2] = {kPreamble, source};
    cl_int err = CL_SUCCESS;
    cl_program p = clCreateProgramWithSource(dev.context, 2, sources, nullptr, &err);
    check(err, "clCreateProgramWithSource", std::string(" for program ") + family);
    note_kernel_compile(dev);
    {
      // A build that stalls is said while it runs (a partly warm cache, or a driver whose cache the
      // folder check cannot see), not only when the cache folder is empty.
      CompileWatch watch(dev, std::string("the ") + family + " kernels");
      err = clBuildProgram(p, 1, &dev.id, options.c_str(), nullptr, nullptr);
    }
    if (err != CL_SUCCESS) {
      size_t n = 0;
      clGetProgramBuildInfo(p, dev.id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
      std::string log(n, '\0');
      if (n) clGetProgramBuildInfo(p, dev.id, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
      clReleaseProgram(p);
      fail_cl(err, "clBuildProgram", std::string(" for program ") + family + " (options \"" + options + "\") on " +
                                         dev.name + "; build log:\n" + log);
    }
    program = p;
    std::atexit(finish_queues_at_exit);
  }
  auto e = std::make_unique<DeviceState::KernelEntry>();
  e->program = program;
  e->name = name;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(program, name, &err);
  check(err, "clCreateKernel", std::string(" for kernel ") + name + " of program " + family);
  size_t wg = 1;
  err = clGetKernelWorkGroupInfo(k, dev.id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, nullptr);
  if (err != CL_SUCCESS) clReleaseKernel(k);
  check(err, "clGetKernelWorkGroupInfo");
  e->idle.push_back(k);  // the first kernel object, ready for the first launch
  e->local = std::max<size_t>(1, std::min<size_t>(wg, 256));
  // Reduction kernels need a power of two.
  size_t p2 = 1;
  while (p2 * 2 <= e->local) p2 *= 2;
  e->local = p2;
  std::unique_lock<std::shared_mutex> lock(dev.kernels_mutex);
  return *(dev.kernels[key] = std::move(e));
}

KernelLease::KernelLease(DeviceState::KernelEntry& entry) : entry_(entry) {
  {
    std::lock_guard<std::mutex> lock(entry.idle_mutex);
    if (!entry.idle.empty()) {
      kernel_ = entry.idle.back();
      entry.idle.pop_back();
      return;
    }
  }
  // Every kernel object of this kernel is in another thread's launch: one more for this thread.
  cl_int err = CL_SUCCESS;
  kernel_ = clCreateKernel(entry.program, entry.name.c_str(), &err);
  check(err, "clCreateKernel", " for another thread's use of kernel " + entry.name);
}

KernelLease::~KernelLease() {
  std::lock_guard<std::mutex> lock(entry_.idle_mutex);
  entry_.idle.push_back(kernel_);
}

Layout collapse(int ndim, const int64_t* shape, const int64_t* const* strides, int operands) {
  Layout l;
  int64_t sh[backend::kMaxDims], st[3][backend::kMaxDims];
  int n = 0;
  for (int i = 0; i < ndim; ++i) {
    l.total *= shape[i];
    if (shape[i] == 1) continue;  // contributes nothing to any offset
    sh[n] = shape[i];
    for (int k = 0; k < operands; ++k) st[k][n] = strides[k][i];
    ++n;
  }
  // Merge axis j-1 into axis j when every operand walks them as one run.
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (m > 0) {
      bool merge = true;
      for (int k = 0; k < operands; ++k)
        if (st[k][m - 1] != st[k][i] * sh[i]) merge = false;
      if (merge) {
        sh[m - 1] *= sh[i];
        for (int k = 0; k < operands; ++k) st[k][m - 1] = st[k][i];
        continue;
      }
    }
    sh[m] = sh[i];
    for (int k = 0; k < operands; ++k) st[k][m] = st[k][i];
    ++m;
  }
  l.ndim = m;
  for (int i = 0; i < m; ++i) {
    l.shape.s[i] = sh[i];
    for (int k = 0; k < operands; ++k) l.stride[k].s[i] = st[k][i];
  }
  return l;
}

namespace {

// cl_mem buffers of one device through the shared size-class cache. The device's global memory
// (CL_DEVICE_GLOBAL_MEM_SIZE; PoCL's POCL_MEMORY_LIMIT sets it in GB) is the pool's budget: a request
// that would take the pool beyond it counts as out of memory like a failed clCreateBuffer, since
// drivers that allocate lazily (PoCL) would otherwise fail later, inside some enqueue. Either way
// the cache is emptied and the allocation tried once more before flux::OutOfMemory is thrown.
class BufferPool {
 public:
  cl_mem allocate(int index, DeviceState& dev, size_t bytes) {
    size_t r = pool_.round(bytes);
    if (dev.max_alloc && r > dev.max_alloc)  // no retry can help; still OutOfMemory, which callers catch
      throw OutOfMemory("OpenCL:" + std::to_string(index) + " (" + dev.name + ")", bytes, pool_.used(), pool_.cached(),
                        dev.global_mem, "the device's largest buffer is " + std::to_string(dev.max_alloc) +
                                        " bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)");
    cl_int err = CL_SUCCESS;
    auto create = [&](size_t size) -> cl_mem {
      if (dev.global_mem && pool_.used() + pool_.cached() + size > dev.global_mem) {
        err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return nullptr;
      }
      cl_mem p = clCreateBuffer(dev.context, CL_MEM_READ_WRITE, size, nullptr, &err);
      bool out_of_memory = err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY;
      if (err != CL_SUCCESS && !out_of_memory)
        check(err, "clCreateBuffer", " allocating " + std::to_string(bytes) + " bytes on " + dev.name);
      return err == CL_SUCCESS ? p : nullptr;
    };
    cl_mem p = pool_.allocate(bytes, create, release_buffer);
    if (!p) {
      bool over_budget = dev.global_mem && pool_.used() + pool_.cached() + r > dev.global_mem;
      throw OutOfMemory("OpenCL:" + std::to_string(index) + " (" + dev.name + ")", bytes, pool_.used(), pool_.cached(),
                        dev.global_mem,
                        over_budget ? "the device's global memory would be exceeded"
                                    : std::string("clCreateBuffer failed with ") + cl_error_name(err));
    }
    return p;
  }
  // clReleaseMemObject is deferred by the runtime until queued commands finish.
  void deallocate(cl_mem p, size_t bytes) { pool_.deallocate(p, bytes, release_buffer); }
  void release() { pool_.release(release_buffer); }
  size_t used() { return pool_.used(); }
  size_t cached() { return pool_.cached(); }

 private:
  static void release_buffer(cl_mem p) { clReleaseMemObject(p); }
  backends::CachingPool<cl_mem> pool_{256};
};

std::string platform_info(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  clGetPlatformInfo(p, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}
std::string device_info(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

struct Device {
  DeviceState state;
  BufferPool pool;
};

// Never destroyed: tensors held in statics may free their buffers after static destruction began.
std::vector<std::unique_ptr<Device>>& devices() {
  static auto* d = new std::vector<std::unique_ptr<Device>>();
  return *d;
}

// At exit, wait for every queue: work nobody waited on (a fill whose result was never read) may still
// run in the driver's worker threads, and PoCL compiles a kernel there on its first launch. Exit
// handlers run in reverse order of registration, and the compiler's lazily built globals (clang's
// file system, ...) are registered when a program is first built: a drain registered before them runs
// after they are destroyed, and the worker's compile crashed (SIGSEGV after main returned, seen in
// flux_reference on PoCL 3.1). So the drain is registered again after each program build (a few dozen
// per process); running it twice costs a clFinish on an idle queue.
void finish_queues_at_exit() {
  for (auto& d : devices())
    if (d && d->state.queue) clFinish(d->state.queue);
}

class OpenCLBackend final : public backend::Backend {
 public:
  OpenCLBackend() { discover(); }

  const char* name() const override { return "OpenCL"; }
  int device_count() override { return int(devices().size()); }
  std::string device_name(int d) override {
    DeviceState& s = device(d);
    return s.name + " (" + s.platform_name + ")";
  }
  bool device_is_cpu(int d) override { return device(d).is_cpu; }
  std::string not_functional_reason() override { return reason_; }
  std::string version_info() override {
    std::ostringstream os;
    for (const std::string& p : platforms_) os << "  platform: " << p << "\n";
    os << "  CLBlast " FLUX_CLBLAST_VERSION " (GEMM); FLUX_OPENCL_DEVICES="
       << ::flux::environment::value("FLUX_OPENCL_DEVICES").value_or("(unset)") << "\n";
    return os.str();
  }
  // f16: units where the device has half arithmetic (cl_khr_fp16); bf16: OpenCL has none. Either
  // way this plugin computes them through Float32 (matmul_low_precision keeps the default false:
  // CLBlast's half GEMM accumulates in half, not the float32 the contract asks for).
  backend::LowPrecisionSupport low_precision_support(int d, DType t) override {
    DeviceState& s = device(d);
    const std::string how = " is stored in 16 bits and computed through Float32 by this plugin";
    if (t == DType::f16 && s.fp16)
      return {true, s.name + " has cl_khr_fp16 (half arithmetic); Float16" + how +
                        " (CLBlast's half GEMM would accumulate in half)"};
    if (t == DType::f16) return {false, s.name + " lacks cl_khr_fp16: Float16" + how};
    if (t == DType::bf16) return {false, "OpenCL has no BFloat16 arithmetic (storage only): BFloat16" + how};
    return {false, std::string(dtype_name(t)) + " is not a low-precision dtype"};
  }

  backend::MemoryInfo memory(int d) override {
    Device& dev = entry(d);
    size_t used = dev.pool.used(), reserved = used + dev.pool.cached();
    size_t total = dev.state.global_mem;
    return {used, reserved, total > reserved ? total - reserved : 0, total};
  }

  backend::Buffer allocate(int d, size_t bytes) override {
    if (!bytes) return {};
    Device& dev = entry(d);
    return {dev.pool.allocate(d, dev.state, bytes), 0};
  }
  void deallocate(int d, backend::Buffer b, size_t bytes) override {
    if (b.handle) entry(d).pool.deallocate(mem(b), bytes);
  }
  void release_cache(int d) override { entry(d).pool.release(); }

  void copy_from_host(int d, backend::Buffer dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& s = device(d);
    // The caller's memory may be gone once we return: stage it, free the copy when the write completes.
    auto* staging = new unsigned char[bytes];
    std::memcpy(staging, src, bytes);
    cl_event done = nullptr;
    cl_int err = clEnqueueWriteBuffer(s.queue, mem(dst), CL_FALSE, dst.offset, bytes, staging, 0, nullptr, &done);
    if (err != CL_SUCCESS) {
      delete[] staging;
      fail_cl(err, "clEnqueueWriteBuffer", " (" + std::to_string(bytes) + " bytes to " + s.name + ")");
    }
    err = clSetEventCallback(done, CL_COMPLETE, [](cl_event, cl_int, void* p) { delete[] static_cast<unsigned char*>(p); },
                             staging);
    if (err != CL_SUCCESS) {
      clWaitForEvents(1, &done);
      delete[] staging;
    }
    clReleaseEvent(done);
  }
  void copy_to_host(int d, void* dst, backend::Buffer src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& s = device(d);
    check(clEnqueueReadBuffer(s.queue, mem(src), CL_TRUE, src.offset, bytes, dst, 0, nullptr, nullptr),
          "clEnqueueReadBuffer", " (" + std::to_string(bytes) + " bytes from " + s.name + ")");
  }
  void copy(int d, backend::Buffer dst, backend::Buffer src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& s = device(d);
    bool overlap = dst.handle == src.handle && dst.offset < src.offset + bytes && src.offset < dst.offset + bytes;
    if (!overlap) {
      check(clEnqueueCopyBuffer(s.queue, mem(src), mem(dst), src.offset, dst.offset, bytes, 0, nullptr, nullptr),
            "clEnqueueCopyBuffer");
      return;
    }
    if (dst.offset == src.offset) return;
    // Overlapping regions of one buffer (memmove): through a temporary.
    backend::Buffer tmp = allocate(d, bytes);
    check(clEnqueueCopyBuffer(s.queue, mem(src), mem(tmp), src.offset, 0, bytes, 0, nullptr, nullptr), "clEnqueueCopyBuffer");
    check(clEnqueueCopyBuffer(s.queue, mem(tmp), mem(dst), 0, dst.offset, bytes, 0, nullptr, nullptr), "clEnqueueCopyBuffer");
    deallocate(d, tmp, bytes);
  }
  bool copy_peer(int dst_device, backend::Buffer dst, int src_device, backend::Buffer src, size_t bytes) override {
    if (dst_device == src_device) {
      copy(dst_device, dst, src, bytes);
      return true;
    }
    DeviceState& to = device(dst_device);
    DeviceState& from = device(src_device);
    if (to.context != from.context) return false;  // different platforms: the core stages through host
    if (!bytes) return true;
    // Order both queues: the copy runs on the destination queue after everything queued on the source
    // queue so far, and later source-queue work (which may reuse src) waits for the copy. Another
    // thread's commands enqueued meanwhile need no ordering with it: they cannot use src or dst,
    // which the caller holds until this returns.
    cl_event src_ready = nullptr, copied = nullptr;
    check(clEnqueueMarkerWithWaitList(from.queue, 0, nullptr, &src_ready), "clEnqueueMarkerWithWaitList");
    cl_int err = clEnqueueCopyBuffer(to.queue, mem(src), mem(dst), src.offset, dst.offset, bytes, 1, &src_ready, &copied);
    clReleaseEvent(src_ready);
    check(err, "clEnqueueCopyBuffer", " (" + from.name + " -> " + to.name + ")");
    err = clEnqueueBarrierWithWaitList(from.queue, 1, &copied, nullptr);
    clReleaseEvent(copied);
    check(err, "clEnqueueBarrierWithWaitList");
    return true;
  }
  void synchronize(int d) override { check(clFinish(device(d).queue), "clFinish"); }

  void fill(int d, DType t, backend::Buffer dst, int64_t n, double v) override { opencl::fill(d, t, dst, n, v); }
  void cast(int d, DType from, backend::Buffer src, DType to, backend::Buffer dst, int64_t n) override {
    opencl::cast(d, from, src, to, dst, n);
  }
  void strided_copy(int d, DType t, backend::Buffer src, backend::Buffer dst, const backend::StridedCopy& p) override {
    opencl::strided_copy(d, t, src, dst, p);
  }
  void unary(int d, backend::UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n,
             double alpha) override {
    opencl::unary(d, op, t, src, dst, n, alpha);
  }
  void binary(int d, backend::BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
              const backend::Broadcast& p) override {
    opencl::binary(d, op, t, a, b, out, p);
  }
  void where(int d, DType t, backend::Buffer c, backend::Buffer a, backend::Buffer b, backend::Buffer out,
             const backend::Broadcast& p) override {
    opencl::where(d, t, c, a, b, out, p);
  }
  void reduce(int d, backend::ReduceOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer,
              int64_t len, int64_t inner) override {
    opencl::reduce(d, op, t, src, dst, outer, len, inner);
  }
  void matmul(int d, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c, const backend::Gemm& g) override {
    opencl::matmul(d, t, a, b, c, g);
  }
  void softmax(int d, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len, int64_t inner,
               bool log) override {
    opencl::softmax(d, t, src, dst, outer, len, inner, log);
  }
  void gather(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer, int64_t len,
              int64_t inner, int64_t nidx) override {
    opencl::gather(d, t, src, idx, dst, outer, len, inner, nidx);
  }
  void scatter_add(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
                   int64_t len, int64_t inner, int64_t nidx) override {
    opencl::scatter_add(d, t, src, idx, dst, outer, len, inner, nidx);
  }
  void adam_step(int d, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer m, backend::Buffer v, int64_t n,
                 const backend::AdamStep& s) override {
    opencl::adam_step(d, t, x, g, m, v, n, s);
  }
  bool unscale_and_check(int d, DType t, backend::Buffer g, backend::Buffer out, int64_t n, double inv_scale,
                         backend::Buffer found) override {
    return opencl::unscale_and_check(d, t, g, out, n, inv_scale, found);
  }
  void im2col(int d, DType t, backend::Buffer x, backend::Buffer col, const backend::ConvGeometry& g) override {
    opencl::im2col(d, t, x, col, g);
  }
  void col2im(int d, DType t, backend::Buffer col, backend::Buffer dx, const backend::ConvGeometry& g) override {
    opencl::col2im(d, t, col, dx, g);
  }
  void pool_forward(int d, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y,
                    const backend::ConvGeometry& g) override {
    opencl::pool_forward(d, op, t, x, y, g);
  }
  void pool_backward(int d, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y, backend::Buffer dy,
                     backend::Buffer dx, const backend::ConvGeometry& g) override {
    opencl::pool_backward(d, op, t, x, y, dy, dx, g);
  }
  bool rownorm_forward(int d, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                       backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t cols, double eps) override {
    return opencl::rownorm_forward(d, t, x, w, b, y, mean, rstd, r, cols, eps);
  }
  bool rownorm_backward(int d, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w, backend::Buffer mean,
                        backend::Buffer rstd, backend::Buffer dx, backend::Buffer dw, backend::Buffer db, int64_t r,
                        int64_t cols) override {
    return opencl::rownorm_backward(d, t, x, dy, w, mean, rstd, dx, dw, db, r, cols);
  }
  bool recurrent_forward(int d, backend::RecurrentCell cell, DType t, backend::Buffer xg, backend::Buffer hg,
                         backend::Buffer b_hh, backend::Buffer h_prev, backend::Buffer c_prev, backend::Buffer h,
                         backend::Buffer c, backend::Buffer saved, int64_t n, int64_t hidden) override {
    return opencl::recurrent_forward(d, cell, t, xg, hg, b_hh, h_prev, c_prev, h, c, saved, n, hidden);
  }
  bool recurrent_backward(int d, backend::RecurrentCell cell, DType t, backend::Buffer dy, backend::Buffer dh_next,
                          backend::Buffer dc, backend::Buffer saved, backend::Buffer c_prev, backend::Buffer c,
                          backend::Buffer h_prev, backend::Buffer h, backend::Buffer dxg, backend::Buffer dhg, int64_t n,
                          int64_t hidden) override {
    return opencl::recurrent_backward(d, cell, t, dy, dh_next, dc, saved, c_prev, c, h_prev, h, dxg, dhg, n, hidden);
  }
  void random_uniform(int d, DType t, backend::Buffer dst, int64_t n, uint64_t seed, uint64_t offset) override {
    opencl::random_uniform(d, t, dst, n, seed, offset);
  }

 private:
  static Device& entry(int d) {
    auto& all = devices();
    if (d < 0 || d >= int(all.size()))
      ::flux::detail::fail("[OpenCL] device index ", d, " is out of range (", all.size(), " device(s))");
    return *all[size_t(d)];
  }

  void discover() {
    // Read with the core's reader (src/environment.hpp). A malformed list hides every device, with the
    // reason as "not functional" (flux-info, versioninfo), not an exception: that would stop device
    // discovery for every backend, the CPU included.
    const std::optional<std::string> sel = ::flux::environment::value("FLUX_OPENCL_DEVICES");
    std::vector<int> wanted;
    bool select = sel.has_value();
    if (select) {
      std::optional<std::vector<int>> list = ::flux::environment::parse_device_list(*sel);
      if (!list) {
        reason_ = ::flux::environment::invalid_message("FLUX_OPENCL_DEVICES", *sel) + "; no OpenCL device is used";
        return;
      }
      wanted = *list;
      if (wanted.empty()) {
        reason_ = "FLUX_OPENCL_DEVICES=" + *sel + " hides every OpenCL device";
        return;
      }
    }
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, nullptr, &np);
    if (err != CL_SUCCESS || np == 0) {
      reason_ = err == CL_SUCCESS ? "no OpenCL platform is installed"
                                  : std::string("clGetPlatformIDs failed with ") + cl_error_name(err) + " (" +
                                        std::to_string(err) + "): no OpenCL platform (ICD) is installed";
      return;
    }
    std::vector<cl_platform_id> platforms(np);
    clGetPlatformIDs(np, platforms.data(), nullptr);
    // Every device of every platform, in platform order: the numbering FLUX_OPENCL_DEVICES refers to.
    std::vector<std::pair<cl_platform_id, cl_device_id>> found;
    for (cl_platform_id p : platforms) {
      cl_uint nd = 0;
      if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
      std::vector<cl_device_id> ids(nd);
      clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ids.data(), nullptr);
      for (cl_device_id d : ids) found.emplace_back(p, d);
      platforms_.push_back(platform_info(p, CL_PLATFORM_NAME) + " (" + platform_info(p, CL_PLATFORM_VERSION) + ")");
    }
    std::vector<std::pair<cl_platform_id, cl_device_id>> chosen;
    if (select) {
      for (int w : wanted)
        if (w < int(found.size())) chosen.push_back(found[size_t(w)]);
    } else {
      chosen = found;
    }
    if (chosen.empty()) {
      reason_ = found.empty() ? "no OpenCL device found on " + std::to_string(np) + " platform(s)"
                              : std::string("FLUX_OPENCL_DEVICES=") + *sel + " selects none of the " +
                                    std::to_string(found.size()) + " OpenCL device(s)";
      return;
    }
    // One context per platform holding all its chosen devices (so copy_peer can copy between them).
    std::map<cl_platform_id, cl_context> contexts;
    for (cl_platform_id p : platforms) {
      std::vector<cl_device_id> ids;
      for (auto& [cp, cd] : chosen)
        if (cp == p) ids.push_back(cd);
      if (ids.empty()) continue;
      cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(p), 0};
      cl_context ctx = clCreateContext(props, cl_uint(ids.size()), ids.data(), nullptr, nullptr, &err);
      if (err != CL_SUCCESS) {
        reason_ = std::string("clCreateContext failed with ") + cl_error_name(err) + " (" + std::to_string(err) + ")";
        continue;
      }
      contexts[p] = ctx;
    }
    for (auto& [p, id] : chosen) {
      auto c = contexts.find(p);
      if (c == contexts.end()) continue;
      auto dev = std::make_unique<Device>();
      DeviceState& s = dev->state;
      s.platform = p;
      s.id = id;
      s.context = c->second;
      s.queue = clCreateCommandQueue(c->second, id, 0, &err);
      if (err != CL_SUCCESS) {
        reason_ = std::string("clCreateCommandQueue failed with ") + cl_error_name(err) + " (" + std::to_string(err) + ")";
        continue;
      }
      s.name = device_info(id, CL_DEVICE_NAME);
      s.platform_name = platform_info(p, CL_PLATFORM_NAME);
      s.version = device_info(id, CL_DEVICE_VERSION);
      cl_device_type type = 0;
      clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof type, &type, nullptr);
      s.is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
      const std::string extensions = device_info(id, CL_DEVICE_EXTENSIONS);
      s.fp64 = extensions.find("cl_khr_fp64") != std::string::npos;
      s.fp16 = extensions.find("cl_khr_fp16") != std::string::npos;
      cl_ulong gm = 0, ma = 0;
      clGetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, nullptr);
      clGetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, nullptr);
      s.global_mem = size_t(gm);
      s.max_alloc = size_t(ma);
      devices().push_back(std::move(dev));
    }
    if (!devices().empty()) reason_.clear();
  }

  std::string reason_;
  std::vector<std::string> platforms_;
};

}  // namespace

DeviceState& device(int d) {
  auto& all = devices();
  if (d < 0 || d >= int(all.size()))
    ::flux::detail::fail("[OpenCL] device index ", d, " is out of range (", all.size(), " device(s))");
  return all[size_t(d)]->state;
}

}  // namespace flux::opencl

namespace {
flux::backend::Backend* create_opencl_backend() {
  static flux::backend::Backend* b = new flux::opencl::OpenCLBackend();  // lives until exit
  return b;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) flux::backend::PluginInfo flux_backend_plugin() {
  return {flux::backend::kBackendAbiVersion, &create_opencl_backend};
}
