// Counter-based uniform random numbers on the GPU (backend.hpp's random_uniform; reference:
// src/backends/cpu/random.cpp): element i depends only on (seed, offset + i), so the values are
// bit-identical to every other backend's whatever the launch shape.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

__device__ inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ inline uint64_t draw(uint64_t seed, uint64_t counter) {
  return splitmix64(seed + counter * 0x9E3779B97F4A7C15ull);
}

// (z >> 40) has 24 bits and (z >> 11) 53: both convert exactly, and the power-of-two scale is exact.
__device__ inline float to_unit(uint64_t z, float*) { return float(z >> 40) * 0x1.0p-24f; }
__device__ inline double to_unit(uint64_t z, double*) { return double(z >> 11) * 0x1.0p-53; }

template <class T> __global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    out[i] = to_unit(draw(seed, offset + uint64_t(i)), static_cast<T*>(nullptr));
}

}  // namespace

void random_uniform(Stream s, DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset) {
  if (t != DType::f32 && t != DType::f64)
    detail::fail("[random_uniform] " FLUX_GPU_BACKEND_NAME " kernel supports Float32 and Float64; got ", dtype_name(t));
  if (n <= 0) return;
  if (t == DType::f32) uniform_kernel<float><<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(dst), n, seed, offset);
  else uniform_kernel<double><<<blocks_for(n), kThreads, 0, s>>>(static_cast<double*>(dst), n, seed, offset);
  check_launch("random_uniform kernel");
}

}  // namespace flux::cuda_backend
