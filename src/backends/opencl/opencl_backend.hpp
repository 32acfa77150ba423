// The OpenCL backend plugin (libflux-opencl.so): shared state and launch helpers. Kernels live one
// file per family (unary.cpp, binary.cpp, ...), mirroring src/backends/cpu. Each family's OpenCL C
// source is compiled lazily, once per device and dtype, and PoCL caches the binaries on disk.
#pragma once
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "flux/backend.hpp"
#include "flux/error.hpp"

namespace flux::opencl {

/// "CL_OUT_OF_RESOURCES" for -5, ...; "unknown OpenCL error" otherwise.
const char* cl_error_name(cl_int err);

/// Throws "[OpenCL] <api> failed with <name> (<code>)<context>".
[[noreturn]] void fail_cl(cl_int err, const char* api, const std::string& context = {});
inline void check(cl_int err, const char* api, const std::string& context = {}) {
  if (err != CL_SUCCESS) fail_cl(err, api, context);
}

/// One selected device: its context (shared by every selected device of the platform), its
/// in-order queue, and the programs built for it.
///
/// Threads: any number of user threads launch on a device at once. The queue is one in-order queue
/// (OpenCL's enqueue calls are thread-safe), so each thread's commands stay in its program order and
/// a buffer freed by one thread and reused by another is written only after the earlier commands.
/// What OpenCL does not make thread-safe is setting a cl_kernel's arguments (clSetKernelArg): each
/// launch borrows a kernel object no other thread is using (KernelEntry::idle) and gives it back
/// once enqueued (the arguments are captured at enqueue). No lock is held across a launch.
struct DeviceState {
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  std::string name, platform_name, version;
  bool is_cpu = false, fp64 = false;
  bool fp16 = false;  // cl_khr_fp16: half arithmetic (low_precision_support)
  size_t global_mem = 0, max_alloc = 0;
  /// One kernel of a built program, with its idle kernel objects: as many exist as threads ever
  /// launched it at the same time (made by clCreateKernel when none is idle).
  struct KernelEntry {
    cl_program program = nullptr;
    std::string name;
    size_t local = 1;
    std::mutex idle_mutex;  // guards idle only; never held across an OpenCL call
    std::vector<cl_kernel> idle;
  };
  std::shared_mutex kernels_mutex;  // kernels: shared for lookups, exclusive to insert
  std::map<std::string, std::unique_ptr<KernelEntry>> kernels;
  std::mutex build_mutex;  // programs, and one build at a time; a lookup of a built kernel never waits
  std::map<std::string, cl_program> programs;
  /// CLBlast before 1.6.1 may throw when two threads cache the same program at once (matmul.cpp):
  /// the first GEMM of each dtype (0 Float32, 1 Float64) runs under gemm_first_mutex, later ones
  /// without a lock.
  std::mutex gemm_first_mutex;
  std::atomic<bool> gemm_ready[2] = {false, false};
};

/// The state of selected device d (0-based); throws when out of range.
DeviceState& device(int d);

/// OpenCL C type of a dtype ("float", "double", "int", "long", "uchar").
const char* cl_type(DType t);
/// OpenCL C unsigned integer type of an element size, for bit copies ("uchar" .. "ulong").
const char* bits_type(size_t element_size);
/// Build options defining T (element type), ACC (accumulator) and IS_FLOAT / IS_SIGNED for dtype t.
std::string type_options(DeviceState& dev, DType t, const char* api);

/// Called before a program build (and CLBlast's first GEMM): on PoCL with an empty kernel cache, prints
/// one "[ Info: ..." line saying the first run compiles the kernels, once per process.
void note_kernel_compile(DeviceState& dev);
/// While alive, watches a step that may compile (a program build, CLBlast's first GEMM of a dtype):
/// if it takes longer than two seconds, one info line says the device is compiling `what` and that
/// later runs reuse the cache, once per process, whether the cache looked cold or not.
class CompileWatch {
 public:
  CompileWatch(const DeviceState& dev, std::string what);
  ~CompileWatch();
  CompileWatch(const CompileWatch&) = delete;
  CompileWatch& operator=(const CompileWatch&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread watcher_;
};

/// The kernel `name` of program `family` built from `source` with `options` for this device.
/// The program is built once; a build failure throws with the compiler's log.
DeviceState::KernelEntry& kernel(DeviceState& dev, const char* family, const char* source,
                                 const std::string& options, const char* name);

/// A scalar kernel argument of a run-time dtype.
struct Scalar {
  unsigned char bytes[8] = {};
  size_t size = 0;
};
/// value converted to dtype t as the CPU backend converts it (T(value)).
Scalar scalar_of(DType t, double value);

inline cl_mem mem(backend::Buffer b) { return static_cast<cl_mem>(b.handle); }
inline cl_ulong off(backend::Buffer b) { return cl_ulong(b.offset); }

namespace detail_args {
template <class A> inline void set(cl_kernel k, cl_uint i, const A& v) {
  check(clSetKernelArg(k, i, sizeof(A), &v), "clSetKernelArg", " (argument " + std::to_string(i) + ")");
}
inline void set(cl_kernel k, cl_uint i, const Scalar& s) {
  check(clSetKernelArg(k, i, s.size, s.bytes), "clSetKernelArg", " (argument " + std::to_string(i) + ")");
}
}  // namespace detail_args

/// A kernel object of `entry` for this thread alone: an idle one, or a new one; back to idle when
/// the lease ends.
class KernelLease {
 public:
  explicit KernelLease(DeviceState::KernelEntry& entry);
  ~KernelLease();
  KernelLease(const KernelLease&) = delete;
  KernelLease& operator=(const KernelLease&) = delete;
  cl_kernel get() const { return kernel_; }

 private:
  DeviceState::KernelEntry& entry_;
  cl_kernel kernel_ = nullptr;
};

/// Enqueues `entry` over `work` work-items (kernels loop grid-stride, so the launch is capped);
/// `groups_only` launches exactly `work` work-groups of the kernel's local size instead.
template <class... Args>
void launch(DeviceState& dev, DeviceState::KernelEntry& entry, int64_t work, bool groups_only, const Args&... args) {
  size_t local = entry.local;
  size_t global;
  if (groups_only) {
    global = size_t(std::min<int64_t>(work, 65536)) * local;
  } else {
    int64_t capped = std::min<int64_t>(work, int64_t(local) * 1024);
    global = (size_t(capped) + local - 1) / local * local;
  }
  if (global == 0) return;
  KernelLease kernel(entry);
  cl_uint i = 0;
  (detail_args::set(kernel.get(), i++, args), ...);
  check(clEnqueueNDRangeKernel(dev.queue, kernel.get(), 1, nullptr, &global, &local, 0, nullptr, nullptr),
        "clEnqueueNDRangeKernel");
}

/// Shape and strides of up to three operands, with size-1 axes dropped and mergeable axes merged.
struct Layout {
  int ndim = 0;
  cl_long8 shape{}, stride[3]{};
  int64_t total = 1;
};
Layout collapse(int ndim, const int64_t* shape, const int64_t* const* strides, int operands);

/// Common head of every program: fp64 pragma, AT(type, base, byte offset), GRID_LOOP, offsets().
extern const char* const kPreamble;

// Kernel families (one file each).
void fill(int d, DType t, backend::Buffer dst, int64_t n, double value);
void cast(int d, DType from, backend::Buffer src, DType to, backend::Buffer dst, int64_t n);
void strided_copy(int d, DType t, backend::Buffer src, backend::Buffer dst, const backend::StridedCopy& plan);
void unary(int d, backend::UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n, double alpha);
void binary(int d, backend::BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
            const backend::Broadcast& plan);
void where(int d, DType t, backend::Buffer cond, backend::Buffer a, backend::Buffer b, backend::Buffer out,
           const backend::Broadcast& plan);
void reduce(int d, backend::ReduceOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer,
            int64_t len, int64_t inner);
void matmul(int d, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c, const backend::Gemm& g);
void softmax(int d, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len, int64_t inner,
             bool log);
void gather(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
            int64_t len, int64_t inner, int64_t nidx);
void scatter_add(int d, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
                 int64_t len, int64_t inner, int64_t nidx);
void adam_step(int d, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer m, backend::Buffer v, int64_t n,
               const backend::AdamStep& s);
/// Loss scaling (optimiser.cpp; Backend::unscale_and_check): f16/bf16/f32/f64.
bool unscale_and_check(int d, DType t, backend::Buffer g, backend::Buffer out, int64_t n, double inv_scale,
                       backend::Buffer found);

/// A ConvGeometry as kernel arguments: (D, H, W, unused) with LEADING length-1 axes for 1-D and 2-D.
struct WindowArgs {
  cl_long4 in{}, out{}, kernel{}, stride{}, pad{}, dilation{};  // pad: pad_lo
  int64_t in_size = 1, out_size = 1, window = 1;                // prod(in), prod(out), prod(kernel)
};
WindowArgs window_args(const backend::ConvGeometry& g);
/// Fails unless t is Float32/Float64 and g has 1 to 3 spatial axes with positive kernel/stride/dilation.
void check_window_geometry(const char* api, DType t, const backend::ConvGeometry& g);

// Convolution and pooling windows (conv.cpp, pooling.cpp), random numbers (random.cpp).
void im2col(int d, DType t, backend::Buffer x, backend::Buffer col, const backend::ConvGeometry& g);
void col2im(int d, DType t, backend::Buffer col, backend::Buffer dx, const backend::ConvGeometry& g);
void pool_forward(int d, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y,
                  const backend::ConvGeometry& g);
void pool_backward(int d, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y, backend::Buffer dy,
                   backend::Buffer dx, const backend::ConvGeometry& g);
void random_uniform(int d, DType t, backend::Buffer dst, int64_t n, uint64_t seed, uint64_t offset);

/// Fused row normalisation (normalisation.cpp), formulas in backend.hpp; f32/f64, false otherwise.
bool rownorm_forward(int d, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                     backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t cols, double eps);
bool rownorm_backward(int d, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w, backend::Buffer mean,
                      backend::Buffer rstd, backend::Buffer dx, backend::Buffer dw, backend::Buffer db, int64_t r,
                      int64_t cols);
/// One fused recurrent step (recurrent.cpp), formulas in backend.hpp; f32/f64, false otherwise.
bool recurrent_forward(int d, backend::RecurrentCell cell, DType t, backend::Buffer xg, backend::Buffer hg,
                       backend::Buffer b_hh, backend::Buffer h_prev, backend::Buffer c_prev, backend::Buffer h,
                       backend::Buffer c, backend::Buffer saved, int64_t n, int64_t hidden);
bool recurrent_backward(int d, backend::RecurrentCell cell, DType t, backend::Buffer dy, backend::Buffer dh_next,
                        backend::Buffer dc, backend::Buffer saved, backend::Buffer c_prev, backend::Buffer c,
                        backend::Buffer h_prev, backend::Buffer h, backend::Buffer dxg, backend::Buffer dhg, int64_t n,
                        int64_t hidden);

}  // namespace flux::opencl
