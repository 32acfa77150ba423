// Storage::derived (storage_cache.hpp).
#include "src/storage_cache.hpp"

#include <algorithm>
#include <mutex>

#include "flux/tensor.hpp"
#include "src/internal.hpp"

namespace flux::detail {

namespace {
uint64_t fresh_version() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

StorageCache::StorageCache() : version_(fresh_version()) {}

std::shared_ptr<const backend::Prepared> StorageCache::find(const backend::PreparedKey& key) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (const auto& [k, p] : entries_)
    if (k == key) return p;
  return nullptr;
}

void StorageCache::insert(const backend::PreparedKey& key, std::shared_ptr<const backend::Prepared> p) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  for (auto& [k, old] : entries_)
    if (k == key) {
      old = std::move(p);
      return;
    }
  if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
  entries_.emplace_back(key, std::move(p));
}

void StorageCache::erase(const backend::PreparedKey& key) {
  std::shared_ptr<const backend::Prepared> dropped;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == key) {
        dropped = std::move(it->second);
        entries_.erase(it);
        break;
      }
  }  // freed outside the lock
}

void StorageCache::written() {
  std::vector<std::pair<backend::PreparedKey, std::shared_ptr<const backend::Prepared>>> dropped;
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    version_.store(fresh_version(), std::memory_order_release);
    dropped.swap(entries_);
  }  // freed outside the lock
}

StorageCache& storage_cache(const Tensor& t) {
  Storage& s = *t.impl()->storage;
  StorageCache* c = s.derived.load(std::memory_order_acquire);
  if (c) return *c;
  auto fresh = std::make_unique<StorageCache>();
  if (s.derived.compare_exchange_strong(c, fresh.get(), std::memory_order_acq_rel)) return *fresh.release();
  return *c;  // another thread made it first
}

void mark_written(const Tensor& t) {
  if (!t.defined() || !t.impl()->storage) return;
  if (StorageCache* c = t.impl()->storage->derived.load(std::memory_order_acquire)) c->written();
}

uint64_t content_version(const Tensor& t) {
  return t.defined() && t.impl()->storage ? storage_cache(t).version() : 0;
}

backend::Buffer buffer_of(const Tensor& t) {
  const TensorImpl* i = t.impl();
  if (!i) fail("[buffer] the tensor is undefined (default-constructed)");
  return {i->storage->buffer.handle, i->storage->buffer.offset + i->offset};
}

}  // namespace flux::detail
