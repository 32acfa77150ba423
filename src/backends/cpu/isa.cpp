// Run-time ISA detection for the CPU kernels (isa.hpp).
#include "src/backends/cpu/isa.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

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

// ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) caps flux's own kernels as it caps oneDNN's, so one
// variable runs a whole program at a lower level (CI's AVX2 passes on an AVX-512 machine): SSE4.1 and
// below -> baseline, AVX and AVX2 (with their VNNI/BF16 variants) -> AVX2, anything else -> no cap.
Isa environment_cap() {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap || !*cap) cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (!cap || !*cap) return Isa::avx512;
  std::string isa(cap);
  for (char& ch : isa) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  if (isa.rfind("SSE", 0) == 0) return Isa::baseline;
  if (isa.rfind("AVX2", 0) == 0 || isa == "AVX") return Isa::avx2;
  return Isa::avx512;
}
}  // namespace

Isa detected_isa() {
  static const Isa level = detect();
  return level;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_relaxed);
  if (v < 0) {
    v = std::min(int(detected_isa()), int(environment_cap()));
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

namespace {
// What CPUID says, before any cap: leaf 7 sub-leaf 0 EDX bits 22 (AMX-BF16), 23 (AVX512-FP16),
// 24 (AMX-TILE); sub-leaf 1 EAX bits 5 (AVX512-BF16), 21 (AMX-FP16); XCR0 bits 17-18 (tile state).
LowPrecisionUnits cpuid_units() {
  LowPrecisionUnits u;
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return u;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned edx0 = d;
  __cpuid_count(7, 1, a, b, c, d);
  const unsigned eax1 = a;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __cpuid(1, a, b, c, d);
  if (c & (1u << 27)) __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool tiles = (edx0 >> 24 & 1u) && (xcr0_lo >> 17 & 3u) == 3u;
  const bool avx512 = detected_isa() == Isa::avx512;
  u.avx512_bf16 = avx512 && (eax1 >> 5 & 1u);
  u.avx512_fp16 = avx512 && (edx0 >> 23 & 1u);
  u.amx_bf16 = tiles && (edx0 >> 22 & 1u);
  u.amx_fp16 = tiles && (eax1 >> 21 & 1u);
#endif
  return u;
}
bool any(const LowPrecisionUnits& u) { return u.avx512_bf16 || u.amx_bf16 || u.avx512_fp16 || u.amx_fp16; }

// The units left by ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), read once as oneDNN reads it.
LowPrecisionUnits capped_by_environment(LowPrecisionUnits u) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap || !*cap) cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (cap && *cap && std::strcmp(cap, "ALL") != 0 && std::strcmp(cap, "all") != 0) {
    const std::string isa(cap);
    const bool amx = isa.find("AMX") != std::string::npos || isa.find("amx") != std::string::npos;
    const bool bf16 = amx || isa.find("BF16") != std::string::npos || isa.find("bf16") != std::string::npos;
    if (!amx) u.amx_bf16 = u.amx_fp16 = false;
    if (!bf16) u.avx512_bf16 = false;
  }
  return u;
}
}  // namespace

// Called per bf16 kernel call and per autocast op: the CPUID and environment answers are made once,
// only force_isa's level is read each time.
LowPrecisionUnits low_precision_units_at(Isa level) {
  static const LowPrecisionUnits found = cpuid_units();
  static const LowPrecisionUnits allowed = capped_by_environment(found);
  LowPrecisionUnits u = level == Isa::avx512 ? allowed : LowPrecisionUnits{};
  u.capped = any(found) && !any(u);
  return u;
}
LowPrecisionUnits low_precision_units() { return low_precision_units_at(active_isa()); }

std::string low_precision_units_text(const LowPrecisionUnits& u) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ", ";
    s += name;
  };
  add(u.avx512_bf16, "AVX512-BF16");
  add(u.amx_bf16, "AMX-BF16");
  add(u.avx512_fp16, "AVX512-FP16");
  add(u.amx_fp16, "AMX-FP16");
  if (s.empty()) s = u.capped ? "none (capped: the CPU has some, a cap hides them)" : "none";
  return s;
}

bool has_f16c() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);  // CPUID.1:ECX bit 29
  }();
  return yes;
#else
  return false;
#endif
}

bool has_avx512_bf16_instructions() {
  static const bool yes = cpuid_units().avx512_bf16;
  return yes;
}

namespace {
std::atomic<bool> g_bypass_bf16_units{false};
}  // namespace

bool bf16_kernels_enabled() {
  if (!FLUX_HAVE_ONEDNN) return false;
  if (g_bypass_bf16_units.load(std::memory_order_relaxed)) return true;
  const LowPrecisionUnits u = low_precision_units();
  return u.avx512_bf16 || u.amx_bf16;
}

bool bypass_bf16_units_check(bool on) { return g_bypass_bf16_units.exchange(on); }

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
