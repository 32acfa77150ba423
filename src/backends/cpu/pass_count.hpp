// Counts of the CPU backend's passes over memory, for benchmarks (bench/flux_bench --passes) and
// tests: how many full-tensor float32 <-> bf16/f16 conversions a step makes (Backend::cast between
// them: the cast-copies around ops that compute through float32) and their bytes, and how many kernel
// calls of any kind (each one pass or more over its operands). Relaxed atomics: a few per kernel call.
#pragma once
#include <atomic>
#include <cstdint>

#include "flux/dtype.hpp"

namespace flux::cpu_backend {

struct PassCounts {
  int64_t conversions = 0;       // Backend::cast calls between float32 and bf16/f16
  int64_t conversion_bytes = 0;  // bytes those read and wrote
  int64_t kernels = 0;           // kernel calls of every kind (casts included)
};

namespace pass_count {
inline std::atomic<int64_t> conversions{0}, conversion_bytes{0}, kernels{0};
inline void kernel() { kernels.fetch_add(1, std::memory_order_relaxed); }
/// A cast of n elements from -> to: counted as a conversion pass when it is float32 <-> bf16/f16.
inline void cast(DType from, DType to, int64_t n) {
  kernel();
  const bool half_from = from == DType::bf16 || from == DType::f16, half_to = to == DType::bf16 || to == DType::f16;
  if ((half_from && to == DType::f32) || (from == DType::f32 && half_to)) {
    conversions.fetch_add(1, std::memory_order_relaxed);
    conversion_bytes.fetch_add(n * 6, std::memory_order_relaxed);  // 4 bytes one side, 2 the other
  }
}
}  // namespace pass_count

/// The counts since the start or the last reset.
inline PassCounts pass_counts() {
  return {pass_count::conversions.load(), pass_count::conversion_bytes.load(), pass_count::kernels.load()};
}
inline void reset_pass_counts() { pass_count::conversions = 0, pass_count::conversion_bytes = 0, pass_count::kernels = 0; }

}  // namespace flux::cpu_backend
