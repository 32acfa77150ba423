// The CUDA backend (and, built by hipcc, the AMDGPU backend): kernel launchers, one file per family
// (unary.cu, binary.cu, ...), mirroring src/backends/cpu. backend.cpp owns devices, streams, memory
// and copies and calls these with the device already current. Every launcher is asynchronous on
// `stream`; pointers are device pointers (Buffer handle + offset). Semantics: src/backends/cpu.
#pragma once
#include <cstdint>
#include <string>

#include "flux/backend.hpp"
#include "src/backends/cuda/gpu_runtime.hpp"
#include "src/backends/cuda/window.hpp"

namespace flux::cuda_backend {

void fill(Stream s, DType t, void* dst, int64_t n, double value);
void cast(Stream s, DType from, const void* src, DType to, void* dst, int64_t n);
void strided_copy(Stream s, DType t, const void* src, void* dst, const backend::StridedCopy& plan);
void unary(Stream s, backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha);
void binary(Stream s, backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan);
void where(Stream s, DType t, const void* cond, const void* a, const void* b, void* out, const backend::Broadcast& plan);
void reduce(Stream s, backend::ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner);
/// `device` selects the per-device BLAS handle (CUDA: cuBLAS; AMDGPU: our tiled kernel, no handle).
void matmul(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g);
/// f16/bf16 GEMM with float32 accumulation (cuBLAS GemmStridedBatchedEx, CUBLAS_COMPUTE_32F: tensor
/// cores); false for other dtypes and on AMDGPU (no rocBLAS). The caller checked the device's units.
bool matmul_low_precision(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g);
void softmax(Stream s, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log);
void gather(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void scatter_add(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void adam_step(Stream s, DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& step);

/// "cuBLAS 13.0.0" or "own tiled GEMM kernel (no rocBLAS)".
std::string blas_version();

// Collectives across processes (collectives.cpp, NCCL; without it collective_id_bytes() is 0). The
// device is current; the operations are enqueued on `s`.
size_t collective_id_bytes();
void collective_unique_id(void* id);
void* collective_join(const void* id, int ranks, int rank);
void collective_allreduce_sum(void* comm, Stream s, DType t, void* data, int64_t n);
void collective_broadcast(void* comm, Stream s, void* data, size_t bytes, int root);
void collective_allgather(void* comm, Stream s, const void* send, void* recv, size_t bytes);
bool collective_wait(void* comm, Stream s, double timeout);

/// Device scratch memory from the backend's caching allocator for the span of one launcher call.
/// Returning it at once after the launches is safe: one stream per device orders every later use.
class Scratch {
 public:
  Scratch(backend::Backend& be, int device, size_t bytes) : be_(be), device_(device), bytes_(bytes) {
    if (bytes_) buffer_ = be_.allocate(device_, bytes_);
  }
  ~Scratch() {
    if (buffer_.handle) be_.deallocate(device_, buffer_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return buffer_.handle ? static_cast<char*>(buffer_.handle) + buffer_.offset : nullptr; }
  size_t size() const { return bytes_; }

 private:
  backend::Backend& be_;
  int device_;
  size_t bytes_;
  backend::Buffer buffer_{};
};

/// The checks every window launcher makes before it launches: float dtype, 1 to 3 spatial axes, and
/// kernel, stride, dilation >= 1 (a zero stride would divide by zero on the device).
inline void check_window(const char* api, DType t, const backend::ConvGeometry& g) {
  if (t != DType::f32 && t != DType::f64)
    detail::fail("[", api, "] " FLUX_GPU_BACKEND_NAME " kernel supports Float32 and Float64; got ", dtype_name(t));
  if (g.spatial < 1 || g.spatial > 3) detail::fail("[", api, "] expected 1 to 3 spatial axes; got ", g.spatial);
  for (int i = 0; i < g.spatial; ++i)
    if (g.stride[i] < 1 || g.dilation[i] < 1 || g.kernel[i] < 1 || g.in[i] < 0 || g.out[i] < 0)
      detail::fail("[", api, "] invalid window on spatial axis ", i, ": in ", g.in[i], ", out ", g.out[i], ", kernel ",
                   g.kernel[i], ", stride ", g.stride[i], ", dilation ", g.dilation[i],
                   " (expected kernel, stride, dilation >= 1)");
}

// ---- convolution, pooling, random (conv.cu, pooling.cu, random.cu); f32 and f64 ----
void im2col(Stream s, DType t, const void* x, void* col, const backend::ConvGeometry& g);
void col2im(Stream s, DType t, const void* col, void* dx, const backend::ConvGeometry& g);
void pool_forward(Stream s, backend::PoolOp op, DType t, const void* x, void* y, const backend::ConvGeometry& g);
/// Max pooling takes int64 scratch (one window index per output) from `be`.
void pool_backward(backend::Backend& be, int device, Stream s, backend::PoolOp op, DType t, const void* x,
                   const void* y, const void* dy, void* dx, const backend::ConvGeometry& g);
void random_uniform(Stream s, DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset);

/// Fused row normalisation (normalisation.cu), formulas in backend.hpp; f32/f64, false otherwise.
/// w, b, dw, db may be null.
bool rownorm_forward(Stream s, DType t, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t r, int64_t d, double eps);
bool rownorm_backward(Stream s, DType t, const void* x, const void* dy, const void* w, const void* mean,
                      const void* rstd, void* dx, void* dw, void* db, int64_t r, int64_t d);

/// One fused recurrent step (recurrent.cu), formulas in backend.hpp; f32/f64, false otherwise.
/// Optional pointers (b_hh, c_prev, c, saved, dc, dhg) may be null where backend.hpp allows it.
bool recurrent_forward(Stream s, backend::RecurrentCell cell, DType t, const void* xg, const void* hg,
                       const void* b_hh, const void* h_prev, const void* c_prev, void* h, void* c, void* saved,
                       int64_t n, int64_t hidden);
bool recurrent_backward(Stream s, backend::RecurrentCell cell, DType t, const void* dy, void* dh_next, void* dc,
                        const void* saved, const void* c_prev, const void* c, const void* h_prev, const void* h,
                        void* dxg, void* dhg, int64_t n, int64_t hidden);

/// cuDNN fast paths (CUDA plugin built with cuDNN); false where there is none for the case: the core
/// then runs im2col + matmul. Workspace comes from `be`'s caching allocator. bias / dbias may be null.
/// f32, f64, and f16/bf16 (every array of that dtype, float32 compute on tensor cores; the caller
/// checked the device's units).
bool conv_forward(backend::Backend& be, int device, Stream s, DType t, const void* x, const void* w, const void* bias,
                  void* y, const backend::ConvGeometry& g);
bool conv_backward_data(backend::Backend& be, int device, Stream s, DType t, const void* dy, const void* w, void* dx,
                        const backend::ConvGeometry& g);
bool conv_backward_weight(backend::Backend& be, int device, Stream s, DType t, const void* x, const void* dy, void* dw,
                          void* dbias, const backend::ConvGeometry& g);
/// "cuDNN 9.19.0" or why there is none ("not built with cuDNN", "no MIOpen in Debian 12").
std::string dnn_version();

}  // namespace flux::cuda_backend
