// The best-fit host pool (src/backends/best_fit_pool.hpp): splitting, best fit, coalescing, large
// segments, the out-of-memory retry, giving segments back, and many threads allocating and freeing
// each other's blocks. The pool is a header without library dependencies: this file also builds alone
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
  pool.deallocate(b, 100, sys.f());  // merges with a's hole: one 1152-byte block
  EXPECT_EQ(pool.allocate(1100, sys.a(), sys.f()), a) << "the merged hole fits 1100 bytes";
  void* e = pool.allocate(64, sys.a(), sys.f());
  EXPECT_EQ(at(e), at(d) + 64) << "the hole was an exact fit: no rest there";
  EXPECT_EQ(sys.allocs.load(), 1);
  for (void* p : {c, d, e, a}) pool.deallocate(p, 0, sys.f());
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
  for (size_t n : {512, 64, 256, 64, 128, 64}) p.push_back(pool.allocate(n, sys.a(), sys.f()));
  for (int i : {0, 2, 4}) pool.deallocate(p[size_t(i)], 0, sys.f());
  EXPECT_EQ(pool.allocate(100, sys.a(), sys.f()), p[4]);
  EXPECT_EQ(pool.allocate(200, sys.a(), sys.f()), p[2]);
  EXPECT_EQ(pool.allocate(300, sys.a(), sys.f()), p[0]);
  EXPECT_EQ(sys.allocs.load(), 1);
}

TEST(BestFitPool, LargeRequestsSplitOnlyAMegabyteOrMore) {
  System sys;
  BestFitPool pool;
  void* big = pool.allocate(5 * MiB, sys.a(), sys.f());  // a segment of its own, rounded to 64 KiB
  EXPECT_EQ(sys.live.load(), 5 * MiB);
  pool.deallocate(big, 0, sys.f());
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
  pool.deallocate(x, 0, sys.f());
  pool.deallocate(y, 0, sys.f());
  EXPECT_EQ(pool.allocate(5 * MiB, sys.a(), sys.f()), big) << "x and y merged back into the whole segment";
  for (void* q : {big, z, small}) pool.deallocate(q, 0, sys.f());
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
  void* b = pool.allocate(MiB, sys.a(), sys.f());      // small: a 2 MiB segment
  pool.deallocate(b, 0, sys.f());                      // its segment is free, still held
  EXPECT_EQ(sys.live.load(), 5 * MiB);
  // 3 MiB more is over the limit (5 + 3 > 7) until the free small segment goes back (3 + 3 <= 7).
  void* c = pool.allocate(3 * MiB, sys.a(), sys.f());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(sys.live.load(), 6 * MiB);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.allocate(2 * MiB, sys.a(), sys.f()), nullptr) << "nothing left to release";
  EXPECT_EQ(pool.used(), 6 * MiB) << "a failed request changes nothing";
  pool.deallocate(a, 0, sys.f());
  pool.deallocate(c, 0, sys.f());
  pool.release(sys.f());
  EXPECT_EQ(sys.live.load(), 0u);
}

TEST(BestFitPool, KeepsAtMostMaxCachedFreeBytes) {
  System sys;
  BestFitPool pool(0);
  void* a = pool.allocate(3 * MiB, sys.a(), sys.f());
  pool.deallocate(a, 0, sys.f());
  EXPECT_EQ(sys.live.load(), 0u) << "a wholly free segment beyond max_cached goes back at once";
  EXPECT_EQ(pool.cached(), 0u);
}

// Threads allocate, fill, check and free blocks of many sizes, and free each other's blocks (handed
// over through a shared list): no two live blocks overlap (their contents survive), and at the end
// every byte is back.
TEST(BestFitPool, ThreadsAllocateAndFreeEachOthersBlocks) {
  System sys;
  BestFitPool pool;
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
}
