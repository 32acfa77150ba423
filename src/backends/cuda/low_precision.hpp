// Which NVIDIA GPUs compute f16/bf16 in tensor cores: f16 from compute capability 7.0 (Volta), bf16
// from 8.0 (Ampere). The CUDA plugin's low_precision_support answers with this rule, and its cuBLAS
// / cuDNN low-precision paths run only where it says units (elsewhere the core computes through
// float32). No runtime headers: tests/test_cuda_low_precision.cpp checks the rule on the host.
#pragma once
#include <string>

#include "flux/backend.hpp"

namespace flux::cuda_backend {

/// Whether a GPU of compute capability `major`.x has tensor cores for t (f16 or bf16).
inline bool has_tensor_cores(int major, DType t) {
  return (t == DType::f16 && major >= 7) || (t == DType::bf16 && major >= 8);
}

/// The answer for GPU `gpu` (its name) of compute capability major.minor and dtype t.
inline backend::LowPrecisionSupport tensor_core_support(const std::string& gpu, int major, int minor, DType t) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  const std::string who = gpu + " (compute capability " + cc + ")";
  if (t != DType::f16 && t != DType::bf16) return {false, dtype_name(t) + std::string(" is not a low-precision dtype")};
  const bool f16 = t == DType::f16;
  const int need = f16 ? 7 : 8;
  if (has_tensor_cores(major, t))
    return {true, who + ": " + (f16 ? "Float16" : "BFloat16") +
                      " tensor cores (cuBLAS GemmEx and cuDNN, float32 accumulation)"};
  return {false, who + " has no " + (f16 ? "Float16" : "BFloat16") + " tensor cores (they need compute capability " +
                     std::to_string(need) + ".0): " + (f16 ? "Float16" : "BFloat16") +
                     " is stored in 16 bits and computed through Float32"};
}

}  // namespace flux::cuda_backend
