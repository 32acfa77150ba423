// gather (index_select) and its adjoint scatter_add over [outer, len, inner], on the GPU
// (reference: src/backends/cpu/index.cpp). The core range-checks indices on the host before calling;
// the kernels still skip out-of-range indices so that a bad index can never touch stray memory.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

// dst[o, j, i] = src[o, idx[j], i]; bit copies, one kernel per element size.
template <class T> __global__ void gather_kernel(const T* src, const int64_t* idx, T* dst, int64_t outer, int64_t len,
                                                 int64_t inner, int64_t nidx) {
  int64_t total = outer * nidx * inner;
  for (int64_t k = thread_index(); k < total; k += thread_stride()) {
    int64_t i = k % inner, r = k / inner, j = r % nidx, o = r / nidx;
    int64_t at = idx[j];
    dst[k] = (at >= 0 && at < len) ? src[(o * len + at) * inner + i] : T(0);
  }
}

// Atomic add for every arithmetic dtype: native for float/double/int32, 64-bit integers through
// unsigned long long (two's complement wraps identically), bytes by compare-and-swap on their word.
__device__ inline void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_add(int32_t* p, int32_t v) { atomicAdd(reinterpret_cast<int*>(p), int(v)); }
__device__ inline void atomic_add(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
__device__ inline void atomic_add(uint8_t* p, uint8_t v) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t(3));
  unsigned int shift = unsigned(addr & 3) * 8;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    unsigned int byte = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (old != assumed);
}

// dst[o, idx[j], i] += src[o, j, i]; indices may repeat, hence atomics.
template <class T> __global__ void scatter_add_kernel(const T* src, const int64_t* idx, T* dst, int64_t outer,
                                                      int64_t len, int64_t inner, int64_t nidx) {
  int64_t total = outer * nidx * inner;
  for (int64_t k = thread_index(); k < total; k += thread_stride()) {
    int64_t i = k % inner, r = k / inner, j = r % nidx, o = r / nidx;
    int64_t at = idx[j];
    if (at >= 0 && at < len) atomic_add(dst + (o * len + at) * inner + i, src[k]);
  }
}

}  // namespace

void gather(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner,
            int64_t nidx) {
  int64_t total = outer * nidx * inner;
  if (total == 0) return;
  FLUX_GPU_DISPATCH_SIZE("gather", t, {
    gather_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const T*>(src), idx, static_cast<T*>(dst), outer,
                                                             len, inner, nidx);
  });
  check_launch("gather kernel");
}

void scatter_add(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len,
                 int64_t inner, int64_t nidx) {
  int64_t total = outer * nidx * inner;
  if (total == 0) return;
  FLUX_GPU_DISPATCH("scatter_add", t, {
    scatter_add_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const T*>(src), idx, static_cast<T*>(dst),
                                                                  outer, len, inner, nidx);
  });
  check_launch("scatter_add kernel");
}

}  // namespace flux::cuda_backend
