// The recurrences of LSTM, GRU and RNN over a whole sequence, each one recorded op with a
// hand-written backpropagation through time. The input projection is NOT done here: the layers
// compute xg = x W_ihᵀ + b_ih for every step in one GEMM and pass it in, time-major.
//
// Shapes: T steps, N batch, H hidden, G gate columns (LSTM 4H in PyTorch's order i, f, g, o; GRU 3H
// r, z, n; RNN H). xg (T, N, G), w_hh (G, H), b_hh (G,) or undefined, h0 and c0 (N, H).
// Per step t: hg = h_{t-1} W_hhᵀ (one GEMM), then one fused gate kernel (Backend::recurrent_forward,
// formulas in backend.hpp, as torch.nn.LSTM / GRU / RNN document them); a backend without the kernel,
// a dtype other than f32/f64 or FLUX_LIBRARY_KERNELS=0 takes the portable path (the same formulas
// from public ops).
// Backward, t = T-1 .. 0: the fused backward kernel gives the pre-activation gradients dxg_t (and dhg_t
// for GRU); dh_{t-1} = direct part + dhg_t W_hh (one GEMM). After the loop, dW_hh = Σ_t dhg_tᵀ h_{t-1}
// and db_hh = Σ_t dhg_t as one GEMM and one reduction over all T N rows.
#include <optional>
#include <utility>

#include "flux/autocast.hpp"
#include "flux/autodiff.hpp"
#include "src/autocast.hpp"
#include "flux/ops.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/through_float32.hpp"
#include "src/storage_cache.hpp"
#include "src/ops/registry.hpp"

namespace flux {

namespace {

using backend::RecurrentCell;
using detail::fail;
using Grads = std::vector<Tensor>;

const ops::Op& cell_op(RecurrentCell cell) {
  switch (cell) {
    case RecurrentCell::lstm: return ops::lstm_recurrence;
    case RecurrentCell::gru: return ops::gru_recurrence;
    default: return ops::rnn_recurrence;
  }
}
int64_t gate_count(RecurrentCell cell) {
  return cell == RecurrentCell::lstm ? 4 : cell == RecurrentCell::gru ? 3 : 1;
}
backend::Buffer buffer_or_none(const Tensor& t) { return t.defined() ? flux::detail::buffer_of(t) : backend::Buffer{}; }

/// c (m, n) = a (m, k) · op(b) + beta c, one backend GEMM on contiguous operands.
void gemm(const Tensor& a, const Tensor& b, Tensor& c, int64_t m, int64_t n, int64_t k, bool trans_b, double beta) {
  backend::Gemm g;
  g.m = m, g.n = n, g.k = k;
  g.trans_b = trans_b;
  g.stride_a = m * k, g.stride_b = n * k, g.stride_c = m * n;
  g.beta = beta;
  a.backend().matmul(a.device().index(), a.dtype(), flux::detail::buffer_of(a), flux::detail::buffer_of(b), flux::detail::buffer_of(c), g);
}

/// Columns [j * H, (j + 1) * H) of a (N, k H) tensor.
Tensor block(const Tensor& x, int64_t j, int64_t hidden) { return slice(x, 1, j * hidden, (j + 1) * hidden); }

void assign(Tensor dst, const Tensor& src) { copy_(dst, src); }

// ---- the portable step (public ops, unrecorded); the same formulas as the fused kernels ----
void portable_forward(RecurrentCell cell, const Tensor& xg, const Tensor& hg, const Tensor& b_hh,
                      const Tensor& h_prev, const Tensor& c_prev, Tensor h, Tensor c, Tensor saved, int64_t hidden) {
  Tensor hgb = b_hh.defined() ? hg + b_hh : hg;
  switch (cell) {
    case RecurrentCell::lstm: {
      Tensor pre = xg + hgb;
      Tensor i = detail::sigmoid_op(block(pre, 0, hidden)), f = detail::sigmoid_op(block(pre, 1, hidden));
      Tensor g = detail::tanh_op(block(pre, 2, hidden)), o = detail::sigmoid_op(block(pre, 3, hidden));
      Tensor c_new = f * c_prev + i * g;
      assign(c, c_new);
      assign(h, o * detail::tanh_op(c_new));
      assign(saved, concat({i, f, g, o}, 1));
      break;
    }
    case RecurrentCell::gru: {
      Tensor r = detail::sigmoid_op(block(xg, 0, hidden) + block(hgb, 0, hidden));
      Tensor z = detail::sigmoid_op(block(xg, 1, hidden) + block(hgb, 1, hidden));
      Tensor hn = block(hgb, 2, hidden);
      Tensor nn = detail::tanh_op(block(xg, 2, hidden) + r * hn);
      assign(h, (1.0 - z) * nn + z * h_prev);
      assign(saved, concat({r, z, nn, hn}, 1));
      break;
    }
    case RecurrentCell::rnn_tanh: assign(h, detail::tanh_op(xg + hgb)); break;
    case RecurrentCell::rnn_relu: assign(h, detail::relu_op(xg + hgb)); break;
  }
}

void portable_backward(RecurrentCell cell, const Tensor& dy, Tensor dh_next, Tensor dc, const Tensor& saved,
                       const Tensor& c_prev, const Tensor& c, const Tensor& h_prev, const Tensor& h, Tensor dxg,
                       Tensor dhg, int64_t hidden) {
  Tensor dh = dy + dh_next;
  switch (cell) {
    case RecurrentCell::lstm: {
      Tensor i = block(saved, 0, hidden), f = block(saved, 1, hidden), g = block(saved, 2, hidden),
             o = block(saved, 3, hidden);
      Tensor tc = detail::tanh_op(c);
      Tensor d_c = dc + dh * o * (1.0 - tc * tc);
      Tensor di = d_c * g, dg = d_c * i, df = d_c * c_prev, d_o = dh * tc;
      assign(dxg, concat({di * i * (1.0 - i), df * f * (1.0 - f), dg * (1.0 - g * g), d_o * o * (1.0 - o)}, 1));
      assign(dc, d_c * f);
      assign(dh_next, zeros_like(dh));
      break;
    }
    case RecurrentCell::gru: {
      Tensor r = block(saved, 0, hidden), z = block(saved, 1, hidden), nn = block(saved, 2, hidden),
             hn = block(saved, 3, hidden);
      Tensor dpre_n = dh * (1.0 - z) * (1.0 - nn * nn);
      Tensor dpre_z = dh * (h_prev - nn) * z * (1.0 - z);
      Tensor dpre_r = dpre_n * hn * r * (1.0 - r);
      assign(dxg, concat({dpre_r, dpre_z, dpre_n}, 1));
      assign(dhg, concat({dpre_r, dpre_z, dpre_n * r}, 1));
      assign(dh_next, dh * z);
      break;
    }
    case RecurrentCell::rnn_tanh:
      assign(dxg, dh * (1.0 - h * h));
      assign(dh_next, zeros_like(dh));
      break;
    case RecurrentCell::rnn_relu:
      assign(dxg, detail::relu_grad(h, dh));
      assign(dh_next, zeros_like(dh));
      break;
  }
}

void check_state(const char* api, const char* name, const Tensor& s, int64_t n, int64_t hidden, const Tensor& xg) {
  if (!s.defined()) fail("[", api, "] the initial state ", name, " is undefined");
  if (s.shape() != Shape{n, hidden})
    fail("[", api, "] initial state ", name, " has shape ", to_string(s.shape()), "; expected (", n, ", ", hidden,
         ") (batch, hidden) for gates ", to_string(xg.shape()));
  if (s.dtype() != xg.dtype())
    fail("[", api, "] initial state ", name, " is ", dtype_name(s.dtype()), " but the gates are ",
         dtype_name(xg.dtype()));
  detail::check_same_device(api, xg, s);
}

/// What the backward of a recurrence reads: y (T, N, H) (+ c_T for LSTM), a view of hist (T + 1 (+ 1),
/// N, H): h_0 .. h_T (then c_T); c_hist (T + 1, N, H) for LSTM; saved (T, N, 4H) for LSTM and GRU.
struct Recurrence {
  Tensor y, hist, c_hist, saved;
};

/// The recurrence over checked operands of one float dtype (f32, f64), traced once; the caller records it.
Recurrence run_forward(RecurrentCell cell, const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0,
                       const Tensor& c0) {
  const bool lstm = cell == RecurrentCell::lstm, gru = cell == RecurrentCell::gru;
  const int64_t steps = xg.size(0), n = xg.size(1), g = xg.size(2), hidden = w_hh.size(1);
  const DType t = xg.dtype();
  const Device dev = xg.device();
  backend::Backend& be = xg.backend();
  const bool fusable = detail::library_kernels() && (t == DType::f32 || t == DType::f64);
  // hist rows: h_0 .. h_T, then c_T for LSTM; the result is rows 1.. (a view).
  Tensor hist = Tensor::empty(Shape{steps + 1 + (lstm ? 1 : 0), n, hidden}, t, dev);
  Tensor c_hist = lstm ? Tensor::empty(Shape{steps + 1, n, hidden}, t, dev) : Tensor();
  Tensor saved = lstm || gru ? Tensor::empty(Shape{steps, n, 4 * hidden}, t, dev) : Tensor();
  assign(hist[0], h0);
  if (lstm) assign(c_hist[0], c0);
  Tensor hg = Tensor::empty(Shape{n, g}, t, dev);
  // W_hh does not change during the recurrence: the backend may pack it for its GEMM kernel at the
  // first step and read the packed copy at the other T - 1 (Backend::linear_forward, kept in W_hh's
  // prepared-data cache), where a plain GEMM packs it at every step.
  backend::PreparedCache* w_hh_cache = &detail::storage_cache(w_hh);
  const bool kept_w_hh = detail::library_kernels();
  {
    autodiff::NoGrad no_grad;  // the whole recurrence is recorded once, below
    trace::Scope untraced(nullptr);  // and traced once (its per-step views are T-dependent internals)
    for (int64_t s = 0; s < steps; ++s) {
      Tensor h_prev = hist[s], h = hist[s + 1];
      Tensor c_prev = lstm ? c_hist[s] : Tensor(), c = lstm ? c_hist[s + 1] : Tensor();
      Tensor sv = saved.defined() ? saved[s] : Tensor();
      Tensor x_s = xg[s];
      if (!kept_w_hh || !be.linear_forward(dev.index(), t, flux::detail::buffer_of(h_prev), flux::detail::buffer_of(w_hh), w_hh_cache,
                                           backend::Buffer{}, flux::detail::buffer_of(hg), n, hidden, g, false))
        gemm(h_prev, w_hh, hg, n, g, hidden, true, 0.0);
      bool fused = fusable && be.recurrent_forward(dev.index(), cell, t, flux::detail::buffer_of(x_s), flux::detail::buffer_of(hg), buffer_or_none(b_hh),
                                                   flux::detail::buffer_of(h_prev), buffer_or_none(c_prev), flux::detail::buffer_of(h), buffer_or_none(c),
                                                   buffer_or_none(sv), n, hidden);
      if (!fused) portable_forward(cell, x_s, hg, b_hh, h_prev, c_prev, h, c, sv, hidden);
    }
    if (lstm) assign(hist[steps + 1], c_hist[steps]);
  }
  Tensor y = hist.slice(1, hist.size(0));
  if (trace::active()) trace::emit(cell_op(cell), {xg, w_hh, b_hh, h0, c0}, y, {{"relu", {int64_t(cell == RecurrentCell::rnn_relu)}, {}}});
  return {y, hist, c_hist, saved};
}

/// The gradients (xg, w_hh, b_hh, h0, c0) of a recurrence r with weight w_hh for the output gradient gy.
Grads run_backward(RecurrentCell cell, const Recurrence& r, const Tensor& w_hh, bool need_b, const Tensor& gy0) {
  const bool lstm = cell == RecurrentCell::lstm, gru = cell == RecurrentCell::gru;
  const Tensor &hist = r.hist, &c_hist = r.c_hist, &saved = r.saved;
  const DType t = hist.dtype();
  const Device dev = hist.device();
  const int64_t steps = hist.size(0) - 1 - (lstm ? 1 : 0), n = hist.size(1), hidden = hist.size(2), g = w_hh.size(0);
  const bool fusable = detail::library_kernels() && (t == DType::f32 || t == DType::f64);
  backend::Backend* bep = &hist.backend();
  Tensor gy = gy0.dtype() == t ? gy0 : gy0.cast(t);
  Tensor dxg = Tensor::empty(Shape{steps, n, g}, t, dev);
  Tensor dhg = gru ? Tensor::empty(Shape{steps, n, g}, t, dev) : dxg;
  Tensor dh_next = zeros(Shape{n, hidden}, t, dev);
  Tensor dc = lstm ? gy[steps].contiguous_copy() : Tensor();
  // dh_{t-1} += dhg_t W_hh reads W_hh at every step: transposed once into (H, G) rows, the backend may
  // keep it packed for its kernel (Backend::linear_forward, as the forward's W_hh) where a GEMM packs
  // it again at every step; its product lands in dh_w and is added to the direct part.
  const bool kept_w = fusable && detail::library_kernels();
  Tensor w_t, dh_w;
  backend::PreparedCache* w_t_cache = nullptr;
  if (kept_w) {
    autodiff::NoGrad no_grad;
    w_t = w_hh.transpose().contiguous_copy();
    w_t_cache = &detail::storage_cache(w_t);
    dh_w = Tensor::empty(Shape{n, hidden}, t, dev);
  }
  for (int64_t s = steps - 1; s >= 0; --s) {
    Tensor dy = gy[s], sv = saved.defined() ? saved[s] : Tensor();
    Tensor c_prev = lstm ? c_hist[s] : Tensor(), c = lstm ? c_hist[s + 1] : Tensor();
    Tensor h_prev = hist[s], h = hist[s + 1];
    Tensor dx_s = dxg[s], dh_s = gru ? dhg[s] : Tensor();
    bool fused = fusable && bep->recurrent_backward(dev.index(), cell, t, flux::detail::buffer_of(dy), flux::detail::buffer_of(dh_next),
                                                  buffer_or_none(dc), buffer_or_none(sv), buffer_or_none(c_prev),
                                                  buffer_or_none(c), flux::detail::buffer_of(h_prev), flux::detail::buffer_of(h), flux::detail::buffer_of(dx_s),
                                                  buffer_or_none(dh_s), n, hidden);
    if (!fused) portable_backward(cell, dy, dh_next, dc, sv, c_prev, c, h_prev, h, dx_s, dh_s, hidden);
    Tensor dh_rec = gru ? dh_s : dx_s;
    if (kept_w && bep->linear_forward(dev.index(), t, flux::detail::buffer_of(dh_rec), flux::detail::buffer_of(w_t), w_t_cache,
                                      backend::Buffer{}, flux::detail::buffer_of(dh_w), n, g, hidden, false)) {
      autodiff::NoGrad no_grad;
      copy_(dh_next, dh_next + dh_w);  // (n, H): small beside the product
    } else {
      gemm(dh_rec, w_hh, dh_next, n, hidden, g, false, 1.0);  // dh_{t-1} += dhg_t W_hh
    }
  }
  Tensor rows = dhg.reshape(Shape{steps * n, g});
  Tensor dw = matmul(rows, hist.slice(0, steps).reshape(Shape{steps * n, hidden}), true, false);
  Tensor db = need_b ? sum(rows, 0) : Tensor();
  return Grads{dxg, dw, db, dh_next, dc};
}

/// The common recurrence. Returns (T, N, H) hidden states, plus c_T as row T for LSTM ((T + 1, N, H)).
Tensor recurrence(RecurrentCell cell, const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0,
                  const Tensor& c0) {
  const char* api = cell_op(cell).name;
  const bool lstm = cell == RecurrentCell::lstm;
  detail::check_defined(api, xg);
  detail::check_defined(api, w_hh);
  if (auto low = detail::autocast_low({&xg, &w_hh, &h0}))
    return recurrence(cell, detail::autocast_to(xg, *low), detail::autocast_to(w_hh, *low),
                      detail::autocast_to(b_hh, *low), detail::autocast_to(h0, *low), detail::autocast_to(c0, *low));
  if (!is_floating(xg.dtype())) fail("[", api, "] needs floating-point gates; got ", summary(xg));
  if (xg.ndim() != 3)
    fail("[", api, "] expects time-major gates (T, N, G); got shape ", to_string(xg.shape()));
  const int64_t steps = xg.size(0), n = xg.size(1), g = xg.size(2);
  if (w_hh.ndim() != 2 || w_hh.size(0) != gate_count(cell) * w_hh.size(1))
    fail("[", api, "] weight_hh must be (", gate_count(cell), " hidden, hidden); got shape ", to_string(w_hh.shape()));
  const int64_t hidden = w_hh.size(1);
  if (g != gate_count(cell) * hidden)
    fail("[", api, "] gates ", to_string(xg.shape()), " have ", g, " columns; weight_hh ", to_string(w_hh.shape()),
         " needs ", gate_count(cell) * hidden);
  if (steps < 1 || n < 1) fail("[", api, "] needs at least one step and one sequence; got gates ", to_string(xg.shape()));
  if (w_hh.dtype() != xg.dtype())
    fail("[", api, "] weight_hh is ", dtype_name(w_hh.dtype()), " but the gates are ", dtype_name(xg.dtype()));
  detail::check_same_device(api, xg, w_hh);
  if (b_hh.defined()) {
    if (b_hh.shape() != Shape{g})
      fail("[", api, "] bias_hh must have shape (", g, ",); got ", to_string(b_hh.shape()));
    if (b_hh.dtype() != xg.dtype())
      fail("[", api, "] bias_hh is ", dtype_name(b_hh.dtype()), " but the gates are ", dtype_name(xg.dtype()));
    detail::check_same_device(api, xg, b_hh);
  }
  check_state(api, "h0", h0, n, hidden, xg);
  if (lstm) check_state(api, "c0", c0, n, hidden, xg);
  if (detail::is_half(xg.dtype())) {
    // Float16/BFloat16: the recurrence through Float32 (its state is carried step to step), one
    // rounding of the outputs. The tape keeps the half operands and the Float32 states the backward
    // reads, not Float32 copies of the operands.
    const DType low = xg.dtype();
    return detail::through_float32(
        nullptr, {&xg, &w_hh, &b_hh, &h0, &c0}, {w_hh},
        [&](std::vector<Tensor>& keep) {
          AutocastScope off(std::nullopt);  // the Float32 recurrence is not autocast again
          Recurrence r = run_forward(cell, detail::float32_of(xg), detail::float32_of(w_hh), detail::float32_of(b_hh),
                                     detail::float32_of(h0), detail::float32_of(c0));
          keep.insert(keep.end(), {r.hist, r.c_hist, r.saved});
          return detail::raw_cast(r.y, low);
        },
        [cell, need_b = b_hh.defined()](const std::vector<Tensor>& k, const Tensor& gy) {
          return run_backward(cell, Recurrence{Tensor(), k[1], k[2], k[3]}, k[0], need_b, gy);
        });
  }
  Recurrence r = run_forward(cell, xg, w_hh, b_hh, h0, c0);
  autodiff::record(r.y, {&xg, &w_hh, &b_hh, &h0, &c0}, [cell, r, w_hh, need_b = b_hh.defined()](const Tensor& gy) {
    return run_backward(cell, r, w_hh, need_b, gy);
  });
  return r.y;
}

}  // namespace

Tensor lstm_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0, const Tensor& c0) {
  return recurrence(RecurrentCell::lstm, xg, w_hh, b_hh, h0, c0);
}

Tensor gru_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0) {
  return recurrence(RecurrentCell::gru, xg, w_hh, b_hh, h0, Tensor());
}

Tensor rnn_recurrence(const Tensor& xg, const Tensor& w_hh, const Tensor& b_hh, const Tensor& h0, bool relu) {
  return recurrence(relu ? RecurrentCell::rnn_relu : RecurrentCell::rnn_tanh, xg, w_hh, b_hh, h0, Tensor());
}

}  // namespace flux
