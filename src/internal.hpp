// Helpers shared by libflux's own sources (not installed).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "flux/backend.hpp"
#include "flux/dtype.hpp"

namespace flux {
class Tensor;
}

namespace flux::detail {

/// Content stamps (Storage::stamp, src/tensor.cpp): marks a tensor's storage as written in place
/// (every writer into an existing tensor must: copy_, sub_, the optimisers' fused steps, state
/// loading; ops writing only tensors they allocated need not); the current stamp of a tensor's storage
/// (0 for an undefined tensor). Backends cache data derived from a buffer's content (reordered conv
/// weights, packed Dense weights) under the stamp the core passes with it.
void mark_written(const Tensor& t);
uint64_t content_stamp(const Tensor& t);
/// t's buffer without materialising a deferred conv output (Tensor::buffer does): only for the x and
/// residual of a forward conv that passes their stamps (ConvGeometry::output_deferred).
backend::Buffer deferrable_buffer(const Tensor& t);
/// After a forward conv set *ConvGeometry::output_deferred: t's plain content is still to be written.
void mark_deferred(const Tensor& t);

/// Whether optimisers::update is writing t's array right now, in some thread (src/optimisers/optimisers.cpp):
/// save refuses such a tensor (two threads training, or saving while training, one model: a user error).
bool being_updated(const Tensor& t);

/// Sets the seed of the counter-based device generator (rand_like, dropout) and resets its call
/// counter (src/ops/random.cpp); seed(n) calls it.
void reset_random_stream(uint64_t seed);

/// The library's log (src/device/device.cpp), on stderr in Julia's style: a warning printed once per
/// process per distinct message ("┌ Warning: ..." / "└ @ flux"), and an info line ("[ Info: ...").
void log_warning_once(const std::string& message);
void log_info(const std::string& message);
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
