// What the core asks of the tape beyond the public flux/autodiff.hpp.
#pragma once
#include "flux/autodiff.hpp"

namespace flux::detail {

/// True while Tape::backward runs its closures on this thread. With recording() (a forward on a
/// tape), it tells training from inference: derived copies worth keeping with a tensor at inference
/// (a weight's float32 cast) are made per call there, since training writes the weights every step.
bool backward_running();

/// For an op that runs its forward under NoGrad and records itself as one node afterwards
/// (src/ops/through_float32.hpp): while one lives on this thread, that forward is still a forward on
/// a tape (training), although recording() is false inside it.
class RecordedForward {
 public:
  explicit RecordedForward(bool on_tape);
  ~RecordedForward();
  RecordedForward(const RecordedForward&) = delete;
  RecordedForward& operator=(const RecordedForward&) = delete;

 private:
  bool on_tape_;
};
bool recorded_forward_running();

/// Neither a forward on a tape nor a backward: inference, where what is derived from a weight (its
/// float32 cast, its prepared layout) is worth keeping with it until it is written.
inline bool inference_call() {
  return !autodiff::recording() && !backward_running() && !recorded_forward_running();
}

}  // namespace flux::detail
