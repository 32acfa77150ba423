// Fused optimiser steps (one pass over each parameter), on the GPU
// (reference: src/backends/cpu/optimiser.cpp; Optimisers.jl's Adam/AdamW).
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

}  // namespace

void adam_step(Stream s, DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& st) {
  if (t != DType::f32 && t != DType::f64) detail::fail("[Adam] needs floating-point parameters, got ", dtype_name(t));
  if (n <= 0) return;
  if (t == DType::f32) adam_typed<float>(s, x, g, m, v, n, st);
  else adam_typed<double>(s, x, g, m, v, n, st);
  check_launch("adam_step kernel");
}

}  // namespace flux::cuda_backend
