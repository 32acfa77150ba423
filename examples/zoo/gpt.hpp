// The Flux model zoo's GPT (text/gpt/gpt.jl, a nanoGPT-style decoder) in flux-cpp, in the zoo's shape:
//
//   struct GPTBlock { layernorm1; mha; mlp }                 Flux.@layer GPTBlock
//     y, α = mha(layernorm1(x); mask = make_causal_mask(x)); x += y; x += mlp(x)
//   struct TransformerGPT { tok_embed; pos_embed; dropout; blocks; layernorm1; output_layer }
//     ids (N, T) -> tok_embed(ids) .+ pos_embed(0:T-1) -> dropout -> blocks -> layernorm1 -> output_layer
//     -> logits (N, T, vocab)
//
// with the zoo's defaults: n_embed 64, n_hidden 256, qk_dim = v_dim = 16, 4 heads, 6 layers, and
// Flux's MultiHeadAttention(n_embed => (qk_dim, v_dim) => n_embed; nheads, dropout_prob) (no bias,
// Flux's default). GPTBlock is a class template over its attention layer, declared with FLUX_LAYER.
// Shapes are batch-first (N, T, features), flux-cpp's layout (Flux's is (features, T, N)).
#pragma once
#include <vector>

#include "flux/flux.hpp"

namespace zoo {
using namespace flux;

struct GPTConfig {
  int64_t n_embed = 64, n_hidden = 256, qk_dim = 16, v_dim = 16, n_heads = 4, n_layers = 6;
  double dropout = 0.0;
};

template <class Attention> struct GPTBlock {
  LayerNorm layernorm1;
  Attention mha;
  Chain<LayerNorm, Dense, Dense, Dropout> mlp;

  /// x (N, T, n_embed) -> (N, T, n_embed); causal self-attention, then the MLP, each residual.
  Tensor operator()(const Tensor& x) const {
    const int64_t t = x.size(1);
    auto [y, alpha] = mha.forward(layernorm1(x), causal_mask(t, t, x.device()));  // Flux's (y, α)
    Tensor h = x + y;
    return h + mlp(h);
  }
};
FLUX_LAYER(GPTBlock, layernorm1, mha, mlp)

inline GPTBlock<MultiHeadAttention> gpt_block(const GPTConfig& c) {
  return {LayerNorm(c.n_embed),
          MultiHeadAttention({.in = c.n_embed, .qk = c.qk_dim, .v = c.v_dim, .out = c.n_embed},
                             {.nheads = c.n_heads, .dropout = c.dropout, .bias = false}),
          Chain(LayerNorm(c.n_embed), Dense(c.n_embed, c.n_hidden, gelu), Dense(c.n_hidden, c.n_embed), Dropout(c.dropout))};
}

struct TransformerGPT {
  Embedding tok_embed, pos_embed;
  Dropout dropout;
  std::vector<GPTBlock<MultiHeadAttention>> blocks;
  LayerNorm layernorm1;
  Dense output_layer;

  TransformerGPT() = default;
  TransformerGPT(int64_t n_vocab, int64_t seq_len, const GPTConfig& c = {})
      : tok_embed(n_vocab, c.n_embed), pos_embed(seq_len, c.n_embed), dropout(c.dropout), layernorm1(c.n_embed),
        output_layer(c.n_embed, n_vocab) {
    for (int64_t i = 0; i < c.n_layers; ++i) blocks.push_back(gpt_block(c));
  }
  /// Token ids (N, T <= seq_len), Int64 -> logits (N, T, n_vocab).
  Tensor operator()(const Tensor& tokens) const {
    const int64_t t = tokens.size(1);
    Tensor te = tok_embed(tokens);                                         // (N, T, E)
    Tensor pe = pos_embed(arange(t, DType::i64, tokens.device()));         // (T, E), broadcast over N
    Tensor x = dropout(te + pe);
    for (const auto& blk : blocks) x = blk(x);
    return output_layer(layernorm1(x));
  }
};
FLUX_LAYER(TransformerGPT, tok_embed, pos_embed, dropout, blocks, layernorm1, output_layer)

/// Flux's parameter count for the same model: what `Chain(...)  # N parameters` reports in Julia.
inline int64_t flux_parameter_count(int64_t n_vocab, int64_t seq_len, const GPTConfig& c) {
  const int64_t e = c.n_embed, layernorm = 2 * e;
  const int64_t mha = c.qk_dim * e * 2 + c.v_dim * e + e * c.v_dim;  // q, k, v, out projections, bias = false
  const int64_t mlp = layernorm + (e * c.n_hidden + c.n_hidden) + (c.n_hidden * e + e);
  return n_vocab * e + seq_len * e + c.n_layers * (layernorm + mha + mlp) + layernorm + (e * n_vocab + n_vocab);
}

}  // namespace zoo
