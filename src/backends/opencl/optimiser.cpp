// Fused optimiser steps (one pass over each parameter), on OpenCL devices. Same arithmetic, in T, as
// src/backends/cpu/optimiser.cpp (Optimisers.jl: dx = eta * mhat / (sqrt(vhat) + eps)), and the loss
// scaler's unscale-and-check pass.
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

// out = g * inv, found = 1 when a result is not finite (KIND 0: T arithmetic, 1 Float16, 2 BFloat16;
// half formats multiply in float and round to nearest even, as the CPU). Every work-item that sees a
// bad value stores the same 1.0f, so no atomics are needed.
const char* const kUnscaleSource = R"CLC(
#if KIND == 1
#define STORE_T half
#define LOAD(p, i) vload_half(i, p)
#elif KIND == 2
#define STORE_T ushort
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#else
#define STORE_T T
#define LOAD(p, i) ((p)[i])
#endif
inline ushort to_bfloat16(float f) {
  uint x = as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40u);
  uint rounding = 0x7fffu + ((x >> 16) & 1u);
  return (ushort)((x + rounding) >> 16);
}
__kernel void unscale_and_check(__global uchar* gb, ulong g_off, __global uchar* ob, ulong o_off, long n, T inv,
                                __global uchar* fb, ulong f_off) {
  __global const STORE_T* g = AT(STORE_T, gb, g_off);
  __global STORE_T* o = AT(STORE_T, ob, o_off);
  int bad = 0;
  GRID_LOOP(i, n) {
#if KIND == 1
    vstore_half_rte(LOAD(g, i) * inv, i, o);
    bad |= (((__global ushort*)o)[i] & 0x7c00u) == 0x7c00u;
#elif KIND == 2
    ushort r = to_bfloat16(LOAD(g, i) * inv);
    o[i] = r;
    bad |= (r & 0x7f80u) == 0x7f80u;
#else
    T v = g[i] * inv;
    o[i] = v;
    bad |= !isfinite(v);
#endif
  }
  if (bad) *AT(float, fb, f_off) = 1.0f;
}
)CLC";

}  // namespace

bool unscale_and_check(int d, DType t, backend::Buffer g, backend::Buffer out, int64_t n, double inv_scale,
                       backend::Buffer found) {
  if (!is_floating(t))
    ::flux::detail::fail("[GradScaler] can only unscale floating-point gradients, got ", dtype_name(t));
  DeviceState& dev = device(d);
  // Half formats compute in float: float's build options (denormal mode included), plus their storage.
  const DType compute = t == DType::f64 ? DType::f64 : DType::f32;
  std::string o = type_options(dev, compute, "GradScaler") + " -DKIND=" +
                  std::to_string(t == DType::f16 ? 1 : t == DType::bf16 ? 2 : 0);
  if (n <= 0) return true;
  auto& k = kernel(dev, "unscale", kUnscaleSource, o, "unscale_and_check");
  launch(dev, k, n, false, mem(g), off(g), mem(out), off(out), cl_long(n), scalar_of(compute, inv_scale), mem(found),
         off(found));
  return true;
}

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
