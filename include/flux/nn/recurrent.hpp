// Recurrent layers, batch-first as PyTorch's nn.RNN / nn.LSTM / nn.GRU with batch_first = true:
//   x (N, T, in) -> output (N, T, hidden), the last layer's hidden state at every step.
// Cells take one step with explicit state: x (N, in), h and c (N, hidden).
// Parameters and state names are PyTorch's, so a torch state_dict loads unchanged:
//   cells:  weight_ih (G, in), weight_hh (G, hidden), bias_ih (G,), bias_hh (G,)
//   layers: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, weight_ih_l1 (G, hidden), ...
// with G = 4 hidden (LSTM; gates i, f, g, o), 3 hidden (GRU; r, z, n), hidden (RNN). Formulas (PyTorch's):
//   LSTM  i, f, o = σ(x W_ixᵀ + b_ix + h W_hxᵀ + b_hx), g = tanh(..), c' = f c + i g, h' = o tanh(c')
//   GRU   r, z = σ(..), n = tanh(x W_inᵀ + b_in + r (h W_hnᵀ + b_hn)), h' = (1 - z) n + z h
//   RNN   h' = tanh(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)   (or relu: RNN(in, hidden, relu))
// Initial states default to zeros; states passed to the layers are (num_layers, N, hidden) as in
// PyTorch (for one layer (N, hidden) is accepted too). Weights are Glorot-uniform and biases zero, as
// Flux's cells; LSTM's forget-gate bias_ih starts at 1 as in Flux (gate(out, 2) .= 1). `.init`
// replaces the weight initialiser.
//   auto lstm = LSTM(64, 128, {.num_layers = 2});
//   Tensor y = lstm(x);                          // (N, T, 128)
//   auto [y2, state] = lstm.forward(x, lstm.initial_state(N));   // state.h, state.c (2, N, 128)
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "flux/functor.hpp"
#include "flux/nn/activations.hpp"
#include "flux/nn/init.hpp"

namespace flux {

struct RecurrentOptions {
  int64_t num_layers = 1;             // stacked layers (the sequence layers; cells are one layer)
  bool bias = true;                   // bias_ih and bias_hh
  DType dtype = DType::f32;
  Initialiser init = glorot_uniform;  // weight_ih and weight_hh, called as init(Shape{G, in}, dtype)
};

/// Hidden and cell state of an LSTM: (N, hidden) for a cell, (num_layers, N, hidden) for LSTM.
struct LSTMState {
  Tensor h;
  Tensor c;
};

// ---- cells: one step ----

/// Elman cell: h' = act(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh), act tanh (default) or relu.
struct RNNCell {
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  Activation activation;

  RNNCell() = default;
  RNNCell(int64_t in, int64_t hidden, Activation act = tanh_act, RecurrentOptions options = {});
  RNNCell(int64_t in, int64_t hidden, RecurrentOptions options) : RNNCell(in, hidden, tanh_act, options) {}
  /// x (N, in), h (N, hidden) -> h' (N, hidden); without h, zeros.
  Tensor operator()(const Tensor& x, const Tensor& h) const;
  Tensor operator()(const Tensor& x) const;
  int64_t in_features() const { return weight_ih.size(1); }
  int64_t hidden_size() const { return weight_hh.size(1); }
};
FLUX_LAYER(RNNCell, weight_ih, weight_hh, bias_ih, bias_hh)

/// LSTM cell: state {h, c} (N, hidden) each -> the next state; the output is its h.
struct LSTMCell {
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

  LSTMCell() = default;
  LSTMCell(int64_t in, int64_t hidden, RecurrentOptions options = {});
  LSTMState operator()(const Tensor& x, const LSTMState& state) const;
  LSTMState operator()(const Tensor& x) const;
  int64_t in_features() const { return weight_ih.size(1); }
  int64_t hidden_size() const { return weight_hh.size(1); }
};
FLUX_LAYER(LSTMCell, weight_ih, weight_hh, bias_ih, bias_hh)

/// GRU cell (PyTorch's variant: r applies to h W_hnᵀ + b_hn): h (N, hidden) -> h'.
struct GRUCell {
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

  GRUCell() = default;
  GRUCell(int64_t in, int64_t hidden, RecurrentOptions options = {});
  Tensor operator()(const Tensor& x, const Tensor& h) const;
  Tensor operator()(const Tensor& x) const;
  int64_t in_features() const { return weight_ih.size(1); }
  int64_t hidden_size() const { return weight_hh.size(1); }
};
FLUX_LAYER(GRUCell, weight_ih, weight_hh, bias_ih, bias_hh)

// ---- layers: a whole sequence ----

/// Output of RNN/GRU forward: all hidden states of the last layer and the final state per layer.
struct SequenceOutput {
  Tensor output;  // (N, T, hidden)
  Tensor h;       // (num_layers, N, hidden)
};
struct LSTMOutput {
  Tensor output;   // (N, T, hidden)
  LSTMState state; // h, c (num_layers, N, hidden)
};

struct RNN {
  std::vector<RNNCell> layers;  // layer l's parameters: weight_ih_l<l>, ...

  RNN() = default;
  RNN(int64_t in, int64_t hidden, Activation act = tanh_act, RecurrentOptions options = {});
  RNN(int64_t in, int64_t hidden, RecurrentOptions options) : RNN(in, hidden, tanh_act, options) {}
  /// x (N, T, in) -> (N, T, hidden); h0 (num_layers, N, hidden), zeros when omitted.
  Tensor operator()(const Tensor& x) const { return forward(x).output; }
  Tensor operator()(const Tensor& x, const Tensor& h0) const { return forward(x, h0).output; }
  SequenceOutput forward(const Tensor& x, const Tensor& h0 = Tensor()) const;
  Tensor initial_state(int64_t batch) const;
  int64_t num_layers() const { return int64_t(layers.size()); }
  int64_t in_features() const { return layers.at(0).in_features(); }
  int64_t hidden_size() const { return layers.at(0).hidden_size(); }
};

struct LSTM {
  std::vector<LSTMCell> layers;

  LSTM() = default;
  LSTM(int64_t in, int64_t hidden, RecurrentOptions options = {});
  Tensor operator()(const Tensor& x) const { return forward(x).output; }
  Tensor operator()(const Tensor& x, const LSTMState& state0) const { return forward(x, state0).output; }
  /// The output and the final state (h_n, c_n) of every layer; state0 {h0, c0}, zeros when undefined.
  LSTMOutput forward(const Tensor& x, const LSTMState& state0 = {}) const;
  LSTMState initial_state(int64_t batch) const;
  int64_t num_layers() const { return int64_t(layers.size()); }
  int64_t in_features() const { return layers.at(0).in_features(); }
  int64_t hidden_size() const { return layers.at(0).hidden_size(); }
};

struct GRU {
  std::vector<GRUCell> layers;

  GRU() = default;
  GRU(int64_t in, int64_t hidden, RecurrentOptions options = {});
  Tensor operator()(const Tensor& x) const { return forward(x).output; }
  Tensor operator()(const Tensor& x, const Tensor& h0) const { return forward(x, h0).output; }
  SequenceOutput forward(const Tensor& x, const Tensor& h0 = Tensor()) const;
  Tensor initial_state(int64_t batch) const;
  int64_t num_layers() const { return int64_t(layers.size()); }
  int64_t in_features() const { return layers.at(0).in_features(); }
  int64_t hidden_size() const { return layers.at(0).hidden_size(); }
};

// PyTorch's names for the stacked layers: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._l1.
namespace detail {
template <class Self_, class Visit_> void recurrent_fields(Self_& self, Visit_& visit) {
  for (size_t l = 0; l < self.layers.size(); ++l) {
    auto& cell = self.layers[l];
    const std::string suffix = "_l" + std::to_string(l);
    visit(("weight_ih" + suffix).c_str(), cell.weight_ih);
    visit(("weight_hh" + suffix).c_str(), cell.weight_hh);
    visit(("bias_ih" + suffix).c_str(), cell.bias_ih);
    visit(("bias_hh" + suffix).c_str(), cell.bias_hh);
  }
}
}  // namespace detail
#define FLUX_RECURRENT_LAYER_(Type)                                                   \
  template <class Self_, class Visit_>                                                \
    requires std::is_same_v<std::remove_const_t<Self_>, Type>                         \
  void flux_fields(Self_& self, Visit_&& visit) {                                     \
    detail::recurrent_fields(self, visit);                                            \
  }                                                                                   \
  inline const char* flux_layer_name(const Type*) { return #Type; }
FLUX_RECURRENT_LAYER_(RNN)
FLUX_RECURRENT_LAYER_(LSTM)
FLUX_RECURRENT_LAYER_(GRU)
#undef FLUX_RECURRENT_LAYER_

/// Flux's display: "LSTM(10 => 20)", "RNN(3 => 5, relu)", "GRU(8 => 16, num_layers=2)", with
/// "; bias=false" when built without biases, then "  # N parameters" for operator<<.
std::string layer_string(const RNNCell& l);
std::string layer_string(const LSTMCell& l);
std::string layer_string(const GRUCell& l);
std::string layer_string(const RNN& l);
std::string layer_string(const LSTM& l);
std::string layer_string(const GRU& l);
std::ostream& operator<<(std::ostream& os, const RNNCell& l);
std::ostream& operator<<(std::ostream& os, const LSTMCell& l);
std::ostream& operator<<(std::ostream& os, const GRUCell& l);
std::ostream& operator<<(std::ostream& os, const RNN& l);
std::ostream& operator<<(std::ostream& os, const LSTM& l);
std::ostream& operator<<(std::ostream& os, const GRU& l);

}  // namespace flux
