// Embedding(vocab, dim): a lookup table, y[n, t, :] = weight[x[n, t], :], for integer indices x of
// shape (N) or (N, T) with values 0..vocab-1 -> (N, dim) or (N, T, dim); weight (vocab, dim) as
// PyTorch's nn.Embedding (state name `weight`; Flux's weight is (dim, vocab) column-major, the same
// memory). Indices are 0-based, Int32 or Int64. As Flux, a one-hot input (onehot(labels, vocab),
// floating or Bool, vocab on the LAST axis: (N, vocab) or (N, T, vocab)) is accepted and gives
// x · weight, the same rows. Initialised N(0, 1) (Flux's randn32 and PyTorch's default).
// Backward: the weight's gradient is a zero table with each output row's gradient scatter-added
// into the row it was read from (the backend's scatter_add; repeated indices accumulate).
#pragma once
#include <ostream>
#include <string>

#include "flux/functor.hpp"
#include "flux/nn/init.hpp"

namespace flux {

struct EmbeddingOptions {
  DType dtype = DType::f32;
  Initialiser init = randn32;  // called as init(Shape{vocab, dim}, dtype)
};

struct Embedding {
  Tensor weight;  // (vocab, dim)

  Embedding() = default;
  Embedding(int64_t vocab, int64_t dim, EmbeddingOptions options = {});
  /// From an existing table (vocab, dim).
  explicit Embedding(Tensor weight);

  /// Indices (N) or (N, T) -> (N, dim) or (N, T, dim); one-hot (..., vocab) -> (..., dim).
  Tensor operator()(const Tensor& x) const;
  int64_t vocab() const { return weight.size(0); }
  int64_t dim() const { return weight.size(1); }
};
FLUX_LAYER(Embedding, weight)

/// The lookup as an op: rows of `weight` (vocab, dim) at integer `indices` of any shape ->
/// indices.shape + (dim,); an index outside 0..vocab-1 is an error naming it.
Tensor embedding(const Tensor& weight, const Tensor& indices);

/// "Embedding(10 => 3)" as Flux.
std::string layer_string(const Embedding& e);
/// "Embedding(10 => 3)  # 30 parameters".
std::ostream& operator<<(std::ostream& os, const Embedding& e);

}  // namespace flux
