// Loss scaling for Float16 training, PyTorch's torch.amp.GradScaler: the loss is multiplied by a scale
// before backward so that small gradients survive f16's range; the gradients are divided by it again
// (one fused pass per tensor that also looks for inf/NaN) and the optimiser step is skipped when any
// gradient is not finite. update() then halves the scale after an overflow, or doubles it after
// growth_interval finite steps in a row. bf16 has float32's range and needs none.
//   optimisers::GradScaler scaler;                        // 2^16, x2 / 2000 steps, x0.5 on overflow
//   auto [loss, grads] = withgradient([&](auto& m) { return scaler.scale(lossfn(m(x), y)); }, model);
//   scaler.step(opt_state, model, grads);                 // unscales; updates unless inf/NaN
//   scaler.update();
// To clip or inspect the true gradients first: auto g = scaler.unscale(grads); ...; scaler.step(opt_state,
// model, g). Gradients of any floating dtype work (f16, bf16, float32 master gradients, f64).
// Distributed: GradScaler({.comm = comm}) sums the inf/NaN flag over the ranks, so that every rank
// skips or steps together and their scales stay equal. save_checkpoint / load_checkpoint take the
// scaler to keep its state (flux/io/safetensors.hpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flux/distributed.hpp"
#include "flux/functor.hpp"
#include "flux/optimisers/optimisers.hpp"
#include "flux/tensor.hpp"

namespace flux::optimisers {

namespace detail {
/// update() unqualified: a sharded state (distributed/shard.hpp) finds its overload by argument-dependent
/// lookup (inside GradScaler the name would find the member update()).
template <class S, class M, class G> void step_update(S& state, M& model, const G& grads) { update(state, model, grads); }
}  // namespace detail

/// PyTorch's GradScaler defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  /// false: scale() returns the loss, unscale() the gradients, step() always steps, update() does nothing.
  bool enabled = true;
  /// The ranks that must take the same skip decision (data-parallel training); none: this process.
  std::optional<distributed::Communicator> comm = std::nullopt;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale (differentiable: every gradient comes out multiplied by the scale), computed in the
  /// loss's dtype; keep the loss in float32 (autocast does), as an f16 loss overflows at 2^16.
  Tensor scale(const Tensor& loss) const;

  /// A copy of `grads` (a model-shaped gradient, or any fmap-able value) whose trainable leaves are
  /// divided by the scale, and records whether any of them is not finite (found_inf()). Leaves that
  /// params() skips (NonTrainable) are kept as they are; tied leaves stay tied. At most once between
  /// two update() calls; every leaf must be floating point.
  template <class G> G unscale(const G& grads);

  /// The optimiser step, skipped when a gradient is inf/NaN: unscales `grads` first unless unscale()
  /// was called since the last update() (then `grads` must be what it returned). True when the
  /// model was updated. At most once between two update() calls. Also takes a sharded model, its
  /// ShardedState and gradient chunks (distributed/shard.hpp).
  template <class S, class M, class G> bool step(S& state, M& model, const G& grads);

  /// Ends the iteration: scale *= backoff_factor and the growth tracker resets after an overflow;
  /// otherwise the tracker counts the finite step and, at growth_interval, scale *= growth_factor.
  void update();
  /// Ends the iteration with this scale instead (PyTorch's update(new_scale); the tracker is kept).
  void update(double new_scale);

  /// The current scale (1 when disabled, as PyTorch).
  double get_scale() const;
  /// Finite steps since the last change of scale.
  int64_t growth_tracker() const { return growth_tracker_; }
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }
  /// Whether this iteration's gradients held inf/NaN; nullopt before they were unscaled.
  std::optional<bool> found_inf() const { return found_inf_; }

  /// Checkpoints (PyTorch's state_dict): the scale, the tracker and the factors and interval.
  struct SavedState {
    double scale, growth_factor, backoff_factor;
    int64_t growth_tracker, growth_interval;
  };
  SavedState saved_state() const;
  /// Restores a saved state (PyTorch's load_state_dict: the factors and the interval too); the
  /// iteration starts afresh. A setting out of the constructor's ranges (or a negative tracker) fails
  /// with the same kind of message and changes nothing.
  void load_saved_state(const SavedState& s);

 private:
  enum class Stage { ready, unscaled, stepped };
  /// The non-template part of unscale(): checks the stage, divides each (named) leaf, sets found_inf_.
  std::vector<Tensor> unscale_leaves(const std::vector<std::string>& names, const std::vector<Tensor>& grads);
  void begin_step();

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  Stage stage_ = Stage::ready;
  std::optional<bool> found_inf_;
};

template <class G> G GradScaler::unscale(const G& grads) {
  G out = grads;
  // Every distinct trainable leaf once (tied gradients share a handle and must be divided once).
  std::vector<std::string> names;
  std::vector<Tensor> inputs;
  std::vector<std::pair<Tensor*, size_t>> slots;
  std::unordered_map<const TensorImpl*, size_t> index;
  auto visit = [&](const std::string& name, Tensor& t, bool trainable) {
    if (!trainable) return;
    auto [it, fresh] = index.emplace(t.impl(), inputs.size());
    if (fresh) {
      names.push_back(name);
      inputs.push_back(t);
    }
    slots.emplace_back(&t, it->second);
  };
  functor::walk(out, "", visit);
  std::vector<Tensor> results = unscale_leaves(names, inputs);
  for (auto& [slot, i] : slots) *slot = results[i];
  return out;
}

template <class S, class M, class G> bool GradScaler::step(S& state, M& model, const G& grads) {
  if (!options_.enabled) {
    detail::step_update(state, model, grads);
    return true;
  }
  begin_step();  // fails when step() already ran in this iteration
  std::optional<G> unscaled;
  if (stage_ == Stage::ready) unscaled.emplace(unscale(grads));
  stage_ = Stage::stepped;
  if (*found_inf_) return false;
  detail::step_update(state, model, unscaled ? *unscaled : grads);
  return true;
}

}  // namespace flux::optimisers
