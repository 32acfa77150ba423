// What the core asks of the tape beyond the public flux/autodiff.hpp.
#pragma once

namespace flux::detail {

/// True while Tape::backward runs its closures on this thread. With recording() (a forward on a
/// tape), it tells training from inference: derived copies worth keeping with a tensor at inference
/// (a weight's float32 cast) are made per call there, since training writes the weights every step.
bool backward_running();

}  // namespace flux::detail
