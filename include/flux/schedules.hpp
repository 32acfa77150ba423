// Learning-rate schedules (ParameterSchedulers.jl, torch.optim.lr_scheduler): a schedule maps a step
// t = 0, 1, 2, ... to a learning rate, and optimisers::adjust(state, schedule(t)) applies it:
//   schedules::CosAnneal sched{.l0 = 1e-3, .l1 = 1e-5, .period = 1000, .warmup = 100};
//   for (int64_t t = 0; ...; ++t) { optimisers::adjust(opt_state, sched(t)); optimisers::update(...); }
// train() takes one as `.schedule` (flux/train.hpp). Each is a plain value; any double(int64_t)
// callable works the same way. They live in their own namespace, as ParameterSchedulers beside
// Optimisers, so that `using namespace flux::optimisers` brings no `Step` into a program.
#pragma once
#include <cstdint>

namespace flux::schedules {

/// start * decay^floor(t / step_size): ParameterSchedulers' Step, PyTorch's StepLR(step_size, gamma).
struct Step {
  double start;
  double decay;
  int64_t step_size;
  double operator()(int64_t t) const;
};

/// start * decay^t: ParameterSchedulers' Exp, PyTorch's ExponentialLR(gamma).
struct Exp {
  double start;
  double decay;
  double operator()(int64_t t) const;
};

/// Cosine annealing from l0 to l1 over `period` steps (ParameterSchedulers' CosAnneal, PyTorch's
/// CosineAnnealingLR), after `warmup` steps rising linearly to l0 (l0 (t + 1) / warmup). At the end
/// it stays at l1, or starts again from l0 when `restart` (SGDR, CosineAnnealingWarmRestarts).
struct CosAnneal {
  double l0;
  double l1 = 0.0;
  int64_t period;
  int64_t warmup = 0;
  bool restart = false;
  double operator()(int64_t t) const;
};

}  // namespace flux::schedules
