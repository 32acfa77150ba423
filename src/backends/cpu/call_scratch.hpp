// Scratch memory for one kernel call (oneDNN's user scratchpads and its operands in the kernels'
// layouts), taken from the CPU pool as the call asks for it and given back when the call ends.
// Scratch thus shares the pool's cached blocks with the tensors, instead of a block kept per thread
// and operand sized to the largest call beside the pool (figures in
// bench/results/2026-12-06-pool-range.md), and FLUX_CPU_MEMORY_LIMIT counts it (beyond the limit:
// flux::OutOfMemory, as for a tensor).
#pragma once
#include <algorithm>
#include <cstddef>

namespace flux::cpu_backend {

/// `bytes` (at least 1) from the CPU pool, 64-byte aligned; flux::OutOfMemory where it cannot.
void* scratch_allocate(size_t bytes);
/// Gives back a block of scratch_allocate(bytes).
void scratch_deallocate(void* p, size_t bytes);

/// One call's scratch blocks, named by `Which` (an enum of kBlocks values): each valid until the
/// object ends; asking again for the same block gives the old one back and takes a new one.
template <class Which, int kBlocks> class CallScratch {
 public:
  CallScratch() = default;
  ~CallScratch() {
    for (Block& b : blocks_)
      if (b.data) scratch_deallocate(b.data, b.size);
  }
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;

  /// Block `which`, at least `bytes`.
  void* get(Which which, size_t bytes) {
    Block& b = blocks_[static_cast<int>(which)];
    if (b.data) scratch_deallocate(b.data, b.size);
    b = {};
    const size_t size = std::max<size_t>(bytes, 1);
    b.data = scratch_allocate(size);
    b.size = size;
    return b.data;
  }

 private:
  struct Block {
    void* data = nullptr;
    size_t size = 0;
  };
  Block blocks_[kBlocks];
};

}  // namespace flux::cpu_backend
