// train(loss, model, data, opt_state): Flux's train! loop. For every batch of `data` it computes
// loss(model, batch...) and its gradient, and updates the model with the optimiser state:
//   auto loss = [](auto& m, const Tensor& x, const Tensor& y) { return logitcrossentropy(m(x), y); };
//   train(loss, model, loader, opt_state, {.epochs = 5, .callback = [](const TrainEvent& e) { ... }});
// A batch that is a std::array / tuple of tensors (DataLoader's) is spread into the loss's arguments;
// any other batch is passed as one. Like Flux, a loss that is not finite stops training with an error
// naming the epoch and batch. Each step reads the loss to the host (one synchronisation per step).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "flux/gradient.hpp"
#include "flux/optimisers/optimisers.hpp"

namespace flux {

/// What the callback sees after every step.
struct TrainEvent {
  int epoch;          // 1-based, as the progress bar shows it
  int64_t batch;      // 1-based within the epoch
  int64_t batches;    // per epoch (0 when the data has no size())
  int64_t step;       // 0-based over the whole run (the schedule's argument)
  double loss;        // this batch's loss
  double epoch_loss;  // mean loss of the epoch so far
};

struct TrainOptions {
  int epochs = 1;
  /// A progress bar per epoch (batches, mean loss, steps/s), redrawn in place on a terminal, else one
  /// line per epoch; written to `out` (stderr by default, as Flux's progress logging).
  bool progress = true;
  std::function<void(const TrainEvent&)> callback = nullptr;
  /// The learning rate for step t (0-based), set with optimisers::adjust before each update; e.g. a
  /// schedule from flux/schedules.hpp (schedules::CosAnneal, ...). A rate that is not finite and >= 0
  /// stops training with an error naming the step, before that step changes anything.
  std::function<double(int64_t)> schedule = nullptr;
  std::ostream* out = &std::cerr;
  /// Resumes a run at this global step (0-based; opt_state.steps after load_checkpoint): `epochs` still
  /// counts the whole run, the epochs and batches before the step are skipped without being read, and
  /// a DataLoader is set to the step's epoch (set_epoch), so its shuffle matches the first run's. Needs
  /// data with a size() when > 0.
  int64_t start_step = 0;
};

/// Mean loss of every epoch this call ran (a resumed epoch: of its batches run here; NaN for an epoch
/// that ran no batch), and the global step reached (start_step + the steps taken).
struct TrainResult {
  std::vector<double> epoch_loss;
  int64_t steps = 0;
};

namespace detail {
template <class T> struct is_tensor_batch : std::false_type {};
template <size_t N> struct is_tensor_batch<std::array<Tensor, N>> : std::true_type {};
template <class... T> struct is_tensor_batch<std::tuple<T...>> : std::true_type {};
template <class A, class B> struct is_tensor_batch<std::pair<A, B>> : std::true_type {};

/// The progress bar of train(): "epoch 2/5 [=====>    ] 120/469  loss 0.4123  38.2 steps/s".
class TrainProgress {
 public:
  TrainProgress(std::ostream* out, int epochs, int64_t batches);
  void start_epoch();
  void update(int epoch, int64_t batch, double mean_loss);
  void end_epoch(int epoch, int64_t batches, double mean_loss);

 private:
  std::ostream* out_;
  int epochs_;
  int64_t batches_;
  bool tty_;
  double epoch_start_ = 0, last_draw_ = -1;
};
/// Throws the error train() gives for a non-finite loss.
[[noreturn]] void non_finite_loss(double loss, int epoch, int64_t batch);
/// Throws the error train() gives for a schedule's rate that is NaN, infinite or negative.
[[noreturn]] void invalid_learning_rate(double eta, int64_t step, int epoch, int64_t batch);
}  // namespace detail

template <class Loss, class M, class Data>
TrainResult train(Loss&& loss, M& model, Data&& data, optimisers::State& opt_state, TrainOptions o = {}) {
  if (o.epochs < 0) detail::fail("[train] epochs must be >= 0, got ", o.epochs);
  int64_t batches = 0;
  if constexpr (requires { data.size(); }) batches = int64_t(data.size());
  if (o.start_step < 0) detail::fail("[train] start_step must be >= 0, got ", o.start_step);
  int first_epoch = 1;
  int64_t skip = 0;  // batches of first_epoch already run
  if (o.start_step > 0) {
    if constexpr (!requires { data.size(); })
      detail::fail("[train] start_step = ", o.start_step, " needs data with a size() (batches per epoch) to find its epoch");
    if (batches == 0) detail::fail("[train] start_step = ", o.start_step, " but the data has no batches");
    first_epoch = int(std::min<int64_t>(o.start_step / batches, int64_t(o.epochs))) + 1;
    skip = o.start_step - int64_t(first_epoch - 1) * batches;
    if constexpr (requires { data.set_epoch(int64_t(0)); }) data.set_epoch(int64_t(first_epoch - 1));
  }
  detail::TrainProgress progress(o.progress ? o.out : nullptr, o.epochs, batches);
  TrainResult result;
  result.steps = o.start_step;
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    progress.start_epoch();
    double total = 0;
    int64_t batch = 0, ran = 0;
    auto it = std::begin(data);
    const auto end = std::end(data);
    for (; batch < skip && it != end; ++it) ++batch;  // resumed: already run before start_step
    skip = 0;
    for (; it != end; ++it) {
      auto&& b = *it;
      if (o.schedule) {
        const double eta = o.schedule(result.steps);
        // Before the step: a NaN or negative rate would write NaN into (or move uphill) every weight.
        if (!(std::isfinite(eta) && eta >= 0)) detail::invalid_learning_rate(eta, result.steps, epoch, batch + 1);
        optimisers::adjust(opt_state, eta);
      }
      auto [value, grads] = withgradient(
          [&](auto& m) -> Tensor {
            using B = std::remove_cvref_t<decltype(b)>;
            if constexpr (detail::is_tensor_batch<B>::value)
              return std::apply([&](const auto&... xs) -> Tensor { return loss(m, xs...); }, b);
            else
              return loss(m, b);
          },
          model);
      const double l = item<double>(value);
      ++batch;
      ++ran;
      if (!std::isfinite(l)) detail::non_finite_loss(l, epoch, batch);
      optimisers::update(opt_state, model, grads);
      total += l;
      progress.update(epoch, batch, total / double(ran));
      if (o.callback) o.callback(TrainEvent{epoch, batch, batches, result.steps, l, total / double(ran)});
      ++result.steps;
    }
    // An epoch without batches has no mean loss: NaN, not 0, which would read as a perfect fit
    // (not an error: a resumed run whose step ends an epoch, or a loader that is empty this epoch,
    // is legitimate, and the caller can test std::isnan).
    result.epoch_loss.push_back(ran ? total / double(ran) : std::numeric_limits<double>::quiet_NaN());
    progress.end_epoch(epoch, batch, result.epoch_loss.back());
  }
  return result;
}

}  // namespace flux
