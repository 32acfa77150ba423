// Float arrays made from a weight buffer and kept between calls: matmul.cpp's packed panels of Dense
// weights, winograd.cpp's transformed conv weights. An array is valid for the buffer it came from
// while that buffer's content stamp (Storage::stamp, passed by the core) and the shape it was made for
// are unchanged; up to `max_sets` arrays and `max_bytes` in all, the least recently used refilled
// (one array larger than max_bytes is kept all the same). The caller serialises calls (its mutex).
// As kept_weights.hpp's oneDNN copies, a model's layers take one array each while they fit the bounds.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace flux::cpu_backend {

class KeptFloats {
 public:
  KeptFloats(size_t max_sets, size_t max_bytes) : max_sets_(max_sets), max_bytes_(max_bytes) {}

  /// The array of `size` floats for (from, stamp, shape_a, shape_b): kept, or (re)made now by
  /// fill(float*) over zeros.
  template <class Fill>
  const float* get(const void* from, uint64_t stamp, int64_t shape_a, int64_t shape_b, size_t size, Fill&& fill) {
    ++calls_;
    Set* slot = nullptr;
    for (Set& s : sets_)
      if (s.from == from) slot = &s;
    if (!slot || slot->stamp != stamp || slot->a != shape_a || slot->b != shape_b) {
      if (!slot && sets_.size() < max_sets_ && bytes_ + size * sizeof(float) <= max_bytes_) slot = &sets_.emplace_back();
      if (!slot && !sets_.empty())
        slot = &*std::min_element(sets_.begin(), sets_.end(), [](const Set& x, const Set& y) { return x.used < y.used; });
      if (!slot) slot = &sets_.emplace_back();
      bytes_ -= slot->data.size() * sizeof(float);
      slot->data.assign(size, 0.0f);
      slot->data.shrink_to_fit();
      bytes_ += size * sizeof(float);
      fill(slot->data.data());
      slot->from = from, slot->stamp = stamp, slot->a = shape_a, slot->b = shape_b;
    }
    slot->used = calls_;
    return slot->data.data();
  }

  /// Drops the array made from `from`, if any (its memory is freed; the slot is reused).
  void forget(const void* from) {
    for (Set& s : sets_)
      if (s.from == from) {
        bytes_ -= s.data.size() * sizeof(float);
        s.data = std::vector<float>();
        s.from = nullptr, s.stamp = 0, s.used = 0;
      }
  }

 private:
  struct Set {
    const void* from = nullptr;
    uint64_t stamp = 0;
    int64_t a = 0, b = 0;
    std::vector<float> data;
    uint64_t used = 0;
  };
  size_t max_sets_, max_bytes_;
  std::deque<Set> sets_;  // stable addresses
  uint64_t calls_ = 0;
  size_t bytes_ = 0;
};

}  // namespace flux::cpu_backend
