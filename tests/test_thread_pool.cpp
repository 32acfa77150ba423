// The CPU backend's thread pool (src/backends/cpu/parallel.cpp): every index is visited exactly once,
// nested and concurrent parallel regions are safe, an exception thrown in any chunk reaches the
// caller only after every worker has left the region, and concurrent callers share the pool's
// threads. Also run under ThreadSanitizer (scripts/test --tsan).
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "src/backends/cpu/cpu_backend.hpp"

namespace {

using flux::cpu_backend::parallel_for;

TEST(ThreadPool, VisitsEveryIndexOnce) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 100003}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      ASSERT_LE(0, b);
      ASSERT_LE(b, e);
      ASSERT_LE(e, n);
      for (int64_t i = b; i < e; ++i) seen[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)].load(), 1) << "n " << n << " index " << i;
  }
}

TEST(ThreadPool, BelowTheGrainRunsInlineOnTheCaller) {
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  parallel_for(100, 1000, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, NestedRegionsRunInlineAndComplete) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(1000, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 8000);
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirWholeRange) {
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4, 0);
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        std::atomic<int64_t> sum{0};
        parallel_for(10000, 1, [&](int64_t b, int64_t e) {
          int64_t s = 0;
          for (int64_t i = b; i < e; ++i) s += i;
          sum.fetch_add(s);
        });
        sums[size_t(c)] += sum.load();
      }
    });
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 50 * (int64_t(10000) * 9999 / 2));
}

TEST(ThreadPool, ExceptionInAnyChunkReachesTheCallerAfterAllChunksEnd) {
  if (flux::cpu_backend::num_threads() < 2) GTEST_SKIP() << "one thread: no worker chunks";
  for (int thrower = 0; thrower < flux::cpu_backend::num_threads(); ++thrower) {
    std::atomic<int> running{0}, finished{0};
    const int64_t n = flux::cpu_backend::num_threads();  // one index per chunk, so chunk k starts at index k
    try {
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        running.fetch_add(1);
        if (b <= thrower && thrower < e) throw std::runtime_error("chunk failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // still working when the other throws
        finished.fetch_add(1);
      });
      ADD_FAILURE() << "no exception from chunk " << thrower;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk failed");
    }
    // Every chunk that started has ended before parallel_for returned: none still runs on a dead frame.
    EXPECT_EQ(finished.load(), running.load() - 1) << "thrower " << thrower;
  }
  // The pool still works afterwards.
  std::atomic<int64_t> total{0};
  parallel_for(1000, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 1000);
}

TEST(ThreadPool, CallersShareThePoolsThreads) {
  // A region takes the pool's threads less one per other caller inside a region or in one within the
  // last millisecond: while two user threads run regions, each region runs on at most size - 1
  // threads (on a pool of two: inline) instead of the first to come taking the whole pool. 95% asked:
  // on a loaded machine a thread may now and then be descheduled between two of its regions for
  // longer than the window.
  const int size = flux::cpu_backend::num_threads();
  if (size < 2) GTEST_SKIP() << "a pool of one thread (FLUX_NUM_THREADS=1 or one core)";
  // The number of threads that ran the pieces of one region of 4 * size pieces of `work` each.
  auto threads_of_a_region = [&](std::chrono::microseconds work) {
    std::mutex m;
    std::set<std::thread::id> ids;
    parallel_for(4 * size, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto until = std::chrono::steady_clock::now() + work;
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
    return ids;
  };
  std::atomic<bool> stop{false}, measuring{false};
  std::atomic<int> other_regions{0}, other_shared{0};
  std::thread other([&] {
    while (!stop.load()) {
      const bool counted = measuring.load();
      const bool shared = int(threads_of_a_region(std::chrono::microseconds(100)).size()) <= size - 1;
      if (counted && measuring.load()) other_regions.fetch_add(1), other_shared.fetch_add(shared);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  measuring.store(true);
  int shared = 0;
  for (int rep = 0; rep < 50; ++rep) shared += int(threads_of_a_region(std::chrono::microseconds(100)).size()) <= size - 1;
  measuring.store(false);
  stop.store(true);
  other.join();
  const int regions = 50 + other_regions.load(), on_shared = shared + other_shared.load();
  EXPECT_GE(on_shared * 20, regions * 19) << on_shared << " of " << regions << " regions of two callers on at most "
                                         << size - 1 << " threads (this caller: " << shared << " of 50)";
  // Alone again, after the window: the workers take pieces again.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::thread::id self = std::this_thread::get_id();
  bool elsewhere = false;
  for (int rep = 0; rep < 200 && !elsewhere; ++rep)
    for (const std::thread::id& id : threads_of_a_region(std::chrono::microseconds(100))) elsewhere |= id != self;
  EXPECT_TRUE(elsewhere) << "no piece ran on a worker of the pool of " << size << " in 200 regions alone";
}

}  // namespace
