// Subnormal (denormal) floats: whether flux's kernels flush them to zero.
// A subnormal is a float below the smallest normal magnitude (float32: 1.18e-38). CPUs run arithmetic
// on them through slow microcode: as a model converges, Adam's moments and small gradients drift into
// that range and a training step can slow several times. So flux's CPU kernels run, by default, with
// flush-to-zero and denormals-are-zero (x86 MXCSR FTZ|DAZ, Arm FPCR.FZ) for float32, float16 and
// bfloat16 (PyTorch's torch.set_flush_denormal(True), oneDNN's and GPUs' usual fast-math setting),
// and keep IEEE subnormals for float64, which users pick for accuracy. The mode is set around each
// kernel on the calling thread and restored after it, and carried to flux's pool threads, so code of
// yours between flux calls keeps its own mode. FLUX_FLUSH_DENORMALS=0 (off), 1 (default) or all
// (float64 too) sets the starting value. OpenCL devices follow it at their next kernel build
// (-cl-denorms-are-zero); CUDA kernels are compiled flushing float32 (-ftz=true) and do not change.
#pragma once
#include "flux/dtype.hpp"

namespace flux {

/// Sets, for the whole process, whether flux's kernels flush subnormal floats to zero: float32,
/// float16 and bfloat16 when `on`, float64 too when also `float64`. Returns false (and flushes
/// nothing) where the CPU has no such mode; flush_denormals(false) always succeeds.
bool flush_denormals(bool on, bool float64 = false);

/// Whether kernels on `dtype` flush subnormals now (integers: false).
bool flushes_denormals(DType dtype = DType::f32);

}  // namespace flux
