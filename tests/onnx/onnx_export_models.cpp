// Exports flux-cpp models with onnx::save for ONNX Runtime to check (tests/onnx.cmake,
// tests/onnx/ort_check.py): an MLP, LeNet, ResNet-18 (models::ResNet18), the char LSTM and the tiny
// transformer of examples/ (and a GRU with a dynamic sequence axis), each with random parameters (BatchNorm statistics included), traced on the
// device named by argv[2] at batch 2. For every model it writes <dir>/<name>.onnx and
// <dir>/<name>.safetensors holding the inputs and flux's outputs at batch 2 and at batch 3 (x2, y2,
// x3, y3): ORT must reproduce y2 and y3 from the one file (its batch axis is dynamic).
// With the model name "examples": every model of examples/ instead (export_examples), at batch 2 and 5
// and two sequence lengths where they read sequences (x.B_T, y.B_T).
#include <cstdio>
#include <string>

#include "flux/flux.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/models/resnet.hpp"
#include "flux/onnx.hpp"
#include "../../examples/example_models.hpp"
#include "../../examples/zoo/gpt.hpp"
#include "../../examples/zoo/mnist_models.hpp"

using namespace flux;

namespace {

using examples::CharModel;        // examples/char_lstm.cpp's: (N, T, V) one-hot -> (N T, V)
using examples::TinyTransformer;  // examples/tiny_transformer.cpp's: ids (N, T) -> logits (N, T, V)

/// Every floating tensor of m random (variances positive), so that no parameter is a trivial 0 or 1.
template <class M> void randomise(M& m) {
  for (auto& [name, t] : state(m)) {
    if (!is_floating(t.dtype())) continue;
    Tensor v = rand(t.shape()) * 0.5 - 0.25;
    if (name.find("running_var") != std::string::npos) v = rand(t.shape()) + 0.5;
    if (name.find("running_mean") != std::string::npos) v = rand(t.shape()) * 0.2 - 0.1;
    Tensor target = t;
    copy_(target, v.cast(t.dtype()));
  }
}

template <class M, class MakeInput>
void export_model(const std::string& dir, const std::string& name, M model, const Device& dev, MakeInput make_input,
                  const onnx::SaveOptions& options = {}) {
  randomise(model);
  testmode(model);
  auto m = model | dev;
  Tensor x2 = make_input(2), x3 = make_input(3);
  Tensor y2 = m(to(x2, dev)), y3 = m(to(x3, dev));
  onnx::save(dir + "/" + name + ".onnx", m, to(x2, dev), options);
  save_state(dir + "/" + name + ".safetensors", {{"x2", x2}, {"y2", to(y2, Device())}, {"x3", x3}, {"y3", to(y3, Device())}});
  std::printf("exported %s on %s: output %s\n", name.c_str(), to_string(dev).c_str(), to_string(y2.shape()).c_str());
}

/// A decoder block whose masks follow the input's length: .causal attention, and a second attention
/// masked by comparing positions made with arange(T) (exported as Range and comparison nodes).
struct CausalBlock {
  MultiHeadAttention self_attn = MultiHeadAttention(16, {.nheads = 4, .causal = true});
  MultiHeadAttention cross = MultiHeadAttention(16, {.nheads = 2});
  LayerNorm norm = LayerNorm(16);
  Tensor operator()(const Tensor& x) const {
    const int64_t t = x.size(1);
    Tensor pos = arange(0, double(t), 1, DType::f32, x.device());
    Tensor mask = le(pos.reshape({1, t}), pos.reshape({t, 1}) + 1.0);
    Tensor h = x + self_attn(norm(x));
    return h + cross.forward(h, h, h, mask).output * gelu_erf(h);
  }
};
FLUX_LAYER(CausalBlock, self_attn, cross, norm)

Tensor ids(int64_t n, int64_t t, int64_t vocab) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n * t; ++i) v.push_back((i * 7 + 3) % vocab);
  return Tensor(v, Shape{n, t});
}

/// Every case (batch, length) of one model: x.B_T and its outputs y.B_T (y.B_T.out1, ... for more than
/// one), flux's, from the one file traced at the first case. lengths {} for models without a sequence.
template <class M, class MakeInput>
void export_cases(const std::string& dir, const std::string& name, M model, const Device& dev, MakeInput make_input,
                  std::vector<int64_t> lengths, onnx::SaveOptions options = {}) {
  randomise(model);
  testmode(model);
  auto m = model | dev;
  const bool sequence = !lengths.empty();
  if (!sequence) lengths = {0};
  if (sequence && options.dynamic_axes.empty()) options.dynamic_axes = {{0, 1}};
  TensorMap cases;
  bool traced = false;
  for (int64_t t : lengths) {
    for (int64_t n : {2, 5}) {
      Tensor x = make_input(n, t);
      if (!traced) onnx::save(dir + "/" + name + ".onnx", m, to(x, dev), options), traced = true;
      const std::string c = std::to_string(n) + "_" + std::to_string(t);
      std::vector<Tensor> ys = onnx::detail::outputs_of(m(to(x, dev)));
      cases["x." + c] = x;
      for (size_t k = 0; k < ys.size(); ++k) cases["y." + c + (k ? ".out" + std::to_string(k) : "")] = to(ys[k], Device());
    }
  }
  save_state(dir + "/" + name + ".safetensors", cases);
  std::printf("exported %s on %s: %zu cases\n", name.c_str(), to_string(dev).c_str(), cases.size());
}

/// Every model of examples/ (and examples/zoo/), as each program builds it (default options), exported
/// as example_<program>[_<part>]: ONNX Runtime must match flux at batch 2 and 5, and at two sequence
/// lengths where the model reads sequences (their axis dynamic).
void export_examples(const std::string& dir, const Device& dev) {
  auto image = [](int64_t side) { return [side](int64_t n, int64_t) { return rand({n, 1, side, side}); }; };
  auto features = [](int64_t f) { return [f](int64_t n, int64_t) { return rand({n, f}); }; };
  export_cases(dir, "example_seed_training_loop", examples::seed_mlp(), dev, features(10), {});
  export_cases(dir, "example_digits_mlp", examples::digits_mlp(), dev, features(64), {});
  export_cases(dir, "example_digits_lenet", examples::digits_lenet(), dev, image(8), {});
  export_cases(dir, "example_fashion_mnist_cnn", examples::fashion_cnn(), dev, image(28), {});
  export_cases(dir, "example_distributed_mnist_mlp", examples::distributed_mlp(), dev, image(28), {});
  export_cases(dir, "example_distributed_mnist_cnn", examples::distributed_cnn(), dev, image(28), {});
  export_cases(dir, "example_onnx_roundtrip", examples::roundtrip_cnn(), dev, image(12), {});
  // char_lstm: one-hot (N, T, V) of a 62-symbol vocabulary, hidden 256.
  export_cases(dir, "example_char_lstm", CharModel(62, 256), dev,
               [](int64_t n, int64_t t) { return onehot(ids(n, t, 62).reshape({n * t}), 62).reshape({n, t, 62}); }, {7, 12});
  // tiny_transformer: seq_len 64, dim 64; ids (N, T <= 64).
  export_cases(dir, "example_tiny_transformer", TinyTransformer(62, 64, 64), dev, [](int64_t n, int64_t t) { return ids(n, t, 62); },
               {9, 16});
  export_cases(dir, "example_zoo_conv_mnist", zoo::LeNet5(), dev, image(28), {});
  // zoo/dcgan_mnist: the generator (latent 100) and the discriminator.
  export_cases(dir, "example_zoo_dcgan_generator", zoo::Generator(100), dev, features(100), {});
  export_cases(dir, "example_zoo_dcgan_discriminator", zoo::Discriminator(), dev, image(28), {});
  // zoo/gpt: TransformerGPT with the zoo's defaults (6 layers, n_embed 64), seq_len 64, 65 symbols.
  export_cases(dir, "example_zoo_gpt", zoo::TransformerGPT(65, 64), dev, [](int64_t n, int64_t t) { return ids(n, t, 65); }, {10, 17});
  // zoo/vae_mnist: the encoder (two outputs) and the decoder (latent 2, hidden 500).
  export_cases(dir, "example_zoo_vae_encoder", zoo::Encoder(784, 2, 500), dev, features(784), {});
  export_cases(dir, "example_zoo_vae_decoder", zoo::Decoder(784, 2, 500), dev, features(2), {});
}


}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: onnx_export_models DIR DEVICE (CPU, OpenCL:0) [MODEL... | examples]\n");
    return 2;
  }
  const std::string dir = argv[1], dev_name = argv[2];
  Device dev = dev_name == "CPU" ? get_device("CPU") : get_device("OpenCL", std::stoi(dev_name.substr(dev_name.find(':') + 1)));
  if (to_string(dev) != dev_name) {
    std::printf("SKIPPED: device %s is not available (got %s)\n", dev_name.c_str(), to_string(dev).c_str());
    return 77;
  }
  auto wanted = [&](const char* name) {
    if (argc == 3) return true;
    for (int i = 3; i < argc; ++i)
      if (std::string(argv[i]) == name) return true;
    return false;
  };
  seed(38);
  if (argc > 3 && std::string(argv[3]) == "examples") {
    export_examples(dir, dev);
    return 0;
  }
  if (wanted("mlp"))
    export_model(dir, "mlp", Chain(Dense(20, 64, relu), Dense(64, 32, tanh), Dense(32, 10), softmax), dev,
                 [](int64_t n) { return rand({n, 20}); });
  // The same MLP with its weights in an external data file (mlp_external.onnx.data), as ORT reads it.
  if (wanted("mlp_external"))
    export_model(dir, "mlp_external", Chain(Dense(20, 64, relu), Dense(64, 10)), dev, [](int64_t n) { return rand({n, 20}); },
                 {.external_data = true});
  if (wanted("lenet"))
    export_model(dir, "lenet",
                 Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}), Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
                       Dense(256, 120, relu), Dense(120, 84, relu), Dense(84, 10)),
                 dev, [](int64_t n) { return rand({n, 1, 28, 28}); });
  if (wanted("resnet18"))
    export_model(dir, "resnet18", models::ResNet18(100), dev, [](int64_t n) { return rand({n, 3, 64, 64}); });
  if (wanted("char_lstm"))
    export_model(dir, "char_lstm", CharModel(12, 32), dev,
                 [](int64_t n) { return rand({n, 7, 12}); });
  // A GRU whose sequence axis is dynamic too: batch 2 with 5 steps, then batch 3 with 6.
  if (wanted("gru_sequence"))
    export_model(dir, "gru_sequence", Chain(GRU(3, 8), Dense(8, 2)), dev, [](int64_t n) { return rand({n, n + 3, 3}); },
                 {.dynamic_axes = {{0, 1}}});
  if (wanted("tiny_transformer"))
    export_model(dir, "tiny_transformer", TinyTransformer(20, 16, 32), dev, [](int64_t n) { return ids(n, 16, 20); });
  // Masks from a dynamic sequence length: batch 2 with 5 steps, then batch 3 with 6.
  if (wanted("causal_block"))
    export_model(dir, "causal_block", CausalBlock{}, dev, [](int64_t n) { return rand({n, n + 3, 16}); },
                 {.dynamic_axes = {{0, 1}}});
  // Newer opsets on request (ONNX Runtime checks them; Debian's ONNX 1.12 checker stops at 17).
  if (wanted("tiny_transformer_opset20"))
    export_model(dir, "tiny_transformer_opset20", TinyTransformer(20, 16, 32), dev, [](int64_t n) { return ids(n, 16, 20); },
                 {.opset = 20});
  // Exact GELU (gelu_erf) as one Gelu node at opset 20, with the dynamic length's masks.
  if (wanted("causal_block_opset20"))
    export_model(dir, "causal_block_opset20", CausalBlock{}, dev, [](int64_t n) { return rand({n, n + 3, 16}); },
                 {.dynamic_axes = {{0, 1}}, .opset = 20});
  if (wanted("resnet18_opset21"))
    export_model(dir, "resnet18_opset21", models::ResNet18(10), dev, [](int64_t n) { return rand({n, 3, 32, 32}); }, {.opset = 21});
  return 0;
}
