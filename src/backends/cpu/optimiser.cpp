// Fused optimiser steps (one pass over each parameter), on the CPU.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

namespace {
// Optimisers.jl's Adam over [b, e): dx = eta * mhat / (sqrt(vhat) + eps) (+ eta * lambda * x, AdamW).
// One plain loop, compiled per ISA level by FLUX_CPU_VARIANTS (isa.hpp); this file is built with
// -fno-math-errno so that sqrt vectorises (v >= 0: sqrt never sets errno here anyway). MNIST MLP
// step on an AVX2 core: the scalar loop was ~26% of the profile (perf, 1 thread), see the note.
template <class T>
FLUX_CPU_INLINE void adam_range_body(T* __restrict x, const T* __restrict g, T* __restrict m, T* __restrict v,
                                     int64_t b, int64_t e, T b1, T b2, T eps, T lr, T wd, T c1, T c2) {
  for (int64_t i = b; i < e; ++i) {
    T gi = g[i];
    T mi = b1 * m[i] + (T(1) - b1) * gi;
    T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    x[i] -= lr * (mi * c1) / (std::sqrt(vi * c2) + eps) + lr * wd * x[i];
  }
}
FLUX_CPU_VARIANTS(adam_range, adam_range_body)

template <class T> void adam_typed(T* x, const T* g, T* m, T* v, int64_t n, const backend::AdamStep& s) {
  const T b1 = T(s.beta1), b2 = T(s.beta2), eps = T(s.eps), lr = T(s.lr), wd = T(s.weight_decay);
  const T c1 = T(1) / T(s.bias1), c2 = T(1) / T(s.bias2);
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) { adam_range(x, g, m, v, b, e, b1, b2, eps, lr, wd, c1, c2); });
}
}  // namespace

void adam_step(DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& s) {
  switch (t) {
    case DType::f32:
      adam_typed(static_cast<float*>(x), static_cast<const float*>(g), static_cast<float*>(m), static_cast<float*>(v), n, s);
      break;
    case DType::f64:
      adam_typed(static_cast<double*>(x), static_cast<const double*>(g), static_cast<double*>(m), static_cast<double*>(v), n, s);
      break;
    default: detail::fail("[Adam] needs floating-point parameters, got ", dtype_name(t));
  }
}

namespace {
// Loss scaling: out = g * inv over [b, e), true when some result is not finite. The test looks at the
// stored bits (all exponent bits set: inf or NaN), so it vectorises and sees exactly what was written.
template <class T, class Bits, Bits kExponent>
FLUX_CPU_INLINE bool unscale_float_body(const T* g, T* out, int64_t b, int64_t e, T inv) {
  Bits bad = 0;
  for (int64_t i = b; i < e; ++i) {
    T v = g[i] * inv;
    out[i] = v;
    Bits bits;
    std::memcpy(&bits, &v, sizeof(T));
    bad |= Bits((bits & kExponent) == kExponent);
  }
  return bad != 0;
}
FLUX_CPU_INLINE bool unscale_f32_body(const float* g, float* out, int64_t b, int64_t e, float inv) {
  return unscale_float_body<float, uint32_t, 0x7f800000u>(g, out, b, e, inv);
}
FLUX_CPU_INLINE bool unscale_f64_body(const double* g, double* out, int64_t b, int64_t e, double inv) {
  return unscale_float_body<double, uint64_t, 0x7ff0000000000000ull>(g, out, b, e, inv);
}
// Float16 / BFloat16: through float32, rounded to nearest even as every cast in flux, in blocks through
// half_cast.cpp's vector casts (bitwise src/half_bits.hpp, NaN and inf included; its scalar references
// where the active ISA level has none); non-finite results found from the output's bits as above.
template <DType t> bool unscale_half_blocks(const uint16_t* g, uint16_t* out, int64_t b, int64_t e, float inv) {
  constexpr int64_t kBlock = 2048;
  constexpr uint16_t kExponent = t == DType::f16 ? 0x7c00u : 0x7f80u;
  alignas(64) float x[kBlock];
  uint32_t bad = 0;
  for (int64_t i = b; i < e; i += kBlock) {
    const int64_t len = std::min(kBlock, e - i);
    half_storage_to_float(t, g + i, x, len);
    for (int64_t k = 0; k < len; ++k) x[k] *= inv;
    float_to_half_storage(t, x, out + i, len);
    for (int64_t k = 0; k < len; ++k) bad |= uint32_t((out[i + k] & kExponent) == kExponent);
  }
  return bad != 0;
}
template <class... A> bool unscale_f32(A... a) { return unscale_f32_body(a...); }
template <class... A> FLUX_CPU_TARGET_AVX2 bool unscale_f32_avx2(A... a) { return unscale_f32_body(a...); }
template <class... A> FLUX_CPU_TARGET_AVX512 bool unscale_f32_avx512(A... a) { return unscale_f32_body(a...); }

template <class T, class Range> bool unscale_parallel(const void* g, void* out, int64_t n, Range range) {
  std::atomic<bool> bad{false};
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    if (range(static_cast<const T*>(g), static_cast<T*>(out), b, e)) bad.store(true, std::memory_order_relaxed);
  });
  return bad.load();
}
}  // namespace

bool unscale_and_check(DType t, const void* g, void* out, int64_t n, double inv_scale, float* found) {
  if (n <= 0) return true;
  const float inv32 = float(inv_scale);
  bool bad = false;
  switch (t) {
    case DType::f32:
      bad = unscale_parallel<float>(g, out, n, [&](const float* s, float* d, int64_t b, int64_t e) {
        switch (active_isa()) {
          case Isa::avx512: return unscale_f32_avx512(s, d, b, e, inv32);
          case Isa::avx2: return unscale_f32_avx2(s, d, b, e, inv32);
          default: return unscale_f32(s, d, b, e, inv32);
        }
      });
      break;
    case DType::f64:
      bad = unscale_parallel<double>(g, out, n, [&](const double* s, double* d, int64_t b, int64_t e) {
        return unscale_f64_body(s, d, b, e, inv_scale);
      });
      break;
    case DType::f16:
      bad = unscale_parallel<uint16_t>(g, out, n, [&](const uint16_t* s, uint16_t* d, int64_t b, int64_t e) {
        return unscale_half_blocks<DType::f16>(s, d, b, e, inv32);
      });
      break;
    case DType::bf16:
      bad = unscale_parallel<uint16_t>(g, out, n, [&](const uint16_t* s, uint16_t* d, int64_t b, int64_t e) {
        return unscale_half_blocks<DType::bf16>(s, d, b, e, inv32);
      });
      break;
    default: detail::fail("[GradScaler] can only unscale floating-point gradients, got ", dtype_name(t));
  }
  if (bad) *found = 1.0f;
  return true;
}

}  // namespace flux::cpu_backend
