// A small passive thread pool: workers sleep on a condition variable (no spinning, so they do not
// fight OpenBLAS's threads), and small loops run inline on the caller.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu {

namespace {
thread_local bool t_inside = false;

class Pool {
 public:
  explicit Pool(int n) : threads_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return threads_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(run_mutex_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lock(m_);
      fn_ = &fn;
      n_ = n;
      pending_ = threads_ - 1;
      ++epoch_;
    }
    cv_.notify_all();
    chunk(0, fn);
    std::unique_lock<std::mutex> lock(m_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void chunk(int part, const std::function<void(int64_t, int64_t)>& fn) {
    int64_t begin = n_ * part / threads_, end = n_ * (part + 1) / threads_;
    if (begin < end) fn(begin, end);
  }
  void work(int part) {
    t_inside = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || epoch_ != seen; });
        if (stop_) return;
        seen = epoch_;
        fn = fn_;
      }
      chunk(part, *fn);
      {
        std::lock_guard<std::mutex> lock(m_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex m_, run_mutex_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int pending_ = 0;
  uint64_t epoch_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* v = std::getenv("FLUX_NUM_THREADS")) {
    int n = std::atoi(v);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}
}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n < grain || t_inside || pool().size() == 1) {
    fn(0, n);
    return;
  }
  t_inside = true;
  try {
    pool().run(n, fn);
  } catch (...) {
    t_inside = false;
    throw;
  }
  t_inside = false;
}

}  // namespace flux::cpu
