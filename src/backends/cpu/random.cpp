// Counter-based uniform random numbers (backend.hpp's random_uniform): element i depends only on
// (seed, offset + i), so any split over threads, and every backend, gives the same values.
#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

namespace {
inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t draw(uint64_t seed, uint64_t counter) { return splitmix64(seed + counter * 0x9E3779B97F4A7C15ull); }
constexpr int64_t kGrain = int64_t(1) << 15;
}  // namespace

void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset) {
  if (t == DType::f32) {
    float* out = static_cast<float*>(dst);
    parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = float(draw(seed, offset + uint64_t(i)) >> 40) * 0x1.0p-24f;
    });
  } else if (t == DType::f64) {
    double* out = static_cast<double*>(dst);
    parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = double(draw(seed, offset + uint64_t(i)) >> 11) * 0x1.0p-53;
    });
  } else {
    detail::fail("[random_uniform] needs Float32 or Float64; got ", dtype_name(t));
  }
}

}  // namespace flux::cpu_backend
