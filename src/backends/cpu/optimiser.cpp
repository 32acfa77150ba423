// Fused optimiser steps (one pass over each parameter), on the CPU.
#include <cmath>
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

}  // namespace flux::cpu_backend
