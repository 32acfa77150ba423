// Fused optimiser steps (one pass over each parameter) and the loss scaler's unscale-and-check pass,
// on the GPU (reference: src/backends/cpu/optimiser.cpp; Optimisers.jl's Adam/AdamW).
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

template <class T> __global__ void adam_kernel(T* x, const T* g, T* m, T* v, int64_t n, T b1, T b2, T eps, T lr, T wd,
                                               T c1, T c2) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    T gi = g[i];
    T mi = b1 * m[i] + (T(1) - b1) * gi;
    T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    // dx = eta * mhat / (sqrt(vhat) + eps), plus decoupled weight decay (AdamW)
    T xi = x[i];
    x[i] = xi - (lr * (mi * c1) / (sqrt(vi * c2) + eps) + lr * wd * xi);
  }
}

template <class T> void adam_typed(Stream s, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& st) {
  adam_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(x), static_cast<const T*>(g), static_cast<T*>(m),
                                                     static_cast<T*>(v), n, T(st.beta1), T(st.beta2), T(st.eps), T(st.lr),
                                                     T(st.weight_decay), T(1) / T(st.bias1), T(1) / T(st.bias2));
}

// Loss scaling: out = g * inv (half formats through float, rounded to nearest even), *found = 1 when a
// result is not finite; every thread that sees one stores the same 1.0f (no atomics needed).
struct F16 {};
struct BF16 {};
template <class S> struct Unscale {
  __device__ static bool run(const S* g, S* o, int64_t i, S inv) {
    S v = g[i] * inv;
    o[i] = v;
    return !isfinite(v);
  }
};
template <> struct Unscale<F16> {
  __device__ static bool run(const uint16_t* g, uint16_t* o, int64_t i, float inv) {
    uint16_t h = float_to_half_bits(half_bits_to_float(g[i]) * inv);
    o[i] = h;
    return (h & 0x7c00u) == 0x7c00u;
  }
};
template <> struct Unscale<BF16> {
  __device__ static bool run(const uint16_t* g, uint16_t* o, int64_t i, float inv) {
    uint16_t h = float_to_bfloat16_bits(bfloat16_bits_to_float(g[i]) * inv);
    o[i] = h;
    return (h & 0x7f80u) == 0x7f80u;
  }
};
template <class K, class S, class C>
__global__ void unscale_kernel(const S* g, S* o, int64_t n, C inv, float* found) {
  bool bad = false;
  for (int64_t i = thread_index(); i < n; i += thread_stride()) bad |= Unscale<K>::run(g, o, i, inv);
  if (bad) *found = 1.0f;
}
template <class K, class S, class C>
void unscale_typed(Stream s, const void* g, void* o, int64_t n, C inv, float* found) {
  unscale_kernel<K, S, C><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const S*>(g), static_cast<S*>(o), n, inv, found);
}

}  // namespace

void unscale_and_check(Stream s, DType t, const void* g, void* out, int64_t n, double inv_scale, float* found) {
  if (n <= 0) return;
  const float inv32 = float(inv_scale);
  switch (t) {
    case DType::f32: unscale_typed<float, float>(s, g, out, n, inv32, found); break;
    case DType::f64: unscale_typed<double, double>(s, g, out, n, inv_scale, found); break;
    case DType::f16: unscale_typed<F16, uint16_t>(s, g, out, n, inv32, found); break;
    case DType::bf16: unscale_typed<BF16, uint16_t>(s, g, out, n, inv32, found); break;
    default: detail::fail("[GradScaler] can only unscale floating-point gradients, got ", dtype_name(t));
  }
  check_launch("unscale_and_check kernel");
}

void adam_step(Stream s, DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& st) {
  if (t != DType::f32 && t != DType::f64) detail::fail("[Adam] needs floating-point parameters, got ", dtype_name(t));
  if (n <= 0) return;
  if (t == DType::f32) adam_typed<float>(s, x, g, m, v, n, st);
  else adam_typed<double>(s, x, g, m, v, n, st);
  check_launch("adam_step kernel");
}

}  // namespace flux::cuda_backend
