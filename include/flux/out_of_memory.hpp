// flux::OutOfMemory: a device allocation that failed after the backend emptied its cache and retried.
#pragma once
#include <cstddef>
#include <cstdio>
#include <sstream>
#include <string>

#include "flux/error.hpp"

namespace flux {

/// Thrown when a device allocation fails even after its backend freed every cached block and tried
/// once more. what() names the device, the requested size and the memory figures; so do the fields
/// (a figure the backend cannot know is 0).
class __attribute__((visibility("default"))) OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& device, size_t requested, size_t used, size_t cached, size_t total,
              const std::string& cause = "")
      : Error(describe(device, requested, used, cached, total, cause)),
        device_(device), requested_(requested), used_(used), cached_(cached), total_(total) {}
  /// "OpenCL:0", "CPU", "CUDA:1".
  const std::string& device() const { return device_; }
  /// Bytes asked for (before the pool's rounding).
  size_t requested() const { return requested_; }
  /// Bytes held by live tensors, by the cache (after it was emptied), and the device's total or limit.
  size_t used() const { return used_; }
  size_t cached() const { return cached_; }
  size_t total() const { return total_; }

  /// "1.50 GiB (1610612736 bytes)"-style text for a byte count.
  static std::string bytes_text(size_t n) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = double(n);
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, ++u;
    char buf[64];
    if (u == 0) std::snprintf(buf, sizeof buf, "%zu bytes", n);
    else std::snprintf(buf, sizeof buf, "%.2f %s (%zu bytes)", v, units[u], n);
    return buf;
  }

 private:
  static std::string describe(const std::string& device, size_t requested, size_t used, size_t cached, size_t total,
                              const std::string& cause) {
    std::ostringstream os;
    os << "[allocate] out of memory on " << device << ": cannot allocate " << bytes_text(requested)
       << " after freeing the cached blocks and retrying";
    if (!cause.empty()) os << " (" << cause << ")";
    os << "; used by tensors " << bytes_text(used) << ", cached " << bytes_text(cached) << ", total "
       << (total ? bytes_text(total) : std::string("unknown"))
       << ". Free tensors you no longer need, or use smaller batches";
    return os.str();
  }
  std::string device_;
  size_t requested_, used_, cached_, total_;
};

}  // namespace flux
