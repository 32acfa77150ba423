// Fused optimiser steps (one pass over each parameter), on OpenCL devices. Same arithmetic, in T, as
// src/backends/cpu/optimiser.cpp (Optimisers.jl: dx = eta * mhat / (sqrt(vhat) + eps)).
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

const char* const kOptimiserSource = R"CLC(
__kernel void adam_step(__global uchar* xb, ulong x_off, __global uchar* gb, ulong g_off, __global uchar* mb, ulong m_off,
                        __global uchar* vb, ulong v_off, long n, T lr, T b1, T b2, T eps, T wd, T c1, T c2) {
  __global T* x = AT(T, xb, x_off);
  __global const T* g = AT(T, gb, g_off);
  __global T* m = AT(T, mb, m_off);
  __global T* v = AT(T, vb, v_off);
  GRID_LOOP(i, n) {
    T gi = g[i];
    T mi = b1 * m[i] + ((T)1 - b1) * gi;
    T vi = b2 * v[i] + ((T)1 - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    x[i] -= lr * (mi * c1) / (sqrt(vi * c2) + eps) + lr * wd * x[i];
  }
}
)CLC";

}  // namespace

void adam_step(int d, DType t, backend::Buffer x, backend::Buffer g, backend::Buffer m, backend::Buffer v, int64_t n,
               const backend::AdamStep& s) {
  if (t != DType::f32 && t != DType::f64)
    ::flux::detail::fail("[Adam] needs floating-point parameters, got ", dtype_name(t));
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "Adam");
  if (n <= 0) return;
  auto& k = kernel(dev, "optimiser", kOptimiserSource, o, "adam_step");
  // The CPU computes 1/bias in T: T(1) / T(bias).
  double c1 = t == DType::f32 ? double(1.0f / float(s.bias1)) : 1.0 / s.bias1;
  double c2 = t == DType::f32 ? double(1.0f / float(s.bias2)) : 1.0 / s.bias2;
  launch(dev, k, n, false, mem(x), off(x), mem(g), off(g), mem(m), off(m), mem(v), off(v), cl_long(n),
         scalar_of(t, s.lr), scalar_of(t, s.beta1), scalar_of(t, s.beta2), scalar_of(t, s.eps),
         scalar_of(t, s.weight_decay), scalar_of(t, c1), scalar_of(t, c2));
}

}  // namespace flux::opencl
