// The background half of DeviceLoader: one worker thread, a bounded queue of ready batches.
#include "flux/data/device_loader.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "flux/error.hpp"

namespace flux::detail {

struct BatchPrefetcher::State {
  int64_t count = 0;
  int depth = 1;
  Producer produce;

  mutable std::mutex m;
  std::condition_variable cv;
  std::deque<Batch> ready;               // produced, not yet taken
  std::exception_ptr error;              // set by the worker; the batch after the last good one
  int64_t produced = 0;                  // batches put into `ready` (or failed)
  int64_t taken = 0;                     // batches handed to the consumer
  bool stop = false;
  Batch current;                         // the batch last handed out, released on the next call
  std::thread worker;

  void run() {
    for (int64_t i = 0; i < count; ++i) {
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return stop || int64_t(ready.size()) < depth; });
        if (stop) return;
      }
      Batch b;
      std::exception_ptr failure;
      try {
        b = produce(i);
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(m);
        if (failure) {
          error = failure;
        } else {
          ready.push_back(std::move(b));
        }
        ++produced;
      }
      cv.notify_all();
      if (failure) return;
    }
  }
};

BatchPrefetcher::BatchPrefetcher(int64_t count, Producer produce, int depth) : state_(std::make_unique<State>()) {
  if (depth < 1) fail("[DeviceLoader] prefetch depth must be at least 1, got ", depth);
  state_->count = count;
  state_->depth = depth;
  state_->produce = std::move(produce);
  State* s = state_.get();
  state_->worker = std::thread([s] { s->run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(state_->m);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->worker.joinable()) state_->worker.join();
}

std::vector<Tensor> BatchPrefetcher::next() {
  State& s = *state_;
  Batch b;
  {
    std::unique_lock<std::mutex> lock(s.m);
    if (s.taken >= s.count) fail("[DeviceLoader] iterated past the last of ", s.count, " batches");
    s.current = Batch();  // release the previous batch before waiting for the next
    s.cv.wait(lock, [&] { return !s.ready.empty() || s.error; });
    if (s.ready.empty()) std::rethrow_exception(s.error);
    b = std::move(s.ready.front());
    s.ready.pop_front();
    ++s.taken;
  }
  s.cv.notify_all();
  std::vector<Tensor> out = b.tensors;
  std::lock_guard<std::mutex> lock(s.m);
  s.current = std::move(b);
  return out;
}

int64_t BatchPrefetcher::produced() const {
  std::lock_guard<std::mutex> lock(state_->m);
  return state_->produced;
}

void check_loader_device(const Device& d) {
  if (d.is_cpu()) {
    if (d.index() != 0) fail("[DataLoader | device] CPU has one device (index 0); got index ", d.index());
    return;
  }
  backend::Backend* b = try_backend(d.backend());
  if (!b) backend_for(d.backend());  // throws with the reason
  int n = b->device_count();
  if (d.index() < 0 || d.index() >= n)
    fail("[DataLoader | device] ", to_string(d), " does not exist: ", d.backend(), " has ", n, " device(s)");
}

}  // namespace flux::detail
