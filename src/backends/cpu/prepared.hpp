// Weights prepared for a kernel (packed panels, Winograd transforms, oneDNN's blocked layouts), kept in
// the weight tensor's cache that the core empties on every write (backend::PreparedCache). One helper
// for every kernel: find the entry, or make it now and keep it. Entries are immutable once kept, so
// callers on any number of threads read them at once.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "flux/backend.hpp"

namespace flux::cpu_backend {

/// The first entry of a PreparedKey: which kernel the prepared weights are for.
/// The bf16 kinds hold oneDNN's bf16 layouts of a bf16 weight tensor (matmul_onednn.cpp, conv_onednn.cpp).
enum class PreparedKind : int64_t {
  panels = 0, onednn_linear = 1, onednn_conv = 2, winograd = 3, onednn_linear_bf16 = 4, onednn_conv_bf16 = 5
};

/// A key from the kind and the integers that name the shape (at most 39).
template <class... I> backend::PreparedKey prepared_key(PreparedKind kind, I... values) {
  static_assert(sizeof...(I) < 40, "a PreparedKey holds 40 integers");
  backend::PreparedKey k{};
  k[0] = int64_t(kind);
  size_t i = 1;
  ((k[i++] = int64_t(values)), ...);
  return k;
}

/// Floats made from a weight buffer (panels, transforms), 64-byte aligned.
struct PreparedFloats final : backend::Prepared {
  explicit PreparedFloats(size_t n) : data(new (std::align_val_t(64)) float[n]) {}
  ~PreparedFloats() override { operator delete[](data, std::align_val_t(64)); }
  PreparedFloats(const PreparedFloats&) = delete;
  PreparedFloats& operator=(const PreparedFloats&) = delete;
  float* data;
};

/// A cache of the caller's own, for preparing weights outside a tensor (the tuner's timers): keeps
/// every entry until it goes out of scope.
class LocalPreparedCache final : public backend::PreparedCache {
 public:
  std::shared_ptr<const backend::Prepared> find(const backend::PreparedKey& key) override {
    for (auto& [k, p] : kept_)
      if (k == key) return p;
    return nullptr;
  }
  void insert(const backend::PreparedKey& key, std::shared_ptr<const backend::Prepared> p) override {
    kept_.emplace_back(key, std::move(p));
  }

 private:
  std::vector<std::pair<backend::PreparedKey, std::shared_ptr<const backend::Prepared>>> kept_;
};

/// The entry of `cache` under `key` as a T, made by make() (returning std::shared_ptr<T>) and kept
/// when absent. A null cache: made for this call only.
template <class T, class Make>
std::shared_ptr<const T> prepared(backend::PreparedCache* cache, const backend::PreparedKey& key, Make&& make) {
  if (cache)
    if (std::shared_ptr<const backend::Prepared> kept = cache->find(key)) return std::static_pointer_cast<const T>(kept);
  std::shared_ptr<const T> made = make();
  if (cache && made) cache->insert(key, made);
  return made;
}

}  // namespace flux::cpu_backend
