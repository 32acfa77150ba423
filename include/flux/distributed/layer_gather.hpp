// Stage 3 of sharded training (distributed/shard.hpp; FSDP's FULL_SHARD): the model's trainable
// arrays are shells between steps, and each layer of a Chain (the whole model when it is not a Chain)
// has its arrays all-gathered from the ranks' master chunks around its forward and its backward.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flux/autodiff.hpp"
#include "flux/distributed/shard_plan.hpp"
#include "flux/functor.hpp"
#include "flux/nn/chain.hpp"

namespace flux::distributed {

/// What the last stage-3 step (withgradient) or call of a sharded model on this thread gathered.
struct LayerGatherStats {
  int gathers = 0;             // layer all-gathers waited for (forward, then again for backward)
  int prefetched = 0;          // of them, started before the layer needed them (one layer earlier)
  int ready_when_needed = 0;   // of those, already complete when the layer needed them
  double wait_seconds = 0;     // waiting for gathers to complete
};
LayerGatherStats last_layer_gather_stats();

namespace detail {

/// Stage 3: the whole arrays of one layer at a time. arrays(k) waits for layer k's all-gather (started
/// by the previous call, else now) and starts the next layer's; leave(k) frees layer k's arrays after
/// its forward. With a tape the arrays are tracked leaves, and backward is followed through the tape's
/// gradient-final reports (ready()): once every array of a layer has its final gradient, the layer's
/// backward no longer reads them, so they are freed, the layer before it gets its arrays back (its
/// gather was started one layer earlier) and the gather of the one before that starts. Freeing swaps
/// an array's storage for an empty one; the tape's references to the array then see the values again
/// once they are gathered back. The last layer's arrays stay from its forward to its backward.
class LayerGather {
 public:
  LayerGather(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> masters, autodiff::Tape* tape);
  ~LayerGather();
  LayerGather(const LayerGather&) = delete;
  LayerGather& operator=(const LayerGather&) = delete;
  /// Layer k's arrays, whole, in plan->units[k] order (tracked on the tape when there is one). keep:
  /// the caller keeps them (gather_model); nothing here frees them.
  std::vector<Tensor> arrays(size_t k, bool keep = false);
  /// Layer k's forward has ended: its arrays are freed (with a tape, all but the last layer's).
  void leave(size_t k);
  /// The tape reports that tape entry `tape_id`'s gradient is final.
  void ready(int64_t tape_id);
  /// The tracked arrays in params() order (fails unless f called the model, once).
  std::vector<Tensor> leaves() const;
  /// After backward (or inference): frees every array and completes any gather in flight.
  void release();
  struct State;

 private:
  std::unique_ptr<State> state_;
};

/// A stage-3 array between steps: shape and dtype, no memory (an empty storage on the device).
Tensor shell_of(const Tensor& x);

/// Stage 3's layers: each element of a Chain, or the whole model; one list of params() indices each.
/// Fails when an array is tied between two layers (one layer's gather would have to keep it alive).
template <class M>
std::vector<std::vector<size_t>> layer_units(const M& model, const std::vector<std::string>& names) {
  std::vector<Tensor> ps = params(model);
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < ps.size(); ++i) index.emplace(ps[i].impl(), i);
  std::vector<std::vector<size_t>> units;
  if constexpr (is_chain<M>::value) {
    std::vector<int64_t> owner(ps.size(), -1);
    auto add = [&](int64_t k, const std::vector<Tensor>& layer_params) {
      units.emplace_back();
      for (const Tensor& t : layer_params) {
        const size_t i = index.at(t.impl());
        if (owner[i] >= 0)
          flux::detail::fail("[distributed::shard] stage 3 gathers one layer of the Chain at a time, but array ", names[i],
                             " is tied between layers ", owner[i], " and ", k,
                             "; keep tied arrays inside one layer (e.g. a Chain element of its own), or use .stage = 2");
        owner[i] = k;
        units.back().push_back(i);
      }
    };
    [&]<size_t... I>(std::index_sequence<I...>) {
      (add(int64_t(I), params(std::get<I>(model.layers))), ...);
    }(std::make_index_sequence<M::size()>{});
  } else {
    units.emplace_back();
    for (size_t i = 0; i < ps.size(); ++i) units.back().push_back(i);
  }
  return units;
}

/// One layer of a stage-3 model: its arrays gathered, the layer run on them, the arrays freed.
template <class L>
Tensor call_layer(LayerGather& g, size_t k, const L& layer, const std::vector<Tensor>& shells, const ShardPlan& plan,
                  const Tensor& x) {
  std::unordered_map<const TensorImpl*, Tensor> whole;
  {
    std::vector<Tensor> arrays = g.arrays(k);
    for (size_t j = 0; j < arrays.size(); ++j) whole.emplace(shells[plan.units[k][j]].impl(), arrays[j]);
  }
  Tensor y;
  {
    L live = fmap(
        [&](const Tensor& t) {
          auto it = whole.find(t.impl());
          return it == whole.end() ? t : it->second;
        },
        layer);
    whole.clear();
    y = live(x);
  }
  g.leave(k);
  return y;
}

template <class M> Tensor run_layers(LayerGather& g, const M& model, const ShardPlan& plan, const Tensor& x) {
  const std::vector<Tensor> shells = params(model);
  if constexpr (is_chain<M>::value) {
    Tensor y = x;
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((y = call_layer(g, I, std::get<I>(model.layers), shells, plan, y)), ...);
    }(std::make_index_sequence<M::size()>{});
    return y;
  } else {
    return call_layer(g, 0, model, shells, plan, x);
  }
}

/// `model` with every trainable array replaced by a shell (tied arrays stay tied).
template <class M> M with_shells(const M& model) {
  std::unordered_map<const TensorImpl*, Tensor> out;
  for (const Tensor& p : params(model)) out.emplace(p.impl(), shell_of(p));
  return fmap(
      [&](const Tensor& t) {
        auto it = out.find(t.impl());
        return it == out.end() ? t : it->second;
      },
      model);
}
}  // namespace detail
}  // namespace flux::distributed
