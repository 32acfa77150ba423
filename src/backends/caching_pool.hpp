// Size-class cache of freed device blocks, shared by the CPU and OpenCL backends: training loops
// allocate the same sizes every step, so a freed block waits for the next request of its class.
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace flux::backends {

template <class Handle> class CachingPool {
 public:
  /// Classes: `min_block` bytes, powers of two up to 1 MiB, 64 KiB steps above; at most
  /// `max_cached` bytes are kept, beyond that a freed block goes back to the device.
  explicit CachingPool(size_t min_block, size_t max_cached = size_t(1) << 30)
      : min_block_(min_block), max_cached_(max_cached) {}

  size_t round(size_t bytes) const {
    if (bytes <= min_block_) return min_block_;
    if (bytes <= (size_t(1) << 20)) {
      size_t r = min_block_;
      while (r < bytes) r <<= 1;
      return r;
    }
    return (bytes + 65535) & ~size_t(65535);
  }

  /// A block for `bytes`: a cached one of its class, else alloc(rounded); when alloc gives a null
  /// handle the cache is emptied with free() and alloc is tried once more (null again is returned).
  template <class Alloc, class Free> Handle allocate(size_t bytes, Alloc alloc, Free free) {
    size_t r = round(bytes);
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = blocks_.find(r);
      if (it != blocks_.end() && !it->second.empty()) {
        Handle h = it->second.back();
        it->second.pop_back();
        cached_ -= r;
        used_ += r;
        return h;
      }
    }
    Handle h = alloc(r);
    if (!h) {
      release(free);
      h = alloc(r);
      if (!h) return h;
    }
    std::lock_guard<std::mutex> lock(m_);
    used_ += r;
    return h;
  }

  template <class Free> void deallocate(Handle h, size_t bytes, Free free) {
    size_t r = round(bytes);
    {
      std::lock_guard<std::mutex> lock(m_);
      used_ -= r;
      if (cached_ + r <= max_cached_) {
        blocks_[r].push_back(h);
        cached_ += r;
        return;
      }
    }
    free(h);
  }

  /// Gives every cached block back with free().
  template <class Free> void release(Free free) {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& [size, list] : blocks_)
      for (Handle h : list) free(h);
    blocks_.clear();
    cached_ = 0;
  }

  size_t used() {
    std::lock_guard<std::mutex> lock(m_);
    return used_;
  }
  size_t cached() {
    std::lock_guard<std::mutex> lock(m_);
    return cached_;
  }

 private:
  size_t min_block_, max_cached_;
  std::mutex m_;
  std::map<size_t, std::vector<Handle>> blocks_;
  size_t used_ = 0, cached_ = 0;
};

}  // namespace flux::backends
