// For tests that compare the backends' fused/library kernels with the portable composed ops.
#pragma once
#include "src/ops/ops_internal.hpp"

namespace flux::testing {

/// For its scope: the fused/library kernels (true, the default) or the portable path (false), as
/// FLUX_LIBRARY_KERNELS=0 does for a whole process.
struct LibraryKernels {
  explicit LibraryKernels(bool on) : saved(detail::library_kernels()) { detail::set_library_kernels(on); }
  ~LibraryKernels() { detail::set_library_kernels(saved); }
  LibraryKernels(const LibraryKernels&) = delete;
  LibraryKernels& operator=(const LibraryKernels&) = delete;
  bool saved;
};

}  // namespace flux::testing
