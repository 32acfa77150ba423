// What the CPU backend's libraries actually run, checked once against the CPU's own ISA (CPUID):
// OpenBLAS's core type (the kernels its DYNAMIC_ARCH build picked, or OPENBLAS_CORETYPE forced) and
// oneDNN's effective ISA. An OpenBLAS older than the CPU model runs an old core's kernels (Debian 12's
// 0.3.21 runs Prescott's SSE3 kernels on Sapphire Rapids); the kernel rules (kernel_choice.cpp) read
// these facts and send float32 GEMMs to the library that runs at the CPU's level.
#pragma once
#include <optional>
#include <string>

#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

/// The facts, read once (the first call) from the libraries and CPUID.
struct DependencyFacts {
  Isa cpu = Isa::baseline;          // detected_isa(): what the CPU and its OS support
  std::string blas_version;         // "OpenBLAS 0.3.21" (from openblas_get_config)
  std::string blas_config;          // openblas_get_config()
  std::string blas_core;            // openblas_get_corename(): "Prescott", "SkylakeX", "Zen", ...
  std::optional<Isa> blas_level;    // the level of that core's kernels; nullopt: a name this table lacks
  std::string blas_simd;            // "SSE3", "AVX2", "AVX-512", ... ("" when unknown)
  bool onednn = false;              // built with oneDNN
  std::string onednn_version;       // "oneDNN 2.6.3"
  std::string onednn_isa;           // "avx512_core_bf16", ... (dnnl_get_effective_cpu_isa)
  std::optional<Isa> onednn_level;  // the flux level of that ISA; nullopt for an unknown value
};
const DependencyFacts& dependency_facts();

/// The ISA level of an OpenBLAS x86-64 core name (case-insensitive) and its SIMD in words; nullopt for
/// a name the table does not know (an unknown core is trusted, never routed around).
std::optional<Isa> openblas_core_level(const std::string& core, std::string* simd = nullptr);

/// Whether OpenBLAS runs kernels below the level flux's own kernels run at now (active_isa()), and
/// oneDNN runs at least at that level (so there is somewhere better to go). Cheap: two loads after the
/// first call.
bool blas_below_cpu();
/// Whether oneDNN runs below active_isa() while OpenBLAS does not.
bool onednn_below_cpu();

/// One line for versioninfo(), flux-info and the bench header, e.g. "OpenBLAS 0.3.21 runs Prescott
/// kernels (SSE3) below this CPU (AVX-512): float32 GEMMs use oneDNN", or "... match this CPU".
std::string dependency_line();

}  // namespace flux::cpu_backend
