// onnx::save: traces the op layer (src/trace.hpp) through two inference forwards, the second with the
// inputs' dynamic axes grown, and writes the ops of the first as an ONNX graph (ONNX's own protobuf
// classes). The second trace tells which sizes follow the dynamic axes (see flux/onnx.hpp).
#include "flux/onnx.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/onnx/onnx_common.hpp"
#include "src/ops/registry.hpp"
#include "src/trace.hpp"

#if FLUX_HAVE_ONNX

namespace flux::onnx {

bool available() { return true; }

namespace detail {
namespace {

using flux::detail::fail;

struct Trace {
  std::vector<Tensor> inputs, outputs;
  std::vector<trace::Event> events;
};

Trace run(const Forward& forward, const std::vector<Tensor>& inputs) {
  Trace t;
  t.inputs = inputs;
  trace::Events r;
  {
    autodiff::NoGrad inference;  // no tape: layers in automatic mode use their inference behaviour
    trace::Scope scope(&r);
    t.outputs = forward(inputs);
  }
  t.events = std::move(r.events);
  return t;
}

/// Where a tensor read by an op comes from.
struct Ref {
  enum Kind { none, input, param, event, constant } kind = none;
  int64_t index = -1;  // input number, param number, event number, or constant number (per trace)
  bool operator==(const Ref&) const = default;
};

/// Resolves every event's inputs and the outputs of one trace.
struct Resolved {
  std::vector<std::vector<Ref>> event_inputs;
  std::vector<Ref> outputs;
  std::vector<Tensor> constants;  // by constant number
};

Resolved resolve(const Trace& t, const std::unordered_map<const TensorImpl*, int64_t>& params) {
  Resolved r;
  std::unordered_map<const TensorImpl*, Ref> producer;
  for (size_t i = 0; i < t.inputs.size(); ++i) producer[t.inputs[i].impl()] = Ref{Ref::input, int64_t(i)};
  auto lookup = [&](const Tensor& x) -> Ref {
    if (!x.defined()) return Ref{};
    auto it = producer.find(x.impl());
    if (it != producer.end()) return it->second;
    auto p = params.find(x.impl());
    if (p != params.end()) return Ref{Ref::param, p->second};
    Ref c{Ref::constant, int64_t(r.constants.size())};
    r.constants.push_back(x);
    producer[x.impl()] = c;
    return c;
  };
  for (size_t k = 0; k < t.events.size(); ++k) {
    std::vector<Ref> in;
    for (const Tensor& x : t.events[k].inputs) in.push_back(lookup(x));
    r.event_inputs.push_back(std::move(in));
    producer[t.events[k].output.impl()] = Ref{Ref::event, int64_t(k)};
  }
  for (const Tensor& y : t.outputs) r.outputs.push_back(lookup(y));
  return r;
}

/// The ops the outputs depend on, in the order they ran.
std::vector<size_t> live_events(const Resolved& r) {
  std::vector<bool> live(r.event_inputs.size(), false);
  std::vector<size_t> todo;
  for (const Ref& x : r.outputs)
    if (x.kind == Ref::event) todo.push_back(size_t(x.index));
  while (!todo.empty()) {
    size_t k = todo.back();
    todo.pop_back();
    if (live[k]) continue;
    live[k] = true;
    for (const Ref& x : r.event_inputs[k])
      if (x.kind == Ref::event && !live[size_t(x.index)]) todo.push_back(size_t(x.index));
  }
  std::vector<size_t> out;
  for (size_t k = 0; k < live.size(); ++k)
    if (live[k]) out.push_back(k);
  return out;
}

/// A dimension as the exporter writes it: c + mul * dyn[a] (* dyn[b]), dyn = the inputs' dynamic axes.
struct DimExpr {
  int64_t constant = 0;  // the value when a < 0
  int a = -1, b = -1;
  int64_t mul = 1, add = 0;
};

struct DynAxis {
  int input, axis;
  int64_t s1, s2;
  std::string name;
};

void check_single_assignment(const ::onnx::GraphProto& g);

class Exporter final : public ops::OnnxGraph {
 public:
  Exporter(const std::vector<std::pair<std::string, Tensor>>& state, const SaveOptions& o) : opts_(o) {
    for (const auto& [name, t] : state)
      if (t.defined() && !param_index_.count(t.impl())) {
        param_index_[t.impl()] = int64_t(params_.size());
        params_.push_back({name, t});
      }
  }

  ::onnx::ModelProto build(const Forward& forward, const std::vector<Tensor>& inputs);

 private:
  // ---- graph building (ops::OnnxGraph, for the ops' writers in src/ops/registry.cpp) ----
  int64_t opset() const override { return opts_.opset; }
  std::string fresh(const std::string& stem) override { return stem + "_" + std::to_string(counter_++); }
  std::string node(const char* type, const std::vector<std::string>& in, const std::vector<Attr>& attrs = {},
                   const std::vector<std::string>& outs = {}) override {
    ::onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(type);
    n->set_name(std::string(type) + "_" + std::to_string(graph_->node_size() - 1));
    for (const auto& x : in) n->add_input(x);
    for (const auto& x : outs.empty() ? std::vector<std::string>{fresh(type)} : outs) n->add_output(x);
    using A = ::onnx::AttributeProto;
    for (const Attr& at : attrs) {
      auto* a = n->add_attribute();
      a->set_name(at.name);
      if (auto* i = std::get_if<int64_t>(&at.value)) a->set_type(A::INT), a->set_i(*i);
      else if (auto* f = std::get_if<double>(&at.value)) a->set_type(A::FLOAT), a->set_f(float(*f));
      else if (auto* w = std::get_if<std::string>(&at.value)) a->set_type(A::STRING), a->set_s(*w);
      else if (auto* t = std::get_if<DType>(&at.value)) a->set_type(A::INT), a->set_i(onnx_dtype(*t));
      else if (auto* x = std::get_if<Tensor>(&at.value)) a->set_type(A::TENSOR), tensor_proto(*x, "", a->mutable_t());
      else if (auto* v = std::get_if<std::vector<int64_t>>(&at.value)) a->set_type(A::INTS), a->mutable_ints()->Add(v->begin(), v->end());
      else if (auto* w = std::get_if<std::vector<std::string>>(&at.value)) a->set_type(A::STRINGS), a->mutable_strings()->Add(w->begin(), w->end());
    }
    return n->output(0);
  }
  std::string ints(const std::vector<int64_t>& v) override {
    std::string name = fresh("const_i64");
    auto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::INT64);
    t->add_dims(int64_t(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
    return name;
  }
  /// A Constant node, not an initialiser: importers (onnx::load too) make initialisers trainable
  /// parameters, and what the forward computed (an attention scale, GELU's constants) is not one.
  std::string constant(const Tensor& x) override { return node("Constant", {}, {{"value", x}}, {fresh("const")}); }
  std::string shape(const char* api, const Shape& s1, const Shape& s2, bool minus_one, const Shape* in1 = nullptr,
                    const Shape* in2 = nullptr) override;

  std::string const_i64_scalar(int64_t v) { return constant(Tensor::scalar(double(v), DType::i64)); }
  /// A scalar of dtype t (the dtype of the tensor it meets).
  std::string const_scalar(double v, DType t) { return constant(Tensor::scalar(v, t)); }

  // ---- dynamic dimensions ----
  std::optional<DimExpr> solve(int64_t v1, int64_t v2) const;
  std::string dim_value(const DimExpr& d);

  // ---- conversion ----
  std::string value_of(const Ref& r, const Ref& r2, const Tensor& t1, const Tensor& t2, size_t user_event);
  std::optional<std::string> shaped_constant(const Tensor& t1, const Tensor& t2);
  std::string scalar_dim(int64_t v1, int64_t v2);
  std::string near_param(size_t k) const;
  void check_user_names(size_t n_inputs) const;

  SaveOptions opts_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::unordered_map<const TensorImpl*, int64_t> param_index_;
  std::vector<DynAxis> dyn_;
  std::vector<std::string> input_names_;
  std::map<int, std::string> shape_of_input_;
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, std::string> dim_cache_;
  std::map<int64_t, std::string> constant_names_;
  std::vector<bool> param_written_;
  std::vector<std::string> event_names_;
  ::onnx::GraphProto* graph_ = nullptr;
  int64_t counter_ = 0;
  const Trace* t1_ = nullptr;
  const Resolved* r1_ = nullptr;
};

std::optional<DimExpr> Exporter::solve(int64_t v1, int64_t v2) const {
  if (v1 == v2) return DimExpr{v1};
  for (size_t a = 0; a < dyn_.size(); ++a)
    if (v1 == dyn_[a].s1 && v2 == dyn_[a].s2) return DimExpr{0, int(a)};
  for (size_t a = 0; a < dyn_.size(); ++a) {
    const DynAxis& d = dyn_[a];
    if (v1 - d.s1 == v2 - d.s2) return DimExpr{0, int(a), -1, 1, v1 - d.s1};
    if (v1 % d.s1 == 0 && v2 % d.s2 == 0 && v1 / d.s1 == v2 / d.s2) return DimExpr{0, int(a), -1, v1 / d.s1, 0};
  }
  for (size_t a = 0; a < dyn_.size(); ++a)
    for (size_t b = a; b < dyn_.size(); ++b) {
      int64_t p1 = dyn_[a].s1 * dyn_[b].s1, p2 = dyn_[a].s2 * dyn_[b].s2;
      if (v1 % p1 == 0 && v2 % p2 == 0 && v1 / p1 == v2 / p2) return DimExpr{0, int(a), int(b), v1 / p1, 0};
    }
  return std::nullopt;
}

std::string Exporter::dim_value(const DimExpr& d) {
  if (d.a < 0) return ints({d.constant});
  auto key = std::make_tuple(d.a, d.b, d.mul, d.add, int64_t(0));
  auto it = dim_cache_.find(key);
  if (it != dim_cache_.end()) return it->second;
  auto axis_value = [&](int a) {
    const DynAxis& x = dyn_[size_t(a)];
    std::string& shape = shape_of_input_[x.input];
    if (shape.empty()) shape = node("Shape", {input_names_[size_t(x.input)]});
    return node("Gather", {shape, ints({x.axis})});
  };
  std::string v = axis_value(d.a);
  if (d.b >= 0) v = node("Mul", {v, axis_value(d.b)});
  if (d.mul != 1) v = node("Mul", {v, ints({d.mul})});
  if (d.add != 0) v = node("Add", {v, ints({d.add})});
  dim_cache_[key] = v;
  return v;
}

std::string Exporter::shape(const char* api, const Shape& s1, const Shape& s2, bool minus_one, const Shape* in1, const Shape* in2) {
  if (s1.size() != s2.size())
    fail("[onnx::save] the ", api, " to ", to_string(s1), " has rank ", s1.size(), " at the second traced size (",
         to_string(s2), "): the forward's ranks must not depend on the input sizes");
  std::vector<int64_t> fixed;
  int varying = 0;
  for (int i = 0; i < s1.size(); ++i) varying += s1[i] != s2[i];
  if (varying == 0) return ints(s1.vec());
  if (minus_one && varying == 1) {
    for (int i = 0; i < s1.size(); ++i) fixed.push_back(s1[i] != s2[i] ? -1 : s1[i]);
    return ints(fixed);
  }
  std::vector<std::string> parts;
  for (int i = 0; i < s1.size(); ++i) {
    if (s1[i] == s2[i]) {
      parts.push_back(ints({s1[i]}));
      continue;
    }
    if (in1 && in2) {
      int j = i - (s1.size() - in1->size());
      if (j >= 0 && (*in1)[j] == s1[i] && (*in2)[j] == s2[i]) {
        parts.push_back(ints({1}));
        continue;
      }
    }
    std::optional<DimExpr> d = solve(s1[i], s2[i]);
    if (!d)
      fail("[onnx::save] the ", api, " to ", to_string(s1), " has dimension ", i, " of ", s1[i], " and ", s2[i],
           " at the two traced input sizes, which is no simple function of the inputs' dynamic axes");
    parts.push_back(dim_value(*d));
  }
  return node("Concat", parts, {{"axis", int64_t(0)}}, {fresh("shape")});
}

std::string Exporter::near_param(size_t k) const {
  // The layer path of the nearest parameter: read by op k or the ops before it on its inputs, else by
  // the first op after it that its value reaches (an op on the inputs alone, before any layer).
  auto layer = [&](const Ref& r) {
    const std::string& name = params_[size_t(r.index)].first;
    size_t dot = name.rfind('.');
    return dot == std::string::npos ? std::string("the model's top level") : "layer '" + name.substr(0, dot) + "'";
  };
  std::vector<size_t> todo{k};
  std::set<size_t> seen;
  for (size_t i = 0; i < todo.size() && i < 64; ++i) {
    size_t e = todo[i];
    if (!seen.insert(e).second) continue;
    for (const Ref& r : r1_->event_inputs[e]) {
      if (r.kind == Ref::param) return layer(r);
      if (r.kind == Ref::event) todo.push_back(size_t(r.index));
    }
  }
  std::set<size_t> reached{k};
  for (size_t e = k + 1; e < r1_->event_inputs.size(); ++e) {
    bool reads = false;
    for (const Ref& r : r1_->event_inputs[e]) reads = reads || (r.kind == Ref::event && reached.count(size_t(r.index)));
    if (!reads) continue;
    for (const Ref& r : r1_->event_inputs[e])
      if (r.kind == Ref::param) return "before " + layer(r);
    reached.insert(e);
  }
  return "the model's top level, on its inputs alone";
}

std::string Exporter::value_of(const Ref& r, const Ref& r2, const Tensor& t1, const Tensor& t2, size_t user) {
  switch (r.kind) {
    case Ref::none: return "";
    case Ref::input: return input_names_[size_t(r.index)];
    case Ref::event: return event_names_[size_t(r.index)];
    case Ref::param: {
      const auto& [name, t] = params_[size_t(r.index)];
      if (!param_written_[size_t(r.index)]) {
        tensor_proto(t, name, graph_->add_initializer());
        param_written_[size_t(r.index)] = true;
      }
      return name;
    }
    case Ref::constant: break;
  }
  auto it = constant_names_.find(r.index);
  if (it != constant_names_.end()) return it->second;
  const trace::Event& e = t1_->events[user];
  std::string name;
  if (r2.kind != Ref::constant)
    fail("[onnx::save] the op '", e.op->name, "' read a tensor made outside the traced ops at one traced size but not at the other");
  if (t1.shape() == t2.shape()) {
    if (host_bytes(t1) != host_bytes(t2))
      fail("[onnx::save] the op '", e.op->name, "' (", near_param(user), ") reads a tensor ", summary(t1),
           " that was computed from the input outside flux's ops (e.g. through Tensor::buffer() or a host copy); "
           "the exported graph cannot compute it. Build it from flux ops");
    name = constant(t1);
  } else {
    // A tensor whose shape follows the inputs (a zero initial state): fine when every element is one value.
    std::vector<double> a = to(t1, Device()).cast(DType::f64).to_vector<double>();
    std::vector<double> b = to(t2, Device()).cast(DType::f64).to_vector<double>();
    bool uniform = !a.empty() && !b.empty();
    for (double v : a) uniform = uniform && (v == a[0] || (std::isnan(v) && std::isnan(a[0])));
    for (double v : b) uniform = uniform && (v == a[0] || (std::isnan(v) && std::isnan(a[0])));
    if (!uniform) {
      if (auto made = shaped_constant(t1, t2)) {
        constant_names_[r.index] = *made;
        return *made;
      }
      fail("[onnx::save] the op '", e.op->name, "' (", near_param(user), ") reads a tensor of shape ", to_string(t1.shape()),
           " (", to_string(t2.shape()), " at the second traced size) made outside flux's ops from the input's size "
           "with varying values; only constant-filled tensors (zeros, full), positions (arange) and triangular "
           "masks (causal_mask) may follow the input's size");
    }
    name = node("ConstantOfShape", {shape("constant", t1.shape(), t2.shape(), false)}, {{"value", full(Shape{1}, a[0], t1.dtype())}},
                {fresh("filled")});
  }
  constant_names_[r.index] = name;
  return name;
}

std::string Exporter::scalar_dim(int64_t v1, int64_t v2) {
  auto d = solve(v1, v2);
  if (!d) fail("[onnx::save] a length ", v1, " (", v2, " at the second traced size) is no simple function of the inputs' dynamic axes");
  return node("Squeeze", {dim_value(*d)});
}

/// Tensors made outside flux's ops whose shape and values follow the input's size, in the two forms
/// models build from a length: positions (a + i d, arange) and triangular masks over the last two axes
/// (value A where j - i <= m, or >= m, else B; m fixed or offset by cols - rows, as causal_mask), written
/// as Range and comparison nodes so the graph computes them at any size. nullopt for anything else.
std::optional<std::string> Exporter::shaped_constant(const Tensor& t1, const Tensor& t2) {
  const DType t = t1.dtype();
  std::vector<double> a = to(t1, Device()).cast(DType::f64).to_vector<double>();
  std::vector<double> b = to(t2, Device()).cast(DType::f64).to_vector<double>();
  if (t1.ndim() != t2.ndim() || a.empty() || b.empty()) return std::nullopt;
  if (t1.ndim() == 1 && t != DType::boolean) {
    const double start = a[0], step = a.size() > 1 ? a[1] - a[0] : b.size() > 1 ? b[1] - b[0] : 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != start + double(i) * step) return std::nullopt;
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i] != start + double(i) * step) return std::nullopt;
    std::string range = node("Range", {const_i64_scalar(0), scalar_dim(t1.size(0), t2.size(0)), const_i64_scalar(1)});
    std::string v = node("Cast", {range}, {{"to", t}}, {fresh("positions")});
    if (step != 1) v = node("Mul", {v, const_scalar(step, t)});
    if (start != 0) v = node("Add", {v, const_scalar(start, t)});
    return v;
  }
  const int nd = t1.ndim();
  if (nd < 2) return std::nullopt;
  for (int i = 0; i < nd - 2; ++i)
    if (t1.shape()[i] != 1 || t2.shape()[i] != 1) return std::nullopt;
  // Per trace: the form (lower: A where j - i <= m; upper: A where j - i >= m) and m.
  auto form = [](const std::vector<double>& v, int64_t rows, int64_t cols, bool lower, int64_t* m) {
    const double on = v[0];
    bool found = false;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (v[size_t(i * cols + j)] == on) *m = found ? (lower ? std::max(*m, j - i) : std::min(*m, j - i)) : j - i, found = true;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const bool want_on = lower ? j - i <= *m : j - i >= *m;
        if ((v[size_t(i * cols + j)] == on) != want_on) return false;
      }
    return true;
  };
  const int64_t r1 = t1.shape()[nd - 2], c1 = t1.shape()[nd - 1], r2 = t2.shape()[nd - 2], c2 = t2.shape()[nd - 1];
  // Exactly two values, the one at (0, 0) ("on") and another.
  double off_value = a[0];
  for (double v : a)
    if (v != a[0]) off_value = v;
  bool two = b[0] == a[0];
  for (const auto* v : {&a, &b})
    for (double x : *v) two = two && (x == a[0] || x == off_value);
  if (!two) return std::nullopt;
  for (bool lower : {true, false}) {
    int64_t m1 = 0, m2 = 0;
    if (!form(a, r1, c1, lower, &m1) || !form(b, r2, c2, lower, &m2)) continue;
    const bool relative = m1 != m2;  // m = k0 + (cols - rows)
    const int64_t k0 = relative ? m1 - (c1 - r1) : m1;
    if (relative && m2 - (c2 - r2) != k0) continue;
    const std::string rows = scalar_dim(r1, r2), cols = scalar_dim(c1, c2);
    auto arange = [&](const std::string& n) { return node("Range", {const_i64_scalar(0), n, const_i64_scalar(1)}); };
    std::string diff = node("Sub", {node("Unsqueeze", {arange(cols), ints({0})}), node("Unsqueeze", {arange(rows), ints({1})})});
    std::string m = const_i64_scalar(k0);
    if (relative) m = node("Add", {node("Sub", {cols, rows}), m});
    std::string cond = node(lower ? "LessOrEqual" : "GreaterOrEqual", {diff, m});
    std::string v = node("Where", {cond, const_scalar(a[0], t), const_scalar(off_value, t)});
    if (nd > 2) {
      std::vector<int64_t> lead;
      for (int i = 0; i < nd - 2; ++i) lead.push_back(i);
      v = node("Unsqueeze", {v, ints(lead)});
    }
    return v;
  }
  return std::nullopt;
}

::onnx::ModelProto Exporter::build(const Forward& forward, const std::vector<Tensor>& inputs) {
  const char* api = "[onnx::save]";
  if (opts_.opset < 13 || opts_.opset > kMaxExportOpset)
    fail(api, " opset ", opts_.opset, " is not supported: this build writes opsets 13 to ", kMaxExportOpset, " (", kMaxOpset,
         ", the default, is the newest ONNX ", kOnnxVersion, "'s checker knows)");
  if (inputs.empty()) fail(api, " needs at least one example input");
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) fail(api, " example input ", i, " is an undefined tensor");
  if (!opts_.dynamic_axes.empty() && opts_.dynamic_axes.size() != inputs.size())
    fail(api, " dynamic_axes lists ", opts_.dynamic_axes.size(), " inputs but the model is called with ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = i < opts_.input_names.size() ? opts_.input_names[i] : (i ? "input_" + std::to_string(i) : "input");
    input_names_.push_back(name);
  }
  check_user_names(inputs.size());
  // The second trace's inputs: every dynamic axis grown by its rank in the list plus one (1 for the
  // first, 2 for the second, ...), so that two dynamic axes of equal size still differ there.
  std::vector<Tensor> grown;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int> axes = opts_.dynamic_axes.empty() ? std::vector<int>{0} : opts_.dynamic_axes[i];
    Tensor x = inputs[i];
    for (size_t j = 0; j < axes.size(); ++j) {
      if (x.ndim() == 0) fail(api, " input ", i, " is 0-dimensional: it has no axis ", axes[j], " to make dynamic");
      int a = axes[j] < 0 ? axes[j] + x.ndim() : axes[j];
      if (a < 0 || a >= x.ndim())
        fail(api, " dynamic axis ", axes[j], " is out of range for input ", i, " of shape ", to_string(x.shape()));
      const int64_t n = x.shape()[a], extra = int64_t(j) + 1;
      if (n == 0) fail(api, " input ", i, " has an empty dynamic axis ", a, " (shape ", to_string(x.shape()), ")");
      std::vector<int64_t> idx;
      for (int64_t r = 0; r < n + extra; ++r) idx.push_back(r % n);
      {
        autodiff::NoGrad outside;
        x = index_select(x, a, to(Tensor(idx, Shape{int64_t(idx.size())}), x.device()));
      }
      std::string dim_name = (a == 0 && j == 0 && (dyn_.empty() || (dyn_[0].s1 == n && dyn_[0].axis == 0)))
                                 ? "batch"
                                 : input_names_[i] + "_dim" + std::to_string(a);
      dyn_.push_back(DynAxis{int(i), a, n, n + extra, dim_name});
    }
    grown.push_back(x);
  }

  Trace t1 = run(forward, inputs);
  Trace t2 = run(forward, grown);
  if (t1.outputs.empty()) fail(api, " the model returned no tensor");
  Resolved r1 = resolve(t1, param_index_), r2 = resolve(t2, param_index_);
  t1_ = &t1;
  r1_ = &r1;
  if (t1.outputs.size() != t2.outputs.size())
    fail(api, " the model returned ", t1.outputs.size(), " tensors at the example's size and ", t2.outputs.size(),
         " with the dynamic axes grown");
  // Live ops: those the outputs depend on, in order; the two traces' live ops must correspond.
  std::vector<size_t> l1 = live_events(r1), l2 = live_events(r2);
  if (l1.size() != l2.size())
    fail(api, " the forward ran ", l1.size(), " ops at the example's size and ", l2.size(),
         " with the dynamic axes grown: export needs a forward whose ops do not depend on the input sizes");
  std::vector<int64_t> pos1(t1.events.size(), -1), pos2(t2.events.size(), -1);
  for (size_t p = 0; p < l1.size(); ++p) pos1[l1[p]] = int64_t(p), pos2[l2[p]] = int64_t(p);
  auto same_ref = [&](const Ref& x, const Ref& y) {
    if (x.kind != y.kind) return false;
    if (x.kind == Ref::event) return pos1[size_t(x.index)] == pos2[size_t(y.index)];
    return x.kind == Ref::constant || x.index == y.index;
  };
  for (size_t i = 0; i < t1.outputs.size(); ++i)
    if (!same_ref(r1.outputs[i], r2.outputs[i]))
      fail(api, " output ", i, " comes from different ops at the two traced input sizes");
  std::vector<size_t> partner(t1.events.size(), 0);
  for (size_t p = 0; p < l1.size(); ++p) {
    const size_t k = l1[p], k2 = l2[p];
    partner[k] = k2;
    const trace::Event &a = t1.events[k], &b = t2.events[k2];
    bool same = a.op == b.op && a.inputs.size() == b.inputs.size();
    for (size_t j = 0; same && j < a.inputs.size(); ++j) same = same_ref(r1.event_inputs[k][j], r2.event_inputs[k2][j]);
    if (!same)
      fail(api, " op ", k, " ('", a.op->name, "', ", near_param(k), ") reads different tensors at the two traced input sizes ('", b.op->name,
           "' there): export needs a forward whose ops do not depend on the input sizes");
    for (size_t j = 0; j < a.attrs.size(); ++j) {
      const std::string name = a.attrs[j].name;
      if (name == "shape" || name == "range") continue;  // written from the two traces
      if (a.attrs[j].ints != b.attrs[j].ints || a.attrs[j].floats != b.attrs[j].floats)
        fail(api, " the op '", a.op->name, "' (", near_param(k), ") has attribute '", name,
             "' that depends on the input size (a window over a dynamic axis?); make that axis static");
    }
  }
  std::ostringstream bad;
  int nbad = 0;
  for (size_t k : l1) {
    const ops::Op& op = *t1.events[k].op;
    if (!op.onnx && !op.write)
      bad << (nbad++ ? "; " : "") << "'" << op.name << "' (" << (op.no_onnx ? op.no_onnx : "no ONNX form") << ", " << near_param(k) << ")";
  }
  if (nbad) fail(api, " the model runs ", nbad, " op(s) with no ONNX form: ", bad.str());

  ::onnx::ModelProto model;
  model.set_ir_version(opts_.opset >= 21 ? 10 : opts_.opset >= 19 ? 9 : 8);  // the IR version each opset came with
  model.set_producer_name("flux-cpp");
  model.set_producer_version(kFluxVersion);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(opts_.opset);
  graph_ = model.mutable_graph();
  graph_->set_name("flux");
  param_written_.assign(params_.size(), false);
  event_names_.assign(t1.events.size(), "");
  auto value_info = [&](::onnx::ValueInfoProto* v, const std::string& name, const Tensor& a, const Tensor& b) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx_dtype(a.dtype()));
    auto* shape = tt->mutable_shape();
    for (int i = 0; i < a.ndim(); ++i) {
      auto* d = shape->add_dim();
      if (a.shape()[i] == b.shape()[i]) {
        d->set_dim_value(a.shape()[i]);
        continue;
      }
      std::optional<DimExpr> e = solve(a.shape()[i], b.shape()[i]);
      if (e && e->a >= 0 && e->b < 0 && e->mul == 1 && e->add == 0) d->set_dim_param(dyn_[size_t(e->a)].name);
      else d->set_dim_param(name + "_dim" + std::to_string(i));
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i) value_info(graph_->add_input(), input_names_[i], inputs[i], grown[i]);
  for (size_t k : l1) {
    const size_t k2 = partner[k];
    const trace::Event &e = t1.events[k], &e2 = t2.events[k2];
    try {  // every error names the layer path of the op it met
      std::vector<std::string> in;
      for (size_t j = 0; j < e.inputs.size(); ++j)
        in.push_back(value_of(r1.event_inputs[k][j], r2.event_inputs[k2][j], e.inputs[j], e2.inputs[j], k));
      event_names_[k] = "t" + std::to_string(k) + "_" + e.op->name;
      if (e.op->onnx) node(e.op->onnx, in, {}, {event_names_[k]});
      else e.op->write(*this, ops::Call{e, e2, in, event_names_[k]});
    } catch (const Error& err) {
      const std::string msg = err.what();
      if (msg.find("layer '") != std::string::npos || msg.find("top level") != std::string::npos) throw;
      fail(msg, " (the op '", e.op->name, "', ", near_param(k), ")");
    }
  }
  for (size_t i = 0; i < t1.outputs.size(); ++i) {
    std::string name = i < opts_.output_names.size() ? opts_.output_names[i] : (i ? "output_" + std::to_string(i) : "output");
    const Ref& r = r1.outputs[i];
    if (r.kind == Ref::none) fail(api, " output ", i, " of the model is an undefined tensor");
    std::string v = value_of(r, r2.outputs[i], t1.outputs[i], t2.outputs[i], 0);
    node("Identity", {v}, {}, {name});
    value_info(graph_->add_output(), name, t1.outputs[i], t2.outputs[i]);
  }
  if (opts_.output_names.size() > t1.outputs.size())
    fail(api, " output_names lists ", opts_.output_names.size(), " names but the model returns ", t1.outputs.size(),
         " tensor(s)");
  check_single_assignment(*graph_);
  return model;
}

// Names the user chose (SaveOptions::input_names, output_names) against each other and the weights',
// before anything is traced or written: onnx::load refuses a graph where one name means two values.
void Exporter::check_user_names(size_t n_inputs) const {
  const char* api = "[onnx::save]";
  if (opts_.input_names.size() > n_inputs)
    fail(api, " input_names lists ", opts_.input_names.size(), " names but the model is called with ", n_inputs,
         " input(s)");
  std::map<std::string, std::string> taken;  // name -> what it names
  for (const auto& [name, t] : params_) taken.emplace(name, "the model's weight '" + name + "'");
  auto claim = [&](const std::string& name, const std::string& what, const char* option) {
    if (name.empty()) fail(api, " ", option, " gives ", what, " an empty name");
    auto [it, fresh] = taken.emplace(name, what);
    if (!fresh)
      fail(api, " ", option, ": '", name, "' would name both ", it->second, " and ", what,
           "; every input, output and weight needs its own name (nothing was written)");
  };
  for (size_t i = 0; i < n_inputs; ++i) claim(input_names_[i], "input " + std::to_string(i), "input_names");
  for (size_t i = 0; i < opts_.output_names.size(); ++i)
    claim(opts_.output_names[i], "output " + std::to_string(i), "output_names");
}

// Every value of an ONNX graph is produced once (a graph input, an initialiser or one node output).
// The user's names are checked above; this catches a user name meeting a generated one ("const_3").
void check_single_assignment(const ::onnx::GraphProto& g) {
  std::map<std::string, int> produced;
  for (const auto& v : g.input()) ++produced[v.name()];
  for (const auto& t : g.initializer()) ++produced[t.name()];
  for (const auto& n : g.node())
    for (const auto& o : n.output()) ++produced[o];
  for (const auto& [name, count] : produced)
    if (count > 1)
      fail("[onnx::save] the name '", name, "' would name ", count, " values of the graph (an input or output name ",
           "meets one the exporter generates); choose other input_names/output_names (nothing was written)");
}

}  // namespace

void save_traced(const std::string& path, const Forward& forward, const std::vector<std::pair<std::string, Tensor>>& state,
                 const std::vector<Tensor>& inputs, const SaveOptions& options) {
  Exporter ex(state, options);
  ::onnx::ModelProto model = ex.build(forward, inputs);
  // External data: initialisers of 1 KiB and more in "<name>.data" beside the file (asked for, or needed
  // above protobuf's 2 GiB), written before the model that names it.
  if (options.external_data || model.ByteSizeLong() > (size_t(1) << 31) - (size_t(64) << 20)) {
    const size_t slash = path.find_last_of('/');
    const std::string location = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".data";
    std::string blob;
    for (auto& t : *model.mutable_graph()->mutable_initializer()) {
      if (t.raw_data().size() < 1024) continue;
      blob.resize((blob.size() + 63) / 64 * 64, '\0');  // 64-byte aligned, for readers that map the file
      const size_t offset = blob.size();
      blob += t.raw_data();
      t.clear_raw_data();
      t.set_data_location(::onnx::TensorProto::EXTERNAL);
      for (auto [k, v] : {std::pair<const char*, std::string>{"location", location}, {"offset", std::to_string(offset)},
                          {"length", std::to_string(blob.size() - offset)}}) {
        auto* e = t.add_external_data();
        e->set_key(k);
        e->set_value(v);
      }
    }
    write_file((slash == std::string::npos ? "" : path.substr(0, slash + 1)) + location, blob, "[onnx::save]");
  }
  write_model(path, model, "[onnx::save]");
}

}  // namespace detail
}  // namespace flux::onnx

#else  // built without ONNX

namespace flux::onnx {
bool available() { return false; }
namespace detail {
void save_traced(const std::string&, const Forward&, const std::vector<std::pair<std::string, Tensor>>&,
                 const std::vector<Tensor>&, const SaveOptions&) {
  flux::detail::fail("[onnx::save] this flux-cpp was built without ONNX (CMake FLUX_ONNX; on Debian 12: scripts/deps.sh onnx, "
                     "i.e. libonnx-dev libprotobuf-dev, then reconfigure)");
}
}  // namespace detail
}  // namespace flux::onnx

#endif
