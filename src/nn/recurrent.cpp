// Recurrent cells and layers (include/flux/nn/recurrent.hpp). Every layer computes the input
// projection x W_ihᵀ + b_ih for all T steps in one GEMM ((T N, in) x (in, G)), then hands the
// time-major gates to the recurrence op (src/ops/recurrent.cpp: one GEMM and one fused gate kernel
// per step). A cell is the same op with T = 1.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "flux/nn/recurrent.hpp"

#include "flux/nn/show.hpp"
#include "src/checked_size.hpp"
#include "src/nn/match_eltype.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

namespace {

using detail::fail;

enum class Kind { rnn, lstm, gru };
int64_t gates(Kind k) { return k == Kind::lstm ? 4 : k == Kind::gru ? 3 : 1; }

/// Parameters of one cell: weight_ih (G, in), weight_hh (G, hidden), zero biases (G,); LSTM's
/// forget-gate bias_ih block starts at 1 (Flux 0.14's LSTMCell: b[gate(out, 2)] .= 1).
template <class Cell>
void init_cell(Cell& cell, const char* api, Kind kind, int64_t in, int64_t hidden, const RecurrentOptions& o) {
  if (in <= 0 || hidden <= 0) fail("[", api, "] sizes must be positive; got ", api, "(", in, " => ", hidden, ")");
  const int64_t g = detail::checked_mul(api, "the gate count (gates × hidden)", gates(kind), hidden);
  cell.weight_ih = detail::initialise(api, o.init, Shape{g, in}, o.dtype);
  cell.weight_hh = detail::initialise(api, o.init, Shape{g, hidden}, o.dtype);
  if (o.bias) {
    std::vector<double> b(size_t(g), 0.0);
    if (kind == Kind::lstm) std::fill(b.begin() + hidden, b.begin() + 2 * hidden, 1.0);
    cell.bias_ih = Tensor(b, Shape{g}).cast(o.dtype);
    cell.bias_hh = zeros(Shape{g}, o.dtype);
  }
}

void check_activation(const char* api, const Activation& act) {
  if (act.name() != "tanh" && act.name() != "relu")
    fail("[", api, "] the activation must be tanh or relu (as torch.nn.RNN's nonlinearity); got ", act.name());
}

/// x (rows, in) W_ihᵀ + b_ih, fused where detail::linear can.
Tensor project(const Tensor& x2, const Tensor& w, const Tensor& b) {
  // Autocast: the projection in the low dtype, bias included (as Dense).
  if (auto low = detail::autocast_low({&x2, &w}))
    return project(detail::autocast_to(x2, *low), detail::autocast_to(w, *low), detail::autocast_to(b, *low));
  Tensor y;
  if (b.defined()) y = detail::linear(x2, w, b);
  if (!y.defined()) {
    y = matmul(x2, w, false, true);
    if (b.defined()) y = y + b;
  }
  return y;
}

template <class Cell> void check_cell_ready(const char* api, const Cell& cell) {
  if (!cell.weight_ih.defined()) fail("[", api, "] the layer is empty (default-constructed)");
}

template <class Cell> std::string cell_signature(const char* api, const Cell& cell) {
  return std::string(api) + "(" + std::to_string(cell.in_features()) + " => " + std::to_string(cell.hidden_size()) + ")";
}

/// x must be (N, in) on the weights' device with their dtype; Float64 input to a narrower layer is
/// converted with Flux's warning (once per process), as Dense and Conv do. Returns the input to use.
template <class Cell> Tensor cell_input(const char* api, const Cell& cell, const Tensor& x0) {
  check_cell_ready(api, cell);
  detail::check_defined(api, x0);
  const Tensor x = detail::match_eltype(api, cell, cell.weight_ih, x0);
  const int64_t in = cell.in_features();
  if (x.ndim() != 2 || x.size(1) != in)
    fail("[", api, "] expected input (N, ", in, ") (batch, features) for ", cell_signature(api, cell), "; got shape ",
         to_string(x.shape()));
  if (x.device() != cell.weight_ih.device())
    fail("[", api, "] input on ", to_string(x.device()), " but the layer's weights on ",
         to_string(cell.weight_ih.device()), "; move one with to() or | dev");
  if (x.dtype() != cell.weight_ih.dtype() && !detail::autocast_active())
    fail("[", api, "] input is ", dtype_name(x.dtype()), " but the layer's weights are ",
         dtype_name(cell.weight_ih.dtype()), "; convert one (x.cast(...), f32(model), f64(model))");
  return x;
}

void check_cell_state(const char* api, const char* name, const Tensor& s, int64_t n, int64_t hidden,
                      const Tensor& weight) {
  if (!s.defined()) fail("[", api, "] the state ", name, " is undefined");
  if (s.shape() != Shape{n, hidden})
    fail("[", api, "] state ", name, " has shape ", to_string(s.shape()), "; expected (", n, ", ", hidden,
         ") (batch, hidden) for an input of ", n, " rows");
  if (s.device() != weight.device())
    fail("[", api, "] state ", name, " on ", to_string(s.device()), " but the layer's weights on ",
         to_string(weight.device()));
  if (s.dtype() != weight.dtype() && !detail::autocast_active())
    fail("[", api, "] state ", name, " is ", dtype_name(s.dtype()), " but the layer's weights are ",
         dtype_name(weight.dtype()));
}

/// One step of any cell through the recurrence op with T = 1; returns (1 or 2, N, hidden).
template <class Cell> Tensor cell_step(Kind kind, bool relu, const Cell& cell, const Tensor& x, const Tensor& h,
                                       const Tensor& c) {
  const int64_t n = x.size(0);
  Tensor xg = project(x, cell.weight_ih, cell.bias_ih).reshape(Shape{1, n, -1});
  switch (kind) {
    case Kind::lstm: return lstm_recurrence(xg, cell.weight_hh, cell.bias_hh, h, c);
    case Kind::gru: return gru_recurrence(xg, cell.weight_hh, cell.bias_hh, h);
    default: return rnn_recurrence(xg, cell.weight_hh, cell.bias_hh, h, relu);
  }
}

// ---- sequence layers ----

/// x must be (N, T, in) on the weights' device with their dtype (Float64 input to a narrower layer is
/// converted, with Flux's warning once per process). Returns the input to use.
template <class Layer> Tensor layer_input(const char* api, const Layer& layer, const Tensor& x0) {
  if (layer.layers.empty() || !layer.layers[0].weight_ih.defined())
    fail("[", api, "] the layer is empty (default-constructed)");
  detail::check_defined(api, x0);
  const int64_t in = layer.in_features();
  const Tensor& w = layer.layers[0].weight_ih;
  const Tensor x = detail::match_eltype(api, layer, w, x0);
  if (x.ndim() != 3 || x.size(2) != in)
    fail("[", api, "] expected input (N, T, ", in, ") (batch, time, features) for ", layer_string(layer),
         "; got shape ", to_string(x.shape()));
  if (x.size(0) < 1 || x.size(1) < 1)
    fail("[", api, "] needs at least one sequence of at least one step; got shape ", to_string(x.shape()));
  if (x.device() != w.device())
    fail("[", api, "] input on ", to_string(x.device()), " but the layer's weights on ", to_string(w.device()),
         "; move one with to() or | dev");
  if (x.dtype() != w.dtype() && !detail::autocast_active())
    fail("[", api, "] input is ", dtype_name(x.dtype()), " but the layer's weights are ", dtype_name(w.dtype()),
         "; convert one (x.cast(...), f32(model), f64(model))");
  return x;
}

/// The initial state of layer l: s (L, N, H) (or (N, H) when L == 1), zeros when undefined.
Tensor layer_state(const char* api, const char* name, const Tensor& s, int64_t l, int64_t layers, int64_t n,
                   int64_t hidden, const Tensor& weight) {
  if (!s.defined()) return zeros(Shape{n, hidden}, weight.dtype(), weight.device());
  const bool flat = layers == 1 && s.ndim() == 2;
  if (!flat && s.shape() != Shape{layers, n, hidden})
    fail("[", api, "] initial state ", name, " has shape ", to_string(s.shape()), "; expected (", layers, ", ", n,
         ", ", hidden, ") (num_layers, batch, hidden)", layers == 1 ? " or (" + std::to_string(n) + ", " +
         std::to_string(hidden) + ")" : std::string());
  if (flat && s.shape() != Shape{n, hidden})
    fail("[", api, "] initial state ", name, " has shape ", to_string(s.shape()), "; expected (1, ", n, ", ", hidden,
         ") (num_layers, batch, hidden) or (", n, ", ", hidden, ")");
  if (s.device() != weight.device())
    fail("[", api, "] initial state ", name, " on ", to_string(s.device()), " but the layer's weights on ",
         to_string(weight.device()));
  if (s.dtype() != weight.dtype() && !detail::autocast_active())
    fail("[", api, "] initial state ", name, " is ", dtype_name(s.dtype()), " but the layer's weights are ",
         dtype_name(weight.dtype()));
  return flat ? s : s[l];
}

/// Runs every layer over the sequence. Returns the last layer's (N, T, H) output; finals gets each
/// layer's final h (and c for LSTM).
template <class Layer>
Tensor run_layers(const char* api, Kind kind, bool relu, const Layer& layer, const Tensor& x0, const Tensor& h0,
                  const Tensor& c0, std::vector<Tensor>& h_final, std::vector<Tensor>& c_final) {
  const Tensor x = layer_input(api, layer, x0);
  const int64_t n = x.size(0), steps = x.size(1), hidden = layer.hidden_size(), nl = layer.num_layers();
  Tensor seq = permute(x, {1, 0, 2});  // (T, N, in): one strided copy, every step then contiguous
  for (int64_t l = 0; l < nl; ++l) {
    const auto& cell = layer.layers[size_t(l)];
    Tensor h = layer_state(api, "h0", h0, l, nl, n, hidden, cell.weight_ih);
    Tensor xg = project(seq.reshape(Shape{steps * n, seq.size(2)}), cell.weight_ih, cell.bias_ih)
                    .reshape(Shape{steps, n, gates(kind) * hidden});
    Tensor y;
    if (kind == Kind::lstm) {
      Tensor c = layer_state(api, "c0", c0, l, nl, n, hidden, cell.weight_ih);
      y = lstm_recurrence(xg, cell.weight_hh, cell.bias_hh, h, c);
      c_final.push_back(y[steps]);
      seq = y.slice(0, steps);
    } else {
      y = kind == Kind::gru ? gru_recurrence(xg, cell.weight_hh, cell.bias_hh, h)
                            : rnn_recurrence(xg, cell.weight_hh, cell.bias_hh, h, relu);
      seq = y;
    }
    h_final.push_back(seq[steps - 1]);
  }
  return permute(seq, {1, 0, 2});
}

template <class Layer> Tensor zero_state(const Layer& layer, int64_t batch) {
  if (layer.layers.empty()) fail("[initial_state] the layer is empty (default-constructed)");
  const Tensor& w = layer.layers[0].weight_hh;
  return zeros(Shape{layer.num_layers(), batch, layer.hidden_size()}, w.dtype(), w.device());
}

template <class Cell> std::string cell_string(const char* name, const Cell& c, const std::string& extra) {
  std::string s = std::string(name) + "(" + std::to_string(c.in_features()) + " => " + std::to_string(c.hidden_size());
  s += extra;
  if (!c.bias_ih.defined()) s += "; bias=false";
  return s + ")";
}

template <class Layer> std::string layers_extra(const Layer& l) {
  return l.num_layers() > 1 ? ", num_layers=" + std::to_string(l.num_layers()) : std::string();
}

template <class L> std::ostream& show_with_count(std::ostream& os, const L& l) {
  std::string s = layer_string(l);
  os << s << std::string(size_t(std::max(2, 20 - int(s.size()))), ' ') << "# " << show::underscorise(parameter_count(l))
     << " parameters";
  return os;
}

}  // namespace

// ---- cells ----

RNNCell::RNNCell(int64_t in, int64_t hidden, Activation act, RecurrentOptions options) : activation(std::move(act)) {
  check_activation("RNNCell", activation);
  init_cell(*this, "RNNCell", Kind::rnn, in, hidden, options);
}
Tensor RNNCell::operator()(const Tensor& x0, const Tensor& h) const {
  const Tensor x = cell_input("RNNCell", *this, x0);
  check_cell_state("RNNCell", "h", h, x.size(0), hidden_size(), weight_hh);
  return cell_step(Kind::rnn, activation.name() == "relu", *this, x, h, Tensor())[0];
}
Tensor RNNCell::operator()(const Tensor& x) const {
  const Tensor x1 = cell_input("RNNCell", *this, x);  // converted once; the call below finds it ready
  return (*this)(x1, zeros(Shape{x1.size(0), hidden_size()}, weight_hh.dtype(), x1.device()));
}

LSTMCell::LSTMCell(int64_t in, int64_t hidden, RecurrentOptions options) {
  init_cell(*this, "LSTMCell", Kind::lstm, in, hidden, options);
}
LSTMState LSTMCell::operator()(const Tensor& x0, const LSTMState& state) const {
  const Tensor x = cell_input("LSTMCell", *this, x0);
  check_cell_state("LSTMCell", "h", state.h, x.size(0), hidden_size(), weight_hh);
  check_cell_state("LSTMCell", "c", state.c, x.size(0), hidden_size(), weight_hh);
  Tensor y = cell_step(Kind::lstm, false, *this, x, state.h, state.c);
  return {y[0], y[1]};
}
LSTMState LSTMCell::operator()(const Tensor& x) const {
  const Tensor x1 = cell_input("LSTMCell", *this, x);  // converted once; the call below finds it ready
  Tensor z = zeros(Shape{x1.size(0), hidden_size()}, weight_hh.dtype(), x1.device());
  return (*this)(x1, LSTMState{z, z});
}

GRUCell::GRUCell(int64_t in, int64_t hidden, RecurrentOptions options) {
  init_cell(*this, "GRUCell", Kind::gru, in, hidden, options);
}
Tensor GRUCell::operator()(const Tensor& x0, const Tensor& h) const {
  const Tensor x = cell_input("GRUCell", *this, x0);
  check_cell_state("GRUCell", "h", h, x.size(0), hidden_size(), weight_hh);
  return cell_step(Kind::gru, false, *this, x, h, Tensor())[0];
}
Tensor GRUCell::operator()(const Tensor& x) const {
  const Tensor x1 = cell_input("GRUCell", *this, x);  // converted once; the call below finds it ready
  return (*this)(x1, zeros(Shape{x1.size(0), hidden_size()}, weight_hh.dtype(), x1.device()));
}

// ---- layers ----

namespace {
template <class Cell, class... Extra>
std::vector<Cell> stack_cells(const char* api, int64_t in, int64_t hidden, const RecurrentOptions& o,
                              const Extra&... extra) {
  if (o.num_layers < 1) fail("[", api, "] num_layers must be at least 1; got ", o.num_layers);
  if (in <= 0 || hidden <= 0) fail("[", api, "] sizes must be positive; got ", api, "(", in, " => ", hidden, ")");
  std::vector<Cell> cells;
  for (int64_t l = 0; l < o.num_layers; ++l) cells.emplace_back(l == 0 ? in : hidden, hidden, extra..., o);
  return cells;
}
}  // namespace

RNN::RNN(int64_t in, int64_t hidden, Activation act, RecurrentOptions options) {
  check_activation("RNN", act);
  layers = stack_cells<RNNCell>("RNN", in, hidden, options, act);
}
SequenceOutput RNN::forward(const Tensor& x, const Tensor& h0) const {
  std::vector<Tensor> hs, cs;
  const bool relu = !layers.empty() && layers[0].activation.name() == "relu";
  Tensor y = run_layers("RNN", Kind::rnn, relu, *this, x, h0, Tensor(), hs, cs);
  return {y, stack(hs, 0)};
}
Tensor RNN::initial_state(int64_t batch) const { return zero_state(*this, batch); }

LSTM::LSTM(int64_t in, int64_t hidden, RecurrentOptions options) {
  layers = stack_cells<LSTMCell>("LSTM", in, hidden, options);
}
LSTMOutput LSTM::forward(const Tensor& x, const LSTMState& state0) const {
  std::vector<Tensor> hs, cs;
  Tensor y = run_layers("LSTM", Kind::lstm, false, *this, x, state0.h, state0.c, hs, cs);
  return {y, LSTMState{stack(hs, 0), stack(cs, 0)}};
}
LSTMState LSTM::initial_state(int64_t batch) const { return {zero_state(*this, batch), zero_state(*this, batch)}; }

GRU::GRU(int64_t in, int64_t hidden, RecurrentOptions options) {
  layers = stack_cells<GRUCell>("GRU", in, hidden, options);
}
SequenceOutput GRU::forward(const Tensor& x, const Tensor& h0) const {
  std::vector<Tensor> hs, cs;
  Tensor y = run_layers("GRU", Kind::gru, false, *this, x, h0, Tensor(), hs, cs);
  return {y, stack(hs, 0)};
}
Tensor GRU::initial_state(int64_t batch) const { return zero_state(*this, batch); }

// ---- printing ----

std::string layer_string(const RNNCell& l) { return cell_string("RNNCell", l, ", " + l.activation.name()); }
std::string layer_string(const LSTMCell& l) { return cell_string("LSTMCell", l, ""); }
std::string layer_string(const GRUCell& l) { return cell_string("GRUCell", l, ""); }
std::string layer_string(const RNN& l) {
  if (l.layers.empty()) return "RNN()";
  return cell_string("RNN", l.layers[0], ", " + l.layers[0].activation.name() + layers_extra(l));
}
std::string layer_string(const LSTM& l) {
  return l.layers.empty() ? "LSTM()" : cell_string("LSTM", l.layers[0], layers_extra(l));
}
std::string layer_string(const GRU& l) {
  return l.layers.empty() ? "GRU()" : cell_string("GRU", l.layers[0], layers_extra(l));
}
std::ostream& operator<<(std::ostream& os, const RNNCell& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const LSTMCell& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const GRUCell& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const RNN& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const LSTM& l) { return show_with_count(os, l); }
std::ostream& operator<<(std::ostream& os, const GRU& l) { return show_with_count(os, l); }

}  // namespace flux
