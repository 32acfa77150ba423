// Devices, the backend registry and device selection (Flux's get_device, gpu_backend!, ...).
#pragma once
#include <cstddef>
#include <iosfwd>
#include <string>
#include <vector>

#include "flux/backend.hpp"

namespace flux {

/// A backend name plus a 0-based device index. Cheap to copy; compares by value.
class Device {
 public:
  Device() : backend_("CPU"), index_(0) {}
  Device(std::string backend, int index) : backend_(std::move(backend)), index_(index) {}
  const std::string& backend() const { return backend_; }
  int index() const { return index_; }
  /// The driver's device name, e.g. "pthread-Intel(R) Xeon(R)".
  std::string name() const;
  /// Memory figures of this device (used/reserved by flux's pool, free/total from the driver).
  backend::MemoryInfo memory() const;
  /// Waits for all queued work on this device.
  void synchronize() const;
  bool is_cpu() const { return backend_ == "CPU"; }
  bool operator==(const Device& o) const { return index_ == o.index_ && backend_ == o.backend_; }
  bool operator!=(const Device& o) const { return !(*this == o); }

 private:
  std::string backend_;
  int index_;
};

/// "CUDA:1", "CPU".
std::string to_string(const Device& d);
std::ostream& operator<<(std::ostream& os, const Device& d);

struct GetDeviceOptions {
  bool verbose = false;
};
/// The preferred backend if set, loaded and functional; else the first functional GPU of CUDA,
/// AMDGPU, Metal, OpenCL (OpenCL devices that are CPUs are skipped); else CPU.
Device get_device(GetDeviceOptions options = {});
/// A named backend's device (0-based); throws flux::Error when unknown, not functional or out of range.
/// `backend` is case-insensitive and may carry the index as to_string prints it: get_device("OpenCL:0"),
/// get_device("opencl", 1), get_device("cpu").
Device get_device(const std::string& backend, int index = 0);
/// Parses a device as to_string prints it ("CPU", "OpenCL:0", "cuda:1"; a missing index is 0; names
/// case-insensitive) without loading anything; get_device(spec) also checks that it exists. Throws
/// flux::Error naming the spelling and what was expected.
Device parse_device(const std::string& spec);
/// {"CUDA", "AMDGPU", "Metal", "OpenCL", "CPU"}, in priority order.
std::vector<std::string> supported_devices();
/// True when the backend's plugin is loaded (CPU always).
bool loaded(const std::string& backend);
/// True when the backend is loaded and has at least one usable device.
bool functional(const std::string& backend);
/// Writes `[flux] gpu_backend = name` to LocalPreferences.toml ($FLUX_PREFERENCES, else ./); takes effect at next start.
void gpu_backend(const std::string& name);
/// The preferred GPU backend as read at start ("CUDA" when none is set, as in Flux).
std::string GPU_BACKEND();
/// Prints the memory figures of every device.
void memory_status(std::ostream& os);
void memory_status();
/// Prints versions of flux, every backend and its devices.
void versioninfo(std::ostream& os);
void versioninfo();

namespace detail {
/// The backend implementing `d`; loads the plugin on first use; throws if unavailable.
backend::Backend& backend_for(const Device& d);
backend::Backend& backend_for(const std::string& backend_name);
backend::Backend* try_backend(const std::string& backend_name);
}  // namespace detail

}  // namespace flux
