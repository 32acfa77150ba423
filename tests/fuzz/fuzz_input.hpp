// Shared by the libFuzzer targets: the current input as a file, so each reader is fuzzed through its
// public, path-taking API exactly as users call it. One memfd per process, rewritten for every input
// and opened by path (/proc/self/fd/N); nothing touches the disk. scratch_dir() is a private folder
// (in /dev/shm when present) for round-trip writes, removed at exit.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace flux_fuzz {

inline const std::string& input_path(const uint8_t* data, size_t size) {
  static int fd = [] {
    int f = ::memfd_create("flux-fuzz-input", MFD_CLOEXEC);
    if (f < 0) std::abort();
    return f;
  }();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    ssize_t w = ::pwrite(fd, data + done, size - done, off_t(done));
    if (w <= 0) std::abort();
    done += size_t(w);
  }
  return path;
}

inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the folder runs after static destructors may have.
  static const std::string* dir = [] {
    std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    auto* d = new std::string(base + "/flux-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

/// Aborts (a libFuzzer crash with the input saved) when a property the reader promises fails.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property failed: %s\n", what);
    std::abort();
  }
}

#ifdef FLUX_FUZZ_WITH_TENSORS
/// A tensor's bytes exactly as stored (NaNs and all), from any device.
inline std::string raw_bytes(const flux::Tensor& t) {
  std::string out(t.nbytes(), '\0');
  if (!out.empty()) t.backend().copy_to_host(t.device().index(), out.data(), t.buffer(), out.size());
  t.device().synchronize();
  return out;
}
#endif

}  // namespace flux_fuzz
