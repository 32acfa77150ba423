// Backend registry, plugin loading, preferences and device selection.
#include "flux/device.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <iterator>

#include "flux/error.hpp"
#include "flux/version.hpp"
#include "src/device/parse_device.hpp"
#include "src/device/preferences.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"

namespace flux {

namespace {

bool debug_backends() {
  static const bool on = [] {
    return environment::flag("FLUX_DEBUG_BACKENDS");
  }();
  return on;
}

template <class... Args> void debug(const Args&... args) {
  if (!debug_backends()) return;
  std::ostringstream os;
  (os << ... << args);
  std::fprintf(stderr, "[flux:backends] %s\n", os.str().c_str());
}

// The warnings shown so far (each once per process).
struct Said {
  std::mutex mutex;
  std::set<std::string> messages;
};
Said& said() {
  static Said* s = new Said();  // never destroyed: late warnings at exit
  return *s;
}

void warn_once(const std::string& message) {
  Said& s = said();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.messages.insert(message).second) std::fprintf(stderr, "┌ Warning: %s\n└ @ flux\n", message.c_str());
}

void info(const std::string& message) { std::fprintf(stderr, "[ Info: %s\n", message.c_str()); }

const char* plugin_file(const std::string& backend) {
  if (backend == "OpenCL") return "libflux-opencl.so";
  if (backend == "CUDA") return "libflux-cuda.so";
  if (backend == "AMDGPU") return "libflux-amdgpu.so";
  if (backend == "Metal") return "libflux-metal.so";
  return nullptr;
}

std::vector<std::string> plugin_dirs() {
  std::vector<std::string> dirs;
  if (const std::optional<std::string> p = environment::value("FLUX_BACKEND_PATH")) {
    std::stringstream ss(*p);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) dirs.push_back(item);
  }
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&plugin_dirs), &self) && self.dli_fname) {
    std::filesystem::path lib(self.dli_fname);
    dirs.push_back(lib.parent_path().string());
    dirs.push_back((lib.parent_path() / "flux").string());
  }
#ifdef FLUX_BUILD_BACKEND_DIR
  dirs.push_back(FLUX_BUILD_BACKEND_DIR);
#endif
  // Once each, first mention first (the build tree's lib/ is often libflux's own folder).
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (const std::string& d : dirs) {
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(d, ec);
    if (seen.insert(ec ? d : canonical.string()).second) unique.push_back(d);
  }
  return unique;
}

struct Entry {
  bool attempted = false;
  backend::Backend* backend = nullptr;
  std::string why_not_loaded;
};

std::recursive_mutex g_registry_mutex;
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}

Entry& load(const std::string& name) {
  debug_backends();  // a malformed FLUX_DEBUG_BACKENDS throws here, before the registry changes
  std::lock_guard<std::recursive_mutex> lock(g_registry_mutex);
  Entry& e = registry()[name];
  if (e.attempted) return e;
  e.attempted = true;
  if (name == "CPU") {
    e.backend = &detail::builtin_cpu_backend();
    return e;
  }
  const char* file = plugin_file(name);
  if (!file) {
    e.why_not_loaded = "no plugin exists for backend " + name;
    return e;
  }
  std::vector<std::string> tried;
  for (const std::string& dir : plugin_dirs()) {
    std::filesystem::path path = std::filesystem::path(dir) / file;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      debug(name, ": no ", path.string());
      continue;
    }
    tried.push_back(path.string());
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      e.why_not_loaded = std::string("dlopen failed: ") + dlerror();
      debug(name, ": ", path.string(), ": ", e.why_not_loaded);
      continue;
    }
    auto entry = reinterpret_cast<backend::PluginInfo (*)()>(dlsym(handle, FLUX_BACKEND_PLUGIN_SYMBOL));
    if (!entry) {
      e.why_not_loaded = path.string() + " does not export " FLUX_BACKEND_PLUGIN_SYMBOL;
      debug(name, ": ", e.why_not_loaded);
      dlclose(handle);
      continue;
    }
    backend::PluginInfo plugin = entry();
    if (plugin.abi_version != backend::kBackendAbiVersion) {
      e.why_not_loaded = path.string() + " was built for backend ABI version " +
                         std::to_string(plugin.abi_version) + " but this libflux has ABI version " +
                         std::to_string(backend::kBackendAbiVersion);
      debug(name, ": refused: ", e.why_not_loaded);
      warn_once("[flux] plugin refused: " + e.why_not_loaded);
      dlclose(handle);
      continue;
    }
    if (!plugin.create) {
      e.why_not_loaded = path.string() + " returned no create function";
      debug(name, ": ", e.why_not_loaded);
      dlclose(handle);
      continue;
    }
    try {
      e.backend = plugin.create();
    } catch (const std::exception& ex) {
      e.why_not_loaded = path.string() + ": initialisation failed: " + ex.what();
    } catch (...) {
      e.why_not_loaded = path.string() + ": initialisation failed with a non-standard exception";
    }
    if (!e.backend) {
      // The handle stays open: a half-initialised plugin may have registered atexit handlers.
      if (e.why_not_loaded.empty()) e.why_not_loaded = path.string() + ": create() returned no backend";
      debug(name, ": ", e.why_not_loaded);
      continue;
    }
    e.why_not_loaded.clear();
    debug(name, ": loaded ", path.string(), " (", e.backend->device_count(), " device(s))");
    return e;
  }
  if (tried.empty()) e.why_not_loaded = std::string(file) + " was not found";
  debug(name, ": not loaded: ", e.why_not_loaded);
  return e;
}

std::filesystem::path preferences_path() {
  if (const std::optional<std::string> p = environment::value("FLUX_PREFERENCES")) {
    std::filesystem::path path(*p);
    if (path.extension() == ".toml") return path;
    return path / "LocalPreferences.toml";
  }
  return std::filesystem::current_path() / "LocalPreferences.toml";
}

// The text of a preference file, or nullopt with `why` set: a directory, a device file, a file over
// 1 MiB or one that cannot be read is refused here rather than read into memory without end
// (/dev/zero) or left to a std exception.
std::optional<std::string> read_preferences_text(const std::filesystem::path& path, std::string& why) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) {
    why = ec.message();
    return std::nullopt;
  }
  if (!std::filesystem::is_regular_file(status)) {
    why = std::filesystem::is_directory(status) ? "it is a directory" : "it is not a regular file";
    return std::nullopt;
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > (1u << 20)) {
    why = ec ? ec.message() : "it is larger than 1 MiB";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = "it cannot be opened";
    return std::nullopt;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    why = "reading it failed";
    return std::nullopt;
  }
  return text;
}

// The preference as read once at start; empty when none.
const std::string& preferred_backend() {
  static const std::string pref = [] {
    std::filesystem::path path = preferences_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      debug("preferences: no ", path.string());
      return std::string();
    }
    std::string why;
    std::optional<std::string> text = read_preferences_text(path, why);
    if (!text) {
      warn_once("[flux] cannot read " + path.string() + " (" + why + "). Ignoring the preference.");
      return std::string();
    }
    preferences::Preference p = preferences::parse(*text, path.string());
    if (!p.warning.empty()) warn_once(p.warning);
    if (p.backend.empty()) {
      if (p.warning.empty()) debug("preferences: ", path.string(), " has no [flux] gpu_backend");
      return std::string();
    }
    debug("preferences: gpu_backend = ", p.backend, " from ", path.string());
    return p.backend;
  }();
  return pref;
}

bool usable_gpu(backend::Backend* b, int& index) {
  int n = b->device_count();
  for (int i = 0; i < n; ++i)
    if (!b->device_is_cpu(i)) {
      index = i;
      return true;
    }
  return false;
}

}  // namespace

namespace detail {
void log_warning_once(const std::string& message) { warn_once(message); }
void forget_logged_warnings() {
  Said& s = said();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.messages.clear();
}
std::string preferences_file() { return preferences_path().string(); }
}  // namespace detail

namespace detail {
backend::Backend* try_backend(const std::string& name) { return load(name).backend; }

backend::Backend& backend_for(const std::string& name) {
  Entry& e = load(name);
  if (!e.backend) {
    auto names = supported_devices();
    if (std::find(names.begin(), names.end(), name) == names.end())
      fail("[device] unknown backend \"", name, "\"; supported are CUDA, AMDGPU, Metal, OpenCL, CPU");
    fail("[device] backend ", name, " is not loaded: ", e.why_not_loaded);
  }
  return *e.backend;
}

backend::Backend& backend_for(const Device& d) {
  if (d.backend() == "CPU") {
    if (d.index() != 0) fail("[device] CPU has one device (index 0); got ", d.backend(), ":", d.index());
    return detail::builtin_cpu_backend();
  }
  backend::Backend& b = backend_for(d.backend());
  if (d.index() < 0 || d.index() >= b.device_count())
    fail("[device] ", to_string(d), " does not exist: ", d.backend(), " has ", b.device_count(), " device(s)");
  return b;
}
}  // namespace detail

std::string Device::name() const { return detail::backend_for(*this).device_name(index_); }
backend::MemoryInfo Device::memory() const { return detail::backend_for(*this).memory(index_); }
void Device::synchronize() const { detail::backend_for(*this).synchronize(index_); }

std::string to_string(const Device& d) {
  return d.backend() == "CPU" ? std::string("CPU") : d.backend() + ":" + std::to_string(d.index());
}
std::ostream& operator<<(std::ostream& os, const Device& d) { return os << to_string(d); }

std::vector<std::string> supported_devices() { return {"CUDA", "AMDGPU", "Metal", "OpenCL", "CPU"}; }

bool loaded(const std::string& name) {
  std::string canonical = detail::canonical_backend(name);
  return load(canonical.empty() ? name : canonical).backend != nullptr;
}

bool functional(const std::string& name) {
  std::string canonical = detail::canonical_backend(name);
  backend::Backend* b = load(canonical.empty() ? name : canonical).backend;
  return b && b->device_count() > 0;
}

std::string GPU_BACKEND() {
  const std::string& p = preferred_backend();
  return p.empty() ? "CUDA" : p;
}

void gpu_backend(const std::string& name) {
  // Exact names, as Flux's gpu_backend! (the preference file is read case-sensitively elsewhere);
  // another case gets the spelling to use.
  auto names = supported_devices();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    const std::string canonical = detail::canonical_backend(name);
    detail::fail("[gpu_backend] unknown backend \"", name, "\"; supported are CUDA, AMDGPU, Metal, OpenCL, CPU",
                 canonical.empty() ? "" : " (names are case-sensitive here: did you mean \"" + canonical + "\"?)");
  }
  // The preference this process started with; read now, before the file changes under it.
  const std::string& at_start = preferred_backend();
  std::filesystem::path path = preferences_path();
  std::string existing;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    std::string why;
    std::optional<std::string> text = read_preferences_text(path, why);
    if (!text) detail::fail("[gpu_backend] cannot read ", path.string(), ": ", why);
    existing = std::move(*text);
  }
  std::string text = preferences::with_backend(existing, path.string(), name);
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) detail::fail("[gpu_backend] cannot write ", tmp.string());
    out << text;
    if (!out) detail::fail("[gpu_backend] failed writing ", tmp.string());
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) detail::fail("[gpu_backend] cannot replace ", path.string(), ": ", ec.message());
  if (name == at_start) {
    info("GPU backend is already set to: " + name + ". No need to do anything else.");
  } else {
    info("New GPU backend set: " + name + " (written to " + path.string() +
         "). Restart your program for this change to take effect.");
  }
}

// The choice get_device() makes: the preference if loaded and functional, else the first functional
// GPU. `note(is_warning, text)` hears each step (get_device prints them; versioninfo stays quiet).
static Device choose_device(const std::function<void(bool, const std::string&)>& note) {
  const std::string& pref = preferred_backend();
  if (!pref.empty()) {
    if (pref == "CPU") {
      note(false, "Using backend set in preferences: CPU.");
      return Device();
    }
    Entry& e = load(pref);
    if (!e.backend) {
      note(true, "Trying to use backend: " + pref + " but its plugin is not loaded (" + e.why_not_loaded +
                     "). Falling back to automatic device selection.");
    } else if (e.backend->device_count() == 0) {
      std::string why = e.backend->not_functional_reason();
      note(true, "Trying to use backend: " + pref + " but it is not functional" +
                     (why.empty() ? std::string() : " (" + why + ")") + ". Falling back to automatic device selection.");
    } else {
      note(false, "Using backend set in preferences: " + pref + ".");
      return Device(pref, 0);
    }
  }
  note(false, "Running automatic device selection...");
  for (std::string name : {"CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    note(false, "Trying backend: " + std::string(name) + ".");
    Entry& e = load(name);
    int index = 0;
    if (!e.backend) {
      note(false, "Backend " + std::string(name) + " is not loaded.");
    } else if (e.backend->device_count() == 0) {
      note(false, "Backend " + std::string(name) + " is loaded but not functional.");
    } else if (!usable_gpu(e.backend, index)) {
      note(false, "Backend " + std::string(name) + " only has CPU devices; skipped (name it to use it).");
    } else {
      note(false, "Device found! Using " + std::string(name) + ":" + std::to_string(index) + ".");
      return Device(name, index);
    }
  }
  note(false, "No functional GPU backend found! Defaulting to CPU.");
  return Device();
}

Device get_device(GetDeviceOptions options) {
  return choose_device([&](bool is_warning, const std::string& text) {
    if (is_warning) warn_once(text);
    else if (options.verbose) info(text);
  });
}

Device get_device(const std::string& spec, int index) {
  // "OpenCL:1" carries its index (to_string's form); names are case-insensitive.
  std::string name = detail::canonical_backend(spec.substr(0, spec.find(':')));
  if (name.empty())
    detail::fail("[get_device] unsupported backend \"", spec, "\"; supported_devices() = CUDA, AMDGPU, Metal, OpenCL, CPU",
                 " (any case, optionally with an index: \"OpenCL:0\")");
  if (spec.find(':') != std::string::npos) {
    if (index != 0)
      detail::fail("[get_device] \"", spec, "\" names its index already, and index ", index,
                   " was passed too; write get_device(\"", name, ":", index, "\") or get_device(\"", name, "\", ", index, ")");
    Device parsed = parse_device(spec);
    index = parsed.index();
  }
  if (name == "CPU") {
    if (index != 0) detail::fail("[get_device] CPU has one device (index 0); got index ", index);
    return Device();
  }
  Entry& e = load(name);
  if (!e.backend) detail::fail("[get_device] backend ", name, " is not loaded: ", e.why_not_loaded);
  int n = e.backend->device_count();
  if (n == 0) {
    std::string why = e.backend->not_functional_reason();
    detail::fail("[get_device] backend ", name, " is loaded but not functional", why.empty() ? "" : ": ", why);
  }
  if (index < 0 || index >= n)
    detail::fail("[get_device] device index ", index, " is out of range for ", name, ", which has ", n,
                 " device(s) (0-based: 0..", n - 1, ")");
  return Device(name, index);
}

static std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MiB", double(bytes) / 1048576.0);
  return buf;
}

void memory_status(std::ostream& os) {
  for (std::string name : {"CPU", "CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    backend::Backend* b = load(name).backend;
    if (!b) continue;
    int n = b->device_count();
    for (int i = 0; i < n; ++i) {
      backend::MemoryInfo m = b->memory(i);
      Device d = name == "CPU" ? Device() : Device(name, i);
      os << to_string(d) << " (" << b->device_name(i) << "): used " << mib(m.used) << ", reserved "
         << mib(m.reserved) << " (pool), free " << mib(m.free) << " of " << mib(m.total) << "\n";
    }
  }
}
void memory_status() { memory_status(std::cout); }

void versioninfo(std::ostream& os) {
  os << "flux-cpp " << FLUX_VERSION_STRING << " (backend ABI " << backend::kBackendAbiVersion << ")\n";
  for (std::string name : {"CPU", "CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    Entry& e = load(name);
    os << "\n" << name << ": ";
    if (!e.backend) {
      os << "not loaded (" << e.why_not_loaded << ")\n";
      continue;
    }
    int n = e.backend->device_count();
    os << (n ? "functional" : "loaded, not functional");
    std::string why = n ? "" : e.backend->not_functional_reason();
    if (!why.empty()) os << " (" << why << ")";
    os << "\n" << e.backend->version_info();
    for (int i = 0; i < n; ++i)
      os << "  " << i << ": " << e.backend->device_name(i) << (e.backend->device_is_cpu(i) ? " [CPU device]" : "") << "\n";
  }
  const std::string& pref = preferred_backend();
  const Device chosen = choose_device([](bool, const std::string&) {});
  os << "\nPreferred GPU backend: " << (pref.empty() ? "none set" : pref) << " [" << preferences_path().string()
     << "]\nget_device() chooses: " << to_string(chosen)
     << (chosen.is_cpu() ? " (no functional GPU backend; `gpu` is a no-op)" : "") << "\n";
}
void versioninfo() { versioninfo(std::cout); }

}  // namespace flux
