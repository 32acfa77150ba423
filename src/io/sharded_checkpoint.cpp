// Sharded checkpoints (distributed/shard.hpp): a folder with one safetensors file per rank and
// index.json. Rank r's file "g<generation>-rank<r>-of<ranks>.safetensors" holds its master chunks
// ("model.<name>", shape (chunk,)), its optimiser chunks ("optimiser.<i>...buffers.<j>", the step
// counts "...t"), and in its metadata the resume state (flux.steps, flux.random_state of that rank);
// rank 0's file also holds the non-trainable leaves whole and the GradScaler state. index.json names
// the files, the ranks, and each trainable array's name, shape, dtype and chunk; rank 0 writes it
// (temporary file, fsync, rename) only after every rank's file is in place, so it is the commit
// point: a save that dies midway leaves the previous index and its files, and the previous
// generation's files are deleted only after the new index is in place.
// Loading cuts the arrays again for any number of ranks: rank r of M needs elements
// [r c', (r + 1) c') of each flattened array, read from the old chunks that overlap them.
#include "src/io/sharded_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "flux/distributed/shard.hpp"
#include "flux/random_state.hpp"
#include "src/internal.hpp"

namespace flux {
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "index.json";
constexpr const char* kFormat = "flux.sharded_checkpoint/1";

std::string file_name(int64_t generation, int rank, int ranks) {
  return "g" + std::to_string(generation) + "-rank" + std::to_string(rank) + "-of" + std::to_string(ranks) + ".safetensors";
}

DType dtype_named(const std::string& name, const std::string& context) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    if (name == dtype_name(t)) return t;
  detail::fail(context, ": index.json names the dtype '", name, "'; expected a floating-point dtype");
}

/// index.json, read and checked.
struct Index {
  int ranks = 0;
  int64_t generation = 0;
  std::vector<std::string> files;
  struct Array {
    std::string name;
    Shape shape;
    DType master = DType::f32;
    int64_t chunk = 0;
  };
  std::vector<Array> arrays;
};

Index read_index(const std::string& dir, const std::string& context) {
  const fs::path p = fs::path(dir) / kIndex;
  std::ifstream in(p);
  if (!in)
    detail::fail(context, ": no ", kIndex, " in the folder: not a sharded checkpoint, or its first save did not complete");
  Index ix;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("format").get<std::string>() != kFormat)
      detail::fail(context, ": ", kIndex, " has format '", j.at("format").get<std::string>(), "'; expected ", kFormat);
    ix.ranks = j.at("ranks").get<int>();
    ix.generation = j.at("generation").get<int64_t>();
    ix.files = j.at("files").get<std::vector<std::string>>();
    for (const auto& a : j.at("arrays")) {
      Index::Array arr;
      arr.name = a.at("name").get<std::string>();
      arr.shape = Shape(a.at("shape").get<std::vector<int64_t>>());
      arr.master = dtype_named(a.at("master_dtype").get<std::string>(), context);
      arr.chunk = a.at("chunk").get<int64_t>();
      ix.arrays.push_back(arr);
    }
  } catch (const nlohmann::json::exception& e) {
    detail::fail(context, ": ", kIndex, " is malformed: ", e.what());
  }
  if (ix.ranks < 1 || int(ix.files.size()) != ix.ranks)
    detail::fail(context, ": ", kIndex, " lists ", ix.files.size(), " files for ", ix.ranks, " ranks");
  for (const Index::Array& a : ix.arrays)
    if (a.chunk < 1 || a.chunk * ix.ranks < a.shape.numel())
      detail::fail(context, ": ", kIndex, ": array ", a.name, " of ", a.shape.numel(), " elements has chunks of ", a.chunk,
                   " for ", ix.ranks, " ranks");
  return ix;
}

/// text written to `path` atomically: a temporary file in the same folder, fsynced, renamed over it.
void write_atomically(const fs::path& path, const std::string& text, const std::string& context) {
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) detail::fail(context, ": cannot create ", tmp.string(), ": ", std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  while (left) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      detail::fail(context, ": cannot write ", tmp.string(), ": ", std::strerror(e));
    }
    p += w;
    left -= size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    detail::fail(context, ": cannot write ", tmp.string(), ": ", std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    detail::fail(context, ": cannot rename ", tmp.string(), " into place: ", std::strerror(e));
  }
  int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// The old ranks' files, loaded (to the CPU) when first needed.
class ShardFiles {
 public:
  ShardFiles(std::string dir, Index index, std::string context)
      : dir_(std::move(dir)), index_(std::move(index)), context_(std::move(context)) {}
  const Index& index() const { return index_; }

  const TensorMap& file(int r) {
    auto it = loaded_.find(r);
    if (it != loaded_.end()) return it->second;
    const std::string p = (fs::path(dir_) / index_.files[size_t(r)]).string();
    if (!fs::exists(p)) detail::fail(context_, ": ", kIndex, " names ", index_.files[size_t(r)], ", which is missing");
    return loaded_.emplace(r, load_state(p)).first->second;
  }
  Metadata metadata(int r) {
    return load_metadata((fs::path(dir_) / index_.files[size_t(r)]).string());
  }
  const Tensor& entry(int r, const std::string& name) {
    const TensorMap& m = file(r);
    auto it = m.find(name);
    if (it == m.end()) detail::fail(context_, ": ", index_.files[size_t(r)], " has no tensor \"", name, "\"");
    return it->second;
  }

  /// Elements [lo, hi) of array `a`'s flattened `name` ("model.<name>" or an optimiser buffer), on
  /// the CPU in the file's dtype, read from the chunks that overlap them.
  Tensor range(size_t a, const std::string& name, int64_t lo, int64_t hi) {
    const int64_t c = index_.arrays[a].chunk;
    std::vector<Tensor> parts;
    for (int64_t at = lo; at < hi;) {
      const int r = int(at / c);
      const int64_t end = std::min(hi, (r + 1) * c);
      const Tensor& chunk = entry(r, name);
      if (chunk.numel() != c)
        detail::fail(context_, ": \"", name, "\" in ", index_.files[size_t(r)], " has ", chunk.numel(),
                     " elements; the index says chunks of ", c);
      parts.push_back(chunk.reshape({-1}).slice(at - r * c, end - r * c));
      at = end;
    }
    if (parts.empty()) return Tensor::empty({0}, index_.arrays[a].master);
    return parts.size() == 1 ? parts[0].contiguous_copy() : concat(parts, 0);
  }

 private:
  std::string dir_;
  Index index_;
  std::string context_;
  std::map<int, TensorMap> loaded_;
};

/// src's values into dst (any device, cast to dst's dtype), as loading does: a write to dst.
void copy_into(Tensor dst, const Tensor& src, const std::string& context, const std::string& name) {
  if (dst.numel() != src.numel())
    detail::fail(context, ": \"", name, "\" has ", src.numel(), " elements in the checkpoint; the model's has ", dst.numel());
  Tensor v = src.reshape(dst.shape());
  if (v.dtype() != dst.dtype()) v = v.cast(dst.dtype());
  if (v.device() != dst.device()) v = to(v, dst.device());
  copy_(dst, v);
}

void collect_buffer_names(const optimisers::LeafState& leaf, const std::string& prefix,
                          std::vector<std::pair<std::string, Tensor>>& buffers,
                          std::vector<std::pair<std::string, int64_t*>>& steps) {
  for (size_t j = 0; j < leaf.buffers.size(); ++j) buffers.emplace_back(prefix + ".buffers." + std::to_string(j), leaf.buffers[j]);
  steps.emplace_back(prefix + ".t", const_cast<int64_t*>(&leaf.t));
  for (size_t k = 0; k < leaf.children.size(); ++k)
    collect_buffer_names(leaf.children[k], prefix + ".children." + std::to_string(k), buffers, steps);
}

std::string rule_kind(const std::string& rule_name) { return rule_name.substr(0, rule_name.find('(')); }

/// Checks the rule, the scaler's presence and flux.steps of rank 0's metadata; returns the steps.
int64_t check_metadata(const Metadata& meta, const optimisers::State& s, bool have_scaler, bool file_has_scaler,
                       const std::string& context) {
  if (s.rule && meta.count("flux.rule") && rule_kind(meta.at("flux.rule")) != rule_kind(s.rule->name()))
    detail::fail(context, ": the checkpoint's optimiser is ", meta.at("flux.rule"), " but opt_state's is ", s.rule->name());
  if (file_has_scaler && !have_scaler)
    detail::fail(context, ": the checkpoint holds a GradScaler's state (grad_scaler.*); pass the scaler to load_checkpoint");
  if (!file_has_scaler && have_scaler)
    detail::fail(context, ": the checkpoint holds no GradScaler state (it was saved without a scaler)");
  int64_t steps = 0;
  if (auto it = meta.find("flux.steps"); it != meta.end()) {
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || errno == ERANGE || n < 0)
      detail::fail(context, ": \"flux.steps\" is '", it->second, "'; expected a non-negative integer (nothing was loaded)");
    steps = n;
  }
  return steps;
}

std::optional<RandomState> random_of(const Metadata& meta, const std::string& context) {
  auto it = meta.find("flux.random_state");
  if (it == meta.end()) return std::nullopt;
  try {
    return parse_random_state(it->second);
  } catch (const Error& e) {
    detail::fail(context, ": \"flux.random_state\" is malformed (nothing was loaded): ", e.what());
  }
}

optimisers::GradScaler::SavedState scaler_state(ShardFiles& files) {
  const std::string p = "grad_scaler.";
  return {files.entry(0, p + "scale").item<double>(), files.entry(0, p + "growth_factor").item<double>(),
          files.entry(0, p + "backoff_factor").item<double>(), files.entry(0, p + "growth_tracker").item<int64_t>(),
          files.entry(0, p + "growth_interval").item<int64_t>()};
}

bool has_scaler(ShardFiles& files) { return files.file(0).count("grad_scaler.scale") != 0; }

}  // namespace

namespace distributed::detail {

void save_sharded(const std::string& path, const ShardPlan& plan, const std::vector<Tensor>& masters,
                  const optimisers::State& opt, const io_detail::Targets& extra, const optimisers::GradScaler* scaler,
                  const Metadata& metadata) {
  const std::string context = "[save_checkpoint] " + path;
  const Communicator& comm = plan.comm;
  // Rank 0 makes the folder and picks the next generation; every rank learns it.
  int64_t generation = 0;
  std::string failure;
  if (comm.rank() == 0) {
    try {
      std::error_code ec;
      fs::create_directories(path, ec);
      if (ec || !fs::is_directory(path)) flux::detail::fail(context, ": cannot make the folder: ", ec.message());
      if (fs::exists(fs::path(path) / kIndex)) generation = read_index(path, context).generation + 1;
    } catch (const Error& e) {
      failure = e.what();
      generation = -1;
    }
  }
  generation = broadcast(comm, Tensor(std::vector<int64_t>{generation}, Shape{}), 0).item<int64_t>();
  if (generation < 0) flux::detail::fail(context, ": rank 0 could not prepare the folder", failure.empty() ? "" : ": ", failure);

  const std::string mine = file_name(generation, comm.rank(), comm.size());
  bool ok = true;
  try {
    io_detail::Targets targets;
    for (size_t i = 0; i < masters.size(); ++i) targets.emplace_back("model." + plan.names[i], masters[i]);
    if (comm.rank() == 0) {
      for (const auto& [name, t] : extra) targets.emplace_back("model." + name, t);
      if (scaler) io_detail::add_grad_scaler_state(*scaler, targets);
    }
    io_detail::add_optimiser_state(opt, targets);
    Metadata meta = metadata;
    meta["flux.format"] = "sharded-checkpoint/1";
    meta["flux.rank"] = std::to_string(comm.rank());
    meta["flux.ranks"] = std::to_string(comm.size());
    if (opt.rule) meta["flux.rule"] = opt.rule->name();
    io_detail::add_resume_state(opt, meta);
    io_detail::save_named("save_checkpoint", (fs::path(path) / mine).string(), targets, meta);
  } catch (const std::exception& e) {  // whatever stops the write, every rank must reach the vote below
    ok = false;
    failure = e.what();
  }
  // Every rank's file in place before the index names them.
  std::vector<int32_t> oks = allgather(comm, Tensor(std::vector<int32_t>{ok ? 1 : 0}, Shape{})).to_vector<int32_t>();
  for (int r = 0; r < comm.size(); ++r)
    if (!oks[size_t(r)])
      flux::detail::fail(context, ": rank ", r, " could not write its shard", r == comm.rank() ? ": " + failure : std::string(),
                   "; the previous checkpoint (if any) stays the one that loads");
  if (comm.rank() == 0) {
    nlohmann::json j;
    j["format"] = kFormat;
    j["ranks"] = comm.size();
    j["generation"] = generation;
    j["steps"] = opt.steps;
    if (opt.rule) j["rule"] = opt.rule->name();
    std::vector<std::string> files;
    for (int r = 0; r < comm.size(); ++r) files.push_back(file_name(generation, r, comm.size()));
    j["files"] = files;
    nlohmann::json arrays = nlohmann::json::array();
    for (size_t i = 0; i < plan.names.size(); ++i)
      arrays.push_back({{"name", plan.names[i]},
                        {"shape", plan.shapes[i].vec()},
                        {"dtype", dtype_name(plan.dtypes[i])},
                        {"master_dtype", dtype_name(plan.master_dtypes[i])},
                        {"chunk", plan.chunk[i]}});
    j["arrays"] = arrays;
    write_atomically(fs::path(path) / kIndex, j.dump(1) + "\n", context);
    // The committed generation's files stay; earlier generations' (and strays of failed saves) go.
    std::set<std::string> keep(files.begin(), files.end());
    std::vector<fs::path> old;  // listed first: removing while iterating may skip entries
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 1 && n[0] == 'g' && n.find("-rank") != std::string::npos && n.ends_with(".safetensors") && !keep.count(n))
        old.push_back(e.path());
    }
    for (const fs::path& o : old) {
      std::error_code ec;
      fs::remove(o, ec);
    }
  }
  barrier(comm);  // the checkpoint is complete on every rank's return
}

Metadata load_sharded(const std::string& path, const ShardPlan& plan, std::vector<Tensor>& masters,
                      optimisers::State& opt, const io_detail::Targets& extra, optimisers::GradScaler* scaler) {
  const std::string context = "[load_checkpoint] " + path;
  ShardFiles files(path, read_index(path, context), context);
  const Index& ix = files.index();
  if (ix.arrays.size() != plan.names.size())
    flux::detail::fail(context, ": the checkpoint has ", ix.arrays.size(), " trainable arrays; the model has ", plan.names.size());
  for (size_t i = 0; i < ix.arrays.size(); ++i)
    if (ix.arrays[i].name != plan.names[i] || ix.arrays[i].shape != plan.shapes[i])
      flux::detail::fail(context, ": trainable array ", i, " is ", ix.arrays[i].name, " ", to_string(ix.arrays[i].shape),
                   " in the checkpoint but ", plan.names[i], " ", to_string(plan.shapes[i]), " in the model");
  Metadata meta0 = files.metadata(0);
  const int64_t steps = check_metadata(meta0, opt, scaler != nullptr, has_scaler(files), context);
  Metadata mine = plan.rank < ix.ranks ? files.metadata(plan.rank) : meta0;
  std::optional<RandomState> random = random_of(mine, context);
  std::optional<optimisers::GradScaler::SavedState> st;
  if (scaler) st = scaler_state(files);
  // Everything read and checked before anything is written.
  std::vector<std::pair<Tensor, Tensor>> writes;  // (destination, values)
  std::vector<std::pair<int64_t*, int64_t>> step_writes;
  for (size_t i = 0; i < masters.size(); ++i) {
    const int64_t n = plan.shapes[i].numel(), c = plan.chunk[i];
    const int64_t lo = std::min(n, plan.rank * c), hi = std::min(n, lo + c);
    auto mine_of = [&](const std::string& name) {
      Tensor part = files.range(i, name, lo, hi);
      return hi - lo < c ? concat({part, zeros({c - (hi - lo)}, part.dtype())}, 0) : part;
    };
    writes.emplace_back(masters[i], mine_of("model." + plan.names[i]));
    std::vector<std::pair<std::string, Tensor>> buffers;
    std::vector<std::pair<std::string, int64_t*>> counts;
    collect_buffer_names(opt.leaves[i], "optimiser." + std::to_string(i), buffers, counts);
    for (auto& [name, t] : buffers) writes.emplace_back(t, mine_of(name));
    for (auto& [name, dst] : counts) step_writes.emplace_back(dst, files.entry(0, name).item<int64_t>());
  }
  for (const auto& [name, t] : extra) writes.emplace_back(t, files.entry(0, "model." + name));
  for (auto& [dst, v] : writes) copy_into(dst, v, context, "");
  for (auto& [dst, v] : step_writes) *dst = v;
  if (scaler) scaler->load_saved_state(*st);
  opt.steps = steps;
  if (random) set_random_state(*random);
  return meta0;
}

}  // namespace distributed::detail

namespace io_detail {

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / kIndex, ec);
}

Metadata load_sharded_gathered(const std::string& path, const Targets& model_targets, optimisers::State& s,
                               optimisers::GradScaler* scaler) {
  const std::string context = "[load_checkpoint] " + path;
  ShardFiles files(path, read_index(path, context), context);
  const Index& ix = files.index();
  if (s.leaves.size() != ix.arrays.size())
    detail::fail(context, ": the checkpoint has ", ix.arrays.size(), " trainable arrays; opt_state has ", s.leaves.size());
  Metadata meta0 = files.metadata(0);
  const int64_t steps = check_metadata(meta0, s, scaler != nullptr, has_scaler(files), context);
  std::optional<RandomState> random = random_of(meta0, context);
  std::optional<optimisers::GradScaler::SavedState> st;
  if (scaler) st = scaler_state(files);
  std::map<std::string, size_t> array_of;
  for (size_t i = 0; i < ix.arrays.size(); ++i) array_of[ix.arrays[i].name] = i;
  std::vector<std::pair<Tensor, Tensor>> writes;
  std::vector<std::string> names;
  for (const auto& [name, t] : model_targets) {
    auto it = array_of.find(name);
    Tensor v = it == array_of.end() ? files.entry(0, "model." + name)
                                    : files.range(it->second, "model." + name, 0, ix.arrays[it->second].shape.numel());
    if (v.numel() != t.numel() || (it != array_of.end() && t.shape() != ix.arrays[it->second].shape))
      detail::fail(context, ": \"", name, "\" is ", to_string(it == array_of.end() ? v.shape() : ix.arrays[it->second].shape),
                   " in the checkpoint but ", to_string(t.shape()), " in the model");
    writes.emplace_back(t, v);
    names.push_back(name);
  }
  std::vector<std::pair<int64_t*, int64_t>> step_writes;
  for (size_t i = 0; i < s.leaves.size(); ++i) {
    std::vector<std::pair<std::string, Tensor>> buffers;
    std::vector<std::pair<std::string, int64_t*>> counts;
    collect_buffer_names(s.leaves[i], "optimiser." + std::to_string(i), buffers, counts);
    for (auto& [name, t] : buffers) {
      writes.emplace_back(t, files.range(i, name, 0, ix.arrays[i].shape.numel()));
      names.push_back(name);
    }
    for (auto& [name, dst] : counts) step_writes.emplace_back(dst, files.entry(0, name).item<int64_t>());
  }
  for (size_t k = 0; k < writes.size(); ++k) copy_into(writes[k].first, writes[k].second, context, names[k]);
  for (auto& [dst, v] : step_writes) *dst = v;
  if (scaler) scaler->load_saved_state(*st);
  s.steps = steps;
  if (random) set_random_state(*random);
  return meta0;
}

}  // namespace io_detail
}  // namespace flux
