// The floating-point mode CPU kernels run under (flux/denormals.hpp): flush-to-zero and
// denormals-are-zero for the dtypes the process-wide policy names. x86-64: MXCSR's FTZ (bit 15) and
// DAZ (bit 6), which govern SSE/AVX float and double alike, so a float64 kernel is run with the
// caller's own mode unless float64 flushing was asked for. AArch64: FPCR.FZ. Elsewhere: no mode.
// Only the calling thread's register changes, and only for the kernel's scope; flux's pool threads
// take the mode of the thread that started each region (parallel.cpp).
#pragma once
#include <cstdint>

#include "flux/dtype.hpp"

namespace flux::cpu_backend {

/// This thread's floating-point control bits (MXCSR without its status flags; FPCR); 0 elsewhere.
uint64_t float_control();
/// Makes this thread's control bits `control` (from float_control() of another thread); keeps its
/// status flags. Cheap when they already are.
void adopt_float_control(uint64_t control);

/// Whether this thread's float mode now compares a float32 subnormal as 0 (x86's DAZ, aarch64's FZ).
bool subnormals_compare_as_zero();
/// What a kernel comparing bf16 bits must know to give the float32 comparison x > 0's answer in this
/// thread's float mode: the largest bit pattern (read as int16) it sees as not positive, +0, or the
/// largest positive subnormal 0x007f where subnormals compare as 0.
int16_t bf16_largest_not_positive();

/// For its scope, this thread flushes subnormals when flushes_denormals(dtype); else nothing changes.
/// The destructor restores the thread's previous control bits.
class FloatModeScope {
 public:
  explicit FloatModeScope(DType dtype);
  ~FloatModeScope();
  FloatModeScope(const FloatModeScope&) = delete;
  FloatModeScope& operator=(const FloatModeScope&) = delete;

 private:
  uint64_t saved_ = 0;
  bool changed_ = false;
};

}  // namespace flux::cpu_backend
