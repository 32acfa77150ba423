// Weights kept in a oneDNN kernel's own layout between calls (conv.cpp: reordered conv weights;
// matmul.cpp: packed Dense weights). A copy is valid for the user buffer it came from while that
// buffer's content stamp (Storage::stamp, passed by the core) is unchanged, and, where the reorder
// multiplied per-channel scales in (the fused Conv + BatchNorm), while the scales are the same.
// Layers of one shape share a cached primitive, so each primitive keeps one copy per buffer, up to
// kMax copies and kMaxBytes, refilling the least recently used. A model runs its layers in a cycle,
// so a bound below its number of layers of one shape makes every call a refill: with 8 copies, 24
// Dense 512 -> 1000 layers at batch 8 took 1040 us a call (each repacked its 2 MB), 161 us with all
// 24 kept (1 thread, AVX-512). Callers hold their cache's mutex; a copy set is used by one thread at a time.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace flux::cpu_backend {

class KeptWeights {
 public:
  static constexpr size_t kMax = 64;
  static constexpr size_t kMaxBytes = size_t(512) << 20;

  /// The copy for (from, stamp, scales[0, n_scales)): kept, or (re)filled now by fill(memory&) into a
  /// new copy of `desc` (up to kMax) or into the least recently used one.
  template <class Fill>
  const dnnl::memory& get(const void* from, uint64_t stamp, const float* scales, size_t n_scales,
                          const dnnl::memory::desc& desc, const dnnl::engine& engine, Fill&& fill) {
    ++calls_;
    Copy* slot = nullptr;
    for (Copy& c : copies_)
      if (c.from == from) slot = &c;
    if (!slot || slot->stamp != stamp || !std::equal(slot->scales.begin(), slot->scales.end(), scales, scales + n_scales)) {
      // The first copy whatever its size (the caller reads the kernel's layout from it).
      if (!slot && (copies_.empty() || (copies_.size() < kMax && bytes_ + desc.get_size() <= kMaxBytes))) {
        slot = &copies_.emplace_back();
        slot->memory = dnnl::memory(desc, engine);
        bytes_ += desc.get_size();
      }
      if (!slot)
        slot = &*std::min_element(copies_.begin(), copies_.end(), [](const Copy& a, const Copy& b) { return a.used < b.used; });
      fill(slot->memory);
      slot->from = from;
      slot->stamp = stamp;
      slot->scales.assign(scales, scales + n_scales);
    }
    slot->used = calls_;
    return slot->memory;
  }

 private:
  struct Copy {
    const void* from = nullptr;
    uint64_t stamp = 0;
    std::vector<float> scales;
    dnnl::memory memory;
    uint64_t used = 0;  // calls_ at the last use
  };
  std::vector<Copy> copies_;
  uint64_t calls_ = 0;
  size_t bytes_ = 0;  // of all copies (one primitive's copies share one desc)
};

}  // namespace flux::cpu_backend
