// MultiHeadAttention(dim, {.nheads = 8, .dropout = 0, .causal = false, .bias = true}): batch-first
// multi-head attention, PyTorch's nn.MultiheadAttention(dim, nheads, batch_first = True):
//   q = xq Wqᵀ + bq, k = xk Wkᵀ + bk, v = xv Wvᵀ + bv   (N, T, dim) -> (N, nheads, T, dim / nheads)
//   o = dot_product_attention(q, k, v, mask)               (N, nheads, Tq, dim / nheads)
//   y = concat_heads(o) Woᵀ + bo                           (N, Tq, dim)
// with [Wq; Wk; Wv] = in_proj_weight (3 dim, dim), [bq; bk; bv] = in_proj_bias (3 dim,) and
// out_proj a Dense(dim => dim): the state names in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias are PyTorch's, so its state_dict loads unchanged. Flux's MultiHeadAttention holds
// q_proj/k_proj/v_proj (bias = false by default there; PyTorch's default bias = true is kept here).
// Masks are Bool, true = attend (NNlib's convention; PyTorch's Bool attn_mask is the negation), of
// shape (Tq, Tk), (N, Tq, Tk) or (N, nheads, Tq, Tk); .causal = true adds causal_mask(Tq, Tk). Dropout
// acts on the attention weights in training (automatic mode, as Dropout). Weights: each of Wq, Wk, Wv
// and Wo glorot_uniform over (dim, dim) as Flux; biases zero.
#pragma once
#include <optional>
#include <ostream>
#include <string>

#include "flux/functor.hpp"
#include "flux/nn/dense.hpp"
#include "flux/nn/init.hpp"

namespace flux {

struct MultiHeadAttentionOptions {
  int64_t nheads = 8;
  double dropout = 0.0;  // on the attention weights, in training
  bool causal = false;   // every call masks future positions
  bool bias = true;
  DType dtype = DType::f32;
  Initialiser init = glorot_uniform;  // called per (dim, dim) block
};

struct MultiHeadAttention {
  Tensor in_proj_weight;  // (3 dim, dim): Wq, Wk, Wv stacked
  Tensor in_proj_bias;    // (3 dim,), undefined when bias = false
  Dense out_proj;         // dim => dim
  int64_t nheads = 1;
  double dropout = 0.0;
  bool causal = false;
  std::optional<bool> active;  // dropout's mode: nullopt automatic (training inside gradient())

  MultiHeadAttention() = default;
  explicit MultiHeadAttention(int64_t dim, MultiHeadAttentionOptions options = {});

  /// Self-attention: x (N, T, dim) -> (N, T, dim); mask optional (see above).
  Tensor operator()(const Tensor& x, const Tensor& mask = Tensor()) const;
  /// Attention of queries (N, Tq, dim) over keys and values (N, Tk, dim) -> (N, Tq, dim).
  Tensor operator()(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask = Tensor()) const;
  int64_t dim() const { return in_proj_weight.size(1); }
  /// Whether dropout acts on the next call.
  bool training() const;
};
FLUX_LAYER(MultiHeadAttention, in_proj_weight, in_proj_bias, out_proj)

/// "MultiHeadAttention(64; nheads=8, bias=true)" as Flux (", dropout_prob=0.1", ", causal=true").
std::string layer_string(const MultiHeadAttention& m);
/// With the parameter count: "MultiHeadAttention(64; nheads=8, bias=true)  # 16_640 parameters".
std::ostream& operator<<(std::ostream& os, const MultiHeadAttention& m);

}  // namespace flux
