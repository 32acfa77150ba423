// What the library derives from a storage's content (Storage::derived): the backends' prepared weights
// (backend::PreparedCache) and the core's own derived values, with a version that names the content.
// Every write to the storage (detail::mark_written: the library's in-place writers and the public
// Tensor::buffer()) renews the version and drops the entries, so nothing derived can outlive the
// content it came from.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "flux/backend.hpp"

namespace flux {
class Tensor;
}

namespace flux::detail {

class StorageCache final : public backend::PreparedCache {
 public:
  StorageCache();
  std::shared_ptr<const backend::Prepared> find(const backend::PreparedKey& key) override;
  void insert(const backend::PreparedKey& key, std::shared_ptr<const backend::Prepared> p) override;
  /// Drops the entry for key, if there is one.
  void erase(const backend::PreparedKey& key);
  /// A process-wide number never used before, renewed by every write.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  /// The content changed: a new version, no entries.
  void written();

 private:
  static constexpr size_t kMaxEntries = 8;  // a layer runs at a few shapes; the oldest goes first
  std::atomic<uint64_t> version_;
  std::shared_mutex mutex_;  // per storage: lookups share it, an insert or a write takes it alone
  std::vector<std::pair<backend::PreparedKey, std::shared_ptr<const backend::Prepared>>> entries_;
};

/// t's storage's cache, created on first use (never null for a defined tensor).
StorageCache& storage_cache(const Tensor& t);

}  // namespace flux::detail
