// The CPU backend's thread pool (src/backends/cpu/parallel.cpp): every index is visited exactly once,
// nested and concurrent parallel regions are safe, and an exception thrown in any chunk reaches the
// caller only after every worker has left the region. Also run under ThreadSanitizer (scripts/test --tsan).
#include <atomic>
#include <chrono>
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

}  // namespace
