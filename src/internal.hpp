// Helpers shared by libflux's own sources (not installed).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "flux/backend.hpp"
#include "flux/dtype.hpp"

namespace flux {
class Tensor;
}

namespace flux::detail {

/// Marks a tensor's storage as written in place (src/storage_cache.cpp): everything derived from its
/// content (a backend's prepared weights, a folded BatchNorm) is dropped. Every writer into an existing
/// tensor calls it: copy_, sub_, the optimisers' fused steps, state loading, Tensor::buffer(); ops that
/// write only tensors they allocated need not.
void mark_written(const Tensor& t);
/// A number naming the content of t's storage, renewed by every write (0 for an undefined tensor):
/// for keys of values the core derives from several tensors.
uint64_t content_version(const Tensor& t);

/// The first entry of the keys under which the core keeps its own values in a storage's cache
/// (src/storage_cache.hpp): negative, apart from the backends' keys (backend::PreparedKey, from 0 up).
enum class CoreEntry : int64_t {
  folded_batchnorm = -1,  // a BatchNorm's statistics folded into scale and shift (fold_batchnorm, src/ops/normalisation.cpp)
  cast = -2,              // a weight cast for autocast or a Float32 fallback (src/autocast.cpp)
};

/// t's buffer for the library's own reads, and writes into tensors it allocated: unlike the public
/// Tensor::buffer(), not a write to the content (nothing derived from it is dropped).
backend::Buffer buffer_of(const Tensor& t);

/// Whether optimisers::update is writing t's array right now, in some thread (src/optimisers/optimisers.cpp):
/// save refuses such a tensor (two threads training, or saving while training, one model: a user error).
bool being_updated(const Tensor& t);

/// Sets the seed of the counter-based device generator (rand_like, dropout) and resets its call
/// counter (src/ops/random.cpp); seed(n) calls it.
void reset_random_stream(uint64_t seed);
/// The device generator's seed and call counter, read and set as one value (src/ops/random.cpp).
std::pair<uint64_t, uint64_t> random_stream();
void set_random_stream(uint64_t seed, uint64_t counter);
/// A copy of the host generator (rand, randn, randperm, init, shuffles) and its replacement
/// (src/tensor.cpp), under the generator's lock.
std::mt19937_64 host_generator();
void set_host_generator(const std::mt19937_64& g);

/// The CPU backend, built into libflux (src/backends/cpu/backend.cpp): the one backend that the device
/// registry (src/device/device.cpp) does not load as a plugin.
backend::Backend& builtin_cpu_backend();

/// The library's log (src/device/device.cpp), on stderr in Julia's style: a warning printed once per
/// process per distinct message ("┌ Warning: ..." / "└ @ flux").
void log_warning_once(const std::string& message);
/// Tests: log_warning_once shows every message again.
void forget_logged_warnings();
/// Where the preferences file (LocalPreferences.toml) is looked for: $FLUX_PREFERENCES (a .toml file
/// or its folder), else the current folder (src/device/device.cpp).
std::string preferences_file();

/// Element k of a host array of dtype t, as a double.
inline double load_as_double(const void* data, DType t, int64_t k) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[k];
    case DType::f64: return static_cast<const double*>(data)[k];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(data)[k]);
    case DType::bf16: return bfloat16_to_float(static_cast<const uint16_t*>(data)[k]);
    case DType::i32: return static_cast<const int32_t*>(data)[k];
    case DType::i64: return double(static_cast<const int64_t*>(data)[k]);
    case DType::u8: return static_cast<const uint8_t*>(data)[k];
    case DType::boolean: return static_cast<const uint8_t*>(data)[k] ? 1.0 : 0.0;
  }
  return 0;
}

/// Store a double as element k of a host array of dtype t.
inline void store_from_double(void* data, DType t, int64_t k, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[k] = float(v); break;
    case DType::f64: static_cast<double*>(data)[k] = v; break;
    case DType::f16: static_cast<uint16_t*>(data)[k] = float_to_half(float(v)); break;
    case DType::bf16: static_cast<uint16_t*>(data)[k] = float_to_bfloat16(float(v)); break;
    case DType::i32: static_cast<int32_t*>(data)[k] = int32_t(v); break;
    case DType::i64: static_cast<int64_t*>(data)[k] = int64_t(v); break;
    case DType::u8: static_cast<uint8_t*>(data)[k] = uint8_t(v); break;
    case DType::boolean: static_cast<uint8_t*>(data)[k] = v != 0 ? 1 : 0; break;
  }
}

}  // namespace flux::detail
