// MultiHeadAttention: the input projections (one GEMM for self-attention), heads split by
// reshape/permute, the dot_product_attention op (src/ops/attention.cpp), heads joined, out_proj.
// Shapes: N batch, T time, E = dim, H = nheads, D = E / H.
#include "flux/nn/attention.hpp"

#include <algorithm>
#include <sstream>

#include "flux/autodiff.hpp"
#include "flux/nn/show.hpp"
#include "flux/ops.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

MultiHeadAttention::MultiHeadAttention(int64_t dim, MultiHeadAttentionOptions o)
    : nheads(o.nheads), dropout(o.dropout), causal(o.causal) {
  if (dim <= 0) detail::fail("[MultiHeadAttention] dim must be positive; got ", dim);
  if (o.nheads <= 0 || dim % o.nheads != 0)
    detail::fail("[MultiHeadAttention] nheads (", o.nheads, ") must be positive and divide dim (", dim, ")");
  if (!(o.dropout >= 0 && o.dropout < 1)) detail::fail("[MultiHeadAttention] dropout must be in [0, 1); got ", o.dropout);
  if (!is_floating(o.dtype)) detail::fail("[MultiHeadAttention] needs a floating-point dtype; got ", dtype_name(o.dtype));
  std::vector<Tensor> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(detail::initialise("MultiHeadAttention", o.init, Shape{dim, dim}, o.dtype));
  in_proj_weight = concat(blocks, 0);
  if (o.bias) in_proj_bias = zeros(Shape{3 * dim}, o.dtype);
  out_proj = Dense(dim, dim, {.bias = o.bias, .dtype = o.dtype, .init = o.init});
}

bool MultiHeadAttention::training() const { return active.value_or(autodiff::recording()); }

namespace {
// (N*T, E) rows @ W (k, E)ᵀ + b -> (N*T, k).
Tensor project(const Tensor& x2, const Tensor& w, const Tensor& b) {
  Tensor y = b.defined() ? detail::linear(x2, w, b) : Tensor();
  if (!y.defined()) {
    y = matmul(x2, w, false, true);
    if (b.defined()) y = y + b;
  }
  return y;
}
// (N, T, E) -> (N, H, T, D).
Tensor split_heads(const Tensor& x, int64_t n, int64_t t, int64_t h, int64_t d) {
  return permute(x.reshape(Shape{n, t, h, d}), {0, 2, 1, 3});
}
}  // namespace

Tensor MultiHeadAttention::operator()(const Tensor& x, const Tensor& mask) const { return (*this)(x, x, x, mask); }

Tensor MultiHeadAttention::operator()(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask) const {
  if (!in_proj_weight.defined()) detail::fail("[MultiHeadAttention] the layer is empty (default-constructed)");
  const int64_t e = dim();
  for (const Tensor* t : {&query, &key, &value}) {
    detail::check_defined("MultiHeadAttention", *t);
    if (t->ndim() != 3 || t->shape()[2] != e)
      detail::fail("[MultiHeadAttention] expected batch-first input (N, T, ", e, ") (", layer_string(*this), "); got ",
                   t == &query ? "query " : t == &key ? "key " : "value ", to_string(t->shape()));
    if (!is_floating(t->dtype())) detail::fail("[MultiHeadAttention] needs floating-point input; got ", summary(*t));
    if (t->device() != in_proj_weight.device())
      detail::fail("[MultiHeadAttention] input on ", to_string(t->device()), " but the layer's weights on ",
                   to_string(in_proj_weight.device()), "; move one with to() or | dev");
  }
  const int64_t n = query.shape()[0], tq = query.shape()[1], tk = key.shape()[1];
  if (key.shape() != value.shape() || key.shape()[0] != n)
    detail::fail("[MultiHeadAttention] query ", to_string(query.shape()), ", key ", to_string(key.shape()), " and value ",
                 to_string(value.shape()), " must share N, and key and value their shape (N, Tk, ", e, ")");
  const int64_t h = nheads, d = e / nheads;
  Tensor q, k, v;
  if (query.impl() == key.impl() && key.impl() == value.impl()) {  // self-attention: one GEMM
    Tensor qkv = project(query.reshape(Shape{n * tq, e}), in_proj_weight, in_proj_bias).reshape(Shape{n, tq, 3, h, d});
    Tensor heads = permute(qkv, {2, 0, 3, 1, 4});  // (3, N, H, T, D)
    q = heads[0], k = heads[1], v = heads[2];
  } else {
    auto part = [&](const Tensor& in, int i, int64_t len) {
      Tensor w = slice(in_proj_weight, 0, i * e, (i + 1) * e);
      Tensor b = in_proj_bias.defined() ? slice(in_proj_bias, 0, i * e, (i + 1) * e) : Tensor();
      return split_heads(project(in.reshape(Shape{n * len, e}), w, b), n, len, h, d);
    };
    q = part(query, 0, tq), k = part(key, 1, tk), v = part(value, 2, tk);
  }
  Tensor m;  // Bool (Tq, Tk) or (N, 1, Tq, Tk) or (N, H, Tq, Tk)
  if (mask.defined()) {
    detail::check_defined("MultiHeadAttention", mask);
    const Shape& s = mask.shape();
    bool ok = mask.dtype() == DType::boolean && s.size() >= 2 && s.size() <= 4 && s[s.size() - 2] == tq &&
              s[s.size() - 1] == tk && (s.size() < 3 || s[0] == n) && (s.size() < 4 || s[1] == h);
    if (!ok)
      detail::fail("[MultiHeadAttention] mask must be Bool (true = attend) of shape (Tq, Tk) = (", tq, ", ", tk,
                   "), (N, Tq, Tk) = (", n, ", ", tq, ", ", tk, ") or (N, nheads, Tq, Tk) = (", n, ", ", h, ", ", tq, ", ",
                   tk, "); got ", summary(mask));
    if (mask.device() != query.device())
      detail::fail("[MultiHeadAttention] mask on ", to_string(mask.device()), " but the input on ",
                   to_string(query.device()), "; move one with to() or | dev");
    m = s.size() == 3 ? mask.reshape(Shape{n, 1, tq, tk}) : mask;
  }
  if (causal) {
    Tensor c = causal_mask(tq, tk, query.device());
    m = m.defined() ? minimum(m, c) : c;  // logical and of Bool masks
  }
  const double p = training() ? dropout : 0.0;
  Tensor o = dot_product_attention(q, k, v, m, 0, p);           // (N, H, Tq, D)
  Tensor joined = permute(o, {0, 2, 1, 3}).reshape(Shape{n * tq, e});  // (N*Tq, E)
  return out_proj(joined).reshape(Shape{n, tq, e});
}

std::string layer_string(const MultiHeadAttention& m) {
  if (!m.in_proj_weight.defined()) return "MultiHeadAttention()";
  std::ostringstream os;
  os << "MultiHeadAttention(" << m.dim() << "; nheads=" << m.nheads;
  if (m.in_proj_bias.defined()) os << ", bias=true";
  if (m.dropout != 0) os << ", dropout_prob=" << m.dropout;
  if (m.causal) os << ", causal=true";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const MultiHeadAttention& m) {
  std::string s = layer_string(m);
  os << s;
  if (int64_t k = parameter_count(m); k > 0)
    os << std::string(std::max(2, 20 - int(s.size())), ' ') << "# " << show::underscorise(k) << " parameters";
  return os;
}

}  // namespace flux
