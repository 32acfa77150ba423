// Compares flux's recurrent layers with PyTorch's results written by recurrent_interop.py: each
// torch.nn.LSTM / GRU / RNN (batch_first) and LSTMCell / GRUCell / RNNCell state_dict file loads
// into the matching flux layer with load(), names unchanged; outputs, final states and the gradients
// of sum(output * r) (input, initial states, layer 0's weights and bias_hh) must match to 1e-5
// relative (to max(1, max |value|)) on every device present (CPU, OpenCL:0, CUDA:0). Exit 0 when all match.
#include <cstdio>
#include <string>
#include <vector>

#include "flux/flux.hpp"

using namespace flux;

namespace {
int failures = 0;
void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double tol = 1e-5) {
  Tensor g = to(got, Device()).f64(), w = want.f64();
  bool same_shape = g.shape() == w.shape();
  double diff = same_shape ? max(abs(g - w)).item<double>() : 1e300;
  double scale = std::max(1.0, max(abs(w)).item<double>());
  bool ok = same_shape && diff <= tol * scale;
  std::printf("%s %-40s max abs diff %.3g (scale %.3g)\n", ok ? "ok  " : "FAIL", what.c_str(), diff, scale);
  failures += !ok;
}

std::vector<Device> devices() {
  std::vector<Device> out{Device()};
  if (functional("OpenCL")) out.push_back(get_device("OpenCL", 0));
  if (functional("CUDA")) out.push_back(get_device("CUDA", 0));
  return out;
}

template <class Layer>
void check_layer(const TensorMap& file, const std::string& dir, const std::string& name, Layer layer, Device d) {
  load(dir + "/" + name + "_state.safetensors", layer);
  auto at = [&](const std::string& k) { return to(file.at(name + "." + k), d); };
  auto m = fmap([&](const Tensor& t) { return to(t, d); }, layer);
  const std::string tag = name + " on " + to_string(d) + " ";
  Tensor x = at("x"), h0 = at("h0"), r = at("r");
  if constexpr (std::is_same_v<Layer, LSTM>) {
    Tensor c0 = at("c0");
    auto out = m.forward(x, {h0, c0});
    expect_close(tag + "output", out.output, file.at(name + ".y"));
    expect_close(tag + "h_n", out.state.h, file.at(name + ".h_n"));
    expect_close(tag + "c_n", out.state.c, file.at(name + ".c_n"));
    auto [gm, gx, gh, gc] = gradient(
        [&](const LSTM& l, const Tensor& xx, const Tensor& hh, const Tensor& cc) { return sum(l(xx, {hh, cc}) * r); },
        m, x, h0, c0);
    expect_close(tag + "d c0", gc, file.at(name + ".dc0"));
    expect_close(tag + "d x", gx, file.at(name + ".dx"));
    expect_close(tag + "d h0", gh, file.at(name + ".dh0"));
    expect_close(tag + "d weight_ih_l0", gm.layers[0].weight_ih, file.at(name + ".dweight_ih_l0"));
    expect_close(tag + "d weight_hh_l0", gm.layers[0].weight_hh, file.at(name + ".dweight_hh_l0"));
    expect_close(tag + "d bias_hh_l0", gm.layers[0].bias_hh, file.at(name + ".dbias_hh_l0"));
  } else {
    auto out = m.forward(x, h0);
    expect_close(tag + "output", out.output, file.at(name + ".y"));
    expect_close(tag + "h_n", out.h, file.at(name + ".h_n"));
    auto [gm, gx, gh] = gradient([&](const Layer& l, const Tensor& xx, const Tensor& hh) { return sum(l(xx, hh) * r); },
                                 m, x, h0);
    expect_close(tag + "d x", gx, file.at(name + ".dx"));
    expect_close(tag + "d h0", gh, file.at(name + ".dh0"));
    expect_close(tag + "d weight_ih_l0", gm.layers[0].weight_ih, file.at(name + ".dweight_ih_l0"));
    expect_close(tag + "d weight_hh_l0", gm.layers[0].weight_hh, file.at(name + ".dweight_hh_l0"));
    expect_close(tag + "d bias_hh_l0", gm.layers[0].bias_hh, file.at(name + ".dbias_hh_l0"));
  }
}

template <class Cell>
void check_cell(const TensorMap& file, const std::string& dir, const std::string& name, Cell cell, Device d) {
  load(dir + "/" + name + "_state.safetensors", cell);
  auto at = [&](const std::string& k) { return to(file.at(name + "." + k), d); };
  auto m = fmap([&](const Tensor& t) { return to(t, d); }, cell);
  const std::string tag = name + " on " + to_string(d) + " ";
  if constexpr (std::is_same_v<Cell, LSTMCell>) {
    LSTMState s = m(at("x"), {at("h"), at("c")});
    expect_close(tag + "h'", s.h, file.at(name + ".h1"));
    expect_close(tag + "c'", s.c, file.at(name + ".c1"));
  } else {
    expect_close(tag + "h'", m(at("x"), at("h")), file.at(name + ".h1"));
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: recurrent_interop RESULTS_FILE STATE_FOLDER\n");
    return 2;
  }
  try {
    TensorMap file = load_state(argv[1]);
    const std::string dir = argv[2];
    for (const Device& d : devices()) {
      check_layer(file, dir, "lstm", LSTM(5, 7, {.num_layers = 2}), d);
      check_layer(file, dir, "gru", GRU(5, 7, {.num_layers = 2}), d);
      check_layer(file, dir, "rnn_tanh", RNN(5, 7, {.num_layers = 2}), d);
      check_layer(file, dir, "rnn_relu", RNN(5, 7, relu), d);
      check_cell(file, dir, "lstm_cell", LSTMCell(4, 6), d);
      check_cell(file, dir, "gru_cell", GRUCell(4, 6), d);
      check_cell(file, dir, "rnn_cell", RNNCell(4, 6), d);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures ? "FAILED" : "all match PyTorch");
  return failures ? 1 : 0;
}
