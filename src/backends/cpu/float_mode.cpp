// Flush-to-zero around CPU kernels (float_mode.hpp).
#include "src/backends/cpu/float_mode.hpp"

#include <cstring>

#include "flux/denormals.hpp"
#include "src/denormals.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace flux::cpu_backend {

namespace {
#if defined(__x86_64__)
constexpr uint32_t kFlags = 0x3f;                 // MXCSR status flags (sticky exceptions)
constexpr uint32_t kFlush = 0x8000 | 0x0040;      // FTZ | DAZ
uint64_t read_control() { return _mm_getcsr(); }
void write_control(uint64_t c) { _mm_setcsr(uint32_t(c)); }
uint64_t flush_bits() { return kFlush; }
uint64_t control_bits(uint64_t c) { return c & ~uint64_t(kFlags); }
uint64_t status_bits(uint64_t c) { return c & kFlags; }
#elif defined(__aarch64__)
uint64_t read_control() {
  uint64_t c;
  asm volatile("mrs %0, fpcr" : "=r"(c));
  return c;
}
void write_control(uint64_t c) { asm volatile("msr fpcr, %0" : : "r"(c)); }
uint64_t flush_bits() { return uint64_t(1) << 24; }  // FPCR.FZ (status flags live in FPSR)
uint64_t control_bits(uint64_t c) { return c; }
uint64_t status_bits(uint64_t) { return 0; }
#else
uint64_t read_control() { return 0; }
void write_control(uint64_t) {}
uint64_t flush_bits() { return 0; }
uint64_t control_bits(uint64_t) { return 0; }
uint64_t status_bits(uint64_t) { return 0; }
#endif
}  // namespace

}  // namespace flux::cpu_backend

// The CPU's answer to the core's policy (src/denormals.hpp).
bool flux::detail::can_flush_denormals() {
#if defined(__x86_64__)
  // DAZ exists where FXSAVE's MXCSR_MASK has bit 6 (0 there means the default mask 0xFFBF, no DAZ).
  static const bool daz = [] {
    alignas(16) unsigned char area[512] = {};
    asm volatile("fxsave %0" : "=m"(area));
    uint32_t mask;
    std::memcpy(&mask, area + 28, sizeof mask);
    return (mask ? mask : 0xFFBFu) & 0x40u;
  }();
  return daz;
#elif defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

namespace flux::cpu_backend {

uint64_t float_control() { return control_bits(read_control()); }

void adopt_float_control(uint64_t control) {
  const uint64_t now = read_control();
  if (control_bits(now) != control) write_control(status_bits(now) | control);
}

bool subnormals_compare_as_zero() {
  // Asked of the mode itself: the smallest positive subnormal compared with 0 now (volatile: not folded).
  const uint32_t smallest = 1;
  volatile float tiny;
  std::memcpy(const_cast<float*>(&tiny), &smallest, sizeof smallest);
  return !(tiny > 0.0f);
}

int16_t bf16_largest_not_positive() { return subnormals_compare_as_zero() ? int16_t(0x007f) : int16_t(0); }

FloatModeScope::FloatModeScope(DType dtype) {
  if (!flushes_denormals(dtype)) return;
  saved_ = read_control();
  if ((saved_ & flush_bits()) == flush_bits()) return;
  write_control(saved_ | flush_bits());
  changed_ = true;
}

FloatModeScope::~FloatModeScope() {
  if (changed_) adopt_float_control(control_bits(saved_));
}

}  // namespace flux::cpu_backend
