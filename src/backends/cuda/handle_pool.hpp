// Library handles (cuBLAS, cuDNN) per host thread and device. Such a handle must not be used by two
// threads at once (NVIDIA's rule for both libraries), so every thread takes its own: from its
// device's pool on its first call there, given back to the pool when the thread ends (a later thread
// reuses it, so the count stays at the most threads that ever ran at once). The pool's lock is taken
// only then; every other call reads the calling thread's own table, so calls from many threads run
// at once. A handle is rebound only when its stream changes. Handles are never destroyed: the pools
// live as long as the process, as the backend does.
//
// Library supplies: `using Handle`, `using Stream`; `static Handle create(int device)` (run with the
// device current; null where the library cannot start there, remembered for the device; may throw);
// `static void bind(Handle, Stream, int device)` (set the handle's stream; throws on failure).
// Nothing here calls the GPU runtime, so tests/test_handle_pool.cpp checks it with a fake library.
#pragma once
#include <mutex>
#include <vector>

namespace flux::cuda_backend {

template <class Library> class HandlePool {
 public:
  using Handle = typename Library::Handle;
  using Stream = typename Library::Stream;

  /// This thread's handle for `device`, bound to `s`; null where the library cannot start there.
  static Handle get(int device, Stream s) {
    Lease& lease = this_thread();
    if (size_t(device) >= lease.slots.size()) lease.slots.resize(size_t(device) + 1);
    Slot& slot = lease.slots[size_t(device)];
    if (!slot.handle && !slot.failed) take(device, slot);
    if (!slot.handle) return Handle{};
    if (!slot.bound || slot.stream != s) {
      Library::bind(slot.handle, s, device);
      slot.stream = s, slot.bound = true;
    }
    return slot.handle;
  }

 private:
  struct Slot {
    Handle handle{};
    Stream stream{};
    bool bound = false, failed = false;
  };
  /// The handles no thread holds, and the devices where the library could not start.
  struct Pools {
    std::mutex mutex;
    std::vector<std::vector<Handle>> idle;  // by device
    std::vector<bool> failed;               // by device
  };
  /// One thread's handles by device; back to the pools when the thread ends.
  struct Lease {
    std::vector<Slot> slots;
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      Pools& p = pools();
      std::lock_guard<std::mutex> lock(p.mutex);
      for (size_t d = 0; d < slots.size(); ++d)
        if (slots[d].handle) p.idle[d].push_back(slots[d].handle);
    }
  };

  static Pools& pools() {
    static Pools* p = new Pools();  // never destroyed: threads give handles back after static destructors
    return *p;
  }
  static Lease& this_thread() {
    thread_local Lease lease;
    return lease;
  }

  // An idle handle of the device, else a new one (created outside the lock); failure is remembered.
  static void take(int device, Slot& slot) {
    Pools& p = pools();
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      if (size_t(device) >= p.idle.size()) p.idle.resize(size_t(device) + 1), p.failed.resize(size_t(device) + 1, false);
      if (p.failed[size_t(device)]) {
        slot.failed = true;
        return;
      }
      if (!p.idle[size_t(device)].empty()) {
        slot.handle = p.idle[size_t(device)].back();
        p.idle[size_t(device)].pop_back();
        return;
      }
    }
    slot.handle = Library::create(device);
    if (slot.handle) return;
    slot.failed = true;
    std::lock_guard<std::mutex> lock(p.mutex);
    p.failed[size_t(device)] = true;
  }
};

}  // namespace flux::cuda_backend
