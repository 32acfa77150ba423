// Autocast's per-thread scope, the device decision and the cast cache (flux/autocast.hpp).
#include "flux/autocast.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "src/autocast.hpp"
#include "src/autodiff_state.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"
#include "src/storage_cache.hpp"

namespace flux {

namespace {
thread_local std::optional<DType> t_low;
std::atomic<int> g_emulate{-1};  // -1: not yet read from FLUX_AUTOCAST_EMULATE
std::atomic<bool> g_warned_bf16{false}, g_warned_f16{false};  // a flag before the log's lock: ops ask on every call

void check_low(DType t) {
  if (t != DType::f16 && t != DType::bf16)
    detail::fail("[autocast] runs in Float16 or BFloat16; got ", dtype_name(t),
                 " (Float32 is what autocast leaves; use no scope for it)");
}
}  // namespace

AutocastScope::AutocastScope(std::optional<DType> low) : saved_(t_low) {
  if (low) check_low(*low);
  t_low = low;
}
AutocastScope::~AutocastScope() { t_low = saved_; }

std::optional<DType> autocast_dtype() { return t_low; }

void set_autocast_emulation(bool on) { g_emulate = on ? 1 : 0; }
bool autocast_emulation() {
  int v = g_emulate.load();
  if (v < 0) {
    v = environment::flag("FLUX_AUTOCAST_EMULATE") ? 1 : 0;
    int expected = -1;
    g_emulate.compare_exchange_strong(expected, v);
    v = g_emulate.load();
  }
  return v == 1;
}

namespace detail {

bool autocast_active() { return t_low.has_value(); }
void reset_autocast_warnings() {
  g_warned_bf16 = g_warned_f16 = false;
  forget_logged_warnings();
}

namespace {
// Whether x's device runs autocast in `low`: always, except a CPU without units for it (then once
// per process and dtype a warning that names what is missing, and Float32).
bool device_runs(const Tensor& x, DType low) {
  if (!x.device().is_cpu() || autocast_emulation()) return true;
  const backend::LowPrecisionSupport s = x.backend().low_precision_support(x.device().index(), low);
  if (s.units) return true;
  std::atomic<bool>& warned = low == DType::bf16 ? g_warned_bf16 : g_warned_f16;
  if (!warned.exchange(true))
    log_warning_once(std::string("[autocast] ") + dtype_name(low) + " autocast on the CPU computes in Float32: " +
                     s.detail + ".\n│   Low precision without units would be slower than Float32; " +
                     "set_autocast_emulation(true) or FLUX_AUTOCAST_EMULATE=1 computes in " + dtype_name(low) +
                     " anyway (to check a model's numerics). This warning is shown once.");
  return false;
}
}  // namespace

std::optional<DType> autocast_low(std::initializer_list<const Tensor*> operands) {
  if (!t_low) return std::nullopt;
  const Tensor* f32 = nullptr;
  for (const Tensor* t : operands)
    if (t->defined() && t->dtype() == DType::f32) {
      f32 = t;
      break;
    }
  if (!f32 || !device_runs(*f32, *t_low)) return std::nullopt;
  return t_low;
}

Tensor autocast_to(const Tensor& x, DType low) {
  if (!x.defined() || x.dtype() != DType::f32) return x;
  return cached_cast(x, low);
}

Tensor autocast_f32(const Tensor& x) {
  if (!t_low || !x.defined() || (x.dtype() != DType::f16 && x.dtype() != DType::bf16)) return x;
  return x.cast(DType::f32);
}

namespace {
struct CastEntry final : backend::Prepared {
  explicit CastEntry(Tensor t) : value(std::move(t)) {}
  Tensor value;
};
}  // namespace

namespace {
// The key of w's cast to t in w's storage cache: the core's cast entry, then dtype, offset and element
// count. Tensors are dense in their storage, so every view of those elements (a reshape: LayerNorm's
// (N, T, D) output read as (N T, D) rows by attention's projection) shares the one cast.
backend::PreparedKey cast_key(const Tensor& w, DType t) {
  backend::PreparedKey key{};
  key[0] = int64_t(CoreEntry::cast), key[1] = int64_t(t), key[2] = int64_t(w.impl()->offset), key[3] = w.numel();
  return key;
}

// A cached cast as w's view (its shape), unrecorded.
Tensor as_view_of(const Tensor& value, const Tensor& w) {
  if (value.shape() == w.shape()) return value;
  autodiff::NoGrad no_grad;
  return value.reshape(w.shape());
}

// w in t, never recorded (the callers record what they need): Tensor::cast with the tape off.
Tensor unrecorded_cast(const Tensor& w, DType t) {
  autodiff::NoGrad no_grad;
  return w.cast(t);
}
}  // namespace

Tensor cached_raw_cast(const Tensor& w, DType t) {
  if (w.dtype() == t) return w;
  const backend::PreparedKey key = cast_key(w, t);
  StorageCache& cache = storage_cache(w);
  if (auto found = cache.find(key)) return as_view_of(static_cast<const CastEntry&>(*found).value, w);
  Tensor value = unrecorded_cast(w, t);
  cache.insert(key, std::make_shared<CastEntry>(value));
  return value;
}

void offer_cast(const Tensor& w, const Tensor& cast) {
  if (w.numel() != cast.numel() || w.device() != cast.device()) return;
  storage_cache(w).insert(cast_key(w, cast.dtype()), std::make_shared<CastEntry>(cast));
}

Tensor f32_weight(const Tensor& w) {
  return inference_call() ? cached_raw_cast(w, DType::f32) : unrecorded_cast(w, DType::f32);
}

Tensor cached_cast(const Tensor& w, DType t) {
  if (w.dtype() == t) return w;
  const Tensor value = cached_raw_cast(w, t);
  // A handle of its own, so that the tape records this use (the cached tensor itself stays untracked).
  Tensor out(std::make_shared<TensorImpl>(*value.impl()));
  out.impl()->tape_id = -1;
  out.impl()->tape_generation = 0;
  const DType from = w.dtype();
  // The backward reaches this node after every op of the step that used the cast: the cast is
  // dropped from w's cache there, so that it does not stay until the optimiser writes w (a later
  // forward before the write casts again).
  const bool keyed = autodiff::tracked(w);
  const backend::PreparedKey key = cast_key(w, t);
  autodiff::record(out, {&w}, [from, w, key, keyed](const Tensor& g) {
    if (keyed) storage_cache(w).erase(key);
    return std::vector<Tensor>{g.cast(from)};
  });
  return out;
}

}  // namespace detail
}  // namespace flux
