// Bytes of live tensor storage, counted by Storage's constructor and destructor (src/tensor.cpp), on
// every device together. For measuring what a tape keeps (bench/amp_memory.cpp, tests/test_autocast.cpp):
// after a forward pass, everything alive beyond the parameters and the input is the tape's saved values.
// Unlike a process's peak RSS, it does not depend on what the allocator keeps of freed memory.
#pragma once
#include <cstddef>

namespace flux::detail {

/// Bytes held by all live Storage objects now.
size_t live_storage_bytes();
/// The most live_storage_bytes() has been since the last reset_peak_storage_bytes() (or the start).
size_t peak_storage_bytes();
/// Starts a new peak from the bytes live now.
void reset_peak_storage_bytes();

}  // namespace flux::detail
