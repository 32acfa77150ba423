// The table of FLUX_* environment variables and their reader (src/environment.hpp).
#include "src/environment.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "src/internal.hpp"

namespace flux::environment {

// Errors, not warnings, unless failing would stop a running service for a setting that has a safe
// fallback: FLUX_NUM_THREADS (read when the thread pool starts, inside the first op of any caller:
// one thread per core is always correct), FLUX_OPENCL_DEVICES (read while the OpenCL plugin
// discovers devices; throwing there would stop get_device() for every backend, the CPU included: the
// plugin is "loaded, not functional" with the reason instead) and FLUX_DEBUG_BACKENDS (a log switch,
// read by every device lookup: a typo in it must not stop a program; it warns and logs nothing).
const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = {
      {"FLUX_AUTOCAST_EMULATE", "boolean", "`0`, `1`, `true`, `false`, `on`, `off`", "`0`",
       "compute autocast's bf16/f16 on CPUs without units for them (slow; for checking numerics)", false},
      {"FLUX_BACKEND_PATH", "paths", "folders separated by `:`", "(none)", "extra folders to look for backend plugins in",
       false},
      {"FLUX_CONV_FUSION", "boolean", "`0`, `1`, `true`, `false`, `on`, `off`", "`1`",
       "fuse conv + bias + activation (and BatchNorm at inference) into one kernel", false},
      {"FLUX_CPU_MEMORY_LIMIT", "size", "bytes, optionally with `K`, `M` or `G` (e.g. `512M`); `0`: no limit", "`0`",
       "the most the CPU pool may hold, live tensors and cached free blocks", false},
      {"FLUX_CPU_POOL", "choice", "`best_fit`, `size_classes`", "`best_fit`",
       "the CPU caching pool: best fit with splitting and coalescing, or the size-class cache it replaced", false},
      {"FLUX_DEBUG_BACKENDS", "boolean", "`0`, `1`, `true`, `false`, `on`, `off`", "`0`",
       "log every plugin path tried, every dlopen error and every device count (an invalid value warns once)", true},
      {"FLUX_DISTRIBUTED_TIMEOUT", "seconds", "a positive number", "`60`",
       "how long a rank waits for the others before ending with an error", false},
      {"FLUX_FLUSH_DENORMALS", "choice", "`0`, `1`, `all`", "`1`",
       "flush subnormals to zero: 0 never, 1 for float32/float16/bfloat16, all for float64 too", false},
      {"FLUX_FUSED_ATTENTION", "boolean", "`0`, `1`, `true`, `false`, `on`, `off`", "`1`",
       "run attention fused (tiles, online softmax) on the CPU; 0 composes matmul, softmax, matmul", false},
      {"FLUX_KERNEL_TABLE", "path", "a file path", "`flux-kernels.tsv` beside `LocalPreferences.toml`",
       "the tuned kernel table that tune_kernels writes and every run reads", false},
      {"FLUX_LIBRARY_KERNELS", "boolean", "`0`, `1`, `true`, `false`, `on`, `off`", "`1`",
       "use oneDNN and flux's tuned kernels on the CPU; 0 forces the portable path", false},
      {"FLUX_NUM_THREADS", "integer", "a whole number from 1 to 8 per core (at least 64)", "one per core",
       "the CPU thread pool's size (an invalid value warns once and uses the default or the cap)", true},
      {"FLUX_ONEDNN_LAYOUT", "choice", "`auto`, `plain`, `any`, `plain-src`", "`auto`",
       "the memory layout of oneDNN convolutions (auto: the heuristic in src/backends/cpu/conv.cpp)", false},
      {"FLUX_ONEDNN_THREADING", "choice", "`pool`, `omp`", "`pool`",
       "run oneDNN on flux's thread pool, or as one call on an OpenMP team", false},
      {"FLUX_OPENCL_DEVICES", "devices", "`-1` (none), or indices separated by `,` (e.g. `0,2`)", "every device",
       "the OpenCL devices used, as CUDA_VISIBLE_DEVICES (an invalid value hides them all, with the reason)", true},
      {"FLUX_PREFERENCES", "path", "a `.toml` file or a folder", "the working directory",
       "where gpu_backend() writes and get_device() reads LocalPreferences.toml", false},
  };
  return table;
}

namespace {
const Variable& find(const char* name) {
  for (const Variable& v : variables())
    if (std::string_view(v.name) == name) return v;
  flux::detail::fail("[flux] internal: the environment variable ", name, " is not in src/environment.cpp's table");
}

// The allowed words of a choice, from the table's text ("`a`, `b`" -> a, b).
std::vector<std::string> words(const char* allowed) {
  std::vector<std::string> out;
  std::string s = allowed;
  for (size_t at = s.find('`'); at != std::string::npos; at = s.find('`', at)) {
    size_t close = s.find('`', at + 1);
    if (close == std::string::npos) break;
    out.push_back(s.substr(at + 1, close - at - 1));
    at = close + 1;
  }
  return out;
}

std::string unquoted(const char* text) {
  std::string s = text;
  s.erase(std::remove(s.begin(), s.end(), '`'), s.end());
  return s;
}
}  // namespace

std::optional<std::string> value(const char* name) {
  find(name);
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::string invalid_message(const char* name, const std::string& value) {
  const Variable& v = find(name);
  return std::string(name) + "='" + value + "' is not allowed: expected " + unquoted(v.allowed) + " (default " +
         unquoted(v.default_value) + ")";
}

void invalid(const char* name, const std::string& value) { flux::detail::fail("[flux] ", invalid_message(name, value)); }

namespace {
// An invalid value: the error, or for a variable marked `warns` one warning and the default.
std::string refuse(const Variable& var, const std::string& value, const std::string& fallback) {
  if (!var.warns) invalid(var.name, value);
  flux::detail::log_warning_once("[flux] " + invalid_message(var.name, value) + "; using " + fallback);
  return fallback;
}
}  // namespace

bool flag(const char* name) {
  const Variable& var = find(name);
  std::optional<std::string> v = value(name);
  const std::string fallback = words(var.default_value).at(0);
  if (!v) return *parse_flag(fallback);
  std::optional<bool> b = parse_flag(*v);
  if (!b) return *parse_flag(refuse(var, *v, fallback));
  return *b;
}

std::string choice(const char* name) {
  const Variable& var = find(name);
  std::optional<std::string> v = value(name);
  if (!v) return words(var.default_value).at(0);
  for (const std::string& w : words(var.allowed))
    if (*v == w) return w;
  return refuse(var, *v, words(var.default_value).at(0));
}

size_t bytes(const char* name) {
  std::optional<std::string> v = value(name);
  if (!v) return 0;
  const char* s = v->c_str();
  // strtoull accepts "-1" (as 2^64 - 1) and leading blanks: only digits may start the number.
  if (!std::isdigit(static_cast<unsigned char>(s[0]))) invalid(name, *v);
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(s, &end, 10);
  size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = size_t(1) << 10, ++end;
  else if (*end == 'M' || *end == 'm') scale = size_t(1) << 20, ++end;
  else if (*end == 'G' || *end == 'g') scale = size_t(1) << 30, ++end;
  if (errno || *end != '\0' || n > SIZE_MAX / scale) invalid(name, *v);
  return size_t(n) * scale;
}

double positive_number(const char* name, double fallback) {
  std::optional<std::string> v = value(name);
  if (!v) return fallback;
  char* end = nullptr;
  double t = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || !(t > 0) || !std::isfinite(t)) invalid(name, *v);
  return t;
}

std::optional<std::vector<int>> parse_device_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t start = item.find_first_not_of(' '), stop = item.find_last_not_of(' ');
    if (start == std::string::npos) return std::nullopt;
    item = item.substr(start, stop - start + 1);
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || errno || n > 1 << 20 || n < -(1 << 20)) return std::nullopt;
    if (n < 0) break;  // as CUDA_VISIBLE_DEVICES: the list ends at the first negative entry
    out.push_back(int(n));
  }
  return out;
}

}  // namespace flux::environment
