// Best-fit caching pool for host memory with block splitting and coalescing, the scheme of PyTorch's
// caching allocators: a request takes the smallest free block that fits (by size, then address) and
// splits off the rest, and a freed block merges with its free neighbours. Freed memory of one size
// thus serves requests of any other, so the pool's reserve follows the peak of live bytes instead of
// the sum of every size class's own peak (caching_pool.hpp, the simple reference).
// Requests up to 256 KiB share 2 MiB segments from the system. Larger ones live in one contiguous
// range of address space (as PyTorch's expandable segments): reserved once without memory (2 MiB
// aligned, transparent huge pages asked for), made usable (committed) at its end in 2 MiB steps when
// no free block fits, so every free block of the range merges with its neighbours and the committed
// pages stay mapped from one step of a training loop to the next (no page faults once its layout
// repeats); its free end goes back to the system with release() or beyond max_cached. Where no range
// can be reserved (or with range_bytes 0, and for a request beyond what is left of it), large requests
// get segments of their own from the system (the request rounded up to 64 KiB), whose wholly free ones
// go back before a new one is taken.
// No process-wide lock on small blocks: they live in arenas, each with its own mutex; a thread
// allocates from the arena it was given at its first request (threads take arenas round-robin) and a
// block goes back to the arena it came from. Large blocks of every thread share the first arena's
// range (and its lock) when there are ranges. In front of the arenas, each thread keeps its last few
// freed blocks of up to 4 KiB (16 at most) and serves requests of their size from them without any
// lock: the small tensors of a training step come and go in that pattern. Same interface as CachingPool; deallocate must be
// given the bytes that allocate was.
#pragma once
#include <sys/mman.h>

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
  static constexpr size_t kSmall = size_t(256) << 10;      // requests up to this share small segments
  static constexpr size_t kSmallSegment = size_t(2) << 20; // a small segment
  static constexpr size_t kLargeRound = size_t(64) << 10;  // large segments: the request rounded up to this
  static constexpr size_t kLargeSplit = size_t(1) << 20;   // a large segment's block splits off rests of this or more
  static constexpr size_t kRangeStep = size_t(2) << 20;    // a range is committed in these steps
  static constexpr size_t kPage = 4096;                    // and given back in pages
  static constexpr int kArenas = 8;

  /// At most `max_cached` free bytes are kept: a freed block that empties its segment (or the range's
  /// end) beyond that goes back to the system. `range_bytes`: the address space each arena reserves
  /// for its large blocks (0: none, segments only).
  explicit BestFitPool(size_t max_cached = size_t(1) << 30, size_t range_bytes = 0)
      : max_cached_(max_cached), range_bytes_(range_bytes & ~(kRangeStep - 1)) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().emplace(id_, this);
  }
  BestFitPool(const BestFitPool&) = delete;
  BestFitPool& operator=(const BestFitPool&) = delete;
  ~BestFitPool() {
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      registry().erase(id_);  // threads' front blocks of this pool are dropped from now on
    }
    for (Arena& a : arenas_) {
      for (auto& [p, b] : a.live) delete b;
      for (Block* b : a.free_small) delete b;
      for (Block* b : a.free_large) delete b;
      if (a.range) munmap(a.range, range_bytes_);
    }
  }

  /// The bytes a request occupies: a multiple of 64, at least 64; above kSmall, of the 4 KiB page (so a
  /// range's free end goes back whole).
  static size_t round(size_t bytes) {
    if (bytes > kSmall) return (bytes + kPage - 1) & ~(kPage - 1);
    return bytes <= kAlign ? kAlign : (bytes + kAlign - 1) & ~(kAlign - 1);
  }

  /// A block for `bytes`: the best-fitting free block of this thread's arena, else (large) the arena's
  /// range grown, else a new segment from alloc(segment bytes), for a large request after the arena's
  /// wholly free large segments went back; when alloc gives null, every arena's free segments go back
  /// with free() and alloc is tried once more for the request alone (null again is returned). The
  /// range grows only while used() + cached() stays within set_limit's bytes.
  template <class Alloc, class Free> void* allocate(size_t bytes, Alloc alloc, Free free) {
    const size_t r = round(bytes);
    if (r <= kFrontMax) {
      Front& f = front();
      if (f.pool == id_)
        for (int i = f.n - 1; i >= 0; --i)
          if (f.size[i] == r) {
            void* p = f.ptr[i];
            f.ptr[i] = f.ptr[f.n - 1], f.size[i] = f.size[f.n - 1], --f.n;
            cached_.fetch_sub(r, std::memory_order_relaxed);
            used_.fetch_add(r, std::memory_order_relaxed);
            return p;
          }
    }
    Arena& a = arenas_[arena_for(r)];
    std::unique_lock<std::mutex> lock(a.m);
    if (Block* b = take(a, r)) return b->ptr;
    if (r > kSmall && grow_range(a, r)) return take(a, r)->ptr;
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
    auto* b = new Block{p, got, false, r <= kSmall ? kSmallKind : kSegmentKind, nullptr, nullptr};
    cached_.fetch_add(got, std::memory_order_relaxed);
    insert_free(a, b);
    Block* t = take(a, r);
    return t->ptr;
  }

  /// Gives p's block (of `bytes`, as allocated) back: to this thread's front blocks when it is small
  /// and there is room, else to its arena, merged with its free neighbours; a segment left wholly free
  /// goes back to the system with free() when the pool already holds max_cached free bytes.
  template <class Free> void deallocate(void* p, size_t bytes, Free free) {
    const size_t r = round(bytes);
    if (r <= kFrontMax) {
      Front& f = front();
      if (f.pool != id_) {
        flush(f);
        f.pool = id_;
      }
      if (f.n < kFrontSlots) {
        f.ptr[f.n] = p, f.size[f.n] = r, ++f.n;
        used_.fetch_sub(r, std::memory_order_relaxed);
        cached_.fetch_add(r, std::memory_order_relaxed);
        return;
      }
    }
    give_back(p, &free, false, arena_for(r));
  }

  /// The calling thread's front blocks go back to their arenas (release() does it too; a thread's
  /// are given back when it exits).
  void flush_thread_cache() {
    Front& f = front();
    if (f.pool == id_) return_front(f);
  }

  /// Gives every wholly free segment back with free(), and each range's free end (blocks in use keep
  /// their memory).
  template <class Free> void release(Free free) {
    flush_thread_cache();
    for (Arena& a : arenas_) {
      std::lock_guard<std::mutex> lock(a.m);
      shrink_range(a);
      for (auto* set : {&a.free_small, &a.free_large})
        for (auto it = set->begin(); it != set->end();) {
          Block* b = *it;
          if (b->prev || b->next || b->kind == kRangeKind) {
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

  /// The most bytes (used() + cached()) a range may grow to; 0, no limit.
  void set_limit(size_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  size_t limit() const { return limit_.load(std::memory_order_relaxed); }

  /// Bytes in blocks handed out (rounded), and free bytes held in segments and ranges.
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t cached() const { return cached_.load(std::memory_order_relaxed); }
  /// Tests: the committed bytes of every arena's range.
  size_t range_committed() {
    size_t n = 0;
    for (Arena& a : arenas_) {
      std::lock_guard<std::mutex> lock(a.m);
      n += a.range_committed;
    }
    return n;
  }
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
  // A block: [ptr, ptr + size) of one segment or range; prev/next are its neighbours there (null at
  // the ends), so a segment's block with neither is the whole segment.
  enum Kind : unsigned char { kSmallKind, kSegmentKind, kRangeKind };
  struct Block {
    char* ptr;
    size_t size;
    bool allocated;
    Kind kind;
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
    char* range = nullptr;                      // the large blocks' range (range_bytes_ of address space)
    size_t range_committed = 0;                 // its usable start, a multiple of kPage
    Block* range_last = nullptr;                // the block that ends at range + range_committed
    bool range_failed = false;                  // reserving it failed once: segments only
  };

  // Makes the arena's range (reserving it at the first call) usable for r more bytes at its end, merged
  // with a free last block; false where it cannot (no range, full, beyond the limit, refused).
  bool grow_range(Arena& a, size_t r) {
    if (!range_bytes_ || a.range_failed) return false;
    if (!a.range) {
      // Reserved with a step to spare and trimmed to a 2 MiB boundary, so that each committed step can
      // be one transparent huge page (asked for with MADV_HUGEPAGE: fewer TLB misses and page faults).
      void* p = mmap(nullptr, range_bytes_ + kRangeStep, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        a.range_failed = true;
        return false;
      }
      char* start = static_cast<char*>(p);
      char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + kRangeStep - 1) & ~uintptr_t(kRangeStep - 1));
      if (base > start) munmap(start, size_t(base - start));
      if (base + range_bytes_ < start + range_bytes_ + kRangeStep)
        munmap(base + range_bytes_, size_t(start + range_bytes_ + kRangeStep - (base + range_bytes_)));
#ifdef MADV_HUGEPAGE  // Linux
      madvise(base, range_bytes_, MADV_HUGEPAGE);
#endif
      a.range = base;
    }
    Block* last = a.range_last;
    const size_t tail = last && !last->allocated ? last->size : 0;
    const size_t grow = (r - tail + kRangeStep - 1) & ~(kRangeStep - 1);
    if (grow > range_bytes_ - a.range_committed) return false;
    const size_t lim = limit();
    if (lim && used() + cached() + grow > lim) return false;
    char* at = a.range + a.range_committed;
    if (mprotect(at, grow, PROT_READ | PROT_WRITE) != 0) return false;
    a.range_committed += grow;
    cached_.fetch_add(grow, std::memory_order_relaxed);
    if (tail) {
      a.free_large.erase(last);
      last->size += grow;
      a.free_large.insert(last);
    } else {
      auto* b = new Block{at, grow, false, kRangeKind, last, nullptr};
      if (last) last->next = b;
      a.range_last = b;
      a.free_large.insert(b);
    }
    return true;
  }
  // The range's free last block goes back to the system, its whole pages (replaced by fresh inaccessible
  // ones).
  void shrink_range(Arena& a) {
    Block* last = a.range_last;
    if (!last || last->allocated) return;
    const size_t from = (size_t(last->ptr - a.range) + kPage - 1) & ~(kPage - 1);
    if (from >= a.range_committed) return;
    const size_t n = a.range_committed - from;
    if (mmap(a.range + from, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
      return;
    a.range_committed = from;
    cached_.fetch_sub(n, std::memory_order_relaxed);
    a.free_large.erase(last);
    last->size -= n;
    if (last->size) {
      a.free_large.insert(last);
      return;
    }
    a.range_last = last->prev;
    if (last->prev) last->prev->next = nullptr;
    delete last;
  }

  // Before a new large segment: the arena's wholly free large segments go back to the system, so the
  // reserve follows the live bytes rather than the sum of segments that no longer fit (figures in
  // bench/results/2026-12-06-blas-below-cpu.md).
  template <class Free> void trim_large(Arena& a, Free free) {
    for (auto it = a.free_large.begin(); it != a.free_large.end();) {
      Block* b = *it;
      if (b->prev || b->next || b->kind == kRangeKind) {
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
  // p's block back to its arena (it must be one of this pool's, handed out): merged with its free
  // neighbours; a wholly free segment beyond max_cached goes back with (*free) unless keep.
  template <class Free> void give_back(void* p, Free* free, bool keep, int own) {
    for (int i = 0; i < kArenas; ++i) {  // the block's arena: `own` (arena_for's), almost always
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
      if (b->kind == kRangeKind) {
        insert_free(a, b);
        if (!keep && b == a.range_last && cached_.load(std::memory_order_relaxed) > max_cached_) shrink_range(a);
        return;
      }
      if (!keep && free && !b->prev && !b->next && cached_.load(std::memory_order_relaxed) > max_cached_) {
        cached_.fetch_sub(b->size, std::memory_order_relaxed);
        void* segment = b->ptr;
        delete b;
        (*free)(segment);
        return;
      }
      insert_free(a, b);
      return;
    }
  }

  // A thread's front blocks: freed blocks of one pool (by id), still in that pool's live table but
  // counted as cached.
  static constexpr size_t kFrontMax = 4096;
  static constexpr int kFrontSlots = 16;
  struct Front {
    uint64_t pool = 0;
    int n = 0;
    void* ptr[kFrontSlots];
    size_t size[kFrontSlots];
    ~Front() { flush(*this); }  // thread exit
  };
  static Front& front() {
    thread_local Front f;
    return f;
  }
  // f's blocks back to this pool's arenas (f.pool == id_).
  void return_front(Front& f) {
    for (int i = 0; i < f.n; ++i) {
      used_.fetch_add(f.size[i], std::memory_order_relaxed);  // give_back counts it as freed again
      cached_.fetch_sub(f.size[i], std::memory_order_relaxed);
      give_back(f.ptr[i], static_cast<void (**)(void*)>(nullptr), true, arena_index());
    }
    f.n = 0;
  }
  // f's blocks back to whichever pool they belong to, if it still exists (else they are dropped).
  static void flush(Front& f) {
    if (f.n) {
      std::lock_guard<std::mutex> lock(registry_mutex());
      auto it = registry().find(f.pool);
      if (it != registry().end()) it->second->return_front(f);
    }
    f.n = 0;
  }
  static std::mutex& registry_mutex() {
    static auto* m = new std::mutex();  // never destroyed: threads exit after static destructors run
    return *m;
  }
  static std::unordered_map<uint64_t, BestFitPool*>& registry() {
    static auto* r = new std::unordered_map<uint64_t, BestFitPool*>();
    return *r;
  }
  static uint64_t fresh_id() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  static FreeSet& set_of(Arena& a, const Block* b) { return b->kind == kSmallKind ? a.free_small : a.free_large; }
  void insert_free(Arena& a, Block* b) { set_of(a, b).insert(b); }

  // The smallest free block of at least r bytes for r's kind of request, split when the rest is worth
  // keeping (any rest in small segments and ranges, whose rests merge back; at least 1 MiB in large
  // segments, as PyTorch); null if none.
  Block* take(Arena& a, size_t r) {
    FreeSet& set = r <= kSmall ? a.free_small : a.free_large;
    Block key{nullptr, r, false, kSmallKind, nullptr, nullptr};
    auto it = set.lower_bound(&key);
    if (it == set.end()) return nullptr;
    Block* b = *it;
    set.erase(it);
    const size_t rest = b->size - r;
    if (rest >= (b->kind == kSegmentKind ? kLargeSplit : kAlign)) {
      auto* tail = new Block{b->ptr + r, rest, false, b->kind, b, b->next};
      if (b->next) b->next->prev = tail;
      else if (b == a.range_last) a.range_last = tail;
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
    if (hi == a.range_last) a.range_last = lo;
    delete hi;
    return lo;
  }

  // The arena of a request of r bytes: with ranges, every thread's large blocks share the first arena's
  // range (writing 256 KiB takes microseconds, the lock nanoseconds; threads' scratch and tensors then
  // share one layout instead of each range keeping its own peak); the thread's own arena otherwise.
  int arena_for(size_t r) const { return r > kSmall && range_bytes_ ? 0 : arena_index(); }
  static int arena_index() {
    static std::atomic<int> next{0};
    thread_local const int index = next.fetch_add(1, std::memory_order_relaxed) % kArenas;
    return index;
  }

  const uint64_t id_ = fresh_id();
  size_t max_cached_;
  const size_t range_bytes_;
  std::atomic<size_t> used_{0}, cached_{0}, limit_{0};
  Arena arenas_[kArenas];
};

}  // namespace flux::backends
