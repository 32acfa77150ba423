// safetensors files <-> tensors on any device. Reading maps the file and copies each tensor once,
// straight from the mapping into its destination buffer; writing streams each tensor through a
// bounded host staging buffer into a temporary (unnamed where the file system allows) file that is
// fsynced and renamed over the target, so a writer killed at any point leaves the previous file.
#include "flux/io/safetensors.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "flux/random_state.hpp"
#include "src/io/sharded_checkpoint.hpp"
#include "src/internal.hpp"
#include "src/io/safetensors_format.hpp"
#include "src/optimisers/grad_scaler_internal.hpp"

namespace flux {

namespace {

std::string context_of(const std::string& api, const std::string& path) { return "[" + api + "] " + path; }

std::string errno_text() { return std::strerror(errno); }

/// A read-only mapping of a whole file (nothing mapped for an empty file).
class MappedFile {
 public:
  MappedFile(const std::string& context, const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) detail::fail(context, ": cannot open for reading: ", errno_text());
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int e = errno;
      ::close(fd_);
      detail::fail(context, ": cannot stat: ", std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      detail::fail(context, ": not a regular file");
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd_);
        detail::fail(context, ": cannot map: ", std::strerror(e));
      }
      data_ = static_cast<const uint8_t*>(p);
      ::madvise(p, size_, MADV_SEQUENTIAL);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/// An open file and its validated layout.
struct Reader {
  MappedFile file;
  safetensors::Layout layout;
  Reader(const std::string& context, const std::string& path)
      : file(context, path),
        layout(safetensors::parse(file.data() ? file.data() : reinterpret_cast<const uint8_t*>(""), file.size(), context)) {}
  const uint8_t* bytes(const safetensors::Entry& e) const { return file.data() + layout.data_start + e.begin; }
};

/// Waits for the asynchronous host->device copies issued from the mapping before it is unmapped.
class DeviceSync {
 public:
  void touch(const Device& d) {
    for (const Device& seen : devices_)
      if (seen == d) return;
    devices_.push_back(d);
  }
  void wait() {
    for (const Device& d : devices_) detail::backend_for(d.backend()).synchronize(d.index());
    devices_.clear();
  }
  ~DeviceSync() {
    try {
      wait();
    } catch (...) {
    }
  }

 private:
  std::vector<Device> devices_;
};

void copy_entry_into(const Reader& reader, const safetensors::Entry& e, Tensor& dst, DeviceSync& sync) {
  size_t nbytes = size_t(e.end - e.begin);
  if (e.dtype == dst.dtype()) {
    if (nbytes) dst.backend().copy_from_host(dst.device().index(), flux::detail::buffer_of(dst), reader.bytes(e), nbytes);
    detail::mark_written(dst);
    sync.touch(dst.device());
    return;
  }
  // Different dtype: land the file's values on the host, then cast and move them as copy_ does.
  Tensor host = Tensor::empty(Shape(e.shape), e.dtype);
  if (nbytes) host.backend().copy_from_host(0, flux::detail::buffer_of(host), reader.bytes(e), nbytes);
  copy_(dst, host);
}

std::string list_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < 8; ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() > 8) os << ", ... (" << names.size() << " in all)";
  return os.str();
}

void write_all(int fd, const void* data, size_t n, const std::string& context) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      detail::fail(context, ": write failed: ", errno_text());
    }
    p += w;
    n -= size_t(w);
  }
}

/// Temporary names are ".<target>.tmp-<pid>-XXXXXX" in the target's folder.
std::string temp_prefix(const std::string& base) { return "." + base + ".tmp-"; }

/// Removes the temporary files that killed writers (whose process no longer exists) left for this
/// target. A live process's temporary is kept: it may be a concurrent save.
void remove_stale_temps(const std::string& dir, const std::string& base) {
  const std::string prefix = temp_prefix(base);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t dash = name.find('-', prefix.size());
    if (dash == std::string::npos || dash == prefix.size()) continue;
    std::string digits = name.substr(prefix.size(), dash - prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    pid_t pid = pid_t(std::stol(digits));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) ::unlinkat(::dirfd(d), name.c_str(), 0);
  }
  ::closedir(d);
}

/// The file being written, invisible until commit() puts it in place with one rename. Where the file
/// system supports it (Linux O_TMPFILE) the data goes to an unnamed file, so a writer killed at any
/// point leaves nothing behind; the name exists only between linkat() and rename(). Elsewhere a
/// named temporary (mode 0600 while written) is removed by the destructor, or, after a SIGKILL, by the
/// next save of the same target (remove_stale_temps).
class AtomicFile {
 public:
  AtomicFile(const std::string& context, const std::string& path) : context_(context), path_(path) {
    size_t slash = path.find_last_of('/');
    dir_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    base_ = slash == std::string::npos ? path : path.substr(slash + 1);
    remove_stale_temps(dir_, base_);
    struct stat st {};
    mode_ = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;  // the replaced file's mode
#ifdef O_TMPFILE
    if (::access("/proc/self/fd", X_OK) == 0) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
#endif
    if (fd_ < 0) {
      std::string pattern = temp_name() + "XXXXXX";
      std::vector<char> buf(pattern.begin(), pattern.end());
      buf.push_back('\0');
      fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
      if (fd_ < 0) detail::fail(context, ": cannot create a temporary file in '", dir_, "': ", errno_text());
      temp_ = buf.data();
    }
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty() && !committed_) ::unlink(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  int fd() const { return fd_; }

  /// fsync the data, give it a name (unnamed files), rename it over the destination, fsync the folder.
  void commit() {
    if (::fchmod(fd_, mode_) != 0) detail::fail(context_, ": cannot set the file mode: ", errno_text());
    if (::fsync(fd_) != 0) detail::fail(context_, ": fsync failed: ", errno_text());
    if (temp_.empty()) {
      // linkat through /proc names the unnamed file without CAP_DAC_READ_SEARCH (AT_EMPTY_PATH needs it).
      const std::string self = "/proc/self/fd/" + std::to_string(fd_);
      for (int attempt = 0; temp_.empty(); ++attempt) {
        std::string name = temp_name() + random_suffix();
        if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) temp_ = name;
        else if (errno != EEXIST || attempt > 100) detail::fail(context_, ": cannot name the temporary file: ", errno_text());
      }
    }
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) detail::fail(context_, ": close failed: ", errno_text());
    if (::rename(temp_.c_str(), path_.c_str()) != 0) detail::fail(context_, ": cannot rename the temporary file into place: ", errno_text());
    committed_ = true;
    int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string temp_name() const {
    return (dir_ == "/" ? "" : dir_) + "/" + temp_prefix(base_) + std::to_string(::getpid()) + "-";
  }
  static std::string random_suffix() {
    static thread_local uint64_t state = uint64_t(::getpid()) * 0x9E3779B97F4A7C15ull ^ uint64_t(time(nullptr));
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    std::string out;
    for (uint64_t v = state >> 16; out.size() < 6; v /= 36) out += digits[v % 36];
    return out;
  }
  std::string context_, path_, dir_, base_, temp_;
  mode_t mode_ = 0644;
  int fd_ = -1;
  bool committed_ = false;
};

constexpr size_t kStagingBytes = size_t(64) << 20;

/// Copies the file's tensors into `targets` after checking that every name, shape and (unless
/// options->convert_dtypes) dtype matches (nothing is copied otherwise, so a file that does not match
/// leaves the targets as they were). options null: an API without LoadOptions (checkpoints).
/// before_copy (when set) runs after those checks and before the first copy: a throw there leaves the
/// targets as they were too.
Metadata load_from(const std::string& context, const Reader& reader, const io_detail::Targets& targets,
                   const LoadOptions* options, const std::function<void()>& before_copy = {}) {
  std::map<std::string, const safetensors::Entry*> in_file;
  for (const safetensors::Entry& e : reader.layout.entries) in_file.emplace(e.name, &e);

  // Check everything before copying anything, so a bad file leaves the model as it was.
  std::vector<std::string> missing, extra, mismatched, retyped;
  std::set<std::string> wanted;
  std::vector<Tensor> zeroed;  // BatchNorm counters absent from a model file
  const bool convert = options && options->convert_dtypes;
  for (const auto& [name, t] : targets) {
    wanted.insert(name);
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      // A state_dict of PyTorch before 0.4.1, or converted weights, has no BatchNorm step counter;
      // load_state_dict fills it in (0 then; PyTorch 2 keeps the module's own value, 0 when fresh):
      // a model file (load, not checkpoints) without it loads with the count 0.
      const std::string counter = "num_batches_tracked";
      const bool is_counter = name.size() >= counter.size() &&
                              name.compare(name.size() - counter.size(), counter.size(), counter) == 0 &&
                              (name.size() == counter.size() || name[name.size() - counter.size() - 1] == '.');
      if (options && is_counter && t.dtype() == DType::i64 && t.numel() == 1) {
        zeroed.push_back(t);
        continue;
      }
      missing.push_back(name);
      continue;
    }
    if (Shape(it->second->shape) != t.shape())
      mismatched.push_back("'" + name + "' is " + to_string(Shape(it->second->shape)) + " in the file but " +
                           to_string(t.shape()) + " in the model");
    else if (it->second->dtype != t.dtype() && !convert)
      retyped.push_back("'" + name + "' is " + dtype_name(it->second->dtype) + " in the file but " +
                        dtype_name(t.dtype()) + " in the model");
  }
  for (const auto& [name, e] : in_file)
    if (!wanted.count(name)) extra.push_back(name);
  if (!missing.empty() || !extra.empty() || !mismatched.empty() || !retyped.empty()) {
    std::ostringstream os;
    os << context << ": the file does not match the model:";
    if (!missing.empty()) os << " missing from the file: " << list_names(missing) << ";";
    if (!extra.empty()) os << " in the file but not in the model: " << list_names(extra) << ";";
    if (!mismatched.empty()) {
      os << " shape mismatch:";
      for (size_t i = 0; i < mismatched.size() && i < 8; ++i) os << (i ? ", " : " ") << mismatched[i];
      os << ";";
    }
    if (!retyped.empty()) {
      os << " dtype mismatch:";
      for (size_t i = 0; i < retyped.size() && i < 8; ++i) os << (i ? ", " : " ") << retyped[i];
      if (retyped.size() > 8) os << ", ... (" << retyped.size() << " in all)";
      os << (options ? " (load(path, model, {.convert_dtypes = true}) converts them, or convert the model to the "
                       "file's dtypes first)"
                     : " (a checkpoint loads into a model and optimiser state of the dtypes it was saved from)");
      os << ";";
    }
    std::string message = os.str();
    message.pop_back();
    throw Error(message);
  }

  if (before_copy) before_copy();
  DeviceSync sync;
  for (const auto& [name, t] : targets) {
    if (!in_file.count(name)) continue;  // a counter set to 0 below
    Tensor dst = t;
    copy_entry_into(reader, *in_file.at(name), dst, sync);
  }
  sync.wait();
  for (Tensor dst : zeroed) copy_(dst, Tensor(std::vector<int64_t>{0}, dst.shape()));
  return reader.layout.metadata;
}

}  // namespace

std::string pytorch_name(const std::string& flux_name, const std::vector<std::string>& chain_prefixes) {
  std::set<std::string> chains(chain_prefixes.begin(), chain_prefixes.end());
  std::string path, out;
  size_t start = 0;
  while (start <= flux_name.size()) {
    size_t dot = flux_name.find('.', start);
    if (dot == std::string::npos) dot = flux_name.size();
    std::string segment = flux_name.substr(start, dot - start);
    path = path.empty() ? segment : path + "." + segment;
    if (!chains.count(path)) out = out.empty() ? segment : out + "." + segment;
    start = dot + 1;
  }
  return out;
}

namespace io_detail {

void save_named(const std::string& api, const std::string& path, const Targets& tensors, const Metadata& metadata) {
  const std::string context = context_of(api, path);
  // Named here, not as a failed rename of the temporary file at the end.
  if (path.empty()) detail::fail("[", api, "] the path is empty; name a file such as \"model.safetensors\"");
  struct stat target {};
  if (path.back() == '/' || (::stat(path.c_str(), &target) == 0 && S_ISDIR(target.st_mode)))
    detail::fail(context, ": '", path, "' is a directory; name a file such as \"", path,
                 path.back() == '/' ? "" : "/", "model.safetensors\"");
  std::vector<safetensors::Entry> entries;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) detail::fail(context, ": tensor '", name, "' is undefined");
    if (!by_name.emplace(name, &t).second) detail::fail(context, ": two tensors are named '", name, "'");
    if (detail::being_updated(t))  // a cheap check, not a lock: it sees an update in progress
      detail::fail(context, ": tensor '", name, "' is being updated by optimisers::update in another thread; the file ",
                   "would mix two steps. Save from the training thread, between steps");
    safetensors::Entry e;
    e.name = name;
    e.dtype = t.dtype();
    e.shape = t.shape().vec();
    entries.push_back(std::move(e));
  }
  std::string header = safetensors::make_header(entries, metadata, context);

  AtomicFile file(context, path);
  write_all(file.fd(), header.data(), header.size(), context);
  std::vector<uint8_t> staging;
  for (const safetensors::Entry& e : entries) {
    const Tensor& t = *by_name.at(e.name);
    size_t total = t.nbytes();
    staging.resize(std::min(total, kStagingBytes));
    backend::Buffer src = flux::detail::buffer_of(t);
    for (size_t done = 0; done < total;) {
      size_t n = std::min(total - done, kStagingBytes);
      t.backend().copy_to_host(t.device().index(), staging.data(), backend::Buffer{src.handle, src.offset + done}, n);
      write_all(file.fd(), staging.data(), n, context);
      done += n;
    }
  }
  file.commit();
}

Metadata load_into(const std::string& api, const std::string& path, const Targets& targets,
                   const LoadOptions& options) {
  const std::string context = context_of(api, path);
  return load_from(context, Reader(context, path), targets, &options);
}

namespace {
void add_leaf(const optimisers::LeafState& leaf, const std::string& prefix, Targets& out) {
  for (size_t j = 0; j < leaf.buffers.size(); ++j)
    if (leaf.buffers[j].defined()) out.emplace_back(prefix + ".buffers." + std::to_string(j), leaf.buffers[j]);
  out.emplace_back(prefix + ".t", Tensor(std::vector<int64_t>{leaf.t}, Shape{}));
  for (size_t k = 0; k < leaf.children.size(); ++k) add_leaf(leaf.children[k], prefix + ".children." + std::to_string(k), out);
}

/// Targets for a leaf's buffers, plus a host scalar per step count to read back after loading.
void leaf_targets(optimisers::LeafState& leaf, const std::string& prefix, Targets& out,
                  std::vector<std::pair<int64_t*, Tensor>>& steps) {
  for (size_t j = 0; j < leaf.buffers.size(); ++j)
    if (leaf.buffers[j].defined()) out.emplace_back(prefix + ".buffers." + std::to_string(j), leaf.buffers[j]);
  Tensor t = Tensor::empty(Shape{}, DType::i64);
  out.emplace_back(prefix + ".t", t);
  steps.emplace_back(&leaf.t, t);
  for (size_t k = 0; k < leaf.children.size(); ++k)
    leaf_targets(leaf.children[k], prefix + ".children." + std::to_string(k), out, steps);
}

std::string rule_kind(const std::string& rule_name) { return rule_name.substr(0, rule_name.find('(')); }
}  // namespace

void add_optimiser_state(const optimisers::State& s, Targets& out) {
  for (size_t i = 0; i < s.leaves.size(); ++i) add_leaf(s.leaves[i], "optimiser." + std::to_string(i), out);
}

namespace {
// PyTorch GradScaler's state_dict keys, as host scalars.
constexpr const char* kScalerPrefix = "grad_scaler.";
}  // namespace

void add_grad_scaler_state(const optimisers::GradScaler& scaler, Targets& out) {
  const optimisers::GradScaler::SavedState s = scaler.saved_state();
  auto f64 = [](double v) { return Tensor(std::vector<double>{v}, Shape{}); };
  auto i64 = [](int64_t v) { return Tensor(std::vector<int64_t>{v}, Shape{}); };
  const std::string p = kScalerPrefix;
  out.emplace_back(p + "scale", f64(s.scale));
  out.emplace_back(p + "growth_factor", f64(s.growth_factor));
  out.emplace_back(p + "backoff_factor", f64(s.backoff_factor));
  out.emplace_back(p + "growth_tracker", i64(s.growth_tracker));
  out.emplace_back(p + "growth_interval", i64(s.growth_interval));
}

void add_resume_state(const optimisers::State& s, Metadata& meta) {
  meta["flux.steps"] = std::to_string(s.steps);
  meta["flux.random_state"] = to_string(random_state());
}

Metadata load_checkpoint_tensors(const std::string& path, const Targets& model_targets, optimisers::State& s,
                                 optimisers::GradScaler* scaler) {
  if (is_sharded_checkpoint(path)) return load_sharded_gathered(path, model_targets, s, scaler);
  // One open and one header parse: errors name load_checkpoint, and the metadata checked below belong to
  // the tensors loaded (a save replacing the file in between cannot mix two files).
  const std::string context = context_of("load_checkpoint", path);
  const Reader reader(context, path);
  Metadata meta = reader.layout.metadata;
  if (!meta.count("flux.format"))
    detail::fail(context, ": not a flux checkpoint (no \"flux.format\" in __metadata__); use load() for a model file");
  if (s.rule && meta.count("flux.rule") && rule_kind(meta["flux.rule"]) != rule_kind(s.rule->name()))
    detail::fail(context, ": the checkpoint's optimiser is ", meta["flux.rule"], " but opt_state's is ", s.rule->name());
  bool file_has_scaler = false;
  for (const safetensors::Entry& e : reader.layout.entries)
    if (e.name.rfind(kScalerPrefix, 0) == 0) file_has_scaler = true;
  if (file_has_scaler && !scaler)
    detail::fail(context, ": the checkpoint holds a GradScaler's state (grad_scaler.*); pass the scaler: ",
                 "load_checkpoint(path, model, opt_state, scaler)");
  if (!file_has_scaler && scaler)
    detail::fail(context, ": the checkpoint holds no GradScaler state (it was saved without a scaler); load it ",
                 "with load_checkpoint(path, model, opt_state)");
  // Resume state, checked before anything is copied (absent in checkpoints of older versions: then
  // the step count starts at 0 and the generators are left as they are).
  int64_t saved_steps = 0;
  std::optional<RandomState> saved_random;
  if (auto it = meta.find("flux.steps"); it != meta.end()) {
    const std::string& v = it->second;
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE || n < 0)
      detail::fail(context, ": \"flux.steps\" is '", v, "'; expected a non-negative integer (nothing was loaded)");
    saved_steps = n;
  }
  if (auto it = meta.find("flux.random_state"); it != meta.end()) {
    try {
      saved_random = parse_random_state(it->second);
    } catch (const Error& e) {
      detail::fail(context, ": \"flux.random_state\" is malformed (nothing was loaded): ", e.what());
    }
  }
  Targets all;
  for (const auto& [name, t] : model_targets) all.emplace_back("model." + name, t);
  std::vector<std::pair<int64_t*, Tensor>> steps;
  for (size_t i = 0; i < s.leaves.size(); ++i) leaf_targets(s.leaves[i], "optimiser." + std::to_string(i), all, steps);
  Targets scaler_targets;
  if (scaler) {
    add_grad_scaler_state(*scaler, scaler_targets);  // host scalars of the right dtypes, read first
    all.insert(all.end(), scaler_targets.begin(), scaler_targets.end());
  }
  // The scaler's entries are read and checked once the file is known to match and before anything is
  // copied: a corrupt scaler state leaves the model and the optimiser state as they were.
  optimisers::GradScaler::SavedState st{};
  // The step counts are read and checked before anything is copied: a count below 0 (a corrupt or
  // hand-made file) would make Adam's bias correction divide by a negative or zero factor.
  auto read_steps = [&] {
    std::map<const TensorImpl*, std::string> step_names;
    for (const auto& [name, t] : all) step_names.emplace(t.impl(), name);
    DeviceSync sync;
    for (auto& [dst, t] : steps)
      for (const safetensors::Entry& e : reader.layout.entries)
        if (e.name == step_names.at(t.impl())) copy_entry_into(reader, e, t, sync);
    sync.wait();
    for (auto& [dst, t] : steps)
      if (int64_t n = t.item<int64_t>(); n < 0)
        detail::fail(context, ": '", step_names.at(t.impl()), "' (a step count) is ", n,
                     "; expected >= 0 (nothing was loaded)");
  };
  auto read_scaler = [&] {
    DeviceSync sync;
    for (auto& [name, t] : scaler_targets)
      for (const safetensors::Entry& e : reader.layout.entries)
        if (e.name == name) copy_entry_into(reader, e, t, sync);
    sync.wait();
    std::map<std::string, Tensor> v(scaler_targets.begin(), scaler_targets.end());
    const std::string p = kScalerPrefix;
    st = {v.at(p + "scale").item<double>(), v.at(p + "growth_factor").item<double>(),
          v.at(p + "backoff_factor").item<double>(), v.at(p + "growth_tracker").item<int64_t>(),
          v.at(p + "growth_interval").item<int64_t>()};
    try {
      optimisers::detail::check_settings("GradScaler::load_saved_state", "scale", st);
    } catch (const Error& e) {
      detail::fail(context, ": the checkpoint's GradScaler state is invalid (nothing was loaded): ", e.what());
    }
  };
  load_from(context, reader, all, nullptr, [&] {
    read_steps();
    if (scaler) read_scaler();
  });
  for (auto& [dst, t] : steps) *dst = t.item<int64_t>();
  if (scaler) scaler->load_saved_state(st);  // checked above
  s.steps = saved_steps;
  if (saved_random) set_random_state(*saved_random);
  return meta;
}

}  // namespace io_detail

void save_state(const std::string& path, const TensorMap& tensors, const Metadata& metadata) {
  io_detail::Targets named(tensors.begin(), tensors.end());
  io_detail::save_named("save_state", path, named, metadata);
}

TensorMap load_state(const std::string& path, const Device& device) {
  const std::string context = context_of("load_state", path);
  Reader reader(context, path);
  TensorMap out;
  DeviceSync sync;
  for (const safetensors::Entry& e : reader.layout.entries) {
    Tensor t = Tensor::empty(Shape(e.shape), e.dtype, device);
    copy_entry_into(reader, e, t, sync);
    out.emplace(e.name, t);
  }
  sync.wait();
  return out;
}

Metadata load_metadata(const std::string& path) {
  Reader reader(context_of("load_metadata", path), path);
  return reader.layout.metadata;
}

}  // namespace flux
