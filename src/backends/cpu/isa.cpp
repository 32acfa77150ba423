// Run-time ISA detection for the CPU kernels (isa.hpp).
#include "src/backends/cpu/isa.hpp"

#include <atomic>

namespace flux::cpu_backend {

namespace {
Isa detect() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  // libgcc's checks include the OS's XSAVE support for the wider registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::baseline;
}
std::atomic<int> g_active{-1};
}  // namespace

Isa detected_isa() {
  static const Isa level = detect();
  return level;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_relaxed);
  if (v < 0) {
    v = int(detected_isa());
    g_active.store(v, std::memory_order_relaxed);
  }
  return Isa(v);
}

Isa force_isa(Isa level) {
  Isa old = active_isa();
  int v = int(level) < int(detected_isa()) ? int(level) : int(detected_isa());
  g_active.store(v, std::memory_order_relaxed);
  return old;
}

const char* isa_name(Isa level) {
  switch (level) {
    case Isa::avx512: return "AVX-512";
    case Isa::avx2: return "AVX2+FMA";
    default: return "baseline x86-64";
  }
}

}  // namespace flux::cpu_backend

namespace flux::detail {
// For bench/flux_bench.cpp: the ISA level the CPU kernels run at, and a cap on it (0 baseline, 1 AVX2,
// 2 AVX-512; never above what the CPU has) for measuring the AVX2 paths on an AVX-512 machine.
const char* cpu_isa_name() { return cpu_backend::isa_name(cpu_backend::active_isa()); }
int cpu_force_isa(int level) { return int(cpu_backend::force_isa(cpu_backend::Isa(level))); }
}  // namespace flux::detail
