// Embedding: the lookup (backend gather over the table's rows) and its scatter-add backward.
#include "flux/nn/embedding.hpp"

#include <algorithm>

#include "flux/autodiff.hpp"
#include "flux/nn/show.hpp"
#include "flux/ops.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"

namespace flux {

namespace {
using Grads = std::vector<Tensor>;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  detail::check_defined("embedding", weight);
  detail::check_defined("embedding", indices);
  if (weight.ndim() != 2) detail::fail("[embedding] weight must be a (vocab, dim) table; got shape ", to_string(weight.shape()));
  if (indices.dtype() != DType::i32 && indices.dtype() != DType::i64)
    detail::fail("[embedding] indices must be Int32 or Int64 (0-based token ids); got ", summary(indices),
                 ". For one-hot input use the Embedding layer with vocab on the last axis");
  if (indices.device() != weight.device())
    detail::fail("[embedding] indices on ", to_string(indices.device()), " but the table on ", to_string(weight.device()),
                 "; move one with to() or | dev");
  const int64_t vocab = weight.shape()[0], dim = weight.shape()[1], nidx = indices.numel();
  Tensor idx = detail::raw_cast(indices.reshape(Shape{nidx}), DType::i64);
  // Range check on the host (one small read): an index out of range must never be read.
  std::vector<int64_t> host = idx.to_vector<int64_t>();
  for (size_t j = 0; j < host.size(); ++j)
    if (host[j] < 0 || host[j] >= vocab)
      detail::fail("[embedding] index ", host[j], " (at flat position ", j, " of indices ", to_string(indices.shape()),
                   ") is out of range for vocabulary size ", vocab, "; indices are 0-based, 0..", vocab - 1);
  std::vector<int64_t> out_dims(indices.shape().begin(), indices.shape().end());
  out_dims.push_back(dim);
  Shape out_shape(out_dims);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  // The table viewed as [outer = 1, len = vocab, inner = dim]: out[j, :] = weight[idx[j], :].
  if (out.numel())
    weight.backend().gather(weight.device().index(), weight.dtype(), flux::detail::buffer_of(weight), flux::detail::buffer_of(idx), flux::detail::buffer_of(out), 1, vocab,
                            dim, nidx);
  if (trace::active()) trace::emit(ops::embedding, {weight, indices}, out);
  if (is_floating(weight.dtype())) {
    Shape table = weight.shape();
    autodiff::record(out, {&weight}, [idx, table, vocab, dim, nidx](const Tensor& g) {
      // Sparse-aware: only the rows that were read receive gradient; repeated ids accumulate.
      Tensor dw = zeros(table, g.dtype(), g.device());
      if (g.numel())
        g.backend().scatter_add(g.device().index(), g.dtype(), flux::detail::buffer_of(g), flux::detail::buffer_of(idx), flux::detail::buffer_of(dw), 1, vocab, dim, nidx);
      return Grads{dw};
    });
  }
  return out;
}

Embedding::Embedding(int64_t vocab, int64_t dim, EmbeddingOptions options) {
  if (vocab <= 0 || dim <= 0) detail::fail("[Embedding] sizes must be positive; got Embedding(", vocab, " => ", dim, ")");
  if (!is_floating(options.dtype))
    detail::fail("[Embedding] needs a floating-point dtype; got ", dtype_name(options.dtype));
  weight = detail::initialise("Embedding", options.init, Shape{vocab, dim}, options.dtype);
}

Embedding::Embedding(Tensor w) : weight(std::move(w)) {
  if (!weight.defined() || weight.ndim() != 2 || !is_floating(weight.dtype()))
    detail::fail("[Embedding] weight must be a floating-point (vocab, dim) table; got ", summary(weight));
}

Tensor Embedding::operator()(const Tensor& x) const {
  if (!weight.defined()) detail::fail("[Embedding] the layer is empty (default-constructed)");
  detail::check_defined("Embedding", x);
  if (x.device() != weight.device())
    detail::fail("[Embedding] input on ", to_string(x.device()), " but the layer's weight on ", to_string(weight.device()),
                 "; move one with to() or | dev");
  const int64_t v = vocab();
  if (x.dtype() == DType::i32 || x.dtype() == DType::i64) {
    if (x.ndim() < 1 || x.ndim() > 2)
      detail::fail("[Embedding] expects indices (N) or (N, T); got shape ", to_string(x.shape()), " (",
                   layer_string(*this), ")");
    try {
      return embedding(weight, x);
    } catch (const Error& e) {
      std::string what = e.what();
      if (what.rfind("[embedding]", 0) == 0) what.erase(0, 11);
      detail::fail("[Embedding]", what, " (", layer_string(*this), ")");
    }
  }
  if (is_floating(x.dtype()) || x.dtype() == DType::boolean) {
    // One-hot input, as Flux's (m::Embedding)(x::OneHotArray) = m.weight * x: vocab on the last axis.
    if (x.ndim() < 1 || x.shape()[x.ndim() - 1] != v)
      detail::fail("[Embedding] a ", dtype_name(x.dtype()), " input is taken as one-hot with the vocabulary (", v,
                   ") on the last axis, e.g. onehot(labels, ", v, "); got shape ", to_string(x.shape()),
                   ". Token ids must be Int32 or Int64 (", layer_string(*this), ")");
    Tensor h = x.dtype() == weight.dtype() ? x : detail::raw_cast(x, weight.dtype());
    if (h.ndim() == 1) return matmul(h.reshape(Shape{1, v}), weight).reshape(Shape{dim()});
    std::vector<int64_t> dims(h.shape().begin(), h.shape().end());
    dims.back() = dim();
    return matmul(h.reshape(Shape{h.numel() / v, v}), weight).reshape(Shape(dims));
  }
  detail::fail("[Embedding] indices must be Int32 or Int64 (0-based token ids); got ", summary(x), " (",
               layer_string(*this), ")");
}

std::string layer_string(const Embedding& e) {
  if (!e.weight.defined()) return "Embedding()";
  return "Embedding(" + std::to_string(e.vocab()) + " => " + std::to_string(e.dim()) + ")";
}

std::ostream& operator<<(std::ostream& os, const Embedding& e) {
  std::string s = layer_string(e);
  os << s << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(parameter_count(e))
     << " parameters";
  return os;
}

}  // namespace flux
