// The zoo's MNIST models (Flux model-zoo's conv_mnist, dcgan_mnist, vae_mnist), as their programs in
// examples/zoo/ build them: the programs and tests/onnx/onnx_export_models.cpp share this definition.
#pragma once
#include <cmath>
#include <utility>

#include <flux/flux.hpp>

namespace zoo {
using namespace flux;

// conv_mnist: LeNet-5; autosize gives each Dense(_, ...) the width that reaches it (Flux's @autosize).
inline auto LeNet5() {
  return autosize({1, 1, 28, 28}, Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}),
                                        Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
                                        Dense(_, 120, relu), Dense(_, 84, relu), Dense(_, 10)));
}

// dcgan_mnist: noise (N, latent_dim) -> images (N, 1, 28, 28) in [-1, 1], and images -> one logit.
inline auto Generator(int64_t latent_dim) {
  return Chain(Dense(latent_dim, 7 * 7 * 256, DenseOptions{.bias = false}), BatchNorm(7 * 7 * 256, relu),
               [](const Tensor& x) { return x.reshape({-1, 256, 7, 7}); },
               ConvTranspose({5, 5}, 256, 128, {.stride = 1, .pad = 2, .bias = false}), BatchNorm(128, relu),
               ConvTranspose({4, 4}, 128, 64, {.stride = 2, .pad = 1, .bias = false}), BatchNorm(64, relu),
               ConvTranspose({4, 4}, 64, 1, tanh, {.stride = 2, .pad = 1, .bias = false}));
}
inline auto Discriminator() {
  return autosize({1, 1, 28, 28}, Chain(Conv({4, 4}, 1, 64, {.stride = 2, .pad = 1}), LeakyRelu{0.2}, Dropout(0.25),
                                        Conv({4, 4}, 64, 128, {.stride = 2, .pad = 1}), LeakyRelu{0.2}, Dropout(0.25),
                                        flatten, Dense(_, 1)));
}

// vae_mnist: the Encoder x (N, input_dim) -> (μ, logσ), each (N, latent_dim); the Decoder z -> logits.
struct Encoder {
  Dense linear, mu, logsigma;
  Encoder(int64_t input_dim, int64_t latent_dim, int64_t hidden_dim)
      : linear(input_dim, hidden_dim, tanh), mu(hidden_dim, latent_dim), logsigma(hidden_dim, latent_dim) {}
  std::pair<Tensor, Tensor> operator()(const Tensor& x) const {
    Tensor h = linear(x);
    return {mu(h), logsigma(h)};
  }
};
FLUX_LAYER(Encoder, linear, mu, logsigma)

inline auto Decoder(int64_t input_dim, int64_t latent_dim, int64_t hidden_dim) {
  return Chain(Dense(latent_dim, hidden_dim, tanh), Dense(hidden_dim, input_dim));
}
using DecoderT = decltype(Decoder(1, 1, 1));

struct VAE {
  Encoder encoder;
  DecoderT decoder;
};
FLUX_LAYER(VAE, encoder, decoder)

}  // namespace zoo
