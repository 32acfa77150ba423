// The CUDA backend object (the AMDGPU one when built by hipcc): devices, one stream per device, a
// caching allocator, pinned-staging host copies, peer copies, and dispatch to the kernel files.
// Runtime API only (never the driver API: only a stub libcuda.so exists where there is no driver).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "flux/out_of_memory.hpp"
#include "src/backends/cuda/cuda_backend.hpp"
#include "src/backends/cuda/low_precision.hpp"
#include "src/environment_flag.hpp"

#ifndef FLUX_GPU_ARCHS
#define FLUX_GPU_ARCHS "unknown"
#endif

namespace flux::cuda_backend {

namespace {

void* ptr(backend::Buffer b) { return static_cast<char*>(b.handle) + b.offset; }
/// A buffer's device address, or nullptr for an absent (null-handle) optional buffer.
void* or_null(backend::Buffer b) { return b.handle ? ptr(b) : nullptr; }

std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e);
}

// Size classes of the caching allocator: 512 B minimum, powers of two to 1 MiB, 2 MiB steps above.
size_t round_size(size_t bytes) {
  if (bytes <= 512) return 512;
  if (bytes <= (size_t(1) << 20)) {
    size_t r = 512;
    while (r < bytes) r <<= 1;
    return r;
  }
  constexpr size_t step = size_t(2) << 20;
  return (bytes + step - 1) / step * step;
}

constexpr size_t kStagingChunk = size_t(4) << 20;  // bytes per pinned staging buffer
constexpr int kStagingBuffers = 4;                 // per device: host memcpy overlaps the DMA

struct Staging {
  void* host = nullptr;
  cudaEvent_t done = nullptr;  // recorded after the last copy that used `host`
};

struct DeviceState {
  std::once_flag init;
  cudaStream_t stream = nullptr;
  std::string gpu;          // the device's name and compute capability (set with the stream)
  int cc_major = 0, cc_minor = 0;
  // caching allocator: freed blocks by size class. One stream per device, so a block freed by the
  // host may be handed out again at once: all later work is ordered after the work that used it.
  std::mutex pool_mutex;
  std::map<size_t, std::vector<void*>> free_blocks;
  size_t used = 0, cached = 0;
  // pinned staging ring for host copies
  std::mutex staging_mutex;
  Staging staging[kStagingBuffers];
  int next_staging = 0;
  bool pinned_failed = false;
  std::mutex peer_mutex;
  std::map<int, bool> peer_tried;
};

thread_local int t_current_device = -1;

class GpuBackend final : public backend::Backend {
 public:
  GpuBackend() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      count_ = 0;
      reason_ = e != cudaSuccess ? FLUX_GPU_API_PREFIX "GetDeviceCount failed: " + error_text(e) : std::string("no device found");
#ifdef FLUX_HIP
      for (const char* var : {"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"})
#else
      for (const char* var : {"CUDA_VISIBLE_DEVICES"})
#endif
        if (const char* v = std::getenv(var)) reason_ += std::string(" (") + var + "=" + v + ")";
    } else {
      count_ = n;
    }
    for (int i = 0; i < count_; ++i) devices_.push_back(std::make_unique<DeviceState>());
  }

  const char* name() const override { return FLUX_GPU_BACKEND_NAME; }
  int device_count() override { return count_; }
  std::string not_functional_reason() override { return reason_; }
  bool device_is_cpu(int) override { return false; }

  std::string device_name(int device) override {
    check_index(device, "device_name");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    char buf[512];
#ifdef FLUX_HIP
    std::snprintf(buf, sizeof buf, "%s (%s, %.1f GiB)", p.name, p.gcnArchName, double(p.totalGlobalMem) / 1073741824.0);
#else
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor, double(p.totalGlobalMem) / 1073741824.0);
#endif
    return buf;
  }

  std::string version_info() override {
    int runtime = 0, driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaDriverGetVersion(&driver);
    (void)cudaGetLastError();
    auto version = [](int v) {
#ifdef FLUX_HIP
      return std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100) + " (" + std::to_string(v) + ")";
#else
      return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
#endif
    };
    std::string s = "  runtime: " FLUX_GPU_RUNTIME_NAME " " + version(runtime) + "; driver: " +
                    (driver ? version(driver) : std::string("none")) + "\n";
    s += "  BLAS: " + blas_version() + "\n";
    s += "  DNN: " + dnn_version() + "\n";
    s += "  kernels built for: " FLUX_GPU_ARCHS "\n";
    return s;
  }

  backend::MemoryInfo memory(int device) override {
    use(device);
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    DeviceState& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.pool_mutex);
    return {d.used, d.used + d.cached, free, total};
  }

  backend::Buffer allocate(int device, size_t bytes) override {
    if (bytes == 0) return {};
    DeviceState& d = use(device);
    size_t r = round_size(bytes);
    {
      std::lock_guard<std::mutex> lock(d.pool_mutex);
      auto it = d.free_blocks.find(r);
      if (it != d.free_blocks.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        d.cached -= r;
        d.used += r;
        return {p, 0};
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, r);
    if (e == cudaErrorMemoryAllocation) {  // free the cache and retry once
      (void)cudaGetLastError();
      release_cache(device);
      e = cudaMalloc(&p, r);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      backend::MemoryInfo m{};
      try {
        m = memory(device);
      } catch (const Error&) {
      }
      if (e != cudaErrorMemoryAllocation)
        detail::fail("[", FLUX_GPU_BACKEND_NAME, "] " FLUX_GPU_API_PREFIX "Malloc of ", bytes, " bytes on ", FLUX_GPU_BACKEND_NAME, ":",
                     device, " failed: ", error_text(e));
      throw OutOfMemory(std::string(FLUX_GPU_BACKEND_NAME) + ":" + std::to_string(device), bytes, m.used,
                        m.reserved - m.used, m.total,
                        FLUX_GPU_API_PREFIX "Malloc: " + error_text(e) + "; the driver reports " + OutOfMemory::bytes_text(m.free) + " free");
    }
    std::lock_guard<std::mutex> lock(d.pool_mutex);
    d.used += r;
    return {p, 0};
  }

  void deallocate(int device, backend::Buffer b, size_t bytes) override {
    if (!b.handle || device < 0 || device >= count_) return;
    DeviceState& d = *devices_[device];
    size_t r = round_size(bytes);
    std::lock_guard<std::mutex> lock(d.pool_mutex);
    d.used -= r;
    d.free_blocks[r].push_back(b.handle);
    d.cached += r;
  }

  void release_cache(int device) override {
    DeviceState& d = use(device);
    (void)cudaStreamSynchronize(d.stream);  // blocks may still be read by work queued before their free
    std::lock_guard<std::mutex> lock(d.pool_mutex);
    for (auto& [size, blocks] : d.free_blocks)
      for (void* p : blocks) (void)cudaFree(p);
    d.free_blocks.clear();
    d.cached = 0;
    (void)cudaGetLastError();
  }

  void copy_from_host(int device, backend::Buffer dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& d = use(device);
    char* to = static_cast<char*>(ptr(dst));
    const char* from = static_cast<const char*>(src);
    std::lock_guard<std::mutex> lock(d.staging_mutex);
    for (size_t off = 0; off < bytes; off += kStagingChunk) {
      size_t len = std::min(kStagingChunk, bytes - off);
      Staging* st = pinned(d);
      if (!st) {  // no pinned memory: a pageable copy, complete before we return (src may be freed)
        check(cudaMemcpyAsync(to + off, from + off, bytes - off, cudaMemcpyHostToDevice, d.stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize");
        return;
      }
      std::memcpy(st->host, from + off, len);
      check(cudaMemcpyAsync(to + off, st->host, len, cudaMemcpyHostToDevice, d.stream), "cudaMemcpyAsync");
      check(cudaEventRecord(st->done, d.stream), "cudaEventRecord");
    }
  }

  void copy_to_host(int device, void* dst, backend::Buffer src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& d = use(device);
    if (bytes <= kStagingChunk) {
      std::lock_guard<std::mutex> lock(d.staging_mutex);
      if (Staging* st = pinned(d)) {
        check(cudaMemcpyAsync(st->host, ptr(src), bytes, cudaMemcpyDeviceToHost, d.stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize (a kernel before this copy failed)");
        std::memcpy(dst, st->host, bytes);
        return;
      }
    }
    check(cudaMemcpyAsync(dst, ptr(src), bytes, cudaMemcpyDeviceToHost, d.stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize (a kernel before this copy failed)");
  }

  void copy(int device, backend::Buffer dst, backend::Buffer src, size_t bytes) override {
    if (!bytes) return;
    DeviceState& d = use(device);
    check(cudaMemcpyAsync(ptr(dst), ptr(src), bytes, cudaMemcpyDeviceToDevice, d.stream), "cudaMemcpyAsync");
  }

  bool copy_peer(int dst_device, backend::Buffer dst, int src_device, backend::Buffer src, size_t bytes) override {
    if (dst_device == src_device) {
      copy(dst_device, dst, src, bytes);
      return true;
    }
    if (!bytes) return true;
    DeviceState& s = use(src_device);
    DeviceState& d = use(dst_device);
    enable_peer(dst_device, src_device);
    // src stream -> dst stream -> copy on dst stream -> src stream waits for it, so neither buffer is
    // reused by its own device before the copy is done.
    use(src_device);
    cudaEvent_t src_ready = nullptr, copied = nullptr;
    check(cudaEventCreateWithFlags(&src_ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(src_ready, s.stream), "cudaEventRecord");
    use(dst_device);
    check(cudaStreamWaitEvent(d.stream, src_ready, 0), "cudaStreamWaitEvent");
    check(cudaMemcpyPeerAsync(ptr(dst), dst_device, ptr(src), src_device, bytes, d.stream), "cudaMemcpyPeerAsync");
    check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(copied, d.stream), "cudaEventRecord");
    use(src_device);
    check(cudaStreamWaitEvent(s.stream, copied, 0), "cudaStreamWaitEvent");
    (void)cudaEventDestroy(src_ready);  // released once complete
    (void)cudaEventDestroy(copied);
    return true;
  }

  void synchronize(int device) override {
    DeviceState& d = use(device);
    check(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize (a kernel failed)");
  }

  size_t collective_id_bytes() override { return cuda_backend::collective_id_bytes(); }
  void collective_unique_id(void* id) override { cuda_backend::collective_unique_id(id); }
  void* collective_join(int device, const void* id, int ranks, int rank) override {
    use(device);
    return cuda_backend::collective_join(id, ranks, rank);
  }
  void collective_allreduce_sum(void* comm, int device, DType t, backend::Buffer data, int64_t n) override {
    cuda_backend::collective_allreduce_sum(comm, use(device).stream, t, ptr(data), n);
  }
  void collective_broadcast(void* comm, int device, backend::Buffer data, size_t bytes, int root) override {
    cuda_backend::collective_broadcast(comm, use(device).stream, ptr(data), bytes, root);
  }
  void collective_allgather(void* comm, int device, backend::Buffer send, backend::Buffer recv, size_t bytes) override {
    cuda_backend::collective_allgather(comm, use(device).stream, ptr(send), ptr(recv), bytes);
  }
  bool collective_wait(void* comm, int device, double timeout) override {
    return cuda_backend::collective_wait(comm, use(device).stream, timeout);
  }

  void fill(int device, DType t, backend::Buffer dst, int64_t n, double v) override {
    cuda_backend::fill(use(device).stream, t, ptr(dst), n, v);
  }
  void cast(int device, DType from, backend::Buffer src, DType to, backend::Buffer dst, int64_t n) override {
    cuda_backend::cast(use(device).stream, from, ptr(src), to, ptr(dst), n);
  }
  void strided_copy(int device, DType t, backend::Buffer src, backend::Buffer dst, const backend::StridedCopy& p) override {
    cuda_backend::strided_copy(use(device).stream, t, ptr(src), ptr(dst), p);
  }
  void unary(int device, backend::UnaryOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t n,
             double alpha) override {
    cuda_backend::unary(use(device).stream, op, t, ptr(src), ptr(dst), n, alpha);
  }
  void binary(int device, backend::BinaryOp op, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer out,
              const backend::Broadcast& p) override {
    cuda_backend::binary(use(device).stream, op, t, ptr(a), ptr(b), ptr(out), p);
  }
  void where(int device, DType t, backend::Buffer c, backend::Buffer a, backend::Buffer b, backend::Buffer out,
             const backend::Broadcast& p) override {
    cuda_backend::where(use(device).stream, t, ptr(c), ptr(a), ptr(b), ptr(out), p);
  }
  void reduce(int device, backend::ReduceOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer,
              int64_t len, int64_t inner) override {
    cuda_backend::reduce(use(device).stream, op, t, ptr(src), ptr(dst), outer, len, inner);
  }
  void matmul(int device, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c, const backend::Gemm& g) override {
    cuda_backend::matmul(device, use(device).stream, t, ptr(a), ptr(b), ptr(c), g);
  }
  void softmax(int device, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len, int64_t inner,
               bool log) override {
    cuda_backend::softmax(use(device).stream, t, ptr(src), ptr(dst), outer, len, inner, log);
  }
  void gather(int device, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
              int64_t len, int64_t inner, int64_t nidx) override {
    cuda_backend::gather(use(device).stream, t, ptr(src), static_cast<const int64_t*>(ptr(idx)), ptr(dst), outer, len, inner, nidx);
  }
  void scatter_add(int device, DType t, backend::Buffer src, backend::Buffer idx, backend::Buffer dst, int64_t outer,
                   int64_t len, int64_t inner, int64_t nidx) override {
    cuda_backend::scatter_add(use(device).stream, t, ptr(src), static_cast<const int64_t*>(ptr(idx)), ptr(dst), outer, len,
                     inner, nidx);
  }
  void adam_step(int device, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer m, backend::Buffer v,
                 int64_t n, const backend::AdamStep& s) override {
    cuda_backend::adam_step(use(device).stream, t, ptr(x), ptr(g), ptr(m), ptr(v), n, s);
  }
  bool unscale_and_check(int device, DType t, backend::Buffer g, backend::Buffer out, int64_t n, double inv_scale,
                         backend::Buffer found) override {
    cuda_backend::unscale_and_check(use(device).stream, t, ptr(g), ptr(out), n, inv_scale, static_cast<float*>(ptr(found)));
    return true;
  }

  // ---- convolution, pooling, random: conv.cu, pooling.cu, random.cu ----
  void im2col(int device, DType t, backend::Buffer x, backend::Buffer col, const backend::ConvGeometry& g) override {
    cuda_backend::im2col(use(device).stream, t, ptr(x), ptr(col), g);
  }
  void col2im(int device, DType t, backend::Buffer col, backend::Buffer dx, const backend::ConvGeometry& g) override {
    cuda_backend::col2im(use(device).stream, t, ptr(col), ptr(dx), g);
  }
  void pool_forward(int device, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y,
                    const backend::ConvGeometry& g) override {
    cuda_backend::pool_forward(use(device).stream, op, t, ptr(x), ptr(y), g);
  }
  void pool_backward(int device, backend::PoolOp op, DType t, backend::Buffer x, backend::Buffer y, backend::Buffer dy,
                     backend::Buffer dx, const backend::ConvGeometry& g) override {
    cuda_backend::pool_backward(*this, device, use(device).stream, op, t, ptr(x), ptr(y), ptr(dy), ptr(dx), g);
  }
  bool rownorm_forward(int device, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                       backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t d, double eps) override {
    return cuda_backend::rownorm_forward(use(device).stream, t, ptr(x), or_null(w), or_null(b), ptr(y), ptr(mean), ptr(rstd), r,
                                d, eps);
  }
  bool rownorm_backward(int device, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w,
                        backend::Buffer mean, backend::Buffer rstd, backend::Buffer dx, backend::Buffer dw,
                        backend::Buffer db, int64_t r, int64_t d) override {
    return cuda_backend::rownorm_backward(use(device).stream, t, ptr(x), ptr(dy), or_null(w), ptr(mean), ptr(rstd), ptr(dx),
                                 or_null(dw), or_null(db), r, d);
  }
  bool recurrent_forward(int device, backend::RecurrentCell cell, DType t, backend::Buffer xg, backend::Buffer hg,
                         backend::Buffer b_hh, backend::Buffer h_prev, backend::Buffer c_prev, backend::Buffer h,
                         backend::Buffer c, backend::Buffer saved, int64_t n, int64_t hidden) override {
    return cuda_backend::recurrent_forward(use(device).stream, cell, t, ptr(xg), ptr(hg), or_null(b_hh), ptr(h_prev),
                                  or_null(c_prev), ptr(h), or_null(c), or_null(saved), n, hidden);
  }
  bool recurrent_backward(int device, backend::RecurrentCell cell, DType t, backend::Buffer dy, backend::Buffer dh_next,
                          backend::Buffer dc, backend::Buffer saved, backend::Buffer c_prev, backend::Buffer c,
                          backend::Buffer h_prev, backend::Buffer h, backend::Buffer dxg, backend::Buffer dhg, int64_t n,
                          int64_t hidden) override {
    return cuda_backend::recurrent_backward(use(device).stream, cell, t, ptr(dy), ptr(dh_next), or_null(dc), or_null(saved),
                                   or_null(c_prev), or_null(c), ptr(h_prev), ptr(h), ptr(dxg), or_null(dhg), n,
                                   hidden);
  }
  void random_uniform(int device, DType t, backend::Buffer dst, int64_t n, uint64_t seed, uint64_t offset) override {
    cuda_backend::random_uniform(use(device).stream, t, ptr(dst), n, seed, offset);
  }
  // ---- f16 / bf16 in hardware (low_precision.hpp): cuBLAS GemmEx and cuDNN, float32 accumulation.
  // Where the device has no such units these decline and the core computes through float32. ----
  backend::LowPrecisionSupport low_precision_support(int device, DType t) override {
#ifdef FLUX_HIP
    check_index(device, "low_precision_support");
    return {false, std::string(dtype_name(t)) + " on " FLUX_GPU_BACKEND_NAME ": no rocBLAS or MIOpen in this build "
                   "(Debian 12), so it is stored in 16 bits and computed through Float32"};
#else
    DeviceState& d = use(device);
    return tensor_core_support(d.gpu, d.cc_major, d.cc_minor, t);
#endif
  }
  bool matmul_low_precision(int device, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c,
                            const backend::Gemm& g) override {
    if (!low_precision_units(device, t)) return false;
    return cuda_backend::matmul_low_precision(device, use(device).stream, t, ptr(a), ptr(b), ptr(c), g);
  }

  bool conv_forward(int device, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer bias, backend::Buffer y,
                    const backend::ConvGeometry& g) override {
    if (!float_or_units(device, t)) return false;
    return cuda_backend::conv_forward(*this, device, use(device).stream, t, ptr(x), ptr(w), bias.handle ? ptr(bias) : nullptr,
                             ptr(y), g);
  }
  bool conv_backward_data(int device, DType t, backend::Buffer dy, backend::Buffer w, backend::Buffer dx,
                          const backend::ConvGeometry& g) override {
    if (!float_or_units(device, t)) return false;
    return cuda_backend::conv_backward_data(*this, device, use(device).stream, t, ptr(dy), ptr(w), ptr(dx), g);
  }
  bool conv_backward_weight(int device, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer dw,
                            backend::Buffer dbias, const backend::ConvGeometry& g) override {
    if (!float_or_units(device, t)) return false;
    return cuda_backend::conv_backward_weight(*this, device, use(device).stream, t, ptr(x), ptr(dy), ptr(dw),
                                     dbias.handle ? ptr(dbias) : nullptr, g);
  }

 private:
  // t is f16/bf16 and the device computes it in tensor cores.
  bool low_precision_units(int device, DType t) {
#ifdef FLUX_HIP
    (void)device, (void)t;
    return false;
#else
    return has_tensor_cores(use(device).cc_major, t);
#endif
  }
  // The library fast paths take f32/f64 always, f16/bf16 only where the device has the units.
  bool float_or_units(int device, DType t) {
    return (t != DType::f16 && t != DType::bf16) || low_precision_units(device, t);
  }

  void check_index(int device, const char* api) const {
    if (device < 0 || device >= count_)
      detail::fail("[", api, "] ", FLUX_GPU_BACKEND_NAME, " device ", device, " does not exist (", count_,
                   " device(s)", count_ ? "" : ": " + reason_, ")");
  }

  // Makes `device` current on this thread (once per switch) and initialises it on first use.
  DeviceState& use(int device) {
    check_index(device, FLUX_GPU_BACKEND_NAME);
    if (t_current_device != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      t_current_device = device;
    }
    DeviceState& d = *devices_[device];
    std::call_once(d.init, [&] {
      check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      cudaDeviceProp p{};
      check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
      d.gpu = p.name;
      d.cc_major = p.major, d.cc_minor = p.minor;
    });
    return d;
  }

  // The next pinned staging buffer, waited for; null when pinned memory cannot be had.
  // Caller holds d.staging_mutex.
  Staging* pinned(DeviceState& d) {
    if (d.pinned_failed) return nullptr;
    Staging& st = d.staging[d.next_staging];
    d.next_staging = (d.next_staging + 1) % kStagingBuffers;
    if (!st.host) {
      if (cudaHostAlloc(&st.host, kStagingChunk, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        if (st.host) (void)cudaFreeHost(st.host);
        st.host = nullptr;
        d.pinned_failed = true;
        return nullptr;
      }
      return &st;
    }
    check(cudaEventSynchronize(st.done), "cudaEventSynchronize (staging buffer)");
    return &st;
  }

  // Direct peer access from dst's context to src's memory when the hardware allows; otherwise
  // cudaMemcpyPeerAsync stages through the host itself.
  void enable_peer(int dst_device, int src_device) {
    DeviceState& d = *devices_[dst_device];
    std::lock_guard<std::mutex> lock(d.peer_mutex);
    if (d.peer_tried[src_device]) return;
    d.peer_tried[src_device] = true;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, dst_device, src_device) == cudaSuccess && can) {
      use(dst_device);
      cudaError_t e = cudaDeviceEnablePeerAccess(src_device, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        if (const char* v = std::getenv("FLUX_DEBUG_BACKENDS"); v && ::flux::environment::parse_flag(v).value_or(false))
          std::fprintf(stderr, "[flux:backends] %s: peer access %d -> %d unavailable: %s\n", FLUX_GPU_BACKEND_NAME,
                       dst_device, src_device, error_text(e).c_str());
      }
    }
    (void)cudaGetLastError();
  }

  int count_ = 0;
  std::string reason_;
  std::vector<std::unique_ptr<DeviceState>> devices_;
};

backend::Backend* create_backend() {
  static GpuBackend* b = new GpuBackend();  // never destroyed: tensors may outlive static destruction
  return b;
}

}  // namespace

}  // namespace flux::cuda_backend

extern "C" __attribute__((visibility("default"))) flux::backend::PluginInfo flux_backend_plugin() {
  return {flux::backend::kBackendAbiVersion, &flux::cuda_backend::create_backend};
}
