// What OpenBLAS and oneDNN run on this CPU, read once (dependency_check.hpp).
#include "src/backends/cpu/dependency_check.hpp"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace flux::cpu_backend {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// OpenBLAS's x86-64 core names (driver/others/dynamic.c) and the SIMD their kernels use. Flux's levels:
// AVX-512 (F, BW, VL, DQ), AVX2 with FMA, and everything older counts as baseline.
struct Core {
  const char* name;
  Isa level;
  const char* simd;
};
constexpr Core kCores[] = {
    {"katmai", Isa::baseline, "SSE"},          {"coppermine", Isa::baseline, "SSE"},
    {"northwood", Isa::baseline, "SSE2"},      {"prescott", Isa::baseline, "SSE3"},
    {"banias", Isa::baseline, "SSE2"},         {"atom", Isa::baseline, "SSSE3"},
    {"core2", Isa::baseline, "SSSE3"},         {"penryn", Isa::baseline, "SSE4.1"},
    {"dunnington", Isa::baseline, "SSE4.1"},   {"nehalem", Isa::baseline, "SSE4.2"},
    {"athlon", Isa::baseline, "SSE"},          {"opteron", Isa::baseline, "SSE2"},
    {"opteron_sse3", Isa::baseline, "SSE3"},   {"barcelona", Isa::baseline, "SSE4a"},
    {"nano", Isa::baseline, "SSE3"},           {"bobcat", Isa::baseline, "SSE4a"},
    {"sandybridge", Isa::baseline, "AVX"},     {"bulldozer", Isa::baseline, "AVX, FMA4"},
    {"piledriver", Isa::baseline, "AVX, FMA3"}, {"steamroller", Isa::baseline, "AVX, FMA3"},
    {"excavator", Isa::baseline, "AVX, FMA3"}, {"haswell", Isa::avx2, "AVX2"},
    {"zen", Isa::avx2, "AVX2"},                {"skylakex", Isa::avx512, "AVX-512"},
    {"cooperlake", Isa::avx512, "AVX-512"},    {"sapphirerapids", Isa::avx512, "AVX-512"},
};

#if FLUX_HAVE_ONEDNN
// oneDNN's ISA values (dnnl_types.h) as flux levels: the avx512_core family is AVX-512 with BW/VL/DQ;
// avx512_mic (Xeon Phi) lacks BW and VL, so it counts as AVX2.
std::optional<Isa> onednn_level_of(dnnl_cpu_isa_t isa, std::string& name) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: name = "sse41"; return Isa::baseline;
    case dnnl_cpu_isa_avx: name = "avx"; return Isa::baseline;
    case dnnl_cpu_isa_avx2: name = "avx2"; return Isa::avx2;
    case dnnl_cpu_isa_avx2_vnni: name = "avx2_vnni"; return Isa::avx2;
    case dnnl_cpu_isa_avx512_mic: name = "avx512_mic"; return Isa::avx2;
    case dnnl_cpu_isa_avx512_mic_4ops: name = "avx512_mic_4ops"; return Isa::avx2;
    case dnnl_cpu_isa_avx512_core: name = "avx512_core"; return Isa::avx512;
    case dnnl_cpu_isa_avx512_core_vnni: name = "avx512_core_vnni"; return Isa::avx512;
    case dnnl_cpu_isa_avx512_core_bf16: name = "avx512_core_bf16"; return Isa::avx512;
    case dnnl_cpu_isa_avx512_core_amx: name = "avx512_core_amx"; return Isa::avx512;
    default: name = "isa " + std::to_string(int(isa)); return std::nullopt;
  }
}
#endif

DependencyFacts read_facts() {
  DependencyFacts f;
  f.cpu = detected_isa();
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  f.blas_config = config ? config : "";
  f.blas_core = core ? core : "";
  std::istringstream words(f.blas_config);
  std::string name, version;
  words >> name >> version;
  f.blas_version = name == "OpenBLAS" && !version.empty() ? name + " " + version : "OpenBLAS";
  f.blas_level = openblas_core_level(f.blas_core, &f.blas_simd);
#if FLUX_HAVE_ONEDNN
  f.onednn = true;
  const dnnl_version_t* v = dnnl_version();
  f.onednn_version = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  f.onednn_level = onednn_level_of(dnnl_get_effective_cpu_isa(), f.onednn_isa);
#endif
  return f;
}

// A level below `cpu`; unknown levels are trusted.
bool below(const std::optional<Isa>& level, Isa cpu) { return level && int(*level) < int(cpu); }
}  // namespace

std::optional<Isa> openblas_core_level(const std::string& core, std::string* simd) {
  const std::string key = lower(core);
  for (const Core& c : kCores)
    if (key == c.name) {
      if (simd) *simd = c.simd;
      return c.level;
    }
  if (simd) simd->clear();
  return std::nullopt;
}

const DependencyFacts& dependency_facts() {
  static const DependencyFacts facts = read_facts();
  return facts;
}

bool blas_below_cpu() {
  const DependencyFacts& f = dependency_facts();
  const Isa cpu = active_isa();
  return f.onednn && below(f.blas_level, cpu) && !below(f.onednn_level, cpu);
}

bool onednn_below_cpu() {
  const DependencyFacts& f = dependency_facts();
  const Isa cpu = active_isa();
  return f.onednn && below(f.onednn_level, cpu) && !below(f.blas_level, cpu);
}

std::string dependency_line() {
  const DependencyFacts& f = dependency_facts();
  const Isa cpu = active_isa();
  const std::string here = std::string("this CPU (") + isa_name(cpu) + ")";
  const std::string blas = f.blas_version + " runs " + (f.blas_core.empty() ? "?" : f.blas_core) + " kernels" +
                           (f.blas_simd.empty() ? std::string(" (a core this check does not know)") : " (" + f.blas_simd + ")");
  const std::string dnn = f.onednn ? f.onednn_version + " runs " + f.onednn_isa : std::string("no oneDNN in this build");
  if (blas_below_cpu()) return blas + " below " + here + ": float32 GEMMs use " + f.onednn_version;
  if (onednn_below_cpu()) return dnn + " below " + here + ": thin float32 GEMMs use OpenBLAS";
  const bool blas_low = below(f.blas_level, cpu), dnn_low = f.onednn && below(f.onednn_level, cpu);
  if (blas_low && dnn_low) return blas + " and " + dnn + ", both below " + here;
  if (blas_low) return blas + " below " + here + "; " + dnn + ", no other float32 GEMM";
  return blas + ", " + dnn + ": at the level of " + here;
}

}  // namespace flux::cpu_backend
