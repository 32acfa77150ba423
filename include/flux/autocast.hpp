// Autocast: mixed precision as PyTorch's torch.autocast. Inside a scope, the ops that gain from low
// precision run in Float16 or BFloat16 (float32 accumulation), the ops that need range or accuracy
// run in Float32, and every other op runs in the dtype of its inputs:
//   low precision: matmul, Dense, Bilinear, conv, conv_transpose, attention, recurrent layers;
//   Float32: losses, softmax/logsoftmax, normalisation statistics, sum/mean, exp/log.
// Only Float32 tensors are cast down (Float64 stays Float64). Parameters stay what they are (the
// float32 master weights): their casts are kept with each weight until it is written, and the
// gradient of a cast is cast back, so gradients have the parameters' own dtype.
//
//   Tensor y = autocast(BFloat16, [&] { return model(x); });                       // inference
//   auto [loss, grads] = withgradient(f, model, {.autocast = BFloat16});          // training
//
// A CPU without units for the dtype (AVX512-BF16 or AMX-BF16 for bf16; none for f16 in oneDNN 2.6)
// warns once and computes in Float32, so autocast is never silently slower there;
// set_autocast_emulation(true) or FLUX_AUTOCAST_EMULATE=1 computes in the low dtype anyway (storage in
// bf16/f16, arithmetic through float32: slow, for checking a model's low-precision numerics anywhere).
// Other devices run the low dtype always (OpenCL without cl_khr_fp16 stores it and computes in float32).
#pragma once
#include <optional>
#include <utility>

#include "flux/dtype.hpp"

namespace flux {

/// Autocast to `low` (Float16 or BFloat16) on this thread for the scope's lifetime; nullopt turns it
/// off inside an enclosing scope. Scopes nest; each restores what it found.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<DType> low);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::optional<DType> saved_;
};

/// f() with autocast to `low` on this thread.
template <class F> decltype(auto) autocast(DType low, F&& f) {
  AutocastScope scope(low);
  return std::forward<F>(f)();
}

/// The dtype autocast runs in on this thread now (nullopt: none).
std::optional<DType> autocast_dtype();

/// Compute in the low dtype on CPUs without units for it (default: the FLUX_AUTOCAST_EMULATE
/// environment variable, else off).
void set_autocast_emulation(bool on);
bool autocast_emulation();

}  // namespace flux
