// Numerically stable (log)softmax over the middle axis of [outer, len, inner], on the GPU
// (reference: src/backends/cpu/softmax.cpp: subtract the max (0 when it is -inf), sum in double).
//   inner == 1: one block per row (max, sum, write: three passes);  inner > 1: one thread per column.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

template <class T> __device__ inline T max_of(T a, T b) { return (a > b || a != a) ? a : b; }  // NaN propagates

template <class T> __global__ void softmax_rows(const T* src, T* dst, int64_t outer, int64_t len, bool log_out) {
  __shared__ T maxes[kThreads];
  __shared__ double sums[kThreads];
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    const T* x = src + row * len;
    T* y = dst + row * len;
    T m = T(-INFINITY);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) m = max_of(m, x[j]);
    maxes[threadIdx.x] = m;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (int(threadIdx.x) < half) maxes[threadIdx.x] = max_of(maxes[threadIdx.x], maxes[threadIdx.x + half]);
      __syncthreads();
    }
    m = maxes[0];
    if (isinf(m) && m < 0) m = 0;
    double total = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) total += double(exp(x[j] - m));
    sums[threadIdx.x] = total;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (int(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
      __syncthreads();
    }
    total = sums[0];
    if (log_out) {
      T log_total = T(log(total));  // (x - m) - log(total): m + log(total) would round at m's magnitude
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) y[j] = (x[j] - m) - log_total;
    } else {
      T inv = T(1.0 / total);
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) y[j] = exp(x[j] - m) * inv;
    }
    __syncthreads();  // the shared buffers are reused by the next row
  }
}

template <class T> __global__ void softmax_columns(const T* src, T* dst, int64_t outer, int64_t len, int64_t inner,
                                                   bool log_out) {
  for (int64_t k = thread_index(); k < outer * inner; k += thread_stride()) {
    int64_t o = k / inner, i = k % inner;
    const T* x = src + o * len * inner + i;
    T* y = dst + o * len * inner + i;
    T m = T(-INFINITY);
    for (int64_t j = 0; j < len; ++j) m = max_of(m, x[j * inner]);
    if (isinf(m) && m < 0) m = 0;
    double total = 0;
    for (int64_t j = 0; j < len; ++j) total += double(exp(x[j * inner] - m));
    if (log_out) {
      T log_total = T(log(total));
      for (int64_t j = 0; j < len; ++j) y[j * inner] = (x[j * inner] - m) - log_total;
    } else {
      T inv = T(1.0 / total);
      for (int64_t j = 0; j < len; ++j) y[j * inner] = exp(x[j * inner] - m) * inv;
    }
  }
}

template <class T> void softmax_typed(Stream s, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log) {
  const T* x = static_cast<const T*>(src);
  T* y = static_cast<T*>(dst);
  if (inner == 1) {
    unsigned blocks = unsigned(outer < 65536 ? outer : 65536);
    softmax_rows<T><<<blocks, kThreads, 0, s>>>(x, y, outer, len, log);
  } else {
    softmax_columns<T><<<blocks_for(outer * inner), kThreads, 0, s>>>(x, y, outer, len, inner, log);
  }
}

}  // namespace

void softmax(Stream s, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log) {
  if (outer * inner == 0 || len == 0) return;
  switch (t) {
    case DType::f32: softmax_typed<float>(s, src, dst, outer, len, inner, log); break;
    case DType::f64: softmax_typed<double>(s, src, dst, outer, len, inner, log); break;
    default: detail::fail("[softmax] needs a floating-point tensor, got ", dtype_name(t));
  }
  check_launch("softmax kernel");
}

}  // namespace flux::cuda_backend
