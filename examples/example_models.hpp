// The models of the example programs in examples/, each as its program builds it (default options):
// the programs and tests/onnx/onnx_export_models.cpp (onnx_export.examples.*) share this one definition.
#pragma once
#include <flux/flux.hpp>

namespace examples {
using namespace flux;

/// seed_training_loop: (N, 10) -> (N, 1).
inline auto seed_mlp() { return Chain(Dense(10, 64, relu), Dense(64, 1)); }

/// digits_mlp: 8x8 digits, flattened (N, 64) -> 10 logits.
inline auto digits_mlp() { return Chain(Dense(64, 128, relu), Dense(128, 64, relu), Dense(64, 10)); }

/// digits_lenet: (N, 1, 8, 8) -> 10 logits.
inline auto digits_lenet() {
  return Chain(Conv({3, 3}, 1, 16, {.pad = 1}), BatchNorm(16, relu), MaxPool({2, 2}),   // (N, 16, 4, 4)
               Conv({3, 3}, 16, 32, {.pad = 1}), BatchNorm(32, relu), MaxPool({2, 2}),  // (N, 32, 2, 2)
               flatten, Dense(128, 64, relu), Dense(64, 10));
}

/// fashion_mnist_cnn: (N, 1, 28, 28) -> 10 logits.
inline auto fashion_cnn() {
  return Chain(Conv({3, 3}, 1, 16, {.pad = 1}), BatchNorm(16, relu), MaxPool({2, 2}),   // (N, 16, 14, 14)
               Conv({3, 3}, 16, 32, {.pad = 1}), BatchNorm(32, relu), MaxPool({2, 2}),  // (N, 32, 7, 7)
               flatten, Dropout(0.25), Dense(32 * 7 * 7, 128, relu), Dense(128, 10));
}

/// distributed_mnist --model mlp and --model cnn: (N, 1, 28, 28) -> 10 logits.
inline auto distributed_mlp() { return Chain(flatten, Dense(784, 1024, relu), Dense(1024, 1024, relu), Dense(1024, 10)); }
inline auto distributed_cnn() {
  return Chain(Conv({3, 3}, 1, 16, relu, {.pad = 1}), MaxPool({2, 2}), Conv({3, 3}, 16, 32, relu, {.pad = 1}), MaxPool({2, 2}),
               flatten, Dense(32 * 7 * 7, 128, relu), Dense(128, 10));
}

/// onnx_roundtrip: (N, 1, 12, 12) bar images -> 2 logits.
inline auto roundtrip_cnn() {
  return Chain(Conv({3, 3}, 1, 8, relu, {.pad = 1}), BatchNorm(8), MaxPool({2, 2}), Conv({3, 3}, 8, 16, relu), GlobalMeanPool(),
               flatten, Dense(16, 2));
}

/// char_lstm: LSTM then a Dense head applied to every step: (N, T, V) one-hot -> (N T, V) logits.
struct CharModel {
  LSTM lstm;
  Dense head;
  CharModel(int64_t vocab, int64_t hidden) : lstm(vocab, hidden), head(hidden, vocab) {}
  Tensor operator()(const Tensor& x) const {
    Tensor h = lstm(x);
    return head(h.reshape({h.size(0) * h.size(1), h.size(2)}));
  }
};
FLUX_LAYER(CharModel, lstm, head)

/// tiny_transformer's pre-norm block: causal self-attention (4 heads) and a GELU MLP, each residual.
inline auto transformer_block(int64_t d) {
  return Chain(SkipConnection(Chain(LayerNorm(d), MultiHeadAttention(d, {.nheads = 4, .causal = true})), plus),
               SkipConnection(Chain(LayerNorm(d), Dense(d, 4 * d, gelu), Dense(4 * d, d)), plus));
}
using TransformerBlock = decltype(transformer_block(1));

/// tiny_transformer: ids (N, T <= seq_len) -> token + positional embeddings -> 2 blocks -> LayerNorm
/// -> logits (N, T, V).
struct TinyTransformer {
  Embedding token, position;  // (V, D), (T, D)
  Chain<TransformerBlock, TransformerBlock> blocks;
  LayerNorm norm;
  Dense head;  // D => V

  TinyTransformer(int64_t vocab, int64_t seq_len, int64_t d)
      : token(vocab, d), position(seq_len, d), blocks(transformer_block(d), transformer_block(d)), norm(d), head(d, vocab) {}
  Tensor operator()(const Tensor& ids) const {
    const int64_t t = ids.shape()[1];
    Tensor pos = position(arange(t, DType::i64, ids.device()));  // (T, D), broadcast over N
    return head(norm(blocks(token(ids) + pos)));
  }
};
FLUX_LAYER(TinyTransformer, token, position, blocks, norm, head)

}  // namespace examples
