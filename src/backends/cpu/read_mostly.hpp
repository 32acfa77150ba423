// A map filled once per key and then only read, by any number of threads at once: the CPU backend's
// oneDNN primitives by shape (matmul_onednn.cpp, conv_onednn.cpp). Lookups share a reader lock; a miss makes
// the value under one process-wide creation lock (oneDNN's primitive-descriptor creation touches its
// global caches, which a sanitizer cannot see synchronised; only misses wait, and a thread that
// waited finds the value made) and stores it. Values are never freed while the
// process runs (callers hold plain pointers); past `bound` entries, new keys get a value of their own
// per call, kept in a short per-thread list.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace flux::cpu_backend {

/// One lock for every map's misses (an inline function: one in the process, not one per type;
/// recursive, so a make() that fills another map cannot deadlock).
inline std::recursive_mutex& creation_mutex() {
  static std::recursive_mutex m;
  return m;
}

template <class Key, class T>
class ReadMostly {
 public:
  explicit ReadMostly(size_t bound) : bound_(bound) {}

  /// The value for key (null allowed: "not available"), made by make() -> std::unique_ptr<const T> on a miss.
  template <class Make> const T* get(const Key& key, Make&& make) {
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second.get();
    }
    std::lock_guard<std::recursive_mutex> creating(creation_mutex());
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second.get();
    }
    std::unique_ptr<const T> made = make();
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.get();
    if (map_.size() < bound_) return map_.emplace(key, std::move(made)).first->second.get();
    lock.unlock();
    thread_local std::vector<std::unique_ptr<const T>> spill;  // the calls in flight on this thread
    if (spill.size() >= 8) spill.erase(spill.begin());
    spill.push_back(std::move(made));
    return spill.back().get();
  }

 private:
  const size_t bound_;
  std::shared_mutex mutex_;
  std::map<Key, std::unique_ptr<const T>> map_;
};

}  // namespace flux::cpu_backend
