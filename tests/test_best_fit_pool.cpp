// The best-fit host pool (src/backends/best_fit_pool.hpp): splitting, best fit, coalescing, large
// segments, the large blocks' range (growing at its end, merging, pages kept across repeated steps,
// the limit, giving its end back), the out-of-memory retry, giving segments back, and many threads
// allocating and freeing each other's blocks. The pool is a header without library dependencies: this file also builds alone
// under ThreadSanitizer (g++ -fsanitize=thread -I. tests/test_best_fit_pool.cpp -lgtest -lgtest_main).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "src/backends/best_fit_pool.hpp"
#include "src/backends/caching_pool.hpp"

using flux::backends::BestFitPool;

namespace {
constexpr size_t MiB = size_t(1) << 20;

// The system side: 64-byte aligned blocks, counted, refused beyond `limit` bytes live.
struct System {
  size_t limit = SIZE_MAX;
  std::atomic<size_t> live{0}, peak{0};
  std::atomic<int> allocs{0}, frees{0};
  std::mutex m;
  std::vector<std::pair<void*, size_t>> blocks;
  void* alloc(size_t n) {
    if (live.load() + n > limit) return nullptr;
    void* p = std::aligned_alloc(64, n);
    std::lock_guard<std::mutex> lock(m);
    blocks.emplace_back(p, n);
    live += n;
    peak = std::max(peak.load(), live.load());
    ++allocs;
    return p;
  }
  void free(void* p) {
    std::lock_guard<std::mutex> lock(m);
    auto it = std::find_if(blocks.begin(), blocks.end(), [&](const auto& b) { return b.first == p; });
    ASSERT_NE(it, blocks.end()) << "freed a pointer the system never gave";
    live -= it->second;
    blocks.erase(it);
    ++frees;
    std::free(p);
  }
  auto a() {
    return [this](size_t n) { return alloc(n); };
  }
  auto f() {
    return [this](void* p) { free(p); };
  }
};
char* at(void* p) { return static_cast<char*>(p); }
}  // namespace

TEST(BestFitPool, SplitsOneSegmentAndReusesTheBestFit) {
  System sys;
  BestFitPool pool;
  void* a = pool.allocate(1000, sys.a(), sys.f());
  void* b = pool.allocate(100, sys.a(), sys.f());
  void* c = pool.allocate(5000, sys.a(), sys.f());
  EXPECT_EQ(sys.allocs.load(), 1) << "one 2 MiB segment serves the three";
  EXPECT_EQ(sys.live.load(), 2 * MiB);
  for (void* p : {a, b, c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(at(b), at(a) + 1024);  // 1000 rounded to 64 bytes
  EXPECT_EQ(at(c), at(b) + 128);
  EXPECT_EQ(pool.used(), 1024u + 128 + 5056);
  EXPECT_EQ(pool.used() + pool.cached(), 2 * MiB);
  // Holes of 1024 and 128 bytes (b's neighbours are in use): 100 bytes go to the 128-byte hole.
  void* d = pool.allocate(64, sys.a(), sys.f());  // keeps c's tail in use next to c
  pool.deallocate(a, 1000, sys.f());
  pool.deallocate(b, 100, sys.f());
  pool.flush_thread_cache();  // from the thread's front blocks to the arena: b merges with a's hole
  EXPECT_EQ(pool.allocate(1100, sys.a(), sys.f()), a) << "the merged hole fits 1100 bytes";
  void* e = pool.allocate(64, sys.a(), sys.f());
  EXPECT_EQ(at(e), at(d) + 64) << "the hole was an exact fit: no rest there";
  EXPECT_EQ(sys.allocs.load(), 1);
  pool.deallocate(c, 5000, sys.f());
  pool.deallocate(d, 64, sys.f());
  pool.deallocate(e, 64, sys.f());
  pool.deallocate(a, 1100, sys.f());
  pool.flush_thread_cache();
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.free_blocks(), 1u) << "every block merged back into the whole segment";
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u);
  EXPECT_EQ(pool.cached(), 0u);
}

TEST(BestFitPool, BestFitPicksTheSmallestHoleThatFits) {
  System sys;
  BestFitPool pool;
  // Blocks of 512, 64 (kept), 256, 64 (kept), 128, 64 (kept): freeing 512, 256 and 128 leaves three holes.
  std::vector<void*> p;
  const size_t sizes[] = {512, 64, 256, 64, 128, 64};
  for (size_t n : sizes) p.push_back(pool.allocate(n, sys.a(), sys.f()));
  for (int i : {0, 2, 4}) pool.deallocate(p[size_t(i)], sizes[i], sys.f());
  pool.flush_thread_cache();
  EXPECT_EQ(pool.allocate(100, sys.a(), sys.f()), p[4]);
  EXPECT_EQ(pool.allocate(200, sys.a(), sys.f()), p[2]);
  EXPECT_EQ(pool.allocate(300, sys.a(), sys.f()), p[0]);
  EXPECT_EQ(sys.allocs.load(), 1);
  pool.deallocate(p[4], 100, sys.f());  // as allocated just above
  pool.deallocate(p[2], 200, sys.f());
  pool.deallocate(p[0], 300, sys.f());
  for (int i : {1, 3, 5}) pool.deallocate(p[size_t(i)], sizes[i], sys.f());
  pool.release(sys.f());
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(sys.live.load(), 0u);
}

TEST(BestFitPool, LargeRequestsSplitOnlyAMegabyteOrMore) {
  System sys;
  BestFitPool pool;
  void* big = pool.allocate(5 * MiB, sys.a(), sys.f());  // a segment of its own, rounded to 64 KiB
  EXPECT_EQ(sys.live.load(), 5 * MiB);
  pool.deallocate(big, 5 * MiB, sys.f());
  void* x = pool.allocate(3 * MiB, sys.a(), sys.f());  // the freed 5 MiB: the 2 MiB rest is split off
  EXPECT_EQ(x, big);
  void* y = pool.allocate(3 * MiB / 2, sys.a(), sys.f());  // the 2 MiB rest; its 0.5 MiB rest is not split
  EXPECT_EQ(at(y), at(big) + 3 * MiB);
  EXPECT_EQ(pool.used(), 5 * MiB);
  EXPECT_EQ(sys.allocs.load(), 1);
  void* z = pool.allocate(MiB + 64, sys.a(), sys.f());  // nothing free: a segment of 1 MiB + 64 KiB
  EXPECT_EQ(sys.live.load(), 6 * MiB + 64 * 1024);
  void* small = pool.allocate(1000, sys.a(), sys.f());  // small requests never take large segments' blocks
  EXPECT_EQ(sys.allocs.load(), 3);
  pool.deallocate(x, 3 * MiB, sys.f());
  pool.deallocate(y, 3 * MiB / 2, sys.f());
  EXPECT_EQ(pool.allocate(5 * MiB, sys.a(), sys.f()), big) << "x and y merged back into the whole segment";
  pool.deallocate(big, 5 * MiB, sys.f());
  pool.deallocate(z, MiB + 64, sys.f());
  pool.deallocate(small, 1000, sys.f());
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u);
  EXPECT_EQ(sys.frees.load(), 3);
}

// A training-like sequence of many sizes: the pool's reserve follows the peak of live bytes, where the
// size-class reference keeps the sum of each class's own peak.
TEST(BestFitPool, ReserveFollowsLiveBytes) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<size_t> size(1000, 4 * MiB);
  std::vector<size_t> sizes(400);
  for (size_t& s : sizes) s = size(gen);
  auto run = [&](auto& pool, System& sys) {
    size_t live = 0, peak_live = 0;
    std::vector<std::pair<void*, size_t>> held;
    for (int step = 0; step < 20; ++step) {  // a "step": 20 tensors live at once, sizes differing per step
      for (int i = 0; i < 20; ++i) {
        const size_t n = sizes[size_t((step * 37 + i * 11) % 400)];
        held.emplace_back(pool.allocate(n, sys.a(), sys.f()), n);
        live += n;
        peak_live = std::max(peak_live, live);
      }
      for (auto& [p, n] : held) {
        pool.deallocate(p, n, sys.f());
        live -= n;
      }
      held.clear();
    }
    return peak_live;
  };
  System best_sys, classes_sys;
  BestFitPool best;
  flux::backends::CachingPool<void*> classes(64);
  const size_t peak_live = run(best, best_sys);
  run(classes, classes_sys);
  std::printf("peak live %.1f MiB, system peak: best fit %.1f MiB, size classes %.1f MiB\n", double(peak_live) / MiB,
              double(best_sys.peak.load()) / MiB, double(classes_sys.peak.load()) / MiB);
  EXPECT_LT(double(best_sys.peak.load()), 1.75 * double(peak_live));  // random sizes: some fragmentation
  EXPECT_LT(2 * best_sys.peak.load(), classes_sys.peak.load());
  best.release(best_sys.f());
  classes.release(classes_sys.f());
  EXPECT_EQ(best_sys.live.load(), 0u);
}

TEST(BestFitPool, OutOfMemoryReleasesFreeSegmentsAndRetriesOnce) {
  System sys;
  sys.limit = 7 * MiB;
  BestFitPool pool;
  void* a = pool.allocate(3 * MiB, sys.a(), sys.f());  // a 3 MiB segment
  void* b = pool.allocate(MiB / 5, sys.a(), sys.f());  // small: a 2 MiB segment
  pool.deallocate(b, MiB / 5, sys.f());                // its segment is free, still held
  EXPECT_EQ(sys.live.load(), 5 * MiB);
  // 3 MiB more is over the limit (5 + 3 > 7) until the free small segment goes back (3 + 3 <= 7).
  void* c = pool.allocate(3 * MiB, sys.a(), sys.f());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(sys.live.load(), 6 * MiB);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.allocate(2 * MiB, sys.a(), sys.f()), nullptr) << "nothing left to release";
  EXPECT_EQ(pool.used(), 6 * MiB) << "a failed request changes nothing";
  pool.deallocate(a, 3 * MiB, sys.f());
  pool.deallocate(c, 3 * MiB, sys.f());
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u);
}

// Blocks of up to 4 KiB wait in their thread's front (16 at most) and serve the next request of their
// size without a lock; a thread's front goes back to the arenas when it exits, and with release().
TEST(BestFitPool, SmallBlocksComeBackFromTheThreadsFront) {
  System sys;
  BestFitPool pool;
  void* a = pool.allocate(256, sys.a(), sys.f());
  pool.deallocate(a, 256, sys.f());
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.cached(), 2 * MiB);
  EXPECT_EQ(pool.free_blocks(), 1u) << "a waits in front; the arena holds the segment's tail";
  EXPECT_EQ(pool.allocate(200, sys.a(), sys.f()), a) << "the same rounded size, from the front";
  std::vector<void*> held;
  for (int i = 0; i < 17; ++i) held.push_back(pool.allocate(64, sys.a(), sys.f()));
  for (void* p : held) pool.deallocate(p, 64, sys.f());  // 16 to the front, the 17th to the arena,
  EXPECT_EQ(pool.free_blocks(), 1u);                      // where it merges with the segment's tail
  EXPECT_EQ(pool.allocate(64, sys.a(), sys.f()), held[15]) << "the front's most recent first";
  pool.deallocate(held[15], 64, sys.f());
  pool.deallocate(a, 200, sys.f());  // the front is full: to the arena
  std::thread([&] {
    void* q = pool.allocate(1000, sys.a(), sys.f());
    pool.deallocate(q, 1000, sys.f());
  }).join();
  EXPECT_EQ(pool.used(), 0u);
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u) << "every front block came back: every segment was free";
  EXPECT_EQ(pool.cached(), 0u);
}

TEST(BestFitPool, KeepsAtMostMaxCachedFreeBytes) {
  System sys;
  BestFitPool pool(0);
  void* a = pool.allocate(3 * MiB, sys.a(), sys.f());
  pool.deallocate(a, 3 * MiB, sys.f());
  EXPECT_EQ(sys.live.load(), 0u) << "a wholly free segment beyond max_cached goes back at once";
  EXPECT_EQ(pool.cached(), 0u);
}

// Threads allocate, fill, check and free blocks of many sizes, and free each other's blocks (handed
// over through a shared list): no two live blocks overlap (their contents survive), and at the end
// every byte is back.
namespace {
void threads_allocate_and_free_each_others_blocks(BestFitPool& pool) {
  System sys;
  std::mutex m;
  std::vector<std::pair<void*, size_t>> handed;
  std::atomic<bool> corrupt{false};
  auto work = [&](int id) {
    std::mt19937 gen(unsigned(100 + id));
    std::uniform_int_distribution<size_t> size(1, 300000);
    std::vector<std::pair<void*, size_t>> mine;
    for (int i = 0; i < 3000; ++i) {
      const size_t n = gen() % 8 == 0 ? size(gen) * 8 : size(gen) / 16 + 1;
      char* p = static_cast<char*>(pool.allocate(n, sys.a(), sys.f()));
      std::memset(p, id + 1, std::min<size_t>(n, 4096));
      p[n - 1] = char(id + 1);
      mine.emplace_back(p, n);
      if (mine.size() > 12 || gen() % 3 == 0) {
        auto [q, k] = mine[gen() % mine.size()];
        mine.erase(std::find(mine.begin(), mine.end(), std::pair{q, k}));
        if (static_cast<char*>(q)[0] != char(id + 1) || static_cast<char*>(q)[k - 1] != char(id + 1)) corrupt = true;
        std::lock_guard<std::mutex> lock(m);
        handed.emplace_back(q, k);
      }
      std::pair<void*, size_t> other{nullptr, 0};
      {
        std::lock_guard<std::mutex> lock(m);
        if (!handed.empty() && gen() % 2 == 0) {
          other = handed.back();
          handed.pop_back();
        }
      }
      if (other.first) pool.deallocate(other.first, other.second, sys.f());
    }
    for (auto [q, k] : mine) pool.deallocate(q, k, sys.f());
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();
  for (auto [q, k] : handed) pool.deallocate(q, k, sys.f());
  EXPECT_FALSE(corrupt.load()) << "a live block was overwritten: two blocks overlapped";
  EXPECT_EQ(pool.used(), 0u);
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.range_committed(), 0u);
}
}  // namespace

TEST(BestFitPool, ThreadsAllocateAndFreeEachOthersBlocks) {
  BestFitPool pool;
  threads_allocate_and_free_each_others_blocks(pool);
}

TEST(BestFitPool, ThreadsAllocateAndFreeEachOthersBlocksInRanges) {
  BestFitPool pool(size_t(1) << 30, size_t(1) << 30);
  threads_allocate_and_free_each_others_blocks(pool);
}

// Large blocks (over 256 KiB, rounded to 4 KiB pages) of a pool with a range: the range grows at its end
// in 2 MiB steps (a free last block grows with it), freed blocks merge into any larger request, nothing
// comes from the system callbacks, and release() gives the free end back.
TEST(BestFitPool, RangeGrowsAtItsEndAndMergesFreedBlocks) {
  System sys;
  BestFitPool pool(size_t(1) << 30, size_t(1) << 30);
  void* x = pool.allocate(3 * MiB, sys.a(), sys.f());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x) % (2 * MiB), 0u) << "the range starts on a huge page's boundary";
  EXPECT_EQ(pool.range_committed(), 4 * MiB);
  EXPECT_EQ(pool.cached(), MiB) << "the free 1 MiB after x";
  void* y = pool.allocate(5 * MiB, sys.a(), sys.f());  // the free 1 MiB grown by 4 MiB
  EXPECT_EQ(at(y), at(x) + 3 * MiB);
  EXPECT_EQ(pool.range_committed(), 8 * MiB);
  void* z = pool.allocate(300 * 1024, sys.a(), sys.f());  // large: in the range too
  EXPECT_EQ(at(z), at(y) + 5 * MiB);
  EXPECT_EQ(sys.allocs.load(), 0) << "large blocks come from the range, not the system callback";
  std::memset(x, 1, 3 * MiB);
  std::memset(y, 2, 5 * MiB);
  pool.deallocate(x, 3 * MiB, sys.f());
  pool.deallocate(y, 5 * MiB, sys.f());
  EXPECT_EQ(pool.allocate(8 * MiB, sys.a(), sys.f()), x) << "x and y merged: 8 MiB without growing";
  EXPECT_EQ(pool.range_committed(), 8 * MiB + 2 * MiB);
  void* small = pool.allocate(1000, sys.a(), sys.f());  // small requests still share 2 MiB segments
  EXPECT_EQ(sys.allocs.load(), 1);
  pool.deallocate(x, 8 * MiB, sys.f());
  pool.deallocate(z, 300 * 1024, sys.f());
  pool.deallocate(small, 1000, sys.f());
  EXPECT_EQ(pool.used(), 0u);
  pool.release(sys.f());
  EXPECT_EQ(pool.range_committed(), 0u) << "the wholly free range went back";
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(sys.live.load(), 0u);
  void* again = pool.allocate(3 * MiB, sys.a(), sys.f());  // and grows again from its start
  EXPECT_EQ(again, x);
  std::memset(again, 3, 3 * MiB);
  pool.deallocate(again, 3 * MiB, sys.f());
}

// A training loop's steps repeat the same requests: after the first step the range's pages are all
// reused (it grows no more), and it stays near the peak of live bytes.
TEST(BestFitPool, RangeKeepsItsPagesAcrossRepeatedSteps) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<size_t> size(300 * 1024, 6 * MiB);
  std::vector<size_t> sizes(60);
  for (size_t& s : sizes) s = size(gen);
  System sys;
  BestFitPool pool(size_t(1) << 30, size_t(1) << 30);
  size_t committed_after_first = 0, peak_live = 0;
  for (int step = 0; step < 5; ++step) {
    // A "forward" keeps every third block (activations) and frees the rest; a "backward" frees the
    // kept ones in reverse, allocating gradients of other sizes in between.
    std::vector<std::pair<void*, size_t>> kept;
    size_t live = 0;
    for (size_t i = 0; i < 40; ++i) {
      void* p = pool.allocate(sizes[i], sys.a(), sys.f());
      live += sizes[i];
      peak_live = std::max(peak_live, live);
      if (i % 3 == 0) kept.emplace_back(p, sizes[i]);
      else pool.deallocate(p, sizes[i], sys.f()), live -= sizes[i];
    }
    for (size_t i = 0; i < kept.size(); ++i) {
      const size_t n = sizes[40 + i % 20];
      void* g = pool.allocate(n, sys.a(), sys.f());
      peak_live = std::max(peak_live, live + n);
      auto [p, k] = kept[kept.size() - 1 - i];
      pool.deallocate(p, k, sys.f());
      live -= k;
      pool.deallocate(g, n, sys.f());
    }
    if (step == 0) committed_after_first = pool.range_committed();
    else EXPECT_EQ(pool.range_committed(), committed_after_first) << "step " << step << " grew the range";
  }
  EXPECT_EQ(sys.allocs.load(), 0);
  EXPECT_LT(double(committed_after_first), 1.25 * double(peak_live) + double(2 * MiB));
  pool.release(sys.f());
  EXPECT_EQ(pool.range_committed(), 0u);
}

// Every thread's large blocks share one range: a block one thread freed serves another thread's request.
TEST(BestFitPool, ThreadsShareOneRangeForLargeBlocks) {
  System sys;
  BestFitPool pool(size_t(1) << 30, size_t(1) << 30);
  void* first = nullptr;
  std::thread([&] {
    first = pool.allocate(3 * MiB, sys.a(), sys.f());
    pool.deallocate(first, 3 * MiB, sys.f());
  }).join();
  void* second = nullptr;
  std::thread([&] { second = pool.allocate(2 * MiB, sys.a(), sys.f()); }).join();
  EXPECT_EQ(second, first);
  EXPECT_EQ(pool.range_committed(), 4 * MiB) << "one range, grown once";
  pool.deallocate(second, 2 * MiB, sys.f());
  pool.release(sys.f());
  EXPECT_EQ(pool.range_committed(), 0u);
}

// The range grows only within set_limit (used + cached); beyond it the system callback is asked (and
// refuses here), the range's free end is given back, and the request fails without changing anything.
TEST(BestFitPool, RangeGrowsWithinTheLimit) {
  System sys;
  sys.limit = 0;  // the system gives nothing: only the range serves
  BestFitPool pool(size_t(1) << 30, size_t(1) << 30);
  pool.set_limit(6 * MiB);
  void* a = pool.allocate(3 * MiB, sys.a(), sys.f());
  void* b = pool.allocate(3 * MiB, sys.a(), sys.f());  // grows by 2 MiB: 6 MiB committed
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool.range_committed(), 6 * MiB);
  EXPECT_EQ(pool.allocate(MiB, sys.a(), sys.f()), nullptr) << "2 MiB more would pass the limit";
  EXPECT_EQ(pool.used(), 6 * MiB);
  pool.deallocate(b, 3 * MiB, sys.f());
  void* c = pool.allocate(2 * MiB, sys.a(), sys.f());
  EXPECT_EQ(c, b) << "the freed block serves within the limit";
  pool.deallocate(a, 3 * MiB, sys.f());
  pool.deallocate(c, 2 * MiB, sys.f());
  pool.release(sys.f());
  EXPECT_EQ(pool.range_committed(), 0u);
}

TEST(BestFitPool, RangeKeepsAtMostMaxCachedFreeBytes) {
  System sys;
  BestFitPool pool(0, size_t(1) << 30);
  void* a = pool.allocate(3 * MiB, sys.a(), sys.f());
  void* b = pool.allocate(3 * MiB, sys.a(), sys.f());
  pool.deallocate(b, 3 * MiB, sys.f());
  EXPECT_EQ(pool.range_committed(), 3 * MiB) << "the free end after a went back, in whole pages";
  pool.deallocate(a, 3 * MiB, sys.f());
  EXPECT_EQ(pool.range_committed(), 0u);
  EXPECT_EQ(pool.cached(), 0u);
}
