// The CPU backend's one thread pool (FLUX_NUM_THREADS threads, the caller included). It is also the
// BLAS's: matmul_blas.cpp keeps the BLAS on one thread and splits the GEMM over this pool, and oneDNN runs
// one OpenMP thread per pool task (conv_onednn.cpp), so no second team of threads competes for the cores.
//
// Hand-off: a region is cut into one piece
// per thread, and every thread, the caller first, claims pieces from an atomic counter, so a worker
// that the OS has descheduled delays nothing: the caller takes its piece. An idle worker spins for
// a short while (kSpin) with a pause instruction, catching the next op of a training step without a
// system call, then sleeps on a futex (raw FUTEX_WAIT on Linux, a condition variable elsewhere);
// the caller wakes sleepers only when there are any: sleeping after every op costs a futex pair per
// op in system time (bench/results/2026-12-06-notes-from-comments.md).
//
// Several callers (user threads calling models at once) share the pool's threads: a region takes
// as many threads as the pool has less one per other caller inside a region or in one within the
// last kShareWindow, and runs inline when that leaves one. With two callers on a pool of two, each
// computes on its own core instead of one caller's worker competing with the other for the cores.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FLUX_CPU_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define FLUX_CPU_PAUSE() asm volatile("yield")
#else
#define FLUX_CPU_PAUSE() std::this_thread::yield()
#endif

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#else
#include <condition_variable>
#endif

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/float_mode.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"

namespace flux::cpu_backend {

namespace {
thread_local bool t_inside = false;

// How long an idle thread polls before sleeping: longer than the framework's gap between two ops of
// a step (a few microseconds), short enough that an idle process stops using the cores at once.
constexpr std::chrono::microseconds kSpin{100};

// How long a caller counts as active after its last region: longer than the gaps between the ops of
// one forward, short enough that a caller left alone gets the whole pool back at once.
constexpr std::chrono::microseconds kShareWindow{1000};

using Clock = std::chrono::steady_clock;

// The threads that run regions now or did lately: one slot per caller thread (a thread takes the next
// slot at its first region; past kSlots threads, slots are shared and callers undercounted), each
// whether that thread is inside a region and when it last entered or left one (refreshed at most
// every kShareWindow / 8, to keep the line mostly read). A caller counts while inside a region (it
// may be descheduled there for longer than the window) and for kShareWindow after it.
class Callers {
 public:
  /// Marks this thread inside a region; how many other threads are inside one or were within kShareWindow.
  int enter() {
    Slot& me = slots_[mine()];
    const int64_t now = micros();
    me.inside.fetch_add(1, std::memory_order_relaxed);
    stamp(me, now);
    int others = 0;
    for (const Slot& s : slots_)
      if (&s != &me && (s.inside.load(std::memory_order_relaxed) > 0 ||
                        now - s.last.load(std::memory_order_relaxed) < kShareWindow.count()))
        ++others;
    return others;
  }
  void leave() {
    Slot& me = slots_[mine()];
    stamp(me, micros());
    me.inside.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  static constexpr int kSlots = 16;
  struct alignas(64) Slot {
    std::atomic<int64_t> last{std::numeric_limits<int64_t>::min() / 2};
    std::atomic<int> inside{0};
  };
  int mine() {
    thread_local const int slot = next_.fetch_add(1, std::memory_order_relaxed) % kSlots;
    return slot;
  }
  static int64_t micros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  }
  static void stamp(Slot& s, int64_t now) {
    if (now - s.last.load(std::memory_order_relaxed) > kShareWindow.count() / 8) s.last.store(now, std::memory_order_relaxed);
  }
  Slot slots_[kSlots];
  std::atomic<int> next_{0};
};

// A 32-bit word threads sleep on until it changes from a value they saw.
class WaitWord {
 public:
  std::atomic<uint32_t> value{0};
#if defined(__linux__)
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  /// Sleeps while value == seen (returns at once otherwise; spurious returns are allowed).
  void wait(uint32_t seen) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&value), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
  }
  void wake_all() { syscall(SYS_futex, reinterpret_cast<uint32_t*>(&value), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0); }
#else
  void wait(uint32_t seen) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return value.load() != seen; });
  }
  void wake_all() {
    { std::lock_guard<std::mutex> lock(m_); }
    cv_.notify_all();
  }
 private:
  std::mutex m_;
  std::condition_variable cv_;
#endif
};

// Polls `ready` with pause for up to kSpin; true when it became true.
template <class Ready> bool spin_until(Ready ready) {
  auto deadline = Clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      FLUX_CPU_PAUSE();
    }
    if (Clock::now() > deadline) return ready();
  }
}

class Pool {
 public:
  explicit Pool(int n) : threads_(n) {
    try {
      for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {  // the system refused a thread: go on with those started
      threads_ = int(workers_.size()) + 1;
      detail::log_warning_once("[flux] could start only " + std::to_string(threads_) + " of " + std::to_string(n) +
                               " CPU threads (" + e.what() + "); using " + std::to_string(threads_));
    }
  }
  ~Pool() {
    stop_.store(true);
    epoch_.value.fetch_add(1);
    epoch_.wake_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return threads_; }

  /// Runs fn over [0, n) in at most `team` pieces (team >= 2); false when another thread's region
  /// holds the pool (the caller then runs its loop itself).
  bool run(int64_t n, int team, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> serial(run_mutex_, std::try_to_lock);
    if (!serial.owns_lock()) return false;
    fn_ = &fn;
    n_ = n;
    float_control_ = float_control();  // workers run the region in the caller's mode (flush-to-zero)
    pieces_ = int(std::min<int64_t>({n, std::min(team, threads_), 0xffff}));
    error_ = nullptr;
    done_.value.store(0, std::memory_order_relaxed);
    uint32_t job = epoch_.value.load(std::memory_order_relaxed) + 1;
    // Publishes fn_, n_, pieces_ to the claimers (release), then wakes the workers.
    next_.store(pack(job, pieces_, 0), std::memory_order_release);
    epoch_.value.store(job, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.wake_all();
    claim_pieces(job);
    const uint32_t pieces = uint32_t(pieces_);
    if (!spin_until([&] { return done_.value.load(std::memory_order_acquire) == pieces; })) {
      caller_waiting_.store(true, std::memory_order_seq_cst);
      for (uint32_t d; (d = done_.value.load(std::memory_order_seq_cst)) != pieces;) done_.wait(d);
      caller_waiting_.store(false, std::memory_order_relaxed);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // The claim word: region (job) number, its piece count and the next unclaimed piece. A worker
  // that wakes late claims nothing from a later region than the one it was woken for.
  static uint64_t pack(uint32_t job, int pieces, int next) {
    return uint64_t(job) << 32 | uint64_t(pieces) << 16 | uint64_t(next);
  }
  // Runs unclaimed pieces of region `job` until none is left.
  void claim_pieces(uint32_t job) {
    for (;;) {
      uint64_t w = next_.load(std::memory_order_acquire);
      int p;
      do {
        p = int(w & 0xffff);
        if (uint32_t(w >> 32) != job || p >= int((w >> 16) & 0xffff)) return;
      } while (!next_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire));
      // The region cannot end before this piece does, so fn_, n_, pieces_ stay this region's.
      const int pieces = pieces_;
      adopt_float_control(float_control_);
      int64_t begin = n_ * p / pieces, end = n_ * (p + 1) / pieces;
      try {
        (*fn_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (done_.value.fetch_add(1, std::memory_order_seq_cst) + 1 == uint32_t(pieces) &&
          caller_waiting_.load(std::memory_order_seq_cst))
        done_.wake_all();
    }
  }
  void work() {
    t_inside = true;
    // From 0, the epoch the pool started with, not from a fresh load: a worker that starts late
    // (after the destructor's bump, in a short process on loaded cores) must still see the change.
    uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return epoch_.value.load(std::memory_order_acquire) != seen; })) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (epoch_.value.load(std::memory_order_seq_cst) == seen && !stop_.load()) epoch_.wait(seen);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = epoch_.value.load(std::memory_order_acquire);
      if (stop_.load()) return;
      claim_pieces(seen);
    }
  }
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, error_mutex_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int pieces_ = 0;
  uint64_t float_control_ = 0;
  std::exception_ptr error_;
  std::atomic<uint64_t> next_{0};
  std::atomic<int> sleepers_{0};
  WaitWord epoch_, done_;  // region number (workers sleep on it); pieces finished (the caller does)
  std::atomic<bool> caller_waiting_{false}, stop_{false};
};

// FLUX_NUM_THREADS: a whole number from 1 to kMaxThreadsPerCore per core (at least 64); anything else
// (0, negative, junk, absurd) is one warning and the fallback: every core, or the cap.
constexpr int kMaxThreadsPerCore = 8;
int configured_threads() {
  unsigned hw_count = std::thread::hardware_concurrency();
  const int hw = hw_count ? int(hw_count) : 1;
  const std::optional<std::string> value = environment::value("FLUX_NUM_THREADS");
  if (!value) return hw;
  const char* v = value->c_str();
  const long cap = std::max(64L, long(kMaxThreadsPerCore) * hw);
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  const bool whole = end != v && *end == '\0' && errno == 0;
  if (whole && n >= 1 && n <= cap) return int(n);
  if (whole && n > cap) {
    detail::log_warning_once("[flux] FLUX_NUM_THREADS=" + std::string(v) + " is more than " + std::to_string(cap) +
                             " threads (" + std::to_string(kMaxThreadsPerCore) + " per core, " + std::to_string(hw) +
                             " cores); using " + std::to_string(cap));
    return int(cap);
  }
  detail::log_warning_once("[flux] FLUX_NUM_THREADS=\"" + std::string(v) + "\" is not a thread count (a whole number from 1 to " +
                           std::to_string(cap) + "); using " + std::to_string(hw) + ", one per core");
  return hw;
}

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

Callers& callers() {
  static Callers c;
  return c;
}
}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n < grain || t_inside || pool().size() == 1) {
    fn(0, n);
    return;
  }
  struct Inside {  // this thread counts as a caller until the region returns or throws
    Inside() : others(callers().enter()) {}
    ~Inside() { callers().leave(); }
    const int others;
  } inside;
  const int team = pool().size() - inside.others;
  if (team < 2) {
    fn(0, n);
    return;
  }
  t_inside = true;
  bool ran;
  try {
    ran = pool().run(n, team, fn);
  } catch (...) {
    t_inside = false;
    throw;
  }
  if (!ran) {
    try {
      fn(0, n);
    } catch (...) {
      t_inside = false;
      throw;
    }
  }
  t_inside = false;
}

}  // namespace flux::cpu_backend
