// Sharded data-parallel training (DeepSpeed's ZeRO stages 1 to 3; PyTorch's ZeroRedundancyOptimizer,
// FSDP's SHARD_GRAD_OP and FULL_SHARD): every trainable array is cut, flattened, into `ranks` equal
// chunks of ceil(numel / ranks) elements (the last padded with zeros); rank r keeps chunk r of every
// array as its float32 master copy (arrays of f16/bf16 get float32 masters) together with the
// optimiser's state for it, so the optimiser's memory per rank is 1/ranks of data-parallel training's.
//   auto [model_s, state_s] = distributed::shard(comm, model, optimisers::setup(Adam(1e-3), model), {.stage = 2});
//   auto [loss, grads] = distributed::withgradient(comm, f, model_s);   // this rank's gradient chunks
//   optimisers::update(state_s, model_s, grads);                        // its chunks, then all-gathered
//   save_checkpoint("ckpt", model_s, state_s);                          // a folder: one file per rank
// Stage 1 reduce-scatters the gradients once backward has ended (the whole gradient lives until then);
// stage 2 reduce-scatters them in buckets while backward runs. Both give each rank the mean of its
// chunks; update() steps the chunks and all-gathers the new values into every rank's whole model.
// Stage 3 (FSDP's FULL_SHARD) keeps no whole array between steps: the model's trainable arrays are
// empty shells (shape and dtype only) and each layer of a Chain (the whole model when it is not a
// Chain) has its arrays all-gathered from the masters just before its forward, the next layer's
// gather in flight while it computes, freed after it, gathered again for its backward (the previous
// layer's in flight) and freed after that; gradients are reduce-scattered in buckets during backward
// as at stage 2, and update() only steps the chunks. f must call the model (m(x)) once; gather_model()
// gives the whole model (to save it or to look at it).
// Every optimiser works: the elementwise rules chunk by chunk, ClipNorm with each array's norm summed
// over the ranks. GradScaler({.comm = comm}) makes every rank skip together.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flux/autodiff.hpp"
#include "flux/distributed.hpp"
#include "flux/distributed/layer_gather.hpp"
#include "flux/distributed/shard_plan.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/optimisers/grad_scaler.hpp"
#include "flux/optimisers/optimisers.hpp"

namespace flux::distributed {

namespace detail {

/// This rank's chunk of x (flattened, padded with zeros to the plan's chunk), in `master` dtype.
Tensor chunk_of(const ShardPlan& plan, size_t i, const Tensor& x, DType master);
/// This rank's master chunk of trainable array i: at stages 1 and 2, for an array of the master dtype
/// whose chunk needs no padding, a view of the array's own memory (the step writes the model in place,
/// no copy is kept); else chunk_of(plan, i, x, master dtype).
Tensor master_of(const ShardPlan& plan, size_t i, const Tensor& x);
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
  /// progress_thread: at stage 2, a helper thread lets MPI move the buckets in flight while backward
  /// computes (as GradientOptions::progress_thread; only where nothing else calls MPI meanwhile).
  ShardReducer(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> leaves, autodiff::Tape& tape,
               bool progress_thread = false);
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
/// At stage 3 `model`'s trainable arrays are shells (shape, dtype, device; no memory) and calling the
/// sharded model gathers each layer's arrays around its forward (collective: every rank calls it).
template <class M> struct Sharded {
  M model;
  std::shared_ptr<const detail::ShardPlan> plan;
  std::vector<Tensor> masters;            // stage 3: the ShardedState's master chunks (shared)
  detail::LayerGather* gather = nullptr;  // stage 3, inside distributed::withgradient

  template <class... A> auto operator()(A&&... a) const {
    if constexpr (sizeof...(A) == 1 && std::is_same_v<decltype(model(std::forward<A>(a)...)), Tensor>) {
      if (plan && plan->options.stage == 3) return forward_sharded(Tensor(std::forward<A>(a)...));
    } else {
      if (plan && plan->options.stage == 3)
        flux::detail::fail("[distributed::shard] a stage-3 model is called on one tensor and returns one tensor");
    }
    return model(std::forward<A>(a)...);
  }

 private:
  Tensor forward_sharded(const Tensor& x) const;
};


template <class M> Tensor Sharded<M>::forward_sharded(const Tensor& x) const {
  if (gather) return detail::run_layers(*gather, model, *plan, x);
  detail::LayerGather g(plan, masters, nullptr);  // inference, or a gradient that is not distributed's
  Tensor y = detail::run_layers(g, model, *plan, x);
  g.release();
  return y;
}

template <class M> struct ShardResult {
  Sharded<M> model;
  ShardedState state;
};

namespace detail {
template <class M> ShardResult<M> finish_shard(const M& model, std::shared_ptr<const ShardPlan> plan, ShardedState state) {
  Sharded<M> s{model, plan, {}, nullptr};
  if (plan->options.stage == 3) {
    s.model = with_shells(model);
    s.masters = state.masters;
  }
  return {std::move(s), std::move(state)};
}
template <class M> std::vector<std::string> trainable_names(const M& model) {
  std::vector<std::string> names;
  for (const NamedLeaf& l : named_leaves(model))
    if (l.trainable) names.push_back(l.name);
  return names;
}
}  // namespace detail

/// Shards `model`'s training over the ranks of `comm`: `opt_state` (from optimisers::setup, fresh or
/// trained) is cut into this rank's chunks. Every rank must pass the same model (broadcast it first).
/// At stage 3 the returned model holds no trainable array: let `model` go to free its memory.
/// Fails on a stage other than 1, 2 or 3, a non-positive bucket size, a wire dtype other than
/// BFloat16, models whose trainable arrays differ between ranks, and at stage 3 on arrays tied
/// between two layers of a Chain.
template <class M> ShardResult<M> shard(const Communicator& comm, const M& model, const optimisers::State& opt_state,
                                        ShardOptions options = {}) {
  std::vector<std::string> names = detail::trainable_names(model);
  std::vector<Tensor> ps = params(model);
  auto plan = detail::make_plan(comm, names, ps, options,
                                options.stage == 3 ? detail::layer_units(model, names) : std::vector<std::vector<size_t>>{});
  ShardedState state{detail::chunk_state(*plan, opt_state), {}, plan};
  for (size_t i = 0; i < ps.size(); ++i) state.masters.push_back(detail::master_of(*plan, i, ps[i]));
  return detail::finish_shard(model, plan, std::move(state));
}

/// shard() with a fresh optimiser state made directly on the chunks (the whole-model state of
/// optimisers::setup never exists: the memory a sharded run should save is never taken).
template <class M>
ShardResult<M> shard(const Communicator& comm, const M& model, const optimisers::Rule& rule, ShardOptions options = {}) {
  std::vector<std::string> names = detail::trainable_names(model);
  std::vector<Tensor> ps = params(model);
  auto plan = detail::make_plan(comm, names, ps, options,
                                options.stage == 3 ? detail::layer_units(model, names) : std::vector<std::vector<size_t>>{});
  ShardedState state{optimisers::setup(rule, std::vector<Tensor>{}), {}, plan};
  for (size_t i = 0; i < ps.size(); ++i) {
    state.masters.push_back(detail::master_of(*plan, i, ps[i]));
    state.opt.leaves.emplace_back();
    state.opt.rule->init(state.opt.leaves.back(), state.masters.back());
  }
  return detail::finish_shard(model, plan, std::move(state));
}

/// The whole model: `model.model` at stages 1 and 2; at stage 3 a copy whose arrays are all-gathered
/// from the masters (to save it, evaluate it unsharded or compare it). Collective.
template <class M> M gather_model(const Sharded<M>& model) {
  if (model.plan->options.stage != 3) return model.model;
  detail::LayerGather g(model.plan, model.masters, nullptr);
  const std::vector<Tensor> shells = params(model.model);
  std::unordered_map<const TensorImpl*, Tensor> whole;
  for (size_t k = 0; k < model.plan->units.size(); ++k) {
    std::vector<Tensor> arrays = g.arrays(k, true);
    for (size_t j = 0; j < arrays.size(); ++j) whole.emplace(shells[model.plan->units[k][j]].impl(), arrays[j]);
  }
  g.release();
  return fmap(
      [&](const Tensor& t) {
        auto it = whole.find(t.impl());
        return it == whole.end() ? t : it->second;
      },
      model.model);
}

/// withgradient for a sharded model: the value, and this rank's chunk of every trainable array's
/// gradient averaged over the ranks (params() order; shape (chunk,), in the master dtype). Only
/// `options.autocast` and `options.progress_thread` (stage 2) are read (the bucket size is the shard's);
/// last_gradient_stats() reports the wait after backward. At stages 1 and 2 f is called with the
/// whole model (M), at stage 3 with the sharded one (Sharded<M>), whose call gathers each layer: write
/// f as [&](auto& m) { return loss(m(x), y); }.
template <class F, class M>
WithGradient<std::vector<Tensor>> withgradient(const Communicator& comm, F&& f, const Sharded<M>& model,
                                               GradientOptions options = {}) {
  if (&comm.state() != &model.plan->comm.state())
    flux::detail::fail("[distributed::withgradient] the model was sharded over another communicator");
  autodiff::Tape tape;
  Tensor value;
  std::vector<Tensor> chunks;
  if (model.plan->options.stage == 3) {
    if constexpr (std::is_invocable_v<F&, Sharded<M>&>) {
      detail::LayerGather gather(model.plan, model.masters, &tape);
      Sharded<M> view = model;
      view.gather = &gather;
      {
        AutocastScope scope(options.autocast);
        value = f(view);
      }
      if (!value.defined()) flux::detail::fail("[distributed::withgradient] the function returned an undefined tensor");
      detail::ShardReducer reducer(model.plan, gather.leaves(), tape);
      tape.on_gradient_final([&](int64_t id) {
        gather.ready(id);
        reducer.ready(id);
      });
      tape.backward(value, 1.0 / comm.size());
      gather.release();
      chunks = reducer.finish();
    } else {
      flux::detail::fail("[distributed::withgradient] at stage 3 f is called with the sharded model (Sharded<M>&); "
                         "take it as auto&");
    }
  } else {
    if constexpr (std::is_invocable_v<F&, M&>) {
      M tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, model.model);
      detail::ShardReducer reducer(model.plan, params(tracked), tape, options.progress_thread);
      tape.on_gradient_final([&](int64_t id) { reducer.ready(id); });
      {
        AutocastScope scope(options.autocast);
        value = f(tracked);
      }
      if (!value.defined()) flux::detail::fail("[distributed::withgradient] the function returned an undefined tensor");
      tape.backward(value, 1.0 / comm.size());  // the reduce-scatter's sum is then the mean
      chunks = reducer.finish();
    } else {
      flux::detail::fail("[distributed::withgradient] at stages 1 and 2 f is called with the whole model (M&)");
    }
  }
  Tensor plain(std::make_shared<TensorImpl>(*value.impl()));
  plain.impl()->tape_id = -1;
  return {plain, std::move(chunks)};
}

/// One optimiser step of a sharded model: this rank steps its chunks, then (stages 1 and 2) every
/// rank's new chunks are all-gathered into the whole model. Collective: every rank calls it.
template <class M> void update(ShardedState& state, Sharded<M>& model, const std::vector<Tensor>& grads) {
  if (state.plan != model.plan) flux::detail::fail("[update] the sharded state belongs to another sharded model");
  detail::step_chunks(*state.plan, state.opt, state.masters, grads);
  if (state.plan->options.stage == 3) model.masters = state.masters;
  else detail::gather_params(*state.plan, state.masters, params(model.model));
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
/// The model after its masters changed: all-gathered into it (stages 1, 2), or handed to it (stage 3).
template <class M> void refresh(const ShardPlan& plan, const std::vector<Tensor>& masters, Sharded<M>& model) {
  if (plan.options.stage == 3) model.masters = masters;
  else gather_params(plan, masters, params(model.model));
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
  detail::refresh(*state.plan, state.masters, model);
  return meta;
}
template <class M>
Metadata load_checkpoint(const std::string& path, Sharded<M>& model, ShardedState& state, optimisers::GradScaler& scaler) {
  Metadata meta = detail::load_sharded(path, *state.plan, state.masters, state.opt, detail::untrainable(model.model), &scaler);
  detail::refresh(*state.plan, state.masters, model);
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
