// Loads torch.nn.MultiheadAttention(batch_first=True) and nn.LayerNorm state_dicts (written by
// attention_interop.py) unchanged into flux's MultiHeadAttention and LayerNorm on every test device
// and compares the outputs (self, causal, cross-attention with a key mask, kdim/vdim cross-attention,
// bias=False, LayerNorm), the per-head attention scores and the causal case's input gradient with PyTorch's: max |flux - torch| <= 1e-5 * max(1, max |torch|).
#include <cstdio>
#include <string>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {
int failures = 0;
void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double tol = 1e-5) {
  Tensor g = to(got, Device()).f64(), w = want.f64();
  bool same_shape = g.shape() == w.shape();
  double diff = same_shape ? max(abs(g - w)).item<double>() : 1e300;
  double scale = std::max(1.0, max(abs(w)).item<double>());
  bool ok = same_shape && diff <= tol * scale;
  std::printf("%s %-34s max abs diff %.3g (scale %.3g)\n", ok ? "ok  " : "FAIL", what.c_str(), diff, scale);
  failures += !ok;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: attention_interop WORKDIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    TensorMap io = load_state(dir + "/attention_io.safetensors");
    const Tensor x = io.at("x"), kv = io.at("kv"), r = io.at("r");
    const int64_t n = x.size(0), t = x.size(1), tk = kv.size(1), dim = x.size(2);
    // PyTorch's key_padding_mask (True = ignore key) -> flux's (N, Tq, Tk) mask, true = attend.
    Tensor keep = eq(io.at("key_padding"), zeros(Shape{n, tk}, DType::boolean)).reshape(Shape{n, 1, tk});
    Tensor cross_mask = broadcast_to(keep, Shape{n, t, tk});
    for (const Device& d : flux::testing::test_devices()) {
      const std::string on = " on " + to_string(d);
      MultiHeadAttention mha = MultiHeadAttention(dim, {.nheads = 4}) | d;
      load(dir + "/mha_state.safetensors", mha);
      MultiHeadAttention causal = mha;
      causal.causal = true;
      Tensor xd = to(x, d), kvd = to(kv, d);
      expect_close("self-attention" + on, mha(xd), io.at("y_self"));
      Tensor gx = gradient([&](const Tensor& v) { return sum(causal(v) * to(r, d)); }, xd);
      expect_close("causal self-attention" + on, causal(xd), io.at("y_causal"));
      expect_close("causal d/dx sum(y r)" + on, gx, io.at("dx_causal"));
      expect_close("self-attention, explicit mask" + on, mha(xd, causal_mask(t, t, d)), io.at("y_causal"));
      expect_close("cross-attention, key mask" + on, mha(xd, kvd, kvd, to(cross_mask, d)), io.at("y_cross"));
      // kdim/vdim: PyTorch's q_proj_weight, k_proj_weight, v_proj_weight; outputs and per-head scores.
      const Tensor keys = io.at("keys"), values = io.at("values");
      MultiHeadAttention kv = MultiHeadAttention({.in = dim, .k_in = keys.size(2), .v_in = values.size(2)}, {.nheads = 4}) | d;
      load(dir + "/mha_kdim_state.safetensors", kv);
      auto [y_kv, scores_kv] = kv.forward(xd, to(keys, d), to(values, d), to(cross_mask, d));
      expect_close("kdim/vdim cross-attention" + on, y_kv, io.at("y_kdim"));
      expect_close("kdim/vdim attention scores" + on, scores_kv, io.at("scores_kdim"));
      // bias=False: no in_proj_bias, no out_proj.bias.
      MultiHeadAttention nobias = MultiHeadAttention(dim, {.nheads = 4, .bias = false}) | d;
      load(dir + "/mha_nobias_state.safetensors", nobias);
      auto [y_nb, scores_nb] = nobias.forward(xd, causal_mask(t, t, d));
      expect_close("bias=false causal" + on, y_nb, io.at("y_nobias"));
      expect_close("bias=false attention scores" + on, scores_nb, io.at("scores_nobias"));
      LayerNorm ln = LayerNorm(dim) | d;
      load(dir + "/layernorm_state.safetensors", ln);
      expect_close("LayerNorm" + on, ln(xd), io.at("y_layernorm"));
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures ? "FAILED" : "all match PyTorch");
  return failures ? 1 : 0;
}
