// Fused recurrent gate kernels, one time step (formulas in backend.hpp; PyTorch's gate order).
// Shapes: n rows (batch), H hidden; xg, hg, dxg, dhg (n, G) with G = 4H (LSTM), 3H (GRU), H (RNN);
// saved (n, 4H); h, c, dy, dh_next, dc (n, H). Threads split the rows; each row's loop over the H
// units reads every gate block contiguously and is vectorised per ISA level (vector_math.hpp's exp,
// sigmoid, tanh for f32). The portable path (src/ops/recurrent.cpp) composes the
// same formulas from public ops and is the reference in tests/test_recurrent.cpp.
#include <algorithm>
#include <cmath>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/vector_math.hpp"

namespace flux::cpu_backend {

namespace {

using backend::RecurrentCell;
namespace vm = vmath;

// One body per cell, compiled per ISA level (isa.hpp) so that the loop over the H units of a row
// vectorises with vmath's exp/sigmoid/tanh; b (the bias) may be null.
template <class T>
FLUX_CPU_INLINE void lstm_forward_body(const T* __restrict xg, const T* __restrict hg, const T* __restrict b,
                                       const T* __restrict c_prev, T* __restrict h, T* __restrict c,
                                       T* __restrict saved, int64_t r0, int64_t r1, int64_t H) {
  // Per row: the three sigmoid gates (i, f: columns [0, 2H); o: [3H, 4H)) in loops of their own, then g,
  // c and h. Each loop holds one function's constants in registers (one loop for all five exp-based
  // functions spilled them on AVX2's 16 registers).
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = xg + r * 4 * H;
    const T* hh = hg + r * 4 * H;
    const T* cp = c_prev + r * H;
    T* hr = h + r * H;
    T* cr = c + r * H;
    T* s = saved + r * 4 * H;
    auto sigmoids = [&](int64_t lo, int64_t hi) __attribute__((always_inline)) {
      if (b)
        for (int64_t j = lo; j < hi; ++j) s[j] = vm::sigmoid(x[j] + hh[j] + b[j]);
      else
        for (int64_t j = lo; j < hi; ++j) s[j] = vm::sigmoid(x[j] + hh[j]);
    };
    sigmoids(0, 2 * H);
    sigmoids(3 * H, 4 * H);
    if (b)
      for (int64_t j = 2 * H; j < 3 * H; ++j) s[j] = vm::tanh(x[j] + hh[j] + b[j]);
    else
      for (int64_t j = 2 * H; j < 3 * H; ++j) s[j] = vm::tanh(x[j] + hh[j]);
    for (int64_t j = 0; j < H; ++j) {
      const T cn = s[H + j] * cp[j] + s[j] * s[2 * H + j];
      cr[j] = cn;
      hr[j] = s[3 * H + j] * vm::tanh(cn);
    }
  }
}
FLUX_CPU_VARIANTS(lstm_forward_rows, lstm_forward_body)

template <class T>
FLUX_CPU_INLINE void gru_forward_body(const T* __restrict xg, const T* __restrict hg, const T* __restrict b,
                                      const T* __restrict h_prev, T* __restrict h, T* __restrict saved, int64_t r0,
                                      int64_t r1, int64_t H) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = xg + r * 3 * H;
    const T* hh = hg + r * 3 * H;
    const T* hp = h_prev + r * H;
    T* hr = h + r * H;
    T* s = saved + r * 4 * H;
    auto unit = [&](int64_t j, T br, T bz, T bn) __attribute__((always_inline)) {
      const T rg = vm::sigmoid(x[j] + hh[j] + br);
      const T z = vm::sigmoid(x[H + j] + hh[H + j] + bz);
      const T hn = hh[2 * H + j] + bn;
      const T nn = vm::tanh(x[2 * H + j] + rg * hn);
      hr[j] = (T(1) - z) * nn + z * hp[j];
      s[j] = rg, s[H + j] = z, s[2 * H + j] = nn, s[3 * H + j] = hn;
    };
    if (b)
      for (int64_t j = 0; j < H; ++j) unit(j, b[j], b[H + j], b[2 * H + j]);
    else
      for (int64_t j = 0; j < H; ++j) unit(j, T(0), T(0), T(0));
  }
}
FLUX_CPU_VARIANTS(gru_forward_rows, gru_forward_body)

template <class T>
FLUX_CPU_INLINE void rnn_forward_body(const T* __restrict xg, const T* __restrict hg, const T* __restrict b,
                                      T* __restrict h, bool relu, int64_t r0, int64_t r1, int64_t H) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = xg + r * H;
    const T* hh = hg + r * H;
    T* hr = h + r * H;
    if (relu) {
      for (int64_t j = 0; j < H; ++j) {
        const T v = x[j] + hh[j] + (b ? b[j] : T(0));
        hr[j] = v <= T(0) ? T(0) : v;  // NaN stays NaN
      }
    } else if (b) {
      for (int64_t j = 0; j < H; ++j) hr[j] = vm::tanh(x[j] + hh[j] + b[j]);
    } else {
      for (int64_t j = 0; j < H; ++j) hr[j] = vm::tanh(x[j] + hh[j]);
    }
  }
}
FLUX_CPU_VARIANTS(rnn_forward_rows, rnn_forward_body)

template <class T>
FLUX_CPU_INLINE void lstm_backward_body(const T* __restrict dy, T* __restrict dh_next, T* __restrict dc,
                                        const T* __restrict saved, const T* __restrict c_prev, const T* __restrict c,
                                        T* __restrict dxg, int64_t r0, int64_t r1, int64_t H) {
  for (int64_t r = r0; r < r1; ++r) {
    T* dx = dxg + r * 4 * H;
    const T* s = saved + r * 4 * H;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t k = r * H + j;
      const T dh = dy[k] + dh_next[k];
      const T i = s[j], f = s[H + j], g = s[2 * H + j], o = s[3 * H + j];
      const T tc = vm::tanh(c[k]);
      const T d_c = dc[k] + dh * o * (T(1) - tc * tc);
      dx[j] = d_c * g * i * (T(1) - i);
      dx[H + j] = d_c * c_prev[k] * f * (T(1) - f);
      dx[2 * H + j] = d_c * i * (T(1) - g * g);
      dx[3 * H + j] = dh * tc * o * (T(1) - o);
      dc[k] = d_c * f;
      dh_next[k] = T(0);
    }
  }
}
FLUX_CPU_VARIANTS(lstm_backward_rows, lstm_backward_body)

template <class T>
FLUX_CPU_INLINE void gru_backward_body(const T* __restrict dy, T* __restrict dh_next, const T* __restrict saved,
                                       const T* __restrict h_prev, T* __restrict dxg, T* __restrict dhg, int64_t r0,
                                       int64_t r1, int64_t H) {
  for (int64_t r = r0; r < r1; ++r) {
    T* dx = dxg + r * 3 * H;
    T* dr = dhg + r * 3 * H;
    const T* s = saved + r * 4 * H;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t k = r * H + j;
      const T dh = dy[k] + dh_next[k];
      const T rg = s[j], z = s[H + j], nn = s[2 * H + j], hn = s[3 * H + j];
      const T dpre_n = dh * (T(1) - z) * (T(1) - nn * nn);
      const T dpre_z = dh * (h_prev[k] - nn) * z * (T(1) - z);
      const T dpre_r = dpre_n * hn * rg * (T(1) - rg);
      dx[j] = dpre_r, dx[H + j] = dpre_z, dx[2 * H + j] = dpre_n;
      dr[j] = dpre_r, dr[H + j] = dpre_z, dr[2 * H + j] = dpre_n * rg;
      dh_next[k] = dh * z;
    }
  }
}
FLUX_CPU_VARIANTS(gru_backward_rows, gru_backward_body)

template <class T>
FLUX_CPU_INLINE void rnn_backward_body(const T* __restrict dy, T* __restrict dh_next, const T* __restrict h,
                                       T* __restrict dxg, bool relu, int64_t r0, int64_t r1, int64_t H) {
  for (int64_t k = r0 * H; k < r1 * H; ++k) {
    const T dh = dy[k] + dh_next[k];
    dxg[k] = relu ? (h[k] > T(0) ? dh : (h[k] <= T(0) ? T(0) : h[k])) : dh * (T(1) - h[k] * h[k]);
    dh_next[k] = T(0);
  }
}
FLUX_CPU_VARIANTS(rnn_backward_rows, rnn_backward_body)

template <class T>
void forward_rows(RecurrentCell cell, const T* xg, const T* hg, const T* b, const T* h_prev, const T* c_prev, T* h,
                  T* c, T* saved, int64_t r0, int64_t r1, int64_t H) {
  switch (cell) {
    case RecurrentCell::lstm: lstm_forward_rows(xg, hg, b, c_prev, h, c, saved, r0, r1, H); break;
    case RecurrentCell::gru: gru_forward_rows(xg, hg, b, h_prev, h, saved, r0, r1, H); break;
    case RecurrentCell::rnn_tanh: rnn_forward_rows(xg, hg, b, h, false, r0, r1, H); break;
    case RecurrentCell::rnn_relu: rnn_forward_rows(xg, hg, b, h, true, r0, r1, H); break;
  }
}

template <class T>
void backward_rows(RecurrentCell cell, const T* dy, T* dh_next, T* dc, const T* saved, const T* c_prev, const T* c,
                   const T* h_prev, const T* h, T* dxg, T* dhg, int64_t r0, int64_t r1, int64_t H) {
  switch (cell) {
    case RecurrentCell::lstm: lstm_backward_rows(dy, dh_next, dc, saved, c_prev, c, dxg, r0, r1, H); break;
    case RecurrentCell::gru: gru_backward_rows(dy, dh_next, saved, h_prev, dxg, dhg, r0, r1, H); break;
    case RecurrentCell::rnn_tanh: rnn_backward_rows(dy, dh_next, h, dxg, false, r0, r1, H); break;
    case RecurrentCell::rnn_relu: rnn_backward_rows(dy, dh_next, h, dxg, true, r0, r1, H); break;
  }
}

// Rows per task: enough work to pay for a thread hand-off, about 64k gate values. A small step (the
// char LSTM's 32 x 256) is then one task: its forward is shorter than two threads' rendezvous, which
// it would pay 128 times per training step (figures: bench/results/2026-12-06-notes-from-comments.md).
int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, 4 * hidden)); }

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

}  // namespace flux::cpu_backend
