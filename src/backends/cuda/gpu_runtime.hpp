// One source, two runtimes: this header maps the CUDA runtime names used by src/backends/cuda to
// HIP when built by hipcc for the AMDGPU plugin (FLUX_HIP defined), and holds the helpers every
// kernel file shares (launch shape, error checks, dtype dispatch, half/bfloat16 bit conversions).
#pragma once
#include <cstdint>
#include <string>

#ifdef FLUX_HIP
#include <hip/hip_runtime.h>
// Runtime API (only the names this backend uses).
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorPeerAccessAlreadyEnabled hipErrorPeerAccessAlreadyEnabled
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventQuery hipEventQuery
#define cudaEventDestroy hipEventDestroy
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyPeerAsync hipMemcpyPeerAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemGetInfo hipMemGetInfo
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaDeviceCanAccessPeer hipDeviceCanAccessPeer
#define cudaDeviceEnablePeerAccess hipDeviceEnablePeerAccess
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaDriverGetVersion hipDriverGetVersion
#define FLUX_GPU_BACKEND_NAME "AMDGPU"
#define FLUX_GPU_RUNTIME_NAME "HIP"
#define FLUX_GPU_API_PREFIX "hip"
#else
#include <cuda_runtime.h>
#define FLUX_GPU_BACKEND_NAME "CUDA"
#define FLUX_GPU_RUNTIME_NAME "CUDA"
#define FLUX_GPU_API_PREFIX "cuda"
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FLUX_HD __host__ __device__ inline
#else
#define FLUX_HD inline
#endif

#include "flux/dtype.hpp"
#include "flux/error.hpp"
#include "src/half_bits.hpp"

namespace flux::cuda_backend {

using Stream = cudaStream_t;

/// Throws flux::Error "[CUDA] <what>: <error name>: <error string>" unless `e` is success.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    detail::fail("[" FLUX_GPU_BACKEND_NAME "] ", what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

/// After a kernel launch: reports a bad launch (configuration, missing kernel image) at once.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

constexpr int kThreads = 256;  // threads per block of every elementwise kernel

/// Blocks for a grid-stride loop over n elements (capped: each thread then loops).
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65536) b = 65536;
  return unsigned(b);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/// Grid-stride loop index helpers (64-bit: tensors may exceed 2^31 elements).
__device__ inline int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t thread_stride() { return int64_t(gridDim.x) * blockDim.x; }
#endif

// IEEE half and bfloat16 from/to float: the one definition in src/half_bits.hpp (also the host's).
FLUX_HD float half_bits_to_float(uint16_t h) { return half_bits::to_float(h); }
FLUX_HD uint16_t float_to_half_bits(float f) { return half_bits::from_float(f); }
FLUX_HD float bfloat16_bits_to_float(uint16_t b) { return half_bits::bfloat16_to_float(b); }
FLUX_HD uint16_t float_to_bfloat16_bits(float f) { return half_bits::bfloat16_from_float(f); }

}  // namespace flux::cuda_backend

// Calls BODY with `using T = <C++ type>` for the arithmetic dtypes; errors for others (as the CPU).
#define FLUX_GPU_DISPATCH(api, dtype, ...)                                                   \
  switch (dtype) {                                                                          \
    case ::flux::DType::f32: { using T = float; __VA_ARGS__; } break;                       \
    case ::flux::DType::f64: { using T = double; __VA_ARGS__; } break;                      \
    case ::flux::DType::i32: { using T = int32_t; __VA_ARGS__; } break;                     \
    case ::flux::DType::i64: { using T = int64_t; __VA_ARGS__; } break;                     \
    case ::flux::DType::u8: case ::flux::DType::boolean: { using T = uint8_t; __VA_ARGS__; } break; \
    default: ::flux::detail::fail("[", api, "] " FLUX_GPU_BACKEND_NAME " kernel does not support ", ::flux::dtype_name(dtype)); \
  }

// Calls BODY with `using T = <unsigned integer of the element's size>` (bit copies: fill, where, copy).
#define FLUX_GPU_DISPATCH_SIZE(api, dtype, ...)                                \
  switch (::flux::dtype_size(dtype)) {                                         \
    case 1: { using T = uint8_t; __VA_ARGS__; } break;                         \
    case 2: { using T = uint16_t; __VA_ARGS__; } break;                        \
    case 4: { using T = uint32_t; __VA_ARGS__; } break;                        \
    case 8: { using T = unsigned long long; __VA_ARGS__; } break;              \
    default: ::flux::detail::fail("[", api, "] unsupported element size");     \
  }
