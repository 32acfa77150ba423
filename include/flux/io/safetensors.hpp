// Saving and loading models, tensor maps and training checkpoints in the safetensors format
// (https://huggingface.co/docs/safetensors): u64 little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}}, then raw little-endian
// row-major data. Files are written atomically (temporary file, fsync, rename) from any device and
// read by mmap with one copy onto the destination device.
//
// Names follow PyTorch's state_dict convention: a Chain contributes only the layer index, so
// Chain(Dense(4, 8), relu, Dense(8, 3)) saves "0.weight", "0.bias", "2.weight", "2.bias", exactly as
// nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)) does (an activation in a Chain keeps its
// index and holds no tensors, like nn.ReLU). Chain(Dense(4, 8, relu), Dense(8, 3)) saves "0.*", "1.*".
// In general, flux's state() name "layers.0.weight" becomes "0.weight": every "layers" segment that a
// Chain adds is dropped (nested Chains give "1.0.weight", as nested nn.Sequential); every other field
// name is kept. Dense's weight is (out, in) and bias (out,), nn.Linear's layout, so no transposes.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flux/functor.hpp"
#include "flux/nn/chain.hpp"
#include "flux/optimisers/grad_scaler.hpp"
#include "flux/optimisers/optimisers.hpp"
#include "flux/tensor.hpp"

namespace flux {

/// Names -> tensors, sorted by name; what save_state writes and load_state returns.
using TensorMap = std::map<std::string, Tensor>;
/// The "__metadata__" section of a safetensors file.
using Metadata = std::map<std::string, std::string>;

/// (PyTorch-style name, tensor) for every leaf of `model`, in state() order ("0.weight", ...).
template <class M> std::vector<std::pair<std::string, Tensor>> pytorch_state(const M& model);

/// Maps one flux state() name to its PyTorch-style name by dropping the segments Chains add.
/// `chain_prefixes` are the dotted paths at which a Chain's "layers" field sits.
std::string pytorch_name(const std::string& flux_name, const std::vector<std::string>& chain_prefixes);

/// How load() treats a file that differs from the model.
struct LoadOptions {
  /// A tensor whose dtype in the file differs from the model's (a bf16 state_dict into a Float32
  /// model, ...) is converted as PyTorch's load_state_dict does (round to nearest even into f16/bf16).
  /// false (the default): such a tensor is an error naming it and both dtypes; never silent.
  bool convert_dtypes = false;
};

/// Writes every tensor of `model` (on any device) to `path`, atomically.
template <class M> void save(const std::string& path, const M& model, const Metadata& metadata = {});
/// Copies the tensors in `path` into `model`'s existing tensors on whatever device each lives, bit
/// for bit. Errors on missing or extra names, on shape mismatches and (unless options.convert_dtypes)
/// on dtype mismatches, before changing anything.
template <class M> void load(const std::string& path, M& model, LoadOptions options = {});

/// Writes a name -> tensor map (tensors on any devices), atomically.
void save_state(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {});
/// Reads every tensor of `path` onto `device` (default CPU).
TensorMap load_state(const std::string& path, const Device& device = Device());
/// The "__metadata__" of `path` (empty when absent), without reading tensor data.
Metadata load_metadata(const std::string& path);

/// Writes the model, the optimiser state (moment buffers and step counts) and `metadata` to one file,
/// atomically, after checking that `opt_state` was made for `model` (one leaf per array, buffers of
/// its shape, dtype and device, valid hyper-parameters and step counts): on any error the file at
/// `path` is left as it was.
/// Tensors are named "model.<pytorch name>" and "optimiser.<leaf>.[children.<k>.]buffers.<j>";
/// step counts are I64 scalars "optimiser.<leaf>.[...]t"; metadata gains "flux.format", "flux.rule",
/// and what resuming needs: "flux.steps" (opt_state.steps) and "flux.random_state" (random_state() at
/// the save, see random_state.hpp).
template <class M>
void save_checkpoint(const std::string& path, const M& model, const optimisers::State& opt_state,
                     const Metadata& metadata = {});
/// Restores `model` and `opt_state` (made by optimisers::setup with the same rule) from a checkpoint;
/// returns its metadata. It also restores opt_state.steps and the random generators (set_random_state),
/// so `train(..., {.start_step = opt_state.steps})` continues the saved run bit for bit, its shuffles
/// and dropout masks included (make the DataLoader before loading, as the first run made it before
/// training: its shuffle seed is drawn when it is made).
template <class M> Metadata load_checkpoint(const std::string& path, M& model, optimisers::State& opt_state);
/// With a loss scaler (Float16 training): its state is saved as "grad_scaler.scale", ".growth_tracker",
/// ".growth_factor", ".backoff_factor", ".growth_interval" (PyTorch GradScaler's state_dict), and
/// loaded back. A checkpoint saved with a scaler must be loaded with one, and the other way round.
template <class M>
void save_checkpoint(const std::string& path, const M& model, const optimisers::State& opt_state,
                     const optimisers::GradScaler& scaler, const Metadata& metadata = {});
template <class M>
Metadata load_checkpoint(const std::string& path, M& model, optimisers::State& opt_state,
                         optimisers::GradScaler& scaler);

// ---------------------------------------------------------------------------------------------
namespace io_detail {

/// Dotted paths of every Chain's "layers" field inside m ("layers", "layers.2.layers", ...).
template <class M> void chain_paths(const M& m, const std::string& prefix, std::vector<std::string>& out) {
  using T = std::remove_const_t<M>;
  if constexpr (is_chain<T>::value) {
    std::string here = functor::join(prefix, "layers");
    out.push_back(here);
    size_t i = 0;
    std::apply([&](const auto&... items) { ((chain_paths(items, functor::join(here, std::to_string(i++)), out)), ...); },
               m.layers);
  } else if constexpr (functor::HasFields<T>) {
    flux_fields(m, [&](const char* name, const auto& field) { chain_paths(field, functor::join(prefix, name), out); });
  } else if constexpr (functor::is_vector<T>::value || functor::is_array<T>::value) {
    for (size_t i = 0; i < m.size(); ++i) chain_paths(m[i], functor::join(prefix, std::to_string(i)), out);
  } else if constexpr (functor::is_tuple<T>::value) {
    size_t i = 0;
    std::apply([&](const auto&... items) { ((chain_paths(items, functor::join(prefix, std::to_string(i++)), out)), ...); }, m);
  }
}

/// One named destination for load: the model's tensor to copy into.
using Targets = std::vector<std::pair<std::string, Tensor>>;
/// Copies the file's tensors into `targets` (all names must match exactly); returns the metadata.
Metadata load_into(const std::string& api, const std::string& path, const Targets& targets,
                   const LoadOptions& options = {});
void save_named(const std::string& api, const std::string& path, const Targets& tensors, const Metadata& metadata);
void add_optimiser_state(const optimisers::State& s, Targets& out);
void add_grad_scaler_state(const optimisers::GradScaler& scaler, Targets& out);
/// What a run resumes from: "flux.steps" (opt_state.steps) and "flux.random_state" (random_state()).
void add_resume_state(const optimisers::State& s, Metadata& meta);
/// scaler: null when the caller has none (the file must then hold no scaler state).
Metadata load_checkpoint_tensors(const std::string& path, const Targets& model_targets, optimisers::State& s,
                                 optimisers::GradScaler* scaler = nullptr);

}  // namespace io_detail

template <class M> std::vector<std::pair<std::string, Tensor>> pytorch_state(const M& model) {
  std::vector<std::string> chains;
  io_detail::chain_paths(model, "", chains);
  auto named = state(model);
  for (auto& [name, t] : named) name = pytorch_name(name, chains);
  return named;
}

template <class M> void save(const std::string& path, const M& model, const Metadata& metadata) {
  io_detail::save_named("save", path, pytorch_state(model), metadata);
}

template <class M> void load(const std::string& path, M& model, LoadOptions options) {
  io_detail::load_into("load", path, pytorch_state(model), options);
}

namespace io_detail {
template <class M>
void save_checkpoint_with(const std::string& path, const M& model, const optimisers::State& opt_state,
                          const optimisers::GradScaler* scaler, const Metadata& metadata) {
  // Before anything is written: a state of another model would make a file that loads into neither.
  optimisers::detail::check_state_matches("save_checkpoint", opt_state, params(model));
  Targets all;
  for (auto& [name, t] : pytorch_state(model)) all.emplace_back("model." + name, t);
  add_optimiser_state(opt_state, all);
  if (scaler) add_grad_scaler_state(*scaler, all);
  Metadata meta = metadata;
  meta["flux.format"] = "checkpoint/1";
  if (opt_state.rule) meta["flux.rule"] = opt_state.rule->name();
  add_resume_state(opt_state, meta);
  save_named("save_checkpoint", path, all, meta);
}
}  // namespace io_detail

template <class M>
void save_checkpoint(const std::string& path, const M& model, const optimisers::State& opt_state,
                     const Metadata& metadata) {
  io_detail::save_checkpoint_with(path, model, opt_state, nullptr, metadata);
}

template <class M> Metadata load_checkpoint(const std::string& path, M& model, optimisers::State& opt_state) {
  return io_detail::load_checkpoint_tensors(path, pytorch_state(model), opt_state);
}

template <class M>
void save_checkpoint(const std::string& path, const M& model, const optimisers::State& opt_state,
                     const optimisers::GradScaler& scaler, const Metadata& metadata) {
  io_detail::save_checkpoint_with(path, model, opt_state, &scaler, metadata);
}

template <class M>
Metadata load_checkpoint(const std::string& path, M& model, optimisers::State& opt_state,
                         optimisers::GradScaler& scaler) {
  return io_detail::load_checkpoint_tensors(path, pytorch_state(model), opt_state, &scaler);
}

}  // namespace flux
