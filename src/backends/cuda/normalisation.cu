// Fused row normalisation on the GPU (layernorm over the last axis, groupnorm's groups as rows), float32
// and float64; formulas in include/flux/backend.hpp, reference: src/backends/cpu/normalisation.cpp.
// hipcc builds the same source. x, y, dy, dx (r, d) row-major; mean, rstd (r,); weight, bias, dweight,
// dbias (d,). Rows: one block of kThreads per row, statistics accumulated in double with a shared-memory
// tree reduction. dweight/dbias: one thread per column walking the rows (no atomics, deterministic).
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

// Sum of every thread's v over the block (blockDim.x == kThreads, a power of two), returned to all.
__device__ double block_sum(double* scratch, double v) {
  const int lid = threadIdx.x;
  scratch[lid] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (lid < w) scratch[lid] += scratch[lid + w];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

template <class T>
__global__ void forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t r, int64_t d,
                               double eps) {
  __shared__ double scratch[kThreads];
  for (int64_t i = blockIdx.x; i < r; i += gridDim.x) {
    const T* xi = x + i * d;
    T* yi = y + i * d;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) acc += double(xi[j]);
    const double mu = block_sum(scratch, acc) / double(d);
    acc = 0;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const double c = double(xi[j]) - mu;
      acc += c * c;
    }
    const double inv = 1.0 / sqrt(block_sum(scratch, acc) / double(d) + eps);
    if (threadIdx.x == 0) mean[i] = T(mu), rstd[i] = T(inv);
    const T m = T(mu), s = T(inv);
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      T v = (xi[j] - m) * s;
      if (w) v *= w[j];
      if (b) v += b[j];
      yi[j] = v;
    }
  }
}

template <class T>
__global__ void backward_x_kernel(const T* x, const T* dy, const T* w, const T* mean, const T* rstd, T* dx, int64_t r,
                                  int64_t d) {
  __shared__ double scratch[kThreads];
  for (int64_t i = blockIdx.x; i < r; i += gridDim.x) {
    const T* xi = x + i * d;
    const T* gi = dy + i * d;
    T* dxi = dx + i * d;
    const double mu = double(mean[i]), s = double(rstd[i]);
    double sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const double g = w ? double(gi[j]) * double(w[j]) : double(gi[j]);
      sg += g;
      sgx += g * (double(xi[j]) - mu) * s;
    }
    const double mg = block_sum(scratch, sg) / double(d);
    const double mgx = block_sum(scratch, sgx) / double(d);
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const double g = w ? double(gi[j]) * double(w[j]) : double(gi[j]);
      dxi[j] = T(s * (g - mg - (double(xi[j]) - mu) * s * mgx));
    }
  }
}

template <class T>
__global__ void backward_params_kernel(const T* x, const T* dy, const T* mean, const T* rstd, T* dw, T* db, int64_t r,
                                       int64_t d) {
  for (int64_t j = thread_index(); j < d; j += thread_stride()) {
    double aw = 0, ab = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double g = double(dy[i * d + j]);
      aw += g * (double(x[i * d + j]) - double(mean[i])) * double(rstd[i]);
      ab += g;
    }
    if (dw) dw[j] = T(aw);
    if (db) db[j] = T(ab);
  }
}

unsigned row_blocks(int64_t r) { return unsigned(r < 65535 ? r : 65535); }

}  // namespace

bool rownorm_forward(Stream s, DType t, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t r, int64_t d, double eps) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (r * d == 0) return true;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    forward_kernel<T><<<row_blocks(r), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                         static_cast<const T*>(b), static_cast<T*>(y),
                                                         static_cast<T*>(mean), static_cast<T*>(rstd), r, d, eps);
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  check_launch("row normalisation forward kernel");
  return true;
}

bool rownorm_backward(Stream s, DType t, const void* x, const void* dy, const void* w, const void* mean,
                      const void* rstd, void* dx, void* dw, void* db, int64_t r, int64_t d) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (r * d == 0) return true;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    backward_x_kernel<T><<<row_blocks(r), kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<const T*>(mean),
        static_cast<const T*>(rstd), static_cast<T*>(dx), r, d);
    if (dw || db)
      backward_params_kernel<T><<<blocks_for(d), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<const T*>(mean),
          static_cast<const T*>(rstd), static_cast<T*>(dw), static_cast<T*>(db), r, d);
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  check_launch("row normalisation backward kernels");
  return true;
}

}  // namespace flux::cuda_backend
