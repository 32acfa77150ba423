// Fused recurrent gate kernels, one time step (formulas in backend.hpp; PyTorch's gate order).
// Shapes: n rows (batch), H hidden; xg, hg, dxg, dhg (n, G) with G = 4H (LSTM), 3H (GRU), H (RNN);
// saved (n, 4H); h, c, dy, dh_next, dc (n, H). Threads split the rows; each row's loop over the H
// units reads every gate block contiguously. The portable path (src/ops/recurrent.cpp) composes the
// same formulas from public ops and is the reference in tests/test_recurrent.cpp.
#include <algorithm>
#include <cmath>

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu {

namespace {

using backend::RecurrentCell;

template <class T> T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <class T>
void forward_rows(RecurrentCell cell, const T* xg, const T* hg, const T* b, const T* h_prev, const T* c_prev, T* h,
                  T* c, T* saved, int64_t r0, int64_t r1, int64_t H) {
  const int64_t G = cell == RecurrentCell::lstm ? 4 * H : cell == RecurrentCell::gru ? 3 * H : H;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = xg + r * G;
    const T* hh = hg + r * G;
    T* hr = h + r * H;
    auto bias = [&](int64_t k) { return b ? b[k] : T(0); };
    switch (cell) {
      case RecurrentCell::lstm: {
        T* s = saved + r * 4 * H;
        for (int64_t j = 0; j < H; ++j) {
          T i = sigmoid(x[j] + hh[j] + bias(j));
          T f = sigmoid(x[H + j] + hh[H + j] + bias(H + j));
          T g = std::tanh(x[2 * H + j] + hh[2 * H + j] + bias(2 * H + j));
          T o = sigmoid(x[3 * H + j] + hh[3 * H + j] + bias(3 * H + j));
          T cn = f * c_prev[r * H + j] + i * g;
          c[r * H + j] = cn;
          hr[j] = o * std::tanh(cn);
          s[j] = i, s[H + j] = f, s[2 * H + j] = g, s[3 * H + j] = o;
        }
        break;
      }
      case RecurrentCell::gru: {
        T* s = saved + r * 4 * H;
        for (int64_t j = 0; j < H; ++j) {
          T rg = sigmoid(x[j] + hh[j] + bias(j));
          T z = sigmoid(x[H + j] + hh[H + j] + bias(H + j));
          T hn = hh[2 * H + j] + bias(2 * H + j);
          T nn = std::tanh(x[2 * H + j] + rg * hn);
          hr[j] = (T(1) - z) * nn + z * h_prev[r * H + j];
          s[j] = rg, s[H + j] = z, s[2 * H + j] = nn, s[3 * H + j] = hn;
        }
        break;
      }
      case RecurrentCell::rnn_tanh:
        for (int64_t j = 0; j < H; ++j) hr[j] = std::tanh(x[j] + hh[j] + bias(j));
        break;
      case RecurrentCell::rnn_relu:
        for (int64_t j = 0; j < H; ++j) {
          T v = x[j] + hh[j] + bias(j);
          hr[j] = v > T(0) ? v : T(0);
        }
        break;
    }
  }
}

template <class T>
void backward_rows(RecurrentCell cell, const T* dy, T* dh_next, T* dc, const T* saved, const T* c_prev, const T* c,
                   const T* h_prev, const T* h, T* dxg, T* dhg, int64_t r0, int64_t r1, int64_t H) {
  const int64_t G = cell == RecurrentCell::lstm ? 4 * H : cell == RecurrentCell::gru ? 3 * H : H;
  for (int64_t r = r0; r < r1; ++r) {
    T* dx = dxg + r * G;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t k = r * H + j;
      const T dh = dy[k] + dh_next[k];
      switch (cell) {
        case RecurrentCell::lstm: {
          const T* s = saved + r * 4 * H;
          const T i = s[j], f = s[H + j], g = s[2 * H + j], o = s[3 * H + j];
          const T tc = std::tanh(c[k]);
          const T d_c = dc[k] + dh * o * (T(1) - tc * tc);
          dx[j] = d_c * g * i * (T(1) - i);
          dx[H + j] = d_c * c_prev[k] * f * (T(1) - f);
          dx[2 * H + j] = d_c * i * (T(1) - g * g);
          dx[3 * H + j] = dh * tc * o * (T(1) - o);
          dc[k] = d_c * f;
          dh_next[k] = T(0);
          break;
        }
        case RecurrentCell::gru: {
          const T* s = saved + r * 4 * H;
          const T rg = s[j], z = s[H + j], nn = s[2 * H + j], hn = s[3 * H + j];
          const T dpre_n = dh * (T(1) - z) * (T(1) - nn * nn);
          const T dpre_z = dh * (h_prev[k] - nn) * z * (T(1) - z);
          const T dpre_r = dpre_n * hn * rg * (T(1) - rg);
          T* dr = dhg + r * G;
          dx[j] = dpre_r, dx[H + j] = dpre_z, dx[2 * H + j] = dpre_n;
          dr[j] = dpre_r, dr[H + j] = dpre_z, dr[2 * H + j] = dpre_n * rg;
          dh_next[k] = dh * z;
          break;
        }
        case RecurrentCell::rnn_tanh:
          dx[j] = dh * (T(1) - h[k] * h[k]);
          dh_next[k] = T(0);
          break;
        case RecurrentCell::rnn_relu:
          dx[j] = h[k] > T(0) ? dh : T(0);
          dh_next[k] = T(0);
          break;
      }
    }
  }
}

// Rows per task: enough work (about 16k gate values) to pay for a thread hand-off.
int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, 4 * hidden)); }

}  // namespace

bool recurrent_forward(RecurrentCell cell, DType t, const void* xg, const void* hg, const void* b_hh,
                       const void* h_prev, const void* c_prev, void* h, void* c, void* saved, int64_t n, int64_t hidden) {
  auto run = [&](auto zero) {
    using T = decltype(zero);
    parallel_for(n, row_grain(hidden), [&](int64_t r0, int64_t r1) {
      forward_rows<T>(cell, static_cast<const T*>(xg), static_cast<const T*>(hg), static_cast<const T*>(b_hh),
                      static_cast<const T*>(h_prev), static_cast<const T*>(c_prev), static_cast<T*>(h),
                      static_cast<T*>(c), static_cast<T*>(saved), r0, r1, hidden);
    });
  };
  if (t == DType::f32) run(0.0f);
  else if (t == DType::f64) run(0.0);
  else return false;
  return true;
}

bool recurrent_backward(RecurrentCell cell, DType t, const void* dy, void* dh_next, void* dc, const void* saved,
                        const void* c_prev, const void* c, const void* h_prev, const void* h, void* dxg, void* dhg,
                        int64_t n, int64_t hidden) {
  auto run = [&](auto zero) {
    using T = decltype(zero);
    parallel_for(n, row_grain(hidden), [&](int64_t r0, int64_t r1) {
      backward_rows<T>(cell, static_cast<const T*>(dy), static_cast<T*>(dh_next), static_cast<T*>(dc),
                       static_cast<const T*>(saved), static_cast<const T*>(c_prev), static_cast<const T*>(c),
                       static_cast<const T*>(h_prev), static_cast<const T*>(h), static_cast<T*>(dxg),
                       static_cast<T*>(dhg), r0, r1, hidden);
    });
  };
  if (t == DType::f32) run(0.0f);
  else if (t == DType::f64) run(0.0);
  else return false;
  return true;
}

}  // namespace flux::cpu
