// The process-wide subnormal policy (flux/denormals.hpp). The CPU backend applies it around each
// kernel and says whether the CPU can flush (src/denormals.hpp); plugins read it through
// flux_denormal_flush_mask below.
#include "flux/denormals.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "flux/error.hpp"
#include "src/denormals.hpp"
#include "src/environment.hpp"

namespace flux {

namespace {
constexpr int kFloat32 = 1, kFloat64 = 2;  // bits of the mode: which dtypes flush

/// FLUX_FLUSH_DENORMALS: 0 (IEEE subnormals everywhere), 1 (float32/16/bf16 flush; the default) or
/// all (float64 too); unset or empty: 1.
int initial_mode() {
  const std::string v = environment::choice("FLUX_FLUSH_DENORMALS");
  return v == "0" ? 0 : v == "all" ? kFloat32 | kFloat64 : kFloat32;
}

std::atomic<int>& mode() {
  static std::atomic<int> m{detail::can_flush_denormals() ? initial_mode() : 0};
  return m;
}
}  // namespace

bool flush_denormals(bool on, bool float64) {
  if (on && !detail::can_flush_denormals()) {
    mode().store(0);
    return false;
  }
  mode().store(on ? (kFloat32 | (float64 ? kFloat64 : 0)) : 0);
  return true;
}

bool flushes_denormals(DType dtype) {
  const int m = mode().load(std::memory_order_relaxed);
  switch (dtype) {
    case DType::f32: case DType::f16: case DType::bf16: return m & kFloat32;
    case DType::f64: return m & kFloat64;
    default: return false;
  }
}

}  // namespace flux

/// For plugins, which do not link libflux (looked up with dlsym): bit 0 float32 (and float16,
/// bfloat16) flushes, bit 1 float64 flushes.
extern "C" __attribute__((visibility("default"))) int flux_denormal_flush_mask() {
  return (flux::flushes_denormals(flux::DType::f32) ? 1 : 0) | (flux::flushes_denormals(flux::DType::f64) ? 2 : 0);
}
