// MultiHeadAttention: batch-first multi-head attention with Flux's widths,
//   MultiHeadAttention({.in = 64, .qk = 16, .v = 16, .out = 64}, {.nheads = 4, .bias = false})
//   (Flux: MultiHeadAttention(64 => (16, 16) => 64; nheads = 4, bias = false)), and PyTorch's
//   MultiHeadAttention(dim, {.nheads = 8}) (nn.MultiheadAttention(dim, 8, batch_first = True)):
//   q = xq Wqᵀ + bq  (N, Tq, q_in) -> (N, Tq, qk) -> (N, nheads, Tq, qk / nheads)
//   k = xk Wkᵀ + bk  (N, Tk, k_in) -> (N, Tk, qk) -> (N, nheads, Tk, qk / nheads)
//   v = xv Wvᵀ + bv  (N, Tk, v_in) -> (N, Tk, v)  -> (N, nheads, Tk, v / nheads)
//   α = softmax(q kᵀ / sqrt(qk / nheads) | mask)   (N, nheads, Tq, Tk): the attention scores
//   y = concat_heads(α v) Woᵀ + bo                   (N, Tq, v) -> (N, Tq, out)
// State names are PyTorch's, so its state_dicts load unchanged: when the query, key and value inputs
// share a width, [Wq; Wk; Wv] = in_proj_weight (2 qk + v, in); otherwise (PyTorch's kdim / vdim)
// q_proj_weight (qk, q_in), k_proj_weight (qk, k_in), v_proj_weight (v, v_in); [bq; bk; bv] =
// in_proj_bias (2 qk + v,); out_proj is a Dense(v => out). Parameter counts equal Flux's (its
// q_proj/k_proj/v_proj/out_proj Denses). `.bias` switches all four biases as Flux's `bias`; its
// default here is PyTorch's true (Flux's is false: write `.bias = false` when porting Flux code).
// Masks are Bool, true = attend (NNlib's convention; PyTorch's Bool attn_mask is the negation), of
// shape (Tq, Tk), (N, Tq, Tk) or (N, nheads, Tq, Tk); .causal = true adds causal_mask(Tq, Tk). Dropout
// acts on the attention weights in training (automatic mode, as Dropout). Weights: Wq, Wk, Wv, Wo
// each glorot_uniform over its own (rows, columns) block, as Flux's Denses; biases zero.
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
  bool bias = true;      // PyTorch's default; Flux's is false
  DType dtype = DType::f32;
  Initialiser init = glorot_uniform;  // called per projection block
};

/// Flux's `(q_in, k_in, v_in) => (qk, v) => out`; a width left 0 takes the one it defaults to.
struct MultiHeadAttentionDims {
  int64_t in = 0;    // query input width (Flux's q_in; PyTorch's embed_dim)
  int64_t k_in = 0;  // key input width; 0: in (PyTorch's kdim)
  int64_t v_in = 0;  // value input width; 0: k_in (PyTorch's vdim)
  int64_t qk = 0;    // query and key width over all heads; 0: in
  int64_t v = 0;     // value width over all heads; 0: qk
  int64_t out = 0;   // output width; 0: in
  bool operator==(const MultiHeadAttentionDims&) const = default;
};

/// What MultiHeadAttention::forward returns: Flux's (y, α).
struct AttentionOutput {
  Tensor output;  // (N, Tq, out)
  Tensor scores;  // (N, nheads, Tq, Tk): the attention weights each query spread over the keys
};

struct MultiHeadAttention {
  Tensor in_proj_weight;  // (2 qk + v, in): Wq, Wk, Wv stacked; undefined when the input widths differ
  Tensor q_proj_weight;   // (qk, q_in) } used instead of in_proj_weight when k_in or v_in differs
  Tensor k_proj_weight;   // (qk, k_in) } from in (PyTorch's kdim / vdim layout)
  Tensor v_proj_weight;   // (v, v_in)  }
  Tensor in_proj_bias;    // (2 qk + v,), undefined when bias = false
  Dense out_proj;         // v => out
  int64_t nheads = 1;
  double dropout = 0.0;
  bool causal = false;
  std::optional<bool> active;  // dropout's mode: nullopt automatic (training inside gradient())

  MultiHeadAttention() = default;
  /// PyTorch's form: every width `dim`.
  explicit MultiHeadAttention(int64_t dim, MultiHeadAttentionOptions options = {});
  /// Flux's form: MultiHeadAttention({.in = 64, .qk = 16, .v = 16, .out = 64}, {.nheads = 4}).
  explicit MultiHeadAttention(MultiHeadAttentionDims dims, MultiHeadAttentionOptions options = {});

  /// Self-attention x (N, T, in) -> (N, T, out), with an optional Bool mask; or, when the second
  /// tensor is floating-point, Flux's mha(q, kv): queries over keys = values = kv (N, Tk, k_in).
  /// Runs the backend's fused attention where it has one (no (Tq, Tk) scores in memory; see README).
  Tensor operator()(const Tensor& x, const Tensor& mask_or_kv = Tensor()) const;
  /// Attention of queries (N, Tq, in) over keys (N, Tk, k_in) and values (N, Tk, v_in) -> (N, Tq, out);
  /// mha(q, kv, mask) when the third tensor is a Bool mask.
  Tensor operator()(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask = Tensor()) const;
  /// As the calls above, returning Flux's (y, α): `auto [y, scores] = mha.forward(x, mask);` (the
  /// scores are materialised, so this runs the composed matmul, softmax, matmul).
  AttentionOutput forward(const Tensor& x, const Tensor& mask_or_kv = Tensor()) const;
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask = Tensor()) const;

  /// The query input width.
  int64_t dim() const;
  /// Every width, with none left 0.
  MultiHeadAttentionDims dims() const;
  /// Whether dropout acts on the next call.
  bool training() const;

 private:
  AttentionOutput attend(const Tensor& x, const Tensor& mask_or_kv, bool scores) const;
  AttentionOutput attend(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask,
                         bool scores) const;
};
FLUX_LAYER(MultiHeadAttention, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, out_proj)

/// As Flux: "MultiHeadAttention(64; nheads=8, bias=true)", "MultiHeadAttention(64 => 16 => 64; nheads=4)"
/// (qk = v), "MultiHeadAttention(64 => (16, 32) => 64; ...)", "MultiHeadAttention((64, 32, 32) => (16, 16)
/// => 64; ...)" (", dropout_prob=0.1", ", causal=true").
std::string layer_string(const MultiHeadAttention& m);
/// With the parameter count: "MultiHeadAttention(64; nheads=8, bias=true)  # 16_640 parameters".
std::ostream& operator<<(std::ostream& os, const MultiHeadAttention& m);

namespace detail {
/// Whether attention may run the backend's fused kernel (default true; FLUX_FUSED_ATTENTION=0 or
/// FLUX_LIBRARY_KERNELS=0 disable it; for tests and benchmarks: the composed path's figures).
void set_fused_attention(bool enabled);
bool fused_attention_enabled();
}  // namespace detail

}  // namespace flux
