// Fused recurrent gate kernels on OpenCL devices, one time step, float32 and float64 (formulas in
// include/flux/backend.hpp; the same arithmetic as src/backends/cpu/recurrent.cpp).
// Shapes: n rows (batch), H hidden; xg, hg, dxg, dhg (n, G), G = 4H (LSTM), 3H (GRU), H (RNN);
// saved (n, 4H); h, c, dy, dh_next, dc (n, H). One work-item per (row, unit): it reads that unit's
// entry of every gate block, so there is no reduction and no atomics.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

using backend::RecurrentCell;

namespace {

// cell: 0 lstm, 1 gru, 2 rnn tanh, 3 rnn relu (backend::RecurrentCell order).
const char* const kRecurrentSource = R"CLC(
inline T sigm(T x) { return (T)1 / ((T)1 + exp(-x)); }

__kernel void recurrent_forward(int cell, __global uchar* xg, ulong xg_off, __global uchar* hg, ulong hg_off,
                                __global uchar* b, ulong b_off, int has_bias, __global uchar* hp, ulong hp_off,
                                __global uchar* cp, ulong cp_off, __global uchar* h, ulong h_off,
                                __global uchar* c, ulong c_off, __global uchar* sv, ulong sv_off, long n, long H) {
  const long G = cell == 0 ? 4 * H : cell == 1 ? 3 * H : H;
  GRID_LOOP(k, n * H) {
    const long r = k / H, j = k - r * H;
    __global const T* x = AT(T, xg, xg_off) + r * G;
    __global const T* hh = AT(T, hg, hg_off) + r * G;
    __global const T* B = has_bias ? AT(T, b, b_off) : 0;
    __global T* hr = AT(T, h, h_off);
    if (cell == 0) {
      __global T* s = AT(T, sv, sv_off) + r * 4 * H;
      T i = sigm(x[j] + hh[j] + (has_bias ? B[j] : (T)0));
      T f = sigm(x[H + j] + hh[H + j] + (has_bias ? B[H + j] : (T)0));
      T g = tanh(x[2 * H + j] + hh[2 * H + j] + (has_bias ? B[2 * H + j] : (T)0));
      T o = sigm(x[3 * H + j] + hh[3 * H + j] + (has_bias ? B[3 * H + j] : (T)0));
      T cn = f * AT(T, cp, cp_off)[k] + i * g;
      AT(T, c, c_off)[k] = cn;
      hr[k] = o * tanh(cn);
      s[j] = i; s[H + j] = f; s[2 * H + j] = g; s[3 * H + j] = o;
    } else if (cell == 1) {
      __global T* s = AT(T, sv, sv_off) + r * 4 * H;
      T rg = sigm(x[j] + hh[j] + (has_bias ? B[j] : (T)0));
      T z = sigm(x[H + j] + hh[H + j] + (has_bias ? B[H + j] : (T)0));
      T hn = hh[2 * H + j] + (has_bias ? B[2 * H + j] : (T)0);
      T nn = tanh(x[2 * H + j] + rg * hn);
      hr[k] = ((T)1 - z) * nn + z * AT(T, hp, hp_off)[k];
      s[j] = rg; s[H + j] = z; s[2 * H + j] = nn; s[3 * H + j] = hn;
    } else {
      T v = x[j] + hh[j] + (has_bias ? B[j] : (T)0);
      hr[k] = cell == 2 ? tanh(v) : (v <= (T)0 ? (T)0 : v);  // relu: NaN stays NaN
    }
  }
}

__kernel void recurrent_backward(int cell, __global uchar* dy, ulong dy_off, __global uchar* dhn, ulong dhn_off,
                                 __global uchar* dc, ulong dc_off, __global uchar* sv, ulong sv_off,
                                 __global uchar* cp, ulong cp_off, __global uchar* c, ulong c_off,
                                 __global uchar* hp, ulong hp_off, __global uchar* h, ulong h_off,
                                 __global uchar* dxg, ulong dxg_off, __global uchar* dhg, ulong dhg_off, long n,
                                 long H) {
  const long G = cell == 0 ? 4 * H : cell == 1 ? 3 * H : H;
  GRID_LOOP(k, n * H) {
    const long r = k / H, j = k - r * H;
    __global T* DHN = AT(T, dhn, dhn_off);
    const T dh = AT(T, dy, dy_off)[k] + DHN[k];
    __global T* dx = AT(T, dxg, dxg_off) + r * G;
    if (cell == 0) {
      __global const T* s = AT(T, sv, sv_off) + r * 4 * H;
      __global T* DC = AT(T, dc, dc_off);
      const T i = s[j], f = s[H + j], g = s[2 * H + j], o = s[3 * H + j];
      const T tc = tanh(AT(T, c, c_off)[k]);
      const T d_c = DC[k] + dh * o * ((T)1 - tc * tc);
      dx[j] = d_c * g * i * ((T)1 - i);
      dx[H + j] = d_c * AT(T, cp, cp_off)[k] * f * ((T)1 - f);
      dx[2 * H + j] = d_c * i * ((T)1 - g * g);
      dx[3 * H + j] = dh * tc * o * ((T)1 - o);
      DC[k] = d_c * f;
      DHN[k] = (T)0;
    } else if (cell == 1) {
      __global const T* s = AT(T, sv, sv_off) + r * 4 * H;
      const T rg = s[j], z = s[H + j], nn = s[2 * H + j], hn = s[3 * H + j];
      const T dpre_n = dh * ((T)1 - z) * ((T)1 - nn * nn);
      const T dpre_z = dh * (AT(T, hp, hp_off)[k] - nn) * z * ((T)1 - z);
      const T dpre_r = dpre_n * hn * rg * ((T)1 - rg);
      __global T* dr = AT(T, dhg, dhg_off) + r * G;
      dx[j] = dpre_r; dx[H + j] = dpre_z; dx[2 * H + j] = dpre_n;
      dr[j] = dpre_r; dr[H + j] = dpre_z; dr[2 * H + j] = dpre_n * rg;
      DHN[k] = dh * z;
    } else {
      const T hv = AT(T, h, h_off)[k];
      dx[j] = cell == 2 ? dh * ((T)1 - hv * hv) : (hv > (T)0 ? dh : (hv <= (T)0 ? (T)0 : hv));
      DHN[k] = (T)0;
    }
  }
}
)CLC";

}  // namespace

bool recurrent_forward(int d, RecurrentCell cell, DType t, backend::Buffer xg, backend::Buffer hg, backend::Buffer b,
                       backend::Buffer h_prev, backend::Buffer c_prev, backend::Buffer h, backend::Buffer c,
                       backend::Buffer saved, int64_t n, int64_t hidden) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (n * hidden == 0) return true;
  DeviceState& dev = device(d);
  auto& k = kernel(dev, "recurrent", kRecurrentSource, type_options(dev, t, "recurrent"), "recurrent_forward");
  launch(dev, k, n * hidden, false, cl_int(cell), mem(xg), off(xg), mem(hg), off(hg), mem(b), off(b),
         cl_int(b.handle != nullptr), mem(h_prev), off(h_prev), mem(c_prev), off(c_prev), mem(h), off(h), mem(c), off(c),
         mem(saved), off(saved), cl_long(n), cl_long(hidden));
  return true;
}

bool recurrent_backward(int d, RecurrentCell cell, DType t, backend::Buffer dy, backend::Buffer dh_next,
                        backend::Buffer dc, backend::Buffer saved, backend::Buffer c_prev, backend::Buffer c,
                        backend::Buffer h_prev, backend::Buffer h, backend::Buffer dxg, backend::Buffer dhg, int64_t n,
                        int64_t hidden) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (n * hidden == 0) return true;
  DeviceState& dev = device(d);
  auto& k = kernel(dev, "recurrent", kRecurrentSource, type_options(dev, t, "recurrent"), "recurrent_backward");
  launch(dev, k, n * hidden, false, cl_int(cell), mem(dy), off(dy), mem(dh_next), off(dh_next), mem(dc), off(dc),
         mem(saved), off(saved), mem(c_prev), off(c_prev), mem(c), off(c), mem(h_prev), off(h_prev), mem(h), off(h),
         mem(dxg), off(dxg), mem(dhg), off(dhg), cl_long(n), cl_long(hidden));
  return true;
}

}  // namespace flux::opencl
