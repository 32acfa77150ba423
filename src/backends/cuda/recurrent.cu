// Fused recurrent gate kernels on the GPU, one time step, float32 and float64 (formulas in
// include/flux/backend.hpp; reference: src/backends/cpu/recurrent.cpp). hipcc builds the same source.
// Shapes: n rows (batch), H hidden; xg, hg, dxg, dhg (n, G), G = 4H (LSTM), 3H (GRU), H (RNN);
// saved (n, 4H); h, c, dy, dh_next, dc (n, H). One thread per (row, unit): no reduction, no atomics.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

using backend::RecurrentCell;

template <class T> __device__ inline T sigm(T x) { return T(1) / (T(1) + exp(-x)); }

template <class T>
__global__ void forward_kernel(RecurrentCell cell, const T* xg, const T* hg, const T* b, const T* h_prev,
                               const T* c_prev, T* h, T* c, T* saved, int64_t n, int64_t H) {
  const int64_t G = cell == RecurrentCell::lstm ? 4 * H : cell == RecurrentCell::gru ? 3 * H : H;
  for (int64_t k = thread_index(); k < n * H; k += thread_stride()) {
    const int64_t r = k / H, j = k - r * H;
    const T* x = xg + r * G;
    const T* hh = hg + r * G;
    auto bias = [&](int64_t q) { return b ? b[q] : T(0); };
    if (cell == RecurrentCell::lstm) {
      T* s = saved + r * 4 * H;
      T i = sigm(x[j] + hh[j] + bias(j));
      T f = sigm(x[H + j] + hh[H + j] + bias(H + j));
      T g = tanh(x[2 * H + j] + hh[2 * H + j] + bias(2 * H + j));
      T o = sigm(x[3 * H + j] + hh[3 * H + j] + bias(3 * H + j));
      T cn = f * c_prev[k] + i * g;
      c[k] = cn;
      h[k] = o * tanh(cn);
      s[j] = i, s[H + j] = f, s[2 * H + j] = g, s[3 * H + j] = o;
    } else if (cell == RecurrentCell::gru) {
      T* s = saved + r * 4 * H;
      T rg = sigm(x[j] + hh[j] + bias(j));
      T z = sigm(x[H + j] + hh[H + j] + bias(H + j));
      T hn = hh[2 * H + j] + bias(2 * H + j);
      T nn = tanh(x[2 * H + j] + rg * hn);
      h[k] = (T(1) - z) * nn + z * h_prev[k];
      s[j] = rg, s[H + j] = z, s[2 * H + j] = nn, s[3 * H + j] = hn;
    } else {
      T v = x[j] + hh[j] + bias(j);
      h[k] = cell == RecurrentCell::rnn_tanh ? tanh(v) : (v <= T(0) ? T(0) : v);  // relu: NaN stays NaN
    }
  }
}

template <class T>
__global__ void backward_kernel(RecurrentCell cell, const T* dy, T* dh_next, T* dc, const T* saved, const T* c_prev,
                                const T* c, const T* h_prev, const T* h, T* dxg, T* dhg, int64_t n, int64_t H) {
  const int64_t G = cell == RecurrentCell::lstm ? 4 * H : cell == RecurrentCell::gru ? 3 * H : H;
  for (int64_t k = thread_index(); k < n * H; k += thread_stride()) {
    const int64_t r = k / H, j = k - r * H;
    const T dh = dy[k] + dh_next[k];
    T* dx = dxg + r * G;
    if (cell == RecurrentCell::lstm) {
      const T* s = saved + r * 4 * H;
      const T i = s[j], f = s[H + j], g = s[2 * H + j], o = s[3 * H + j];
      const T tc = tanh(c[k]);
      const T d_c = dc[k] + dh * o * (T(1) - tc * tc);
      dx[j] = d_c * g * i * (T(1) - i);
      dx[H + j] = d_c * c_prev[k] * f * (T(1) - f);
      dx[2 * H + j] = d_c * i * (T(1) - g * g);
      dx[3 * H + j] = dh * tc * o * (T(1) - o);
      dc[k] = d_c * f;
      dh_next[k] = T(0);
    } else if (cell == RecurrentCell::gru) {
      const T* s = saved + r * 4 * H;
      const T rg = s[j], z = s[H + j], nn = s[2 * H + j], hn = s[3 * H + j];
      const T dpre_n = dh * (T(1) - z) * (T(1) - nn * nn);
      const T dpre_z = dh * (h_prev[k] - nn) * z * (T(1) - z);
      const T dpre_r = dpre_n * hn * rg * (T(1) - rg);
      T* dr = dhg + r * G;
      dx[j] = dpre_r, dx[H + j] = dpre_z, dx[2 * H + j] = dpre_n;
      dr[j] = dpre_r, dr[H + j] = dpre_z, dr[2 * H + j] = dpre_n * rg;
      dh_next[k] = dh * z;
    } else {
      const T hv = h[k];
      dx[j] = cell == RecurrentCell::rnn_tanh ? dh * (T(1) - hv * hv) : (hv > T(0) ? dh : (hv <= T(0) ? T(0) : hv));
      dh_next[k] = T(0);
    }
  }
}

}  // namespace

bool recurrent_forward(Stream s, RecurrentCell cell, DType t, const void* xg, const void* hg, const void* b_hh,
                       const void* h_prev, const void* c_prev, void* h, void* c, void* saved, int64_t n, int64_t hidden) {
  if (t != DType::f32 && t != DType::f64) return false;
  const int64_t total = n * hidden;
  if (total <= 0) return true;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    forward_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(
        cell, static_cast<const T*>(xg), static_cast<const T*>(hg), static_cast<const T*>(b_hh),
        static_cast<const T*>(h_prev), static_cast<const T*>(c_prev), static_cast<T*>(h), static_cast<T*>(c),
        static_cast<T*>(saved), n, hidden);
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  check_launch("recurrent forward kernel");
  return true;
}

bool recurrent_backward(Stream s, RecurrentCell cell, DType t, const void* dy, void* dh_next, void* dc,
                        const void* saved, const void* c_prev, const void* c, const void* h_prev, const void* h,
                        void* dxg, void* dhg, int64_t n, int64_t hidden) {
  if (t != DType::f32 && t != DType::f64) return false;
  const int64_t total = n * hidden;
  if (total <= 0) return true;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    backward_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(
        cell, static_cast<const T*>(dy), static_cast<T*>(dh_next), static_cast<T*>(dc), static_cast<const T*>(saved),
        static_cast<const T*>(c_prev), static_cast<const T*>(c), static_cast<const T*>(h_prev),
        static_cast<const T*>(h), static_cast<T*>(dxg), static_cast<T*>(dhg), n, hidden);
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  check_launch("recurrent backward kernel");
  return true;
}

}  // namespace flux::cuda_backend
