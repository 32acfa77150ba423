// The importer's operator table and runners (see import_ops.hpp). Each runner turns one node into
// flux ops on the device of its data, so autodiff records it like any layer; integer "shape" values
// (Shape, Gather on shapes, Concat, Range, ...) are small host tensors on the CPU. Semantics follow
// https://onnx.ai/onnx/operators/ per operator version; the version a file's opset selects is `n.opset`.
#include "src/onnx/import_ops.hpp"

#if FLUX_HAVE_ONNX
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "flux/nn/activations.hpp"
#include "src/autocast.hpp"
#include "src/internal.hpp"
#include "src/onnx/onnx_common.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"

namespace flux::onnx::detail {

using flux::detail::fail;

std::string where(const ::onnx::NodeProto& n) { return "node '" + n.name() + "' (" + n.op_type() + ")"; }

Tensor on(const Tensor& x, const Device& d) { return !x.defined() || x.device() == d ? x : to(x, d); }

Device device_of(const std::vector<Tensor>& in) {
  for (const Tensor& t : in)
    if (t.defined() && !t.device().is_cpu()) return t.device();
  return Device();
}

Tensor in_or(const std::vector<Tensor>& in, size_t k) { return k < in.size() ? in[k] : Tensor(); }

namespace {

// ---- attributes ----
const ::onnx::AttributeProto* attr(const ::onnx::NodeProto& n, const char* name, ::onnx::AttributeProto::AttributeType type) {
  for (const auto& a : n.attribute())
    if (a.name() == name) {
      if (a.type() != type)
        fail("[onnx] node '", n.name(), "' (", n.op_type(), "): attribute '", name, "' has type ",
             ::onnx::AttributeProto::AttributeType_Name(a.type()), ", expected ",
             ::onnx::AttributeProto::AttributeType_Name(type));
      return &a;
    }
  return nullptr;
}
int64_t attr_i(const ::onnx::NodeProto& n, const char* name, int64_t dflt) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::INT);
  return a ? a->i() : dflt;
}
std::string attr_s(const ::onnx::NodeProto& n, const char* name, const std::string& dflt) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::STRING);
  return a ? a->s() : dflt;
}
std::vector<int64_t> attr_ints(const ::onnx::NodeProto& n, const char* name, std::vector<int64_t> dflt = {}) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::INTS);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : dflt;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}


std::vector<int64_t> host_ints(const Tensor& t, const ::onnx::NodeProto& n, const char* what) {
  if (!t.defined()) fail("[onnx] ", where(n), ": its input '", what, "' is missing");
  if (is_floating(t.dtype())) fail("[onnx] ", where(n), ": its input '", what, "' must be integer; got ", summary(t));
  if (t.numel() > (1 << 20)) fail("[onnx] ", where(n), ": its input '", what, "' has ", t.numel(), " values");
  return t.to_vector<int64_t>();
}

constexpr int64_t kMaxFill = int64_t(1) << 30;  // elements a shape-driven op (ConstantOfShape, Expand) may make

Shape checked_shape(const std::vector<int64_t>& dims, const ::onnx::NodeProto& n) {
  int64_t numel = 1;
  if (dims.size() > size_t(backend::kMaxDims)) fail("[onnx] ", where(n), ": shape of ", dims.size(), " dimensions");
  for (int64_t d : dims) {
    if (d < 0) fail("[onnx] ", where(n), ": negative dimension ", d);
    if (d > 0 && numel > kMaxFill / d) fail("[onnx] ", where(n), ": shape over ", kMaxFill, " elements");
    numel *= d;
  }
  return Shape(dims);
}

int norm_axis(int64_t axis, int rank, const ::onnx::NodeProto& n) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) fail("[onnx] ", where(n), ": axis ", axis, " is out of range for rank ", rank);
  return int(a);
}

/// ONNX pads (begins, then ends) -> flux's (lo, hi) per axis.
Padding pads_of(const ::onnx::NodeProto& n, int spatial) {
  std::vector<int64_t> p = attr_ints(n, "pads", std::vector<int64_t>(size_t(2 * spatial), 0));
  if (int(p.size()) != 2 * spatial) fail("[onnx] ", where(n), ": pads has ", p.size(), " values for ", spatial, " spatial axes");
  std::vector<int64_t> out;
  for (int i = 0; i < spatial; ++i) out.push_back(p[size_t(i)]), out.push_back(p[size_t(i + spatial)]);
  return Padding(out);
}

Tensor gather(const Tensor& data, const Tensor& indices, int64_t axis0, const ::onnx::NodeProto& n) {
  const int axis = norm_axis(axis0, data.ndim(), n);
  std::vector<int64_t> idx = host_ints(indices, n, "indices");
  const int64_t len = data.shape()[axis];
  for (int64_t& i : idx) {
    if (i < -len || i >= len) fail("[onnx] ", where(n), ": index ", i, " out of range for axis of length ", len);
    if (i < 0) i += len;
  }
  Tensor picked = index_select(data, axis, on(Tensor(idx, Shape{int64_t(idx.size())}), data.device()));
  std::vector<int64_t> shape;
  for (int i = 0; i < axis; ++i) shape.push_back(data.shape()[i]);
  for (int i = 0; i < indices.ndim(); ++i) shape.push_back(indices.shape()[i]);
  for (int i = axis + 1; i < data.ndim(); ++i) shape.push_back(data.shape()[i]);
  return picked.reshape(Shape(shape));
}

/// The shape Unsqueeze (insert) or Squeeze (remove) makes of `shape` with `axes`; a repeated axis, one
/// out of range, or a squeezed axis whose length is not 1 is an error (the ONNX spec's).
Shape squeezed_shape(const Shape& shape, const std::vector<int64_t>& axes, bool insert, const ::onnx::NodeProto& n) {
  const int rank = int(shape.size()) + (insert ? int(axes.size()) : 0);
  std::vector<int> a;
  for (int64_t v : axes) a.push_back(norm_axis(v, rank, n));
  std::sort(a.begin(), a.end());
  if (std::adjacent_find(a.begin(), a.end()) != a.end())
    fail("[onnx] ", where(n), ": axes [", join(axes), "] name an axis twice (rank ", rank, ")");
  std::vector<int64_t> out(shape.begin(), shape.end());
  if (insert) {
    for (int v : a) out.insert(out.begin() + v, 1);  // ascending: each position is final
    return Shape(out);
  }
  if (axes.empty())
    for (int i = 0; i < int(shape.size()); ++i)
      if (shape[i] == 1) a.push_back(i);
  for (auto it = a.rbegin(); it != a.rend(); ++it) {
    if (out[size_t(*it)] != 1) fail("[onnx] ", where(n), ": cannot squeeze axis ", *it, " of shape ", to_string(shape));
    out.erase(out.begin() + *it);
  }
  return Shape(out);
}


// ---- helpers for the runners ----

const Tensor& need(const Node& n, const std::vector<Tensor>& in, size_t k) {
  if (k >= in.size() || !in[k].defined()) fail("[onnx] ", where(n.proto), ": its input ", k, " is missing");
  return in[k];
}
bool has(const std::vector<Tensor>& in, size_t k) { return k < in.size() && in[k].defined(); }

/// Int64 indices on device d.
Tensor index_tensor(const std::vector<int64_t>& idx, const Device& d) {
  return on(Tensor(idx, Shape{int64_t(idx.size())}), d);
}

/// Axes given as input k (opset >= since_input) or as the attribute "axes" (before).
std::vector<int64_t> axes_of(const Node& n, const std::vector<Tensor>& in, size_t k, int64_t since_input) {
  if (n.opset >= since_input) return has(in, k) ? host_ints(in[k], n.proto, "axes") : std::vector<int64_t>{};
  return attr_ints(n.proto, "axes");
}

/// Distinct normalised axes, sorted; a repeated one is an error.
std::vector<int> distinct_axes(const std::vector<int64_t>& axes, int rank, const ::onnx::NodeProto& n) {
  std::vector<int> a;
  for (int64_t v : axes) a.push_back(norm_axis(v, rank, n));
  std::sort(a.begin(), a.end());
  if (std::adjacent_find(a.begin(), a.end()) != a.end()) fail("[onnx] ", where(n), ": axes [", join(axes), "] name an axis twice");
  return a;
}

Tensor bool_scalar(bool v, const Device& d) { return Tensor::scalar(v ? 1.0 : 0.0, DType::boolean, d); }

/// The gate blocks of (G, ...) rows reordered: block b of the result is block order[b] of x.
Tensor gates(const Tensor& x, const std::vector<int64_t>& order, int64_t h) {
  std::vector<int64_t> rows;
  for (int64_t b : order)
    for (int64_t i = 0; i < h; ++i) rows.push_back(b * h + i);
  return index_select(x, 0, index_tensor(rows, x.device()));
}

/// x reversed along `axis`.
Tensor flip(const Tensor& x, int axis) {
  std::vector<int64_t> idx(static_cast<size_t>(x.shape()[axis]));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t(idx.size() - 1 - i);
  return index_select(x, axis, index_tensor(idx, x.device()));
}

// ---- recurrent ----

/// ONNX LSTM / GRU / RNN (layout 0, forward, reverse or bidirectional) on flux's recurrence ops: per
/// direction, xg = X Wᵀ + Wb with the gate blocks in PyTorch's order (flux's), then the recurrence with
/// R and Rb likewise; the reverse direction runs on X reversed in time and its outputs are reversed
/// back. Outputs: Y (T, D, N, H), Y_h (D, N, H), LSTM's Y_c (D, N, H).
std::vector<Tensor> run_recurrent(const Node& node, const std::vector<Tensor>& in) {
  const auto& n = node.proto;
  const std::string& op = n.op_type();
  const bool lstm = op == "LSTM", gru = op == "GRU";
  const int64_t ngates = lstm ? 4 : gru ? 3 : 1;
  const std::string direction = attr_s(n, "direction", "forward");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const Device dev = device_of(in);
  Tensor x = on(need(node, in, 0), dev), w = on(need(node, in, 1), dev), r = on(need(node, in, 2), dev);
  if (x.ndim() != 3 || w.ndim() != 3 || r.ndim() != 3 || w.size(0) != dirs || r.size(0) != dirs)
    fail("[onnx] ", where(n), ": needs X (T, N, I), W (", dirs, ", G, I) and R (", dirs, ", G, H) for direction ", direction);
  if (has(in, 4)) fail("[onnx] ", where(n), ": sequence_lens is not supported");
  const int64_t h = attr_i(n, "hidden_size", r.size(2)), steps = x.size(0), batch = x.size(1);
  const int64_t g = ngates * h;
  if (w.size(1) != g || r.size(1) != g || r.size(2) != h || w.size(2) != x.size(2))
    fail("[onnx] ", where(n), ": W ", to_string(w.shape()), " and R ", to_string(r.shape()), " do not fit hidden_size ", h,
         " and X ", to_string(x.shape()));
  // Flux's (PyTorch's) block b is ONNX's block order[b]: LSTM i f g o <- i o f c; GRU r z n <- z r h.
  const std::vector<int64_t> order = lstm ? std::vector<int64_t>{0, 2, 3, 1} : gru ? std::vector<int64_t>{1, 0, 2} : std::vector<int64_t>{0};
  const auto* acts = attr(n, "activations", ::onnx::AttributeProto::STRINGS);
  const bool relu = acts && acts->strings_size() > 0 && acts->strings(0) == "Relu";
  Tensor b = on(in_or(in, 3), dev);
  if (b.defined() && b.shape() != Shape{dirs, 2 * g})
    fail("[onnx] ", where(n), ": B must be (", dirs, ", ", 2 * g, "); got ", to_string(b.shape()));
  auto state = [&](size_t k, int64_t d) {
    if (has(in, k)) {
      Tensor s = on(in[k], dev);
      if (s.shape() != Shape{dirs, batch, h}) fail("[onnx] ", where(n), ": initial state must be (", dirs, ", ", batch, ", ", h, ")");
      return s[d];
    }
    return zeros(Shape{batch, h}, x.dtype(), dev);
  };
  std::vector<Tensor> ys, hs, cs;
  for (int64_t d = 0; d < dirs; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    Tensor xd = reverse ? flip(x, 0) : x;
    Tensor wp = gates(w[d], order, h), rp = gates(r[d], order, h);
    Tensor xg = matmul(xd, wp, false, true), rb;
    if (b.defined()) {
      xg = xg + gates(b[d].slice(0, g), order, h);
      rb = gates(b[d].slice(g, 2 * g), order, h);
    }
    Tensor y, c;
    if (lstm) {
      Tensor yc = lstm_recurrence(xg, rp, rb, state(5, d), state(6, d));  // rows h_1..h_T, then c_T
      y = yc.slice(0, steps), c = yc[steps];
    } else {
      y = gru ? gru_recurrence(xg, rp, rb, state(5, d)) : rnn_recurrence(xg, rp, rb, state(5, d), relu);
    }
    hs.push_back(y[steps - 1]);
    ys.push_back(reverse ? flip(y, 0) : y);
    if (lstm) cs.push_back(c);
  }
  std::vector<Tensor> out = {dirs == 1 ? ys[0].reshape({steps, 1, batch, h}) : stack(ys, 1),
                             dirs == 1 ? hs[0].reshape({1, batch, h}) : stack(hs, 0)};
  if (lstm) out.push_back(dirs == 1 ? cs[0].reshape({1, batch, h}) : stack(cs, 0));
  return out;
}

std::string recurrent_check(const Node& node) {
  const auto& n = node.proto;
  const std::string dir = attr_s(n, "direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") return "direction " + dir;
  if (attr_i(n, "layout", 0) != 0) return "layout 1";
  if (attr(n, "clip", ::onnx::AttributeProto::FLOAT)) return "clip";
  if (n.op_type() == "GRU" && attr_i(n, "linear_before_reset", 0) != 1) return "linear_before_reset 0 (PyTorch's GRU exports 1)";
  if (n.op_type() == "LSTM" && (attr_i(n, "input_forget", 0) || (n.input_size() > 7 && !n.input(7).empty())))
    return "peepholes or input_forget";
  if (const auto* a = attr(n, "activations", ::onnx::AttributeProto::STRINGS)) {
    const size_t dirs = dir == "bidirectional" ? 2 : 1;
    std::vector<std::string> want = n.op_type() == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                  : n.op_type() == "GRU"  ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                          : std::vector<std::string>{"Tanh"};
    std::vector<std::string> got(a->strings().begin(), a->strings().end());
    if (n.op_type() == "RNN" && !got.empty() && got[0] == "Relu") want = {"Relu"};
    std::vector<std::string> all;
    for (size_t d = 0; d < dirs; ++d) all.insert(all.end(), want.begin(), want.end());
    if (got != all && got != want) return "activations other than the defaults";
  }
  return "";
}

// ---- elementwise ----

/// An operator that is a registry entry's op, input for input (Add, Relu, ...).
std::vector<Tensor> run_entry(const Node& n, const std::vector<Tensor>& in) {
  if (n.entry->unary) return {n.entry->unary(need(n, in, 0))};
  const Device d = device_of(in);
  return {n.entry->binary(on(need(n, in, 0), d), on(need(n, in, 1), d))};
}

/// Div (integers truncate), Pow (the exponent in the base's dtype), Max and Min (of any number of inputs).
Tensor binary_op(const std::string& op, Tensor a, Tensor b) {
  const Device d = device_of({a, b});
  a = on(a, d), b = on(b, d);
  if (op == "Div") {
    if (!is_floating(a.dtype()) && !is_floating(b.dtype()))  // ONNX integer division truncates
      return div(a, b).cast(DType::f64).cast(a.dtype());
    return div(a, b);
  }
  if (op == "Pow") return pow(a, b.cast(a.dtype()));
  return op == "Max" ? maximum(a, b) : minimum(a, b);
}

std::vector<Tensor> run_binary(const Node& n, const std::vector<Tensor>& in) {
  const std::string& op = n.proto.op_type();
  Tensor y = binary_op(op, need(n, in, 0), need(n, in, 1));
  for (size_t k = 2; k < in.size() && (op == "Max" || op == "Min"); ++k) y = binary_op(op, y, need(n, in, k));
  return {y};
}

/// Mod: fmod = 1 keeps the dividend's sign (C's fmod), fmod = 0 the divisor's (Python's %, integers).
std::vector<Tensor> run_mod(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor a = on(need(n, in, 0), d), b = on(need(n, in, 1), d);
  if (a.dtype() != b.dtype()) fail("[onnx] ", where(n.proto), ": A and B differ in type (", dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), ")");
  const bool fmod = attr_i(n.proto, "fmod", 0);
  if (is_floating(a.dtype()) && !fmod) fail("[onnx] ", where(n.proto), ": floating Mod needs fmod = 1 (the spec's rule)");
  if (!is_floating(a.dtype()) && sum(eq(b, zeros(Shape{}, b.dtype(), d)).cast(DType::i64)).item<int64_t>() > 0)
    fail("[onnx] ", where(n.proto), ": integer Mod by zero");
  // trunc(a / b) through Int64: exact for integers and for floats whose quotient fits; a quotient out of
  // Int64's range (b = 0 included) is clamped into it and NaN taken as 0 first, so the cast is defined.
  Tensor qf = clamp(div(a.cast(DType::f64), b.cast(DType::f64)), -4e18, 4e18);
  qf = where(ne(qf, qf), zeros(Shape{}, DType::f64, d), qf);
  Tensor q = qf.cast(DType::i64).cast(a.dtype());
  Tensor r = a - b * q;
  if (fmod) return {r};
  Tensor zero = zeros(Shape{}, a.dtype(), d);
  Tensor fix = where(ne(r, zero), ne(lt(r, zero), lt(b, zero)), bool_scalar(false, d));
  return {where(fix, r + b, r)};
}

std::vector<Tensor> run_logic(const Node& n, const std::vector<Tensor>& in) {
  const std::string& op = n.proto.op_type();
  const Device d = device_of(in);
  Tensor a = on(need(n, in, 0), d);
  if (a.dtype() != DType::boolean) fail("[onnx] ", where(n.proto), ": needs Bool inputs; got ", dtype_name(a.dtype()));
  const Tensor t = bool_scalar(true, d), f = bool_scalar(false, d);
  if (op == "Not") return {where(a, f, t)};
  Tensor b = on(need(n, in, 1), d);
  if (b.dtype() != DType::boolean) fail("[onnx] ", where(n.proto), ": needs Bool inputs; got ", dtype_name(b.dtype()));
  if (op == "And") return {where(a, b, f)};
  if (op == "Or") return {where(a, t, b)};
  return {where(a, where(b, f, t), b)};  // Xor
}

std::vector<Tensor> run_reciprocal(const Node& n, const std::vector<Tensor>& in) { return {1.0 / need(n, in, 0)}; }
/// Softplus as the spec writes it, log(exp(x) + 1).
std::vector<Tensor> run_softplus(const Node& n, const std::vector<Tensor>& in) { return {log1p(exp(need(n, in, 0)))}; }

/// HardSigmoid max(0, min(1, alpha x + beta)); HardSwish x HardSigmoid(x) with alpha 1/6, beta 1/2.
std::vector<Tensor> run_hard(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  if (n.proto.op_type() == "HardSwish") return {x * clamp(x * (1.0 / 6) + 0.5, 0, 1)};
  return {clamp(x * attr_f(n.proto, "alpha", 0.2) + attr_f(n.proto, "beta", 0.5), 0, 1)};
}

/// Gelu (opset 20): approximate "none" is the exact x Φ(x), "tanh" the tanh form.
std::vector<Tensor> run_gelu(const Node& n, const std::vector<Tensor>& in) {
  const std::string a = attr_s(n.proto, "approximate", "none");
  if (a == "tanh") return {flux::detail::gelu_op(need(n, in, 0))};
  if (a != "none") fail("[onnx] ", where(n.proto), ": approximate '", a, "' (none or tanh)");
  return {flux::detail::gelu_erf_op(need(n, in, 0))};
}

std::vector<Tensor> run_clip(const Node& n, const std::vector<Tensor>& in) {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  if (has(in, 1)) lo = in[1].item<double>();
  if (has(in, 2)) hi = in[2].item<double>();
  return {clamp(need(n, in, 0), lo, hi)};
}

std::vector<Tensor> run_where(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  return {flux::where(on(need(n, in, 0), d), on(need(n, in, 1), d), on(need(n, in, 2), d))};
}

// ---- constants and shapes ----

std::vector<Tensor> run_constant(const Node& node, const std::vector<Tensor>&) {
  const auto& n = node.proto;
  if (const auto* a = attr(n, "value", ::onnx::AttributeProto::TENSOR)) return {from_proto(a->t(), "[onnx] " + where(n))};
  if (const auto* a = attr(n, "value_float", ::onnx::AttributeProto::FLOAT)) return {Tensor::scalar(a->f())};
  if (const auto* a = attr(n, "value_int", ::onnx::AttributeProto::INT)) return {Tensor::scalar(double(a->i()), DType::i64)};
  if (const auto* a = attr(n, "value_ints", ::onnx::AttributeProto::INTS)) {
    std::vector<int64_t> v(a->ints().begin(), a->ints().end());
    return {Tensor(v, Shape{int64_t(v.size())})};
  }
  if (const auto* a = attr(n, "value_floats", ::onnx::AttributeProto::FLOATS)) {
    std::vector<float> v(a->floats().begin(), a->floats().end());
    return {Tensor(v, Shape{int64_t(v.size())})};
  }
  fail("[onnx] ", where(n), ": a Constant needs value, value_float(s) or value_int(s)");
}

std::vector<Tensor> run_shape(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const int r = x.ndim();
  int64_t start = attr_i(n.proto, "start", 0), end = attr_i(n.proto, "end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r), end = std::clamp<int64_t>(end, start, r);
  std::vector<int64_t> dims(x.shape().begin() + start, x.shape().begin() + end);
  Tensor s(dims, Shape{int64_t(dims.size())});
  // Traced as an op (onnx::save of an imported model): the sizes follow the input.
  if (trace::active()) trace::emit(ops::shape, {x}, s, {{"range", {start, end}, {}}});
  return {s};
}

std::vector<Tensor> run_size(const Node& n, const std::vector<Tensor>& in) {
  return {Tensor::scalar(double(need(n, in, 0).numel()), DType::i64)};
}

std::vector<Tensor> run_squeeze(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const bool insert = n.proto.op_type() == "Unsqueeze";
  return {x.reshape(squeezed_shape(x.shape(), axes_of(n, in, 1, 13), insert, n.proto))};
}

std::vector<Tensor> run_concat(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  std::vector<Tensor> xs;
  for (const Tensor& t : in)
    if (t.defined() && t.numel() > 0) xs.push_back(on(t, d));
  if (xs.empty()) {  // every part empty: the first one's shape with the axis summed (0)
    if (in.empty() || !in[0].defined()) fail("[onnx] ", where(n.proto), ": nothing to concatenate");
    return {in[0]};
  }
  return {concat(xs, norm_axis(attr_i(n.proto, "axis", 0), xs[0].ndim(), n.proto))};
}

/// Slice (opset 10+: starts, ends, axes, steps as inputs), any step: step 1 a view, others gathers.
std::vector<Tensor> run_slice(const Node& n, const std::vector<Tensor>& in) {
  Tensor x = need(n, in, 0);
  std::vector<int64_t> starts = host_ints(need(n, in, 1), n.proto, "starts"), ends = host_ints(need(n, in, 2), n.proto, "ends");
  std::vector<int64_t> axes = has(in, 3) ? host_ints(in[3], n.proto, "axes") : std::vector<int64_t>{};
  std::vector<int64_t> steps = has(in, 4) ? host_ints(in[4], n.proto, "steps") : std::vector<int64_t>{};
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (ends.size() != starts.size() || axes.size() != starts.size() || (!steps.empty() && steps.size() != starts.size()))
    fail("[onnx] ", where(n.proto), ": starts, ends, axes and steps differ in length");
  distinct_axes(axes, x.ndim(), n.proto);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int a = norm_axis(axes[i], x.ndim(), n.proto);
    const int64_t len = x.shape()[a], step = steps.empty() ? 1 : steps[i];
    if (step == 0) fail("[onnx] ", where(n.proto), ": step 0");
    int64_t s = starts[i] < 0 ? starts[i] + len : starts[i], e = ends[i] < 0 ? ends[i] + len : ends[i];
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, len), e = std::clamp<int64_t>(e, 0, len);
      if (step == 1) {
        if (s != 0 || e != len) x = slice(x, a, s, std::max(s, e));
        continue;
      }
    } else {
      s = std::clamp<int64_t>(s, 0, len - 1), e = std::clamp<int64_t>(e, -1, len - 1);
    }
    std::vector<int64_t> idx;
    for (int64_t j = s; step > 0 ? j < e : j > e; j += step) idx.push_back(j);
    x = index_select(x, a, index_tensor(idx, x.device()));
  }
  return {x};
}

std::vector<Tensor> run_reshape(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  std::vector<int64_t> s = host_ints(need(n, in, 1), n.proto, "shape");
  const bool allowzero = n.opset >= 14 && attr_i(n.proto, "allowzero", 0);
  for (size_t i = 0; i < s.size() && !allowzero; ++i)
    if (s[i] == 0) {
      if (int(i) >= x.ndim()) fail("[onnx] ", where(n.proto), ": shape entry 0 at ", i, " beyond the input's rank");
      s[i] = x.shape()[int(i)];
    }
  if (std::count(s.begin(), s.end(), -1) > 1) fail("[onnx] ", where(n.proto), ": shape [", join(s), "] has more than one -1");
  return {x.reshape(Shape(s))};
}

std::vector<Tensor> run_flatten(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  int64_t axis = attr_i(n.proto, "axis", 1);
  if (axis < 0) axis += x.ndim();
  if (axis < 0 || axis > x.ndim()) fail("[onnx] ", where(n.proto), ": axis ", axis, " out of range");
  int64_t outer = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
  return {x.reshape(Shape{outer, outer ? x.numel() / outer : 0})};
}

std::vector<Tensor> run_transpose(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  std::vector<int64_t> p = attr_ints(n.proto, "perm");
  if (!p.empty() && int(p.size()) != x.ndim()) fail("[onnx] ", where(n.proto), ": perm has ", p.size(), " axes for rank ", x.ndim());
  std::vector<int> perm;
  for (int i = 0; i < x.ndim(); ++i) perm.push_back(p.empty() ? x.ndim() - 1 - i : norm_axis(p[size_t(i)], x.ndim(), n.proto));
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) fail("[onnx] ", where(n.proto), ": perm [", join(p), "] repeats an axis");
  return {permute(x, perm)};
}

std::vector<Tensor> run_expand(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  std::vector<int64_t> s = host_ints(need(n, in, 1), n.proto, "shape");
  Shape target = flux::detail::broadcast_shapes("onnx Expand", x.shape(), checked_shape(s, n.proto));
  checked_shape(target.vec(), n.proto);
  return {target == x.shape() ? x : broadcast_to(x, target)};
}

/// Tile: each axis repeated repeats[i] times (a gather of i mod len).
std::vector<Tensor> run_tile(const Node& n, const std::vector<Tensor>& in) {
  Tensor x = need(n, in, 0);
  std::vector<int64_t> reps = host_ints(need(n, in, 1), n.proto, "repeats");
  if (int(reps.size()) != x.ndim()) fail("[onnx] ", where(n.proto), ": repeats has ", reps.size(), " values for rank ", x.ndim());
  std::vector<int64_t> out(x.shape().begin(), x.shape().end());
  for (size_t i = 0; i < reps.size(); ++i) {
    if (reps[i] < 0) fail("[onnx] ", where(n.proto), ": negative repeat ", reps[i]);
    out[i] *= reps[i];
  }
  checked_shape(out, n.proto);
  for (int a = 0; a < x.ndim(); ++a) {
    if (reps[size_t(a)] == 1) continue;
    std::vector<int64_t> idx;
    const int64_t len = x.shape()[a];
    for (int64_t j = 0; j < len * reps[size_t(a)]; ++j) idx.push_back(j % len);
    x = index_select(x, a, index_tensor(idx, x.device()));
  }
  return {x};
}

/// Range(start, limit, delta): max(ceil((limit - start) / delta), 0) values, the type of start.
std::vector<Tensor> run_range(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& s = need(n, in, 0);
  const double start = s.item<double>(), limit = need(n, in, 1).item<double>(), delta = need(n, in, 2).item<double>();
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta))
    fail("[onnx] ", where(n.proto), ": start ", start, ", limit ", limit, ", delta ", delta);
  const double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (count > double(kMaxFill)) fail("[onnx] ", where(n.proto), ": ", count, " values");
  std::vector<double> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + double(i) * delta;
  return {Tensor(v, Shape{int64_t(v.size())}).cast(s.dtype())};
}

std::vector<Tensor> run_constant_of_shape(const Node& n, const std::vector<Tensor>& in) {
  Shape s = checked_shape(host_ints(need(n, in, 0), n.proto, "shape"), n.proto);
  if (const auto* a = attr(n.proto, "value", ::onnx::AttributeProto::TENSOR)) {
    Tensor v = from_proto(a->t(), "[onnx] " + where(n.proto));
    if (v.numel() != 1) fail("[onnx] ", where(n.proto), ": value must hold one element");
    return {full(s, v.item<double>(), v.dtype())};
  }
  return {zeros(s)};
}

std::vector<Tensor> run_cast(const Node& n, const std::vector<Tensor>& in) {
  if (n.proto.op_type() == "CastLike") return {need(n, in, 0).cast(need(n, in, 1).dtype())};
  return {need(n, in, 0).cast(flux_dtype(int32_t(attr_i(n.proto, "to", 1)), "[onnx] " + where(n.proto)))};
}

std::vector<Tensor> run_gather(const Node& n, const std::vector<Tensor>& in) {
  return {gather(need(n, in, 0), need(n, in, 1), attr_i(n.proto, "axis", 0), n.proto)};
}

/// The rows that GatherND and ScatterND address: `data` seen as (B, M, rest...) with B the product of its
/// first batch_dims axes and M that of the next k (k = indices' last length), and for each of indices'
/// tuples the row b * M + m it names (negative indices count from the end; out of range is an error).
struct NdRows {
  std::vector<int64_t> rows;  // one per index tuple, in indices' order
  Shape rest;                 // data's axes after batch_dims + k
  int64_t total = 0;          // B * M
};
NdRows nd_rows(const Tensor& data, const Tensor& indices, int64_t batch_dims, const ::onnx::NodeProto& n) {
  const int r = data.ndim(), q = indices.ndim();
  if (q < 1 || batch_dims < 0 || batch_dims >= std::min(r, q))
    fail("[onnx] ", where(n), ": batch_dims ", batch_dims, " with data ", to_string(data.shape()), " and indices ", to_string(indices.shape()));
  const int b = int(batch_dims);
  for (int i = 0; i < b; ++i)
    if (indices.shape()[i] != data.shape()[i])
      fail("[onnx] ", where(n), ": the batch axes of indices ", to_string(indices.shape()), " and data ", to_string(data.shape()), " differ");
  const int64_t k = indices.shape()[q - 1];
  if (k < 1 || b + k > r)
    fail("[onnx] ", where(n), ": index tuples of length ", k, " for data of rank ", r, " (batch_dims ", b, ")");
  std::vector<int64_t> idx = host_ints(indices, n, "indices");
  int64_t batch = 1, m = 1;
  for (int i = 0; i < b; ++i) batch *= data.shape()[i];
  for (int i = b; i < b + int(k); ++i) m *= data.shape()[i];
  NdRows out;
  out.total = batch * m;
  for (int i = b + int(k); i < r; ++i) out.rest.push_back(data.shape()[i]);
  const size_t tuples = idx.size() / size_t(k), per_batch = batch ? tuples / size_t(batch) : 0;
  for (size_t t = 0; t < tuples; ++t) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t len = data.shape()[b + j];
      int64_t v = idx[t * size_t(k) + size_t(j)];
      if (v < -len || v >= len) fail("[onnx] ", where(n), ": index ", v, " out of range for axis ", b + j, " of length ", len);
      row = row * len + (v < 0 ? v + len : v);
    }
    out.rows.push_back(int64_t(t / per_batch) * m + row);
  }
  return out;
}
Shape with_rest(std::vector<int64_t> lead, const Shape& rest) {
  for (int64_t d : rest) lead.push_back(d);
  return Shape(lead);
}

/// GatherND: the slices of data that indices' last axis addresses (batch_dims leading axes shared).
std::vector<Tensor> run_gather_nd(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& data = need(n, in, 0);
  const Tensor& indices = need(n, in, 1);
  const NdRows nd = nd_rows(data, indices, attr_i(n.proto, "batch_dims", 0), n.proto);
  Tensor flat = data.reshape(with_rest({nd.total}, nd.rest));
  Tensor picked = index_select(flat, 0, on(Tensor(nd.rows, Shape{int64_t(nd.rows.size())}), data.device()));
  std::vector<int64_t> lead(indices.shape().begin(), indices.shape().end() - 1);
  return {picked.reshape(with_rest(lead, nd.rest))};
}

/// ScatterND (reduction none): data with the slices that indices address replaced by updates (the last
/// update wins where two address one slice). Made as one index_select over [data rows; update rows], so
/// gradients reach both data and updates.
std::vector<Tensor> run_scatter_nd(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor data = on(need(n, in, 0), d), updates = on(need(n, in, 2), d);
  const Tensor& indices = need(n, in, 1);
  const NdRows nd = nd_rows(data, indices, 0, n.proto);
  std::vector<int64_t> lead(indices.shape().begin(), indices.shape().end() - 1);
  if (updates.shape() != with_rest(lead, nd.rest) || updates.dtype() != data.dtype())
    fail("[onnx] ", where(n.proto), ": updates ", summary(updates), " do not fit data ", summary(data), " and indices ",
         to_string(indices.shape()), " (expected shape ", to_string(with_rest(lead, nd.rest)), ")");
  std::vector<int64_t> src(size_t(nd.total));
  std::iota(src.begin(), src.end(), int64_t(0));
  for (size_t j = 0; j < nd.rows.size(); ++j) src[size_t(nd.rows[j])] = nd.total + int64_t(j);
  Tensor both = concat({data.reshape(with_rest({nd.total}, nd.rest)), updates.reshape(with_rest({int64_t(nd.rows.size())}, nd.rest))}, 0);
  return {index_select(both, 0, on(Tensor(src, Shape{nd.total}), d)).reshape(data.shape())};
}
std::string scatter_nd_check(const Node& n) {
  const std::string r = attr_s(n.proto, "reduction", "none");
  return r == "none" ? "" : "reduction " + r + " (only none)";
}

/// Split into n.outputs parts: sizes from the attribute "split" (opset < 13), the input (13+), or
/// equal parts (the last smaller, num_outputs from 18).
std::vector<Tensor> run_split(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const int a = norm_axis(attr_i(n.proto, "axis", 0), x.ndim(), n.proto);
  const int64_t len = x.shape()[a], parts = n.proto.output_size();
  std::vector<int64_t> sizes = n.opset >= 13 ? (has(in, 1) ? host_ints(in[1], n.proto, "split") : std::vector<int64_t>{})
                                             : attr_ints(n.proto, "split");
  if (sizes.empty()) {
    if (parts < 1) fail("[onnx] ", where(n.proto), ": no outputs");
    const int64_t each = (len + parts - 1) / parts;
    for (int64_t i = 0, left = len; i < parts; ++i, left -= each) sizes.push_back(std::max<int64_t>(std::min(each, left), 0));
  }
  if (int64_t(sizes.size()) != parts || std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) != len ||
      std::any_of(sizes.begin(), sizes.end(), [](int64_t v) { return v < 0; }))
    fail("[onnx] ", where(n.proto), ": split [", join(sizes), "] does not cut length ", len, " into ", parts, " outputs");
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) out.push_back(slice(x, a, at, at + s)), at += s;
  return out;
}

/// Trilu: the upper (upper = 1) or lower triangle of the last two axes, diagonal offset k.
std::vector<Tensor> run_trilu(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  if (x.ndim() < 2) fail("[onnx] ", where(n.proto), ": needs rank >= 2; got ", to_string(x.shape()));
  const int64_t k = has(in, 1) ? in[1].item<int64_t>() : 0;
  const bool upper = attr_i(n.proto, "upper", 1);
  const int64_t rows = x.shape()[x.ndim() - 2], cols = x.shape()[x.ndim() - 1];
  std::vector<uint8_t> keep(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) keep[size_t(i * cols + j)] = upper ? j - i >= k : j - i <= k;
  Tensor mask = on(Tensor(keep, Shape{rows, cols}, DType::boolean), x.device());
  return {where(mask, x, zeros(Shape{}, x.dtype(), x.device()))};
}

// ---- linear algebra, convolution, pooling ----

std::vector<Tensor> run_matmul(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  return {matmul(on(need(n, in, 0), d), on(need(n, in, 1), d))};
}

std::vector<Tensor> run_gemm(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor a = on(need(n, in, 0), d), b = on(need(n, in, 1), d), c = on(in_or(in, 2), d);
  const bool ta = attr_i(n.proto, "transA", 0), tb = attr_i(n.proto, "transB", 0);
  const double alpha = attr_f(n.proto, "alpha", 1.0), beta = attr_f(n.proto, "beta", 1.0);
  if (Tensor y = gemm_linear(n.proto, a, b, c, false); y.defined()) return {y};
  Tensor y = matmul(a, b, ta, tb);
  if (alpha != 1.0) y = y * alpha;
  if (c.defined()) y = y + (beta != 1.0 ? c * beta : c);
  return {y};
}

/// Einsum in the two-operand forms attention writes ("bhid,bhjd->bhij", "bhij,bhjd->bhid", ...):
/// shared leading batch letters, then one contraction, as a batched matmul.
std::vector<Tensor> run_einsum(const Node& n, const std::vector<Tensor>& in) {
  std::string eq = attr_s(n.proto, "equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  const size_t comma = eq.find(','), arrow = eq.find("->");
  if (in.size() != 2 || comma == std::string::npos || arrow == std::string::npos || arrow < comma)
    fail("[onnx] ", where(n.proto), ": equation '", eq, "': only two operands with an explicit output are supported");
  const std::string a = eq.substr(0, comma), b = eq.substr(comma + 1, arrow - comma - 1), o = eq.substr(arrow + 2);
  const Device d = device_of(in);
  Tensor x = on(need(n, in, 0), d), y = on(need(n, in, 1), d);
  // (batch..., i, k) x (batch..., k, j) -> (batch..., i, j) with the letters permuted into place.
  const size_t nb = a.size() >= 2 ? a.size() - 2 : 0;
  const std::string batch = a.substr(0, nb);
  auto bad = [&] { fail("[onnx] ", where(n.proto), ": equation '", eq, "' is not a batched matrix product"); };
  if (a.size() != b.size() || o.size() != a.size() || b.substr(0, nb) != batch || o.substr(0, nb) != batch ||
      int(a.size()) != x.ndim() || int(b.size()) != y.ndim())
    bad();
  const std::string ra = a.substr(nb), rb = b.substr(nb), ro = o.substr(nb);
  // The contracted letter is in both operands and not in the output.
  char k = 0;
  for (char c : ra)
    if (rb.find(c) != std::string::npos && ro.find(c) == std::string::npos) k = c;
  if (!k) bad();
  const char i = ra[0] == k ? ra[1] : ra[0], j = rb[0] == k ? rb[1] : rb[0];
  if (ro != std::string{i, j} && ro != std::string{j, i}) bad();
  Tensor z = matmul(x, y, ra[0] == k, rb[1] == k);
  if (ro[0] == j) z = z.transpose();
  return {z};
}

std::vector<Tensor> run_conv(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  return {conv(on(need(n, in, 0), d), on(need(n, in, 1), d), on(in_or(in, 2), d), conv_params(n.proto, in[1]))};
}

std::string conv_check(const Node& n) {
  const std::string pad = attr_s(n.proto, "auto_pad", "NOTSET");
  if (pad != "NOTSET" && pad != "VALID") return "auto_pad " + pad + " (explicit pads only)";
  if (n.proto.op_type() == "ConvTranspose" && attr(n.proto, "output_shape", ::onnx::AttributeProto::INTS))
    return "output_shape (give pads and output_padding)";
  return "";
}

std::vector<Tensor> run_conv_transpose(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor x = on(need(n, in, 0), d), w = on(need(n, in, 1), d);
  const ConvParams c = conv_params(n.proto, w);
  const int spatial = w.ndim() - 2;
  ConvTransposeParams p;
  p.stride = c.stride, p.pad = c.pad, p.dilation = c.dilation, p.groups = c.groups;
  p.output_padding = Dims(attr_ints(n.proto, "output_padding", std::vector<int64_t>(size_t(spatial), 0)));
  return {conv_transpose(x, w, on(in_or(in, 2), d), p)};
}

std::vector<Tensor> run_batchnorm(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  return {batchnorm(on(need(n, in, 0), d), on(need(n, in, 1), d), on(need(n, in, 2), d), on(need(n, in, 3), d),
                    on(need(n, in, 4), d), attr_f(n.proto, "epsilon", 1e-5))};
}

/// x padded with `value` by (lo, hi) on `axis` (negative: cropped).
Tensor pad_axis(const Tensor& x, int axis, int64_t lo, int64_t hi, const std::string& mode, double value) {
  const int64_t len = x.shape()[axis];
  Tensor y = x;
  if (lo < 0 || hi < 0) {
    y = slice(y, axis, std::max<int64_t>(-lo, 0), len - std::max<int64_t>(-hi, 0));
    lo = std::max<int64_t>(lo, 0), hi = std::max<int64_t>(hi, 0);
  }
  if (lo == 0 && hi == 0) return y;
  const int64_t m = y.shape()[axis];
  if (mode == "constant") {
    std::vector<Tensor> parts;
    auto block = [&](int64_t k) {
      std::vector<int64_t> s(y.shape().begin(), y.shape().end());
      s[size_t(axis)] = k;
      return full(Shape(s), value, y.dtype(), y.device());
    };
    if (lo) parts.push_back(block(lo));
    parts.push_back(y);
    if (hi) parts.push_back(block(hi));
    return concat(parts, axis);
  }
  std::vector<int64_t> idx;
  for (int64_t j = -lo; j < m + hi; ++j) {
    int64_t v = j;
    if (mode == "edge") v = std::clamp<int64_t>(j, 0, m - 1);
    else if (mode == "wrap") v = ((j % m) + m) % m;
    else {  // reflect, without repeating the edge
      const int64_t period = 2 * (m - 1);
      v = period ? ((j % period) + period) % period : 0;
      if (v >= m) v = period - v;
    }
    idx.push_back(v);
  }
  return index_select(y, axis, index_tensor(idx, y.device()));
}

/// Pad (opset 11+: pads and constant_value inputs, axes from 18; modes constant, reflect, edge, wrap 19).
std::vector<Tensor> run_pad(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const std::string mode = attr_s(n.proto, "mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && !(mode == "wrap" && n.opset >= 19))
    fail("[onnx] ", where(n.proto), ": mode '", mode, "'");
  std::vector<int64_t> pads = host_ints(need(n, in, 1), n.proto, "pads");
  const double value = has(in, 2) && in[2].numel() ? in[2].item<double>() : 0.0;
  std::vector<int64_t> axes = n.opset >= 18 && has(in, 3) ? host_ints(in[3], n.proto, "axes") : std::vector<int64_t>{};
  if (axes.empty())
    for (int i = 0; i < x.ndim(); ++i) axes.push_back(i);
  distinct_axes(axes, x.ndim(), n.proto);
  if (pads.size() != 2 * axes.size())
    fail("[onnx] ", where(n.proto), ": pads has ", pads.size(), " values for ", axes.size(), " axes (begins, then ends)");
  Tensor y = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int a = norm_axis(axes[i], x.ndim(), n.proto);
    const int64_t lo = pads[i], hi = pads[i + axes.size()], len = y.shape()[a];
    if (lo + len + hi < 0 || (mode != "constant" && (lo > 0 || hi > 0) && len == 0))
      fail("[onnx] ", where(n.proto), ": pads (", lo, ", ", hi, ") on axis ", a, " of length ", len);
    if (mode == "reflect" && (lo >= len || hi >= len) && (lo > 0 || hi > 0))
      fail("[onnx] ", where(n.proto), ": reflect pads (", lo, ", ", hi, ") need an axis longer than them; axis ", a, " has ", len);
    std::vector<int64_t> s(y.shape().begin(), y.shape().end());
    s[size_t(a)] = lo + len + hi;
    checked_shape(s, n.proto);
    y = pad_axis(y, a, lo, hi, mode, value);
  }
  return {y};
}

/// MaxPool / AveragePool with explicit pads, ceil_mode and count_include_pad. The windows of ceil_mode
/// run over extra high padding, but (as in ONNX Runtime and PyTorch) a window must start inside the
/// input or its low padding, and an average divides by the window's part inside input + pads
/// (count_include_pad 1) or inside the input (0).
std::vector<Tensor> run_pool(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const std::vector<int64_t> k = attr_ints(n.proto, "kernel_shape");
  const int spatial = int(k.size());
  if (x.ndim() != spatial + 2) fail("[onnx] ", where(n.proto), ": input ", to_string(x.shape()), " for a ", spatial, "-D window");
  std::vector<int64_t> stride = attr_ints(n.proto, "strides", std::vector<int64_t>(size_t(spatial), 1));
  std::vector<int64_t> pads = attr_ints(n.proto, "pads", std::vector<int64_t>(size_t(2 * spatial), 0));
  if (int(stride.size()) != spatial || int(pads.size()) != 2 * spatial)
    fail("[onnx] ", where(n.proto), ": strides / pads do not fit a ", spatial, "-D window");
  const bool ceil = attr_i(n.proto, "ceil_mode", 0), avg = n.proto.op_type() == "AveragePool";
  const bool include_pad = attr_i(n.proto, "count_include_pad", 0);
  std::vector<int64_t> extra(size_t(spatial), 0);
  for (int i = 0; i < spatial; ++i) {
    const int64_t len = x.shape()[2 + i], lo = pads[size_t(i)], hi = pads[size_t(i + spatial)], s = stride[size_t(i)];
    if (k[size_t(i)] < 1 || s < 1 || lo < 0 || hi < 0) fail("[onnx] ", where(n.proto), ": kernel, strides or pads out of range");
    const int64_t span = len + lo + hi - k[size_t(i)];
    if (span < 0) fail("[onnx] ", where(n.proto), ": window ", k[size_t(i)], " larger than the padded input ", len + lo + hi);
    if (!ceil) continue;
    int64_t out = (span + s - 1) / s + 1;
    if ((out - 1) * s >= len + lo) --out;
    extra[size_t(i)] = (out - 1) * s + k[size_t(i)] - (len + lo + hi);
  }
  std::vector<int64_t> flux_pad;
  bool padded = false, any_extra = false;
  for (int i = 0; i < spatial; ++i) {
    flux_pad.push_back(pads[size_t(i)]), flux_pad.push_back(pads[size_t(i + spatial)] + extra[size_t(i)]);
    padded = padded || pads[size_t(i)] || pads[size_t(i + spatial)];
    any_extra = any_extra || extra[size_t(i)] > 0;
  }
  PoolParams p;
  p.stride = Dims(stride);
  p.pad = Padding(flux_pad);
  if (!avg) return {maxpool(x, Dims(k), p)};
  // flux's meanpool divides by the whole window: right where no window sees padding it must not count.
  if (!any_extra && (include_pad || !padded)) return {meanpool(x, Dims(k), p)};
  // Otherwise: the mean over the whole window, times the window's size over the count that counts.
  std::vector<int64_t> ones_shape(size_t(spatial + 2), 1);
  std::vector<int64_t> counted(size_t(spatial + 2), 1);
  for (int i = 0; i < spatial; ++i)
    counted[size_t(2 + i)] = x.shape()[2 + i] + (include_pad ? pads[size_t(i)] + pads[size_t(i + spatial)] : 0);
  Tensor mask = ones(Shape(counted), x.dtype(), x.device());
  PoolParams mp = p;
  if (include_pad) {
    std::vector<int64_t> rest;
    for (int i = 0; i < spatial; ++i) rest.push_back(0), rest.push_back(extra[size_t(i)]);
    mp.pad = Padding(rest);
  }
  Tensor frac = meanpool(mask, Dims(k), mp);  // (1, 1, out...): the counted part of each window
  return {meanpool(x, Dims(k), p) / frac};
}

std::string pool_check(const Node& n) {
  if (attr_ints(n.proto, "kernel_shape").empty()) return "no kernel_shape";
  std::string pad = attr_s(n.proto, "auto_pad", "NOTSET");
  if (pad != "NOTSET" && pad != "VALID") return "auto_pad " + pad;
  for (int64_t d : attr_ints(n.proto, "dilations"))
    if (d != 1) return "dilations other than 1";
  if (n.proto.output_size() > 1 && !n.proto.output(1).empty()) return "the Indices output";
  return "";
}

std::vector<Tensor> run_global_pool(const Node& n, const std::vector<Tensor>& in) {
  return {n.proto.op_type() == "GlobalAveragePool" ? global_meanpool(need(n, in, 0)) : global_maxpool(need(n, in, 0))};
}

// ---- normalisation and softmax ----

/// Softmax / LogSoftmax: from opset 13 along `axis` (default -1); before, over the input flattened to
/// 2-D at `axis` (default 1).
std::vector<Tensor> run_softmax(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  const bool log = n.proto.op_type() == "LogSoftmax";
  auto apply = [&](const Tensor& t, int a) { return log ? flux::detail::logsoftmax_op(t, a) : flux::detail::softmax_op(t, a); };
  if (n.opset >= 13) return {apply(x, norm_axis(attr_i(n.proto, "axis", -1), x.ndim(), n.proto))};
  int64_t axis = attr_i(n.proto, "axis", 1);
  if (axis < 0) axis += x.ndim();
  if (axis < 0 || axis > x.ndim()) fail("[onnx] ", where(n.proto), ": axis ", axis, " out of range");
  int64_t outer = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
  return {apply(x.reshape(Shape{outer, outer ? x.numel() / outer : 0}), 1).reshape(x.shape())};
}

std::vector<Tensor> run_layernorm(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor x = on(need(n, in, 0), d), scale = on(need(n, in, 1), d), bias = on(in_or(in, 2), d);
  const int a = norm_axis(attr_i(n.proto, "axis", -1), x.ndim(), n.proto);
  int64_t inner = 1;
  for (int i = a; i < x.ndim(); ++i) inner *= x.shape()[i];
  if (scale.numel() != inner || (bias.defined() && bias.numel() != inner))
    fail("[onnx] ", where(n.proto), ": scale and bias must hold ", inner, " values");
  Tensor y = layernorm(x.reshape(Shape{-1, inner}), scale.reshape(Shape{inner}), bias.defined() ? bias.reshape(Shape{inner}) : Tensor(),
                       attr_f(n.proto, "epsilon", 1e-5));
  return {y.reshape(x.shape())};
}

std::string layernorm_check(const Node& n) {
  for (int k = 1; k < n.proto.output_size(); ++k)
    if (!n.proto.output(k).empty()) return "the Mean / InvStdDev outputs";
  return "";
}

/// GroupNormalization: scale and bias per group in opset 18, per channel from 21.
std::vector<Tensor> run_groupnorm(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor x = on(need(n, in, 0), d), scale = on(need(n, in, 1), d), bias = on(need(n, in, 2), d);
  const int64_t groups = attr_i(n.proto, "num_groups", 0);
  if (x.ndim() < 3 || groups < 1 || x.shape()[1] % groups)
    fail("[onnx] ", where(n.proto), ": num_groups ", groups, " for input ", to_string(x.shape()));
  const int64_t c = x.shape()[1], per = n.opset >= 21 ? c : groups;
  if (scale.numel() != per || bias.numel() != per)
    fail("[onnx] ", where(n.proto), ": scale and bias must hold ", per, " values at opset ", n.opset, " (",
         n.opset >= 21 ? "per channel" : "per group, before opset 21", ")");
  scale = scale.reshape(Shape{per}), bias = bias.reshape(Shape{per});
  if (per != c) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < c; ++i) idx.push_back(i / (c / groups));
    scale = index_select(scale, 0, index_tensor(idx, d)), bias = index_select(bias, 0, index_tensor(idx, d));
  }
  return {groupnorm(x, groups, scale, bias, attr_f(n.proto, "epsilon", 1e-5))};
}

std::vector<Tensor> run_instancenorm(const Node& n, const std::vector<Tensor>& in) {
  const Device d = device_of(in);
  Tensor x = on(need(n, in, 0), d);
  return {groupnorm(x, x.ndim() > 1 ? x.shape()[1] : 1, on(need(n, in, 1), d), on(need(n, in, 2), d), attr_f(n.proto, "epsilon", 1e-5))};
}

/// ReduceSum (axes an input from 13), ReduceMean/Max/Min/SumSquare/L2 (from 18); no axes: every
/// axis, or none with noop_with_empty_axes.
std::vector<Tensor> run_reduce(const Node& n, const std::vector<Tensor>& in) {
  const std::string& op = n.proto.op_type();
  Tensor x = need(n, in, 0);
  std::vector<int64_t> axes = axes_of(n, in, 1, op == "ReduceSum" ? 13 : 18);
  const bool keep = attr_i(n.proto, "keepdims", 1);
  if (axes.empty() && attr_i(n.proto, "noop_with_empty_axes", 0)) return {x};
  std::vector<int> a = distinct_axes(axes, x.ndim(), n.proto);
  if (a.empty())
    for (int i = 0; i < x.ndim(); ++i) a.push_back(i);
  if (op == "ReduceSumSquare" || op == "ReduceL2") x = square(x);
  Tensor y = x;
  for (auto it = a.rbegin(); it != a.rend(); ++it) {
    const int v = *it;
    if (op == "ReduceMean") y = mean(y, v, true);
    else if (op == "ReduceMax") y = max(y, v, true);
    else if (op == "ReduceMin") y = min(y, v, true);
    else y = sum(y, v, true);
  }
  if (op == "ReduceL2") {
    // sqrt's derivative is infinite at 0: a zero vector (swin_v2's padded window tokens, whose key has no
    // bias, through F.normalize) would turn the gradient into NaN. The norm of a zero vector gets a zero
    // gradient instead, as PyTorch's norm gives.
    Tensor zero = eq(y, zeros(Shape{}, y.dtype(), y.device()));
    y = where(zero, zeros(Shape{}, y.dtype(), y.device()), sqrt(where(zero, full(Shape{}, 1.0, y.dtype(), y.device()), y)));
  }
  if (!keep) {
    std::vector<int64_t> s;
    for (int i = 0; i < x.ndim(); ++i)
      if (std::find(a.begin(), a.end(), i) == a.end()) s.push_back(x.shape()[i]);
    y = y.reshape(Shape(s));
  }
  return {y};
}

std::vector<Tensor> run_argreduce(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& x = need(n, in, 0);
  if (attr_i(n.proto, "select_last_index", 0)) fail("[onnx] ", where(n.proto), ": select_last_index 1");
  const int a = norm_axis(attr_i(n.proto, "axis", 0), x.ndim(), n.proto);
  const bool keep = attr_i(n.proto, "keepdims", 1);
  return {n.proto.op_type() == "ArgMax" ? argmax(x, a, keep) : argmin(x, a, keep)};
}

// ---- resize ----

/// Resize (opset 11+; 18 adds axes, antialias, keep_aspect_ratio_policy; 19 half_pixel_symmetric):
/// nearest (its four rounding modes) and linear, per axis as a gather (nearest) or a blend of two
/// gathers (linear), on the input coordinate the coordinate_transformation_mode maps each output to.
std::vector<Tensor> run_resize(const Node& n, const std::vector<Tensor>& in) {
  const auto& p = n.proto;
  Tensor x = need(n, in, 0);
  const std::string mode = attr_s(p, "mode", "nearest"), ctm = attr_s(p, "coordinate_transformation_mode", "half_pixel");
  const std::string nearest = attr_s(p, "nearest_mode", "round_prefer_floor");
  std::vector<int64_t> axes = n.opset >= 18 ? attr_ints(p, "axes") : std::vector<int64_t>{};
  if (axes.empty())
    for (int i = 0; i < x.ndim(); ++i) axes.push_back(i);
  distinct_axes(axes, x.ndim(), p);
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  if (has(in, 3) && in[3].numel()) sizes = host_ints(in[3], p, "sizes");
  else if (has(in, 2) && in[2].numel()) scales = to(in[2], Device()).to_vector<float>();
  else fail("[onnx] ", where(p), ": needs scales or sizes");
  if ((!sizes.empty() && sizes.size() != axes.size()) || (!scales.empty() && scales.size() != axes.size()))
    fail("[onnx] ", where(p), ": scales / sizes hold ", std::max(sizes.size(), scales.size()), " values for ", axes.size(), " axes");
  for (size_t i = 0; i < axes.size(); ++i) {
    const int a = norm_axis(axes[i], x.ndim(), p);
    const int64_t len = x.shape()[a];
    double scale;
    int64_t out;
    if (!sizes.empty()) {
      out = sizes[i];
      scale = len ? double(out) / double(len) : 1.0;
    } else {
      scale = scales[i];
      if (!(scale > 0) || !std::isfinite(scale)) fail("[onnx] ", where(p), ": scale ", scale);
      out = int64_t(std::floor(double(len) * scale));
    }
    if (out < 0 || out > kMaxFill) fail("[onnx] ", where(p), ": output length ", out, " on axis ", a);
    if (out == len && scale == 1.0) continue;
    std::vector<int64_t> lo(static_cast<size_t>(out)), hi(static_cast<size_t>(out));
    std::vector<float> w(static_cast<size_t>(out));
    for (int64_t j = 0; j < out; ++j) {
      double c;  // the input coordinate of output j
      if (ctm == "half_pixel") c = (double(j) + 0.5) / scale - 0.5;
      else if (ctm == "pytorch_half_pixel") c = out > 1 ? (double(j) + 0.5) / scale - 0.5 : 0.0;
      else if (ctm == "align_corners") c = out > 1 ? double(j) * double(len - 1) / double(out - 1) : 0.0;
      else if (ctm == "asymmetric") c = double(j) / scale;
      else if (ctm == "half_pixel_symmetric" && n.opset >= 19) {
        const double adjust = double(out) / (scale * double(len)), offset = double(len) / 2 * (1 - adjust);
        c = offset + (double(j) + 0.5) / scale - 0.5;
      } else {
        fail("[onnx] ", where(p), ": coordinate_transformation_mode '", ctm, "'");
      }
      if (mode == "nearest") {
        double r;
        if (nearest == "floor") r = std::floor(c);
        else if (nearest == "ceil") r = std::ceil(c);
        else if (nearest == "round_prefer_ceil") r = std::floor(c + 0.5);
        else r = std::ceil(c - 0.5);  // round_prefer_floor
        lo[size_t(j)] = std::clamp<int64_t>(int64_t(r), 0, len - 1);
      } else {
        c = std::clamp(c, 0.0, double(len - 1));
        const int64_t f = int64_t(std::floor(c));
        lo[size_t(j)] = f, hi[size_t(j)] = std::min(f + 1, len - 1), w[size_t(j)] = float(c - double(f));
      }
    }
    if (mode == "nearest") {
      x = index_select(x, a, index_tensor(lo, x.device()));
      continue;
    }
    std::vector<int64_t> wshape(size_t(x.ndim()), 1);
    wshape[size_t(a)] = out;
    Tensor wt = on(Tensor(w, Shape(wshape)).cast(x.dtype()), x.device());
    Tensor xl = index_select(x, a, index_tensor(lo, x.device())), xh = index_select(x, a, index_tensor(hi, x.device()));
    x = xl + (xh - xl) * wt;
  }
  return {x};
}

std::string resize_check(const Node& n) {
  const auto& p = n.proto;
  const std::string mode = attr_s(p, "mode", "nearest");
  if (mode != "nearest" && mode != "linear") return "mode " + mode + " (nearest and linear)";
  const std::string nm = attr_s(p, "nearest_mode", "round_prefer_floor");
  if (nm != "round_prefer_floor" && nm != "round_prefer_ceil" && nm != "floor" && nm != "ceil") return "nearest_mode " + nm;
  if (attr_i(p, "antialias", 0)) return "antialias 1";
  if (n.opset >= 18 && attr_s(p, "keep_aspect_ratio_policy", "stretch") != "stretch") return "keep_aspect_ratio_policy other than stretch";
  const std::string ctm = attr_s(p, "coordinate_transformation_mode", "half_pixel");
  if (ctm == "tf_crop_and_resize") return "coordinate_transformation_mode tf_crop_and_resize";
  return "";
}

std::vector<Tensor> run_identity(const Node& n, const std::vector<Tensor>& in) { return {need(n, in, 0)}; }

/// Dropout: the identity at inference, and in training mode with ratio 0 (torchvision's swin calls
/// F.dropout(p=0.0) with training left true; torch 1.13 writes both as constant inputs). Training mode
/// with a ratio above 0 is refused when the node runs.
std::vector<Tensor> run_dropout(const Node& n, const std::vector<Tensor>& in) {
  auto scalar = [&](size_t k, const char* what) {
    if (in[k].numel() != 1) fail("[onnx] ", where(n.proto), ": ", what, " must be a scalar; got ", summary(in[k]));
    return in[k].cast(DType::f64).item<double>();
  };
  if (has(in, 2) && scalar(2, "training_mode") != 0) {
    const double ratio = has(in, 1) ? scalar(1, "ratio") : 0.5;
    if (ratio != 0)
      fail("[onnx] ", where(n.proto), ": training_mode is true with ratio ", ratio,
           " (only inference Dropout: export the model in eval mode)");
  }
  const Tensor& x = need(n, in, 0);
  if (n.proto.output_size() > 1 && !n.proto.output(1).empty())  // the mask: every element kept
    return {x, full(x.shape(), 1.0, DType::boolean, x.device())};
  return {x};
}
std::string batchnorm_check(const Node& n) {
  return attr_i(n.proto, "training_mode", 0) || n.proto.output_size() > 1 ? "training_mode (inference form only)" : "";
}

std::vector<Tensor> run_leakyrelu(const Node& n, const std::vector<Tensor>& in) {
  return {leakyrelu(need(n, in, 0), attr_f(n.proto, "alpha", 0.01))};
}
std::vector<Tensor> run_elu(const Node& n, const std::vector<Tensor>& in) {
  return {flux::detail::elu_op(need(n, in, 0), attr_f(n.proto, "alpha", 1.0))};
}

}  // namespace

Tensor gemm_linear(const ::onnx::NodeProto& n, const Tensor& a, const Tensor& b, const Tensor& c, bool relu) {
  if (attr_i(n, "transA", 0) || !attr_i(n, "transB", 0) || attr_f(n, "alpha", 1.0) != 1.0 || attr_f(n, "beta", 1.0) != 1.0 ||
      !c.defined() || c.ndim() != 1)
    return Tensor();
  // Under autocast in its low dtype on the kept casts of W and b, as Dense runs.
  if (auto low = flux::detail::autocast_low({&a, &b}))
    return flux::detail::linear(flux::detail::autocast_to(a, *low), flux::detail::autocast_to(b, *low),
                                flux::detail::autocast_to(c, *low), relu);
  return flux::detail::linear(a, b, c, relu);
}

double attr_f(const ::onnx::NodeProto& n, const char* name, double dflt) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::FLOAT);
  return a ? a->f() : dflt;
}

ConvParams conv_params(const ::onnx::NodeProto& n, const Tensor& w) {
  const int spatial = w.defined() ? w.ndim() - 2 : 0;
  if (spatial < 1 || spatial > 3) fail("[onnx] ", where(n), ": weight ", w.defined() ? to_string(w.shape()) : "missing", " is not (O, C, k...)");
  ConvParams p;
  p.stride = Dims(attr_ints(n, "strides", std::vector<int64_t>(size_t(spatial), 1)));
  p.dilation = Dims(attr_ints(n, "dilations", std::vector<int64_t>(size_t(spatial), 1)));
  p.groups = attr_i(n, "group", 1);
  p.pad = pads_of(n, spatial);
  return p;
}

const std::map<std::string, Operator>& operator_table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, Operator>();
    // One entry per operator: a name listed twice (by hand, or by hand and by the registry) is a bug.
    auto add = [&](std::initializer_list<const char*> names, Operator op) {
      for (const char* name : names)
        if (!t->emplace(name, op).second) fail("[onnx] the importer's operator table lists ", name, " twice");
    };
    for (const ops::Op* op : ops::all())
      if (op->unary || op->binary) add({op->onnx}, {.run = run_entry, .entry = op});
    add({"Div", "Pow", "Max", "Min"}, {.run = run_binary});
    add({"Mod"}, {.run = run_mod});
    add({"Not", "And", "Or", "Xor"}, {.run = run_logic});
    add({"Reciprocal"}, {.run = run_reciprocal});
    add({"Softplus"}, {.run = run_softplus});
    add({"HardSigmoid"}, {.run = run_hard});
    add({"HardSwish"}, {.since = 14, .run = run_hard});
    add({"Gelu"}, {.since = 20, .run = run_gelu});
    add({"LeakyRelu"}, {.run = run_leakyrelu});
    add({"Elu"}, {.run = run_elu});
    add({"Clip"}, {.run = run_clip});
    add({"Where"}, {.run = run_where});
    add({"Identity"}, {.run = run_identity});
    add({"Dropout"}, {.run = run_dropout});
    add({"Constant"}, {.run = run_constant});
    add({"Shape"}, {.run = run_shape});
    add({"Size"}, {.run = run_size});
    add({"Gather"}, {.run = run_gather});
    add({"GatherND"}, {.run = run_gather_nd});
    add({"ScatterND"}, {.run = run_scatter_nd, .check = scatter_nd_check});
    add({"Squeeze", "Unsqueeze"}, {.run = run_squeeze});
    add({"Concat"}, {.run = run_concat});
    add({"Slice"}, {.run = run_slice});
    add({"Split"}, {.run = run_split});
    add({"Reshape"}, {.run = run_reshape});
    add({"Flatten"}, {.run = run_flatten});
    add({"Transpose"}, {.run = run_transpose});
    add({"Expand"}, {.run = run_expand});
    add({"Tile"}, {.run = run_tile});
    add({"Range"}, {.run = run_range});
    add({"Trilu"}, {.since = 14, .run = run_trilu});
    add({"ConstantOfShape"}, {.run = run_constant_of_shape});
    add({"Cast"}, {.run = run_cast});
    add({"CastLike"}, {.since = 15, .run = run_cast});
    add({"MatMul"}, {.run = run_matmul});
    add({"Gemm"}, {.run = run_gemm});
    add({"Einsum"}, {.since = 12, .run = run_einsum});
    add({"Conv"}, {.run = run_conv, .check = conv_check});
    add({"ConvTranspose"}, {.run = run_conv_transpose, .check = conv_check});
    add({"BatchNormalization"}, {.run = run_batchnorm, .check = batchnorm_check});
    add({"MaxPool", "AveragePool"}, {.run = run_pool, .check = pool_check});
    add({"GlobalAveragePool", "GlobalMaxPool"}, {.run = run_global_pool});
    add({"Pad"}, {.run = run_pad});
    add({"Resize"}, {.run = run_resize, .check = resize_check});
    add({"Softmax", "LogSoftmax"}, {.run = run_softmax});
    add({"LayerNormalization"}, {.since = 17, .run = run_layernorm, .check = layernorm_check});
    add({"GroupNormalization"}, {.since = 18, .run = run_groupnorm});
    add({"InstanceNormalization"}, {.run = run_instancenorm});
    add({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2"}, {.run = run_reduce});
    add({"ArgMax", "ArgMin"}, {.run = run_argreduce});
    add({"LSTM", "GRU", "RNN"}, {.run = run_recurrent, .check = recurrent_check});
    return t;
  }();
  return *table;
}

}  // namespace flux::onnx::detail
#endif
