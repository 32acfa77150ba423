// Run-time ISA dispatch for the CPU kernels. A hot loop is written once, as a plain (always_inline)
// range function; FLUX_CPU_VARIANTS compiles it three times — baseline x86-64, AVX2+FMA, AVX-512 —
// and calls the best the CPU supports, checked once at run time (__builtin_cpu_supports), so the
// shipped library needs no -march flag. The baseline copy is the reference the tests compare with.
#pragma once
#include <string>

namespace flux::cpu_backend {

enum class Isa : int { baseline = 0, avx2 = 1, avx512 = 2 };

/// The best level this CPU (and its OS) supports: AVX-512 needs F, BW, VL and DQ; AVX2 needs FMA.
Isa detected_isa();
/// The level kernels use now: detected_isa() capped by ONEDNN_MAX_CPU_ISA (DNNL_MAX_CPU_ISA) as oneDNN
/// is, or lower where force_isa() asked for it.
Isa active_isa();
/// Tests and benchmarks: run the kernels at `level` (clamped to detected_isa()); returns the old one.
Isa force_isa(Isa level);
/// "baseline x86-64", "AVX2+FMA", "AVX-512".
const char* isa_name(Isa level);

/// The CPU's low-precision units as the kernels may use them now: none below an active AVX-512
/// level (force_isa), AMX and AVX512-BF16 off where ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) caps
/// oneDNN below them, AMX only where the OS enables its tile state (XCR0).
struct LowPrecisionUnits {
  bool avx512_bf16 = false, amx_bf16 = false, avx512_fp16 = false, amx_fp16 = false;
  bool capped = false;  // the CPU has some of them, but a cap above hides them
};
LowPrecisionUnits low_precision_units();
/// The same at a given ISA level, whatever force_isa says now (fixed per process for each level).
LowPrecisionUnits low_precision_units_at(Isa level);
/// "AVX512-BF16, AMX-BF16", or "none" (with "(capped)" when a cap hides units the CPU has).
std::string low_precision_units_text(const LowPrecisionUnits& u);

/// Whether the CPU has F16C (vcvtps2ph/vcvtph2ps: the f16 casts of half_cast.cpp), by CPUID.
bool has_f16c();
/// Whether the CPU has AVX512-BF16 (vcvtneps2bf16: the bf16 casts of half_cast.cpp), by CPUID and the
/// OS's AVX-512 state, whatever ONEDNN_MAX_CPU_ISA says (that caps oneDNN's kernels, not ours).
bool has_avx512_bf16_instructions();

/// Whether the bf16 library kernels (oneDNN: matmul_low_precision, linear_forward, conv_*) run: the
/// CPU's bf16 units (AVX512-BF16 or AMX-BF16, as low_precision_units) and oneDNN built in. Elsewhere
/// they return false at once and the core computes through float32.
bool bf16_kernels_enabled();
/// Tests: ask oneDNN for bf16 kernels whatever the units (on a CPU without them oneDNN must decline
/// and the kernels return false cleanly). Returns the previous setting.
bool bypass_bf16_units_check(bool on);

}  // namespace flux::cpu_backend

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLUX_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FLUX_CPU_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#else
#define FLUX_CPU_TARGET_AVX2
#define FLUX_CPU_TARGET_AVX512
#endif

// FLUX_CPU_VARIANTS(name, body): defines `name(args...)`, which calls body(args...) compiled for the
// active ISA level. `body` is a function template marked FLUX_CPU_INLINE so that each variant
// inlines (and vectorises) it under its own target. Call it inside parallel_for's chunk, not around
// it: a lambda does not inherit its enclosing function's target.
#define FLUX_CPU_INLINE [[gnu::always_inline]] inline
#define FLUX_CPU_VARIANTS(name, body)                                                        \
  template <class... A> void name##_baseline(A... a) { body(a...); }                         \
  template <class... A> FLUX_CPU_TARGET_AVX2 void name##_avx2(A... a) { body(a...); }        \
  template <class... A> FLUX_CPU_TARGET_AVX512 void name##_avx512(A... a) { body(a...); }    \
  template <class... A> void name(A... a) {                                                   \
    switch (::flux::cpu_backend::active_isa()) {                                                     \
      case ::flux::cpu_backend::Isa::avx512: return name##_avx512(a...);                             \
      case ::flux::cpu_backend::Isa::avx2: return name##_avx2(a...);                                 \
      default: return name##_baseline(a...);                                                 \
    }                                                                                        \
  }
