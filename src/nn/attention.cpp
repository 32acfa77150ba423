// MultiHeadAttention: the input projections (one GEMM for self-attention when the weights are
// stacked), heads split by reshape/permute, the attention scores and their product with the values
// (src/ops/attention.cpp), heads joined, out_proj.
// Shapes: N batch, Tq/Tk time, H = nheads, Dq = qk / H, Dv = v / H.
#include "flux/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "flux/autodiff.hpp"
#include "flux/nn/show.hpp"
#include "flux/ops.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux {

namespace {
MultiHeadAttentionDims resolve(MultiHeadAttentionDims d) {
  if (d.k_in == 0) d.k_in = d.in;
  if (d.v_in == 0) d.v_in = d.k_in;
  if (d.qk == 0) d.qk = d.in;
  if (d.v == 0) d.v = d.qk;
  if (d.out == 0) d.out = d.in;
  return d;
}
std::string dims_string(const MultiHeadAttentionDims& d) {
  std::ostringstream os;
  os << "(in = " << d.in << ", k_in = " << d.k_in << ", v_in = " << d.v_in << ", qk = " << d.qk << ", v = " << d.v
     << ", out = " << d.out << ")";
  return os.str();
}
}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t dim, MultiHeadAttentionOptions o)
    : MultiHeadAttention(MultiHeadAttentionDims{.in = dim}, o) {}

MultiHeadAttention::MultiHeadAttention(MultiHeadAttentionDims given, MultiHeadAttentionOptions o)
    : nheads(o.nheads), dropout(o.dropout), causal(o.causal) {
  const MultiHeadAttentionDims d = resolve(given);
  if (d.in <= 0 || d.k_in <= 0 || d.v_in <= 0 || d.qk <= 0 || d.v <= 0 || d.out <= 0) {
    if (given == MultiHeadAttentionDims{.in = given.in}) detail::fail("[MultiHeadAttention] dim must be positive; got ", given.in);
    detail::fail("[MultiHeadAttention] every width must be positive (0 takes its default); got ", dims_string(given));
  }
  const bool square = d.k_in == d.in && d.v_in == d.in && d.qk == d.in && d.v == d.in && d.out == d.in;
  if (o.nheads <= 0 || d.qk % o.nheads != 0 || d.v % o.nheads != 0) {
    if (square) detail::fail("[MultiHeadAttention] nheads (", o.nheads, ") must be positive and divide dim (", d.in, ")");
    detail::fail("[MultiHeadAttention] nheads (", o.nheads, ") must be positive and divide qk (", d.qk, ") and v (", d.v, ")");
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) detail::fail("[MultiHeadAttention] dropout must be in [0, 1); got ", o.dropout);
  if (!is_floating(o.dtype)) detail::fail("[MultiHeadAttention] needs a floating-point dtype; got ", dtype_name(o.dtype));
  Tensor wq = detail::initialise("MultiHeadAttention", o.init, Shape{d.qk, d.in}, o.dtype);
  Tensor wk = detail::initialise("MultiHeadAttention", o.init, Shape{d.qk, d.k_in}, o.dtype);
  Tensor wv = detail::initialise("MultiHeadAttention", o.init, Shape{d.v, d.v_in}, o.dtype);
  if (d.k_in == d.in && d.v_in == d.in) {
    in_proj_weight = concat({wq, wk, wv}, 0);
  } else {
    q_proj_weight = wq, k_proj_weight = wk, v_proj_weight = wv;
  }
  if (o.bias) in_proj_bias = zeros(Shape{2 * d.qk + d.v}, o.dtype);
  out_proj = Dense(d.v, d.out, {.bias = o.bias, .dtype = o.dtype, .init = o.init});
}

bool MultiHeadAttention::training() const { return active.value_or(autodiff::recording()); }

int64_t MultiHeadAttention::dim() const {
  return in_proj_weight.defined() ? in_proj_weight.size(1) : q_proj_weight.defined() ? q_proj_weight.size(1) : 0;
}

MultiHeadAttentionDims MultiHeadAttention::dims() const {
  if (!out_proj.weight.defined()) return {};
  MultiHeadAttentionDims d;
  d.v = out_proj.weight.size(1), d.out = out_proj.weight.size(0);
  if (in_proj_weight.defined()) {
    d.in = d.k_in = d.v_in = in_proj_weight.size(1);
    d.qk = (in_proj_weight.size(0) - d.v) / 2;
  } else {
    d.in = q_proj_weight.size(1), d.k_in = k_proj_weight.size(1), d.v_in = v_proj_weight.size(1);
    d.qk = q_proj_weight.size(0);
  }
  return d;
}

namespace {
// (rows, in) @ W (k, in)ᵀ + b -> (rows, k).
Tensor project(const Tensor& x2, const Tensor& w, const Tensor& b) {
  // Autocast: the projection in the low dtype, bias included (as Dense).
  if (auto low = detail::autocast_low({&x2, &w}))
    return project(detail::autocast_to(x2, *low), detail::autocast_to(w, *low), detail::autocast_to(b, *low));
  Tensor y = b.defined() ? detail::linear(x2, w, b) : Tensor();
  if (!y.defined()) {
    y = matmul(x2, w, false, true);
    if (b.defined()) y = y + b;
  }
  return y;
}
// (N, T, H * D) -> (N, H, T, D).
Tensor split_heads(const Tensor& x, int64_t n, int64_t t, int64_t h, int64_t d) {
  return permute(x.reshape(Shape{n, t, h, d}), {0, 2, 1, 3});
}
}  // namespace

AttentionOutput MultiHeadAttention::forward(const Tensor& x, const Tensor& mask_or_kv) const {
  return attend(x, mask_or_kv, true);
}
Tensor MultiHeadAttention::operator()(const Tensor& x, const Tensor& mask_or_kv) const {
  return attend(x, mask_or_kv, false).output;
}
AttentionOutput MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                            const Tensor& mask) const {
  return attend(query, key, value, mask, true);
}
Tensor MultiHeadAttention::operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const Tensor& mask) const {
  return attend(query, key, value, mask, false).output;
}

AttentionOutput MultiHeadAttention::attend(const Tensor& x, const Tensor& mask_or_kv, bool scores) const {
  // A floating-point 3-d second tensor is Flux's mha(q, kv) (N, Tk, k_in); masks are Bool, so the
  // dtype decides (anything else goes to the mask's checks, which name what a mask must be).
  if (mask_or_kv.defined() && is_floating(mask_or_kv.dtype()) && mask_or_kv.ndim() == 3)
    return attend(x, mask_or_kv, mask_or_kv, Tensor(), scores);
  const MultiHeadAttentionDims d = dims();
  if (out_proj.weight.defined() && (d.k_in != d.in || d.v_in != d.in))
    detail::fail("[MultiHeadAttention] self-attention mha(x) needs the key and value input widths to equal the query's; ",
                 layer_string(*this), " has in = ", d.in, ", k_in = ", d.k_in, ", v_in = ", d.v_in,
                 ": call mha(q, k, v) or mha(q, kv)");
  return attend(x, x, x, mask_or_kv, scores);
}

AttentionOutput MultiHeadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value_or_mask,
                                           const Tensor& mask_in, bool want_scores) const {
  if (!out_proj.weight.defined()) detail::fail("[MultiHeadAttention] the layer is empty (default-constructed)");
  // mha(q, kv, mask): a Bool third tensor is the mask, the key tensor the values too.
  const bool kv_form = value_or_mask.defined() && value_or_mask.dtype() == DType::boolean;
  if (kv_form && mask_in.defined())
    detail::fail("[MultiHeadAttention] got a Bool tensor as the values and a mask; call mha(q, k, v, mask) or mha(q, kv, mask)");
  const Tensor& value = kv_form ? key : value_or_mask;
  const Tensor& mask = kv_form ? value_or_mask : mask_in;
  const MultiHeadAttentionDims dm = dims();
  const Tensor* inputs[3] = {&query, &key, &value};
  const int64_t widths[3] = {dm.in, dm.k_in, dm.v_in};
  const char* names[3] = {"query", "key", "value"};
  const Tensor& weight0 = in_proj_weight.defined() ? in_proj_weight : q_proj_weight;
  for (int i = 0; i < 3; ++i) {
    const Tensor& t = *inputs[i];
    detail::check_defined("MultiHeadAttention", t);
    if (t.ndim() != 3 || t.shape()[2] != widths[i])
      detail::fail("[MultiHeadAttention] expected batch-first input (N, T, ", widths[i], ") (", layer_string(*this),
                   "); got ", names[i], " ", to_string(t.shape()),
                   t.dtype() == DType::boolean ? " (a Bool tensor: masks come after the inputs)" : "");
    if (!is_floating(t.dtype()))
      detail::fail("[MultiHeadAttention] needs floating-point ", names[i], " (a mask must be Bool and come last); got ", summary(t));
    if (t.device() != weight0.device())
      detail::fail("[MultiHeadAttention] input on ", to_string(t.device()), " but the layer's weights on ",
                   to_string(weight0.device()), "; move one with to() or | dev");
  }
  const int64_t n = query.shape()[0], tq = query.shape()[1], tk = key.shape()[1];
  if (key.shape()[0] != n || value.shape()[0] != n || value.shape()[1] != tk)
    detail::fail("[MultiHeadAttention] query ", to_string(query.shape()), ", key ", to_string(key.shape()), " and value ",
                 to_string(value.shape()), " must share N, and key and value their length Tk");
  const int64_t h = nheads, dq = dm.qk / h, dv = dm.v / h;
  // The projections, (N * T, width) rows with the heads side by side: one GEMM for self-attention
  // (qkv: [q | k | v] per row), else one per input.
  const bool self = in_proj_weight.defined() && query.impl() == key.impl() && key.impl() == value.impl();
  Tensor qkv, qp, kp, vp;
  if (self) {
    qkv = project(query.reshape(Shape{n * tq, dm.in}), in_proj_weight, in_proj_bias);  // (N*T, 2 qk + v)
  } else {
    const int64_t starts[4] = {0, dm.qk, 2 * dm.qk, 2 * dm.qk + dm.v};
    auto part = [&](const Tensor& in, int i, int64_t len, const Tensor& separate) {
      Tensor w = in_proj_weight.defined() ? slice(in_proj_weight, 0, starts[i], starts[i + 1]) : separate;
      Tensor b = in_proj_bias.defined() ? slice(in_proj_bias, 0, starts[i], starts[i + 1]) : Tensor();
      return project(in.reshape(Shape{n * len, widths[i]}), w, b);
    };
    qp = part(query, 0, tq, q_proj_weight), kp = part(key, 1, tk, k_proj_weight), vp = part(value, 2, tk, v_proj_weight);
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
  const double p = training() ? dropout : 0.0;
  // Fused (the backend's attention kernel; no (Tq, Tk) matrix) unless the scores are asked for or
  // dropout acts on them: the heads are read in place from the projections' rows and the output is
  // written as the (N * Tq, v) rows out_proj takes, so no head split or join is copied either.
  if (!want_scores && p == 0) {
    backend::Attention a;
    a.b0 = n, a.b1 = h, a.tq = tq, a.tk = tk, a.d = dq, a.dv = dv, a.causal = causal;
    a.scale = 1.0 / std::sqrt(double(dq));
    if (m.defined()) {
      const Shape& s = m.shape();
      a.mask_stride[0] = s.size() == 4 ? s[1] * tq * tk : 0;
      a.mask_stride[1] = s.size() == 4 && s[1] == h ? tq * tk : 0;
      a.mask_stride[2] = tk, a.mask_stride[3] = 1;
    }
    a.o_stride[0] = tq * dm.v, a.o_stride[1] = dv, a.o_stride[2] = dm.v;
    detail::AttentionView vq, vk, vv;
    if (self) {
      const int64_t w = 2 * dm.qk + dm.v;
      vq = {qkv, 0, {tq * w, dq, w}}, vk = {qkv, dm.qk, {tq * w, dq, w}}, vv = {qkv, 2 * dm.qk, {tq * w, dv, w}};
    } else {
      vq = {qp, 0, {tq * dm.qk, dq, dm.qk}}, vk = {kp, 0, {tk * dm.qk, dq, dm.qk}}, vv = {vp, 0, {tk * dm.v, dv, dm.v}};
    }
    Tensor joined = detail::fused_attention(vq, vk, vv, m, a, Shape{n * tq, dm.v});
    if (joined.defined()) return {out_proj(joined).reshape(Shape{n, tq, dm.out}), Tensor()};
  }
  // Composed: heads split by permute (N, H, T, D), the scores (N, H, Tq, Tk) in memory.
  Tensor q, k, v;
  if (self && dm.qk == dm.v) {
    Tensor heads = permute(qkv.reshape(Shape{n, tq, 3, h, dq}), {2, 0, 3, 1, 4});  // (3, N, H, T, D)
    q = heads[0], k = heads[1], v = heads[2];
  } else if (self) {
    q = split_heads(slice(qkv, 1, 0, dm.qk), n, tq, h, dq);
    k = split_heads(slice(qkv, 1, dm.qk, 2 * dm.qk), n, tq, h, dq);
    v = split_heads(slice(qkv, 1, 2 * dm.qk, 2 * dm.qk + dm.v), n, tq, h, dv);
  } else {
    q = split_heads(qp, n, tq, h, dq), k = split_heads(kp, n, tk, h, dq), v = split_heads(vp, n, tk, h, dv);
  }
  if (causal) {
    Tensor c = causal_mask(tq, tk, query.device());
    m = m.defined() ? minimum(m, c) : c;  // logical and of Bool masks
  }
  Tensor scores = dot_product_attention_scores(q, k, m, 0, p);           // (N, H, Tq, Tk)
  Tensor o = matmul(scores, v);                                         // (N, H, Tq, Dv)
  Tensor joined = permute(o, {0, 2, 1, 3}).reshape(Shape{n * tq, dm.v});  // (N*Tq, v)
  return {out_proj(joined).reshape(Shape{n, tq, dm.out}), scores};
}

std::string layer_string(const MultiHeadAttention& m) {
  if (!m.out_proj.weight.defined()) return "MultiHeadAttention()";
  const MultiHeadAttentionDims d = m.dims();
  std::ostringstream os;
  os << "MultiHeadAttention(";
  const bool same_in = d.k_in == d.in && d.v_in == d.in;
  if (same_in && d.qk == d.in && d.v == d.in && d.out == d.in) os << d.in;  // Flux's show, case by case
  else if (same_in && d.qk == d.v) os << d.in << " => " << d.qk << " => " << d.out;
  else if (same_in) os << d.in << " => (" << d.qk << ", " << d.v << ") => " << d.out;
  else os << "(" << d.in << ", " << d.k_in << ", " << d.v_in << ") => (" << d.qk << ", " << d.v << ") => " << d.out;
  os << "; nheads=" << m.nheads;
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
