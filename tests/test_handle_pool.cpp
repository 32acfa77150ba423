// The GPU plugins' per-thread library handles (src/backends/cuda/handle_pool.hpp: cuBLAS and cuDNN
// handles per host thread and device), checked on the host with fake libraries: threads that run at
// once never share a handle, a finished thread's handle goes to the next thread, a handle is rebound
// only when its stream changes, and a device where the library cannot start is asked once.
#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "src/backends/cuda/handle_pool.hpp"

namespace {

using flux::cuda_backend::HandlePool;

// A fake library per test (each instantiates its own pools): handles are fresh heap addresses,
// streams are ints; device 1 cannot start.
template <int Id> struct FakeLibrary {
  using Handle = int*;
  using Stream = int;
  static inline std::atomic<int> created{0}, refused{0}, bound{0};
  static Handle create(int device) {
    if (device == 1) {
      ++refused;
      return nullptr;
    }
    ++created;
    return new int(device);  // never freed: the pool keeps handles for the process, as the plugins do
  }
  static void bind(Handle, Stream, int) { ++bound; }
};

// Waits until `count` threads have arrived (all alive at once).
void arrive_and_wait(std::atomic<int>& arrived, int count) {
  ++arrived;
  while (arrived.load() < count) std::this_thread::yield();
}

TEST(HandlePool, ThreadsRunningAtOnceGetHandlesOfTheirOwn) {
  using Lib = FakeLibrary<0>;
  constexpr int kThreads = 8;
  const int created = Lib::created;  // (a repeated run reuses the handles its first run made)
  std::vector<int*> got(kThreads, nullptr);
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      got[size_t(t)] = HandlePool<Lib>::get(0, 7);
      arrive_and_wait(arrived, kThreads);  // no thread ends (and gives its handle back) before all have one
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<int*>(got.begin(), got.end()).size(), size_t(kThreads));
  for (int* h : got) ASSERT_NE(h, nullptr);
  EXPECT_LE(Lib::created - created, kThreads);
}

TEST(HandlePool, AFinishedThreadsHandleGoesToTheNextThread) {
  using Lib = FakeLibrary<1>;
  const int bound = Lib::bound;
  int* first = nullptr;
  int* second = nullptr;
  std::thread([&] { first = HandlePool<Lib>::get(0, 1); }).join();
  std::thread([&] { second = HandlePool<Lib>::get(0, 2); }).join();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first, second);
  EXPECT_EQ(Lib::created.load(), 1);
  EXPECT_EQ(Lib::bound - bound, 2);  // bound to each thread's stream when taken
}

TEST(HandlePool, OneHandlePerDeviceOnAThreadReboundOnlyWhenItsStreamChanges) {
  using Lib = FakeLibrary<2>;
  const int bound = Lib::bound;
  std::thread([&] {
    int* a = HandlePool<Lib>::get(0, 5);
    EXPECT_EQ(HandlePool<Lib>::get(0, 5), a);
    EXPECT_EQ(Lib::bound - bound, 1);
    EXPECT_EQ(HandlePool<Lib>::get(0, 6), a);
    EXPECT_EQ(Lib::bound - bound, 2);
    int* b = HandlePool<Lib>::get(2, 5);
    EXPECT_NE(b, a);
    EXPECT_EQ(*a, 0);
    EXPECT_EQ(*b, 2);
  }).join();
  EXPECT_EQ(Lib::created.load(), 2);
}

TEST(HandlePool, ADeviceWhereTheLibraryCannotStartIsAskedOnce) {
  using Lib = FakeLibrary<3>;
  const int bound = Lib::bound;
  std::thread([&] {
    EXPECT_EQ(HandlePool<Lib>::get(1, 0), nullptr);
    EXPECT_EQ(HandlePool<Lib>::get(1, 0), nullptr);
  }).join();
  std::thread([&] { EXPECT_EQ(HandlePool<Lib>::get(1, 0), nullptr); }).join();
  EXPECT_EQ(Lib::refused.load(), 1);
  EXPECT_EQ(Lib::bound - bound, 0);
  std::thread([&] { EXPECT_NE(HandlePool<Lib>::get(0, 0), nullptr); }).join();  // other devices unaffected
}

// A library whose create throws (cuBLAS's cublasCreate failing): the error reaches the caller on every
// call and nothing is remembered.
struct ThrowingLibrary {
  using Handle = int*;
  using Stream = int;
  static inline std::atomic<int> tries{0};
  static Handle create(int) {
    ++tries;
    throw std::runtime_error("[matmul] cublasCreate failed");
  }
  static void bind(Handle, Stream, int) {}
};

TEST(HandlePool, ACreateThatThrowsIsTriedAgainNextCall) {
  const int tries = ThrowingLibrary::tries;
  std::thread([&] {
    EXPECT_THROW(HandlePool<ThrowingLibrary>::get(0, 0), std::runtime_error);
    EXPECT_THROW(HandlePool<ThrowingLibrary>::get(0, 0), std::runtime_error);
  }).join();
  EXPECT_EQ(ThrowingLibrary::tries - tries, 2);
}

}  // namespace
