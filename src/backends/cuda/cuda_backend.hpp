// The CUDA backend (and, built by hipcc, the AMDGPU backend): kernel launchers, one file per family
// (unary.cu, binary.cu, ...), mirroring src/backends/cpu. backend.cpp owns devices, streams, memory
// and copies and calls these with the device already current. Every launcher is asynchronous on
// `stream`; pointers are device pointers (Buffer handle + offset). Semantics: src/backends/cpu.
#pragma once
#include <cstdint>
#include <string>

#include "flux/backend.hpp"
#include "src/backends/cuda/gpu_runtime.hpp"

namespace flux::gpu {

void fill(Stream s, DType t, void* dst, int64_t n, double value);
void cast(Stream s, DType from, const void* src, DType to, void* dst, int64_t n);
void strided_copy(Stream s, DType t, const void* src, void* dst, const backend::StridedCopy& plan);
void unary(Stream s, backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha);
void binary(Stream s, backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan);
void where(Stream s, DType t, const void* cond, const void* a, const void* b, void* out, const backend::Broadcast& plan);
void reduce(Stream s, backend::ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner);
/// `device` selects the per-device BLAS handle (CUDA: cuBLAS; AMDGPU: our tiled kernel, no handle).
void matmul(int device, Stream s, DType t, const void* a, const void* b, void* c, const backend::Gemm& g);
void softmax(Stream s, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log);
void gather(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void scatter_add(Stream s, DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void adam_step(Stream s, DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& step);

/// "cuBLAS 13.0.0" or "own tiled GEMM kernel (no rocBLAS)".
std::string blas_version();

}  // namespace flux::gpu
