// train()'s progress bar and its error for a non-finite loss (the loop itself is in flux/train.hpp).
#include "flux/train.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace flux::detail {

namespace {
double seconds_now() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
}  // namespace

TrainProgress::TrainProgress(std::ostream* out, int epochs, int64_t batches)
    : out_(out), epochs_(epochs), batches_(batches),
      tty_(out == &std::cerr ? isatty(STDERR_FILENO) != 0 : out == &std::cout ? isatty(STDOUT_FILENO) != 0 : false) {}

void TrainProgress::start_epoch() { epoch_start_ = seconds_now(), last_draw_ = -1; }

void TrainProgress::update(int epoch, int64_t batch, double mean_loss) {
  if (!out_ || !tty_) return;  // in a log: one line per epoch (end_epoch)
  double t = seconds_now();
  if (last_draw_ >= 0 && t - last_draw_ < 0.1) return;
  last_draw_ = t;
  constexpr int width = 30;
  int filled = batches_ > 0 ? int(width * std::min<int64_t>(batch, batches_) / batches_) : 0;
  std::string bar(size_t(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(width, ' ');
  double elapsed = t - epoch_start_;
  char line[200];
  std::snprintf(line, sizeof line, "\repoch %d/%d [%s] %lld/%lld  loss %.4f  %.1f steps/s", epoch, epochs_, bar.c_str(),
                (long long)batch, (long long)batches_, mean_loss, elapsed > 0 ? double(batch) / elapsed : 0.0);
  *out_ << line << std::flush;
}

void TrainProgress::end_epoch(int epoch, int64_t batches, double mean_loss) {
  if (!out_) return;
  double elapsed = seconds_now() - epoch_start_;
  char line[200];
  std::snprintf(line, sizeof line, "%sepoch %d/%d: %lld batches, mean loss %.4f, %.1f steps/s, %.1f s\n", tty_ ? "\r\033[K" : "",
                epoch, epochs_, (long long)batches, mean_loss, elapsed > 0 ? double(batches) / elapsed : 0.0, elapsed);
  *out_ << line << std::flush;
}

void non_finite_loss(double loss, int epoch, int64_t batch) {
  fail("[train] the loss is ", loss, " at epoch ", epoch, ", batch ", batch,
       "; stopping (as Flux's train!); the model holds the update of the previous batch");
}

void invalid_learning_rate(double eta, int64_t step, int epoch, int64_t batch) {
  fail("[train] the schedule gives the learning rate ", eta, " at step ", step, " (epoch ", epoch, ", batch ", batch,
       "); a rate must be finite and >= 0. Stopping before this step: the model holds the update of the previous one");
}

}  // namespace flux::detail
