// Sharded data-parallel training (DeepSpeed's ZeRO stages 1 and 2; PyTorch's ZeroRedundancyOptimizer
// and FSDP's SHARD_GRAD_OP): every trainable array is cut, flattened, into `ranks` equal chunks of
// ceil(numel / ranks) elements (the last padded with zeros); rank r keeps chunk r of every array as
// its float32 master copy (arrays of f16/bf16 get float32 masters) together with the optimiser's state
// for it, so the optimiser's memory per rank is 1/ranks of data-parallel training's.
//   auto [model_s, state_s] = distributed::shard(comm, model, optimisers::setup(Adam(1e-3), model), {.stage = 2});
//   auto [loss, grads] = distributed::withgradient(comm, f, model_s);   // this rank's gradient chunks
//   optimisers::update(state_s, model_s, grads);                        // its chunks, then all-gathered
//   save_checkpoint("ckpt", model_s, state_s);                          // a folder: one file per rank
// Stage 1 reduce-scatters the gradients once backward has ended (the whole gradient lives until then);
// stage 2 reduce-scatters them in buckets while backward runs. Both give each rank the mean of its
// chunks; update() steps the chunks and all-gathers the new values into every rank's whole model.
// Every optimiser works: the elementwise rules chunk by chunk, ClipNorm with each array's norm summed
// over the ranks. GradScaler({.comm = comm}) makes every rank skip together. Stage 3 (parameters
// sharded between steps) is not implemented: shard() refuses it.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flux/distributed.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/optimisers/grad_scaler.hpp"
#include "flux/optimisers/optimisers.hpp"

namespace flux::distributed {

struct ShardOptions {
  /// 1: optimiser state and master weights sharded; 2: gradients too (reduce-scatter during backward).
  int stage = 1;
  /// Gradients are reduce-scattered in buckets of about this many bytes (of the wire dtype), in reverse
  /// parameter order; parameters are all-gathered in buckets of the same size.
  int64_t bucket_bytes = int64_t(25) << 20;
  /// BFloat16: gradients cross the wire in bf16 (half the bytes) and each rank sums the ranks' bf16
  /// chunks in float32 (MPI_Ialltoall, then a local sum in rank order); none: float32 (float64 for
  /// float64 arrays) reduce-scatter.
  std::optional<DType> wire = std::nullopt;
};

namespace detail {

/// What every rank knows about the sharding of one model.
struct ShardPlan {
  Communicator comm;
  ShardOptions options;
  std::vector<std::string> names;  // PyTorch-style names of the trainable arrays, params() order
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;         // the model's
  std::vector<DType> master_dtypes;  // float32 for f16/bf16 arrays, else the array's
  std::vector<Device> devices;
  std::vector<int64_t> chunk;        // ceil(numel / ranks): elements per rank
  int rank = 0, ranks = 1;
};

std::shared_ptr<const ShardPlan> make_plan(const Communicator& comm, const std::vector<std::string>& names,
                                           const std::vector<Tensor>& params, const ShardOptions& options);
/// This rank's chunk of x (flattened, padded with zeros to the plan's chunk), in `master` dtype.
Tensor chunk_of(const ShardPlan& plan, size_t i, const Tensor& x, DType master);
/// A state over the chunks: every buffer of `full` (the rule's state for the whole arrays) chunked.
optimisers::State chunk_state(const ShardPlan& plan, const optimisers::State& full);
/// Writes every rank's masters into `params` (all-gathered in buckets, cast to each array's dtype).
void gather_params(const ShardPlan& plan, const std::vector<Tensor>& masters, const std::vector<Tensor>& params);
/// One optimiser step on the chunks (ClipNorm's norms summed over the ranks).
void step_chunks(const ShardPlan& plan, optimisers::State& opt, std::vector<Tensor>& masters,
                 const std::vector<Tensor>& grads);

/// Reduce-scatters the trainable parameters' gradients in buckets; stage 2 launches each bucket as
/// the tape reports its gradients final, stage 1 all of them in finish().
class ShardReducer {
 public:
  ShardReducer(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> leaves, autodiff::Tape& tape);
  ~ShardReducer();
  ShardReducer(const ShardReducer&) = delete;
  ShardReducer& operator=(const ShardReducer&) = delete;
  void ready(int64_t tape_id);
  /// This rank's chunk of each leaf's mean gradient (params() order), in the master dtype.
  std::vector<Tensor> finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// (PyTorch-style name, tensor, trainable) of each distinct leaf, in state() order.
struct NamedLeaf {
  std::string name;
  Tensor tensor;
  bool trainable;
};
template <class M> std::vector<NamedLeaf> named_leaves(const M& model) {
  std::vector<std::string> chains;
  io_detail::chain_paths(model, "", chains);
  std::vector<NamedLeaf> out;
  std::unordered_map<const TensorImpl*, bool> seen;
  auto visit = [&](const std::string& name, const Tensor& t, bool trainable) {
    if (seen.emplace(t.impl(), true).second) out.push_back({pytorch_name(name, chains), t, trainable});
  };
  functor::walk(model, "", visit);
  return out;
}

/// Sharded checkpoints (src/io/sharded_checkpoint.cpp). `extra`: the non-trainable leaves (whole,
/// written by rank 0).
void save_sharded(const std::string& path, const ShardPlan& plan, const std::vector<Tensor>& masters,
                  const optimisers::State& opt, const io_detail::Targets& extra, const optimisers::GradScaler* scaler,
                  const Metadata& metadata);
Metadata load_sharded(const std::string& path, const ShardPlan& plan, std::vector<Tensor>& masters,
                      optimisers::State& opt, const io_detail::Targets& extra, optimisers::GradScaler* scaler);

}  // namespace detail

/// The optimiser's side of a sharded model: this rank's master chunks and the rule's state for them.
struct ShardedState {
  optimisers::State opt;        // rule, per-array LeafState over the chunks, steps
  std::vector<Tensor> masters;  // chunk `rank` of each trainable array, shape (chunk,), zero-padded
  std::shared_ptr<const detail::ShardPlan> plan;
  int64_t steps() const { return opt.steps; }
};

/// A model whose training is sharded: stages 1 and 2 keep the whole model on every rank (for the
/// forward and backward); `model` is that model, updated by optimisers::update(state, sharded, grads).
template <class M> struct Sharded {
  M model;
  std::shared_ptr<const detail::ShardPlan> plan;
  template <class... A> auto operator()(A&&... a) const { return model(std::forward<A>(a)...); }
};

template <class M> struct ShardResult {
  Sharded<M> model;
  ShardedState state;
};

/// Shards `model`'s training over the ranks of `comm`: `opt_state` (from optimisers::setup, fresh or
/// trained) is cut into this rank's chunks. Every rank must pass the same model (broadcast it first).
/// Fails on stage 3, a non-positive bucket size, a wire dtype other than BFloat16, or models whose
/// trainable arrays differ between ranks.
template <class M> ShardResult<M> shard(const Communicator& comm, const M& model, const optimisers::State& opt_state,
                                        ShardOptions options = {}) {
  std::vector<std::string> names;
  for (const detail::NamedLeaf& l : detail::named_leaves(model))
    if (l.trainable) names.push_back(l.name);
  std::vector<Tensor> ps = params(model);
  auto plan = detail::make_plan(comm, names, ps, options);
  ShardedState state{detail::chunk_state(*plan, opt_state), {}, plan};
  for (size_t i = 0; i < ps.size(); ++i) state.masters.push_back(detail::chunk_of(*plan, i, ps[i], plan->master_dtypes[i]));
  return {Sharded<M>{model, plan}, std::move(state)};
}

/// shard() with a fresh optimiser state made directly on the chunks (the whole-model state of
/// optimisers::setup never exists: the memory a sharded run should save is never taken).
template <class M>
ShardResult<M> shard(const Communicator& comm, const M& model, const optimisers::Rule& rule, ShardOptions options = {}) {
  std::vector<std::string> names;
  for (const detail::NamedLeaf& l : detail::named_leaves(model))
    if (l.trainable) names.push_back(l.name);
  std::vector<Tensor> ps = params(model);
  auto plan = detail::make_plan(comm, names, ps, options);
  ShardedState state{optimisers::setup(rule, std::vector<Tensor>{}), {}, plan};
  for (size_t i = 0; i < ps.size(); ++i) {
    state.masters.push_back(detail::chunk_of(*plan, i, ps[i], plan->master_dtypes[i]));
    state.opt.leaves.emplace_back();
    state.opt.rule->init(state.opt.leaves.back(), state.masters.back());
  }
  return {Sharded<M>{model, plan}, std::move(state)};
}

/// withgradient for a sharded model: the value, and this rank's chunk of every trainable array's
/// gradient averaged over the ranks (params() order; shape (chunk,), in the master dtype). Only
/// `options.autocast` is read (the bucket size is the shard's).
template <class F, class M>
WithGradient<std::vector<Tensor>> withgradient(const Communicator& comm, F&& f, const Sharded<M>& model,
                                               GradientOptions options = {}) {
  if (&comm.state() != &model.plan->comm.state())
    flux::detail::fail("[distributed::withgradient] the model was sharded over another communicator");
  autodiff::Tape tape;
  M tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, model.model);
  detail::ShardReducer reducer(model.plan, params(tracked), tape);
  tape.on_gradient_final([&](int64_t id) { reducer.ready(id); });
  Tensor value;
  {
    AutocastScope scope(options.autocast);
    value = f(tracked);
  }
  if (!value.defined()) flux::detail::fail("[distributed::withgradient] the function returned an undefined tensor");
  tape.backward(value, 1.0 / comm.size());  // the reduce-scatter's sum is then the mean
  std::vector<Tensor> chunks = reducer.finish();
  Tensor plain(std::make_shared<TensorImpl>(*value.impl()));
  plain.impl()->tape_id = -1;
  return {plain, std::move(chunks)};
}

/// One optimiser step of a sharded model: this rank steps its chunks, then every rank's new chunks
/// are all-gathered into the whole model. Collective: every rank calls it.
template <class M> void update(ShardedState& state, Sharded<M>& model, const std::vector<Tensor>& grads) {
  if (state.plan != model.plan) flux::detail::fail("[update] the sharded state belongs to another sharded model");
  detail::step_chunks(*state.plan, state.opt, state.masters, grads);
  detail::gather_params(*state.plan, state.masters, params(model.model));
}

/// Sets the learning rate (schedules), as optimisers::adjust.
inline void adjust(ShardedState& state, double eta) { optimisers::adjust(state.opt, eta); }

namespace detail {
template <class M> io_detail::Targets untrainable(const M& model) {
  io_detail::Targets out;
  for (NamedLeaf& l : named_leaves(model))
    if (!l.trainable) out.emplace_back(l.name, l.tensor);
  return out;
}
}  // namespace detail

/// A sharded checkpoint: the folder `path` holds one safetensors file per rank (its master chunks,
/// optimiser chunks, random state) and index.json, the commit point, written last by rank 0 (temporary
/// file and rename). Files of the previous save are removed only after the new index is in place, so
/// a save that dies midway leaves the previous checkpoint as the one that loads. Collective.
template <class M>
void save_checkpoint(const std::string& path, const Sharded<M>& model, const ShardedState& state,
                     const Metadata& metadata = {}) {
  detail::save_sharded(path, *state.plan, state.masters, state.opt, detail::untrainable(model.model), nullptr, metadata);
}
template <class M>
void save_checkpoint(const std::string& path, const Sharded<M>& model, const ShardedState& state,
                     const optimisers::GradScaler& scaler, const Metadata& metadata = {}) {
  detail::save_sharded(path, *state.plan, state.masters, state.opt, detail::untrainable(model.model), &scaler, metadata);
}
/// Loads a sharded checkpoint written by any number of ranks into a model sharded over any number
/// (the chunks are cut again); the model's arrays are all-gathered from the loaded masters. A single
/// process loads it with flux::load_checkpoint(path, model, opt_state), which gathers the chunks.
template <class M> Metadata load_checkpoint(const std::string& path, Sharded<M>& model, ShardedState& state) {
  Metadata meta = detail::load_sharded(path, *state.plan, state.masters, state.opt, detail::untrainable(model.model), nullptr);
  detail::gather_params(*state.plan, state.masters, params(model.model));
  return meta;
}
template <class M>
Metadata load_checkpoint(const std::string& path, Sharded<M>& model, ShardedState& state, optimisers::GradScaler& scaler) {
  Metadata meta = detail::load_sharded(path, *state.plan, state.masters, state.opt, detail::untrainable(model.model), &scaler);
  detail::gather_params(*state.plan, state.masters, params(model.model));
  return meta;
}

}  // namespace flux::distributed

namespace flux::optimisers {
/// optimisers::update and adjust on a sharded model (see distributed/shard.hpp).
template <class M>
void update(distributed::ShardedState& state, distributed::Sharded<M>& model, const std::vector<Tensor>& grads) {
  distributed::update(state, model, grads);
}
inline void adjust(distributed::ShardedState& state, double eta) { distributed::adjust(state, eta); }
}  // namespace flux::optimisers
