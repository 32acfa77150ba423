// What the core asks of the tape beyond the public flux/autodiff.hpp.
#pragma once
#include "flux/autodiff.hpp"

namespace flux::detail {

/// True while Tape::backward runs its closures on this thread. With recording() (a forward on a
/// tape), it tells training from inference: derived copies worth keeping with a tensor at inference
/// (a weight's float32 cast) are made per call there, since training writes the weights every step.
bool backward_running();

/// Neither a forward on a tape nor a backward: inference, where what is derived from a weight (its
/// float32 cast, its prepared layout) is worth keeping with it until it is written.
inline bool inference_call() { return !autodiff::recording() && !backward_running(); }

}  // namespace flux::detail
