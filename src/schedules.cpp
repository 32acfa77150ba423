// Learning-rate schedules: values per step (formulas in flux/schedules.hpp).
#include "flux/schedules.hpp"

#include <cmath>
#include <numbers>

#include "flux/error.hpp"

namespace flux::schedules {

namespace {
void check_step(const char* api, int64_t t) {
  if (t < 0) detail::fail("[", api, "] the step must be >= 0, got ", t);
}
}  // namespace

double Step::operator()(int64_t t) const {
  check_step("Step", t);
  if (step_size <= 0) detail::fail("[Step] step_size must be positive, got ", step_size);
  return start * std::pow(decay, double(t / step_size));
}

double Exp::operator()(int64_t t) const {
  check_step("Exp", t);
  return start * std::pow(decay, double(t));
}

double CosAnneal::operator()(int64_t t) const {
  check_step("CosAnneal", t);
  if (period <= 0) detail::fail("[CosAnneal] period must be positive, got ", period);
  if (warmup < 0) detail::fail("[CosAnneal] warmup must be >= 0, got ", warmup);
  if (t < warmup) return l0 * double(t + 1) / double(warmup);
  int64_t s = t - warmup;
  if (restart) s %= period;
  else if (s >= period) return l1;
  return l1 + (l0 - l1) * 0.5 * (1.0 + std::cos(std::numbers::pi * double(s) / double(period)));
}

}  // namespace flux::schedules
