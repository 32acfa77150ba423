// Best-fit caching pool for host memory with block splitting and coalescing, the scheme of PyTorch's
// caching allocators: memory comes from the system in segments (2 MiB for requests up to 1 MiB, the
// request rounded up to 64 KiB above: a host pool's unused tail is address space a limit counts
// against, not a GPU's fixed granule), a request takes the smallest free block that fits (by size,
// then address) and splits off the rest, and a freed block merges with its free neighbours. Freed
// memory of one size thus serves requests of any other, so the pool's reserve follows the peak of live
// bytes instead of the sum of every size class's own peak (caching_pool.hpp, the simple reference).
// No process-wide lock: blocks live in arenas, each with its own mutex; a thread allocates from the
// arena it was given at its first request (threads take arenas round-robin) and a block goes back to
// the arena it came from. Same interface as CachingPool.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>

namespace flux::backends {

class BestFitPool {
 public:
  static constexpr size_t kAlign = 64;                     // every block starts 64-byte aligned
  static constexpr size_t kSmall = size_t(1) << 20;        // requests up to this share small segments
  static constexpr size_t kSmallSegment = size_t(2) << 20; // a small segment
  static constexpr size_t kLargeRound = size_t(64) << 10;  // large segments: the request rounded up to this
  static constexpr int kArenas = 8;

  /// At most `max_cached` free bytes are kept: a freed block that empties its segment beyond that goes
  /// back to the system.
  explicit BestFitPool(size_t max_cached = size_t(1) << 30) : max_cached_(max_cached) {}
  BestFitPool(const BestFitPool&) = delete;
  BestFitPool& operator=(const BestFitPool&) = delete;
  ~BestFitPool() {
    for (Arena& a : arenas_) {
      for (auto& [p, b] : a.live) delete b;
      for (Block* b : a.free_small) delete b;
      for (Block* b : a.free_large) delete b;
    }
  }

  /// The bytes a request occupies: a multiple of 64, at least 64.
  static size_t round(size_t bytes) { return bytes <= kAlign ? kAlign : (bytes + kAlign - 1) & ~(kAlign - 1); }

  /// A block for `bytes`: the best-fitting free block of this thread's arena, else a new segment from
  /// alloc(segment bytes), for a large request after the arena's wholly free large segments went back;
  /// when alloc gives null, every arena's free segments go back with free() and alloc is tried once
  /// more for the request alone (null again is returned).
  template <class Alloc, class Free> void* allocate(size_t bytes, Alloc alloc, Free free) {
    const size_t r = round(bytes);
    Arena& a = arenas_[arena_index()];
    std::unique_lock<std::mutex> lock(a.m);
    if (Block* b = take(a, r)) return b->ptr;
    if (r > kSmall) trim_large(a, free);
    lock.unlock();
    const size_t segment = r <= kSmall ? kSmallSegment : (r + kLargeRound - 1) & ~(kLargeRound - 1);
    size_t got = segment;
    char* p = static_cast<char*>(alloc(segment));
    if (!p && segment > r) {  // the segment's rest may be what is missing
      got = r;
      p = static_cast<char*>(alloc(r));
    }
    if (!p) {
      release(free);
      got = r;
      p = static_cast<char*>(alloc(r));
      if (!p) return nullptr;
    }
    lock.lock();
    auto* b = new Block{p, got, false, r <= kSmall, nullptr, nullptr};
    cached_.fetch_add(got, std::memory_order_relaxed);
    insert_free(a, b);
    Block* t = take(a, r);
    return t->ptr;
  }

  /// Gives p's block back to its arena, merged with its free neighbours; a segment left wholly free
  /// goes back to the system with free() when the pool already holds max_cached free bytes.
  template <class Free> void deallocate(void* p, size_t /*bytes*/, Free free) {
    const int own = arena_index();
    for (int i = 0; i < kArenas; ++i) {  // the block's arena: this thread's own, almost always
      Arena& a = arenas_[(own + i) % kArenas];
      std::lock_guard<std::mutex> lock(a.m);
      auto it = a.live.find(p);
      if (it == a.live.end()) continue;
      Block* b = it->second;
      a.live.erase(it);
      used_.fetch_sub(b->size, std::memory_order_relaxed);
      cached_.fetch_add(b->size, std::memory_order_relaxed);
      b->allocated = false;
      if (b->prev && !b->prev->allocated) b = merge(a, b->prev, b);
      if (b->next && !b->next->allocated) b = merge(a, b, b->next);
      if (!b->prev && !b->next && cached_.load(std::memory_order_relaxed) > max_cached_) {
        cached_.fetch_sub(b->size, std::memory_order_relaxed);
        void* segment = b->ptr;
        delete b;
        free(segment);
        return;
      }
      insert_free(a, b);
      return;
    }
  }

  /// Gives every wholly free segment back with free() (blocks in use keep their segments).
  template <class Free> void release(Free free) {
    for (Arena& a : arenas_) {
      std::lock_guard<std::mutex> lock(a.m);
      for (auto* set : {&a.free_small, &a.free_large})
        for (auto it = set->begin(); it != set->end();) {
          Block* b = *it;
          if (b->prev || b->next) {
            ++it;
            continue;
          }
          it = set->erase(it);
          cached_.fetch_sub(b->size, std::memory_order_relaxed);
          void* seg = b->ptr;
          delete b;
          free(seg);
        }
    }
  }

  /// Bytes in blocks handed out (rounded), and free bytes held in segments.
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t cached() const { return cached_.load(std::memory_order_relaxed); }
  /// Tests: free blocks (after coalescing) in every arena, and segments.
  size_t free_blocks() {
    size_t n = 0;
    for (Arena& a : arenas_) {
      std::lock_guard<std::mutex> lock(a.m);
      n += a.free_small.size() + a.free_large.size();
    }
    return n;
  }

 private:
  // A block: [ptr, ptr + size) of one segment; prev/next are its neighbours in that segment (null at
  // the segment's ends), so a block with neither is a whole segment.
  struct Block {
    char* ptr;
    size_t size;
    bool allocated;
    bool small;
    Block* prev;
    Block* next;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : std::less<const char*>()(a->ptr, b->ptr);
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;
  struct alignas(64) Arena {
    std::mutex m;
    FreeSet free_small, free_large;             // small and large segments' free blocks apart
    std::unordered_map<void*, Block*> live;     // blocks handed out, by address
  };

  // Before a new large segment: the arena's wholly free large segments go back to the system, so the
  // reserve follows the live bytes rather than the sum of segments that no longer fit (ResNet-18
  // training kept ~30% more than its storage peak without this; bench/results/2026-12-06-blas-below-cpu.md).
  template <class Free> void trim_large(Arena& a, Free free) {
    for (auto it = a.free_large.begin(); it != a.free_large.end();) {
      Block* b = *it;
      if (b->prev || b->next) {
        ++it;
        continue;
      }
      it = a.free_large.erase(it);
      cached_.fetch_sub(b->size, std::memory_order_relaxed);
      void* seg = b->ptr;
      delete b;
      free(seg);
    }
  }
  static FreeSet& set_of(Arena& a, const Block* b) { return b->small ? a.free_small : a.free_large; }
  void insert_free(Arena& a, Block* b) { set_of(a, b).insert(b); }

  // The smallest free block of at least r bytes in r's kind of segment, split when the rest is worth
  // keeping (any rest for small segments; at least 1 MiB for large ones, as PyTorch); null if none.
  Block* take(Arena& a, size_t r) {
    FreeSet& set = r <= kSmall ? a.free_small : a.free_large;
    Block key{nullptr, r, false, r <= kSmall, nullptr, nullptr};
    auto it = set.lower_bound(&key);
    if (it == set.end()) return nullptr;
    Block* b = *it;
    set.erase(it);
    const size_t rest = b->size - r;
    if (rest >= (b->small ? kAlign : kSmall)) {
      auto* tail = new Block{b->ptr + r, rest, false, b->small, b, b->next};
      if (b->next) b->next->prev = tail;
      b->next = tail;
      b->size = r;
      set.insert(tail);
    }
    b->allocated = true;
    a.live.emplace(b->ptr, b);
    cached_.fetch_sub(b->size, std::memory_order_relaxed);
    used_.fetch_add(b->size, std::memory_order_relaxed);
    return b;
  }

  // Merges free neighbours lo and hi (lo->next == hi) into lo, out of the free set (the block being
  // freed is not in it: erasing it finds nothing, addresses being unique).
  Block* merge(Arena& a, Block* lo, Block* hi) {
    FreeSet& set = set_of(a, lo);
    set.erase(lo);
    set.erase(hi);
    lo->size += hi->size;
    lo->next = hi->next;
    if (hi->next) hi->next->prev = lo;
    delete hi;
    return lo;
  }

  static int arena_index() {
    static std::atomic<int> next{0};
    thread_local const int index = next.fetch_add(1, std::memory_order_relaxed) % kArenas;
    return index;
  }

  size_t max_cached_;
  std::atomic<size_t> used_{0}, cached_{0};
  Arena arenas_[kArenas];
};

}  // namespace flux::backends
