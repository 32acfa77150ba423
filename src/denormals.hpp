// What the process-wide subnormal policy (src/denormals.cpp, flux/denormals.hpp) needs to know of the
// CPU it runs on. The CPU backend answers (src/backends/cpu/float_mode.cpp), so that the core reads
// the fact here and includes no backend file.
#pragma once

namespace flux::detail {

/// Whether this CPU has a flush-to-zero mode that flux can set (x86-64 with DAZ, AArch64).
bool can_flush_denormals();

}  // namespace flux::detail
