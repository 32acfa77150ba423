// onnx::load: reads an ONNX file with ONNX's protobuf classes, checks it whole (opset and IR version,
// every operator against the one table in import_ops.cpp, the graph's wiring, every initialiser's data
// against its shape and the memory it needs) and runs it as a layer: each node's runner turns it into
// flux ops on the device of its data, so autodiff records it like any layer; Conv, Gemm + Relu and
// attention chains are fused here (Graph::Step, Graph::Chain).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "flux/nn/activations.hpp"
#include "flux/onnx.hpp"
#include "flux/out_of_memory.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/onnx/import_ops.hpp"
#include "src/onnx/onnx_common.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/trace.hpp"

#if FLUX_HAVE_ONNX

namespace flux::onnx {

namespace detail {

using flux::detail::fail;

struct Graph {
  ::onnx::ModelProto proto;
  std::string context;
  int64_t opset = 0;
  int nslots = 0;
  struct Step {
    const ::onnx::NodeProto* node = nullptr;
    const Operator* op = nullptr;  // the node's entry in operator_table(), found at load
    std::vector<int> in, out;  // slots; -1 for an absent optional input / output
    // Fusion (load time): a Conv whose value only a BatchNormalization, then a Relu or a residual Add
    // (then a Relu) read runs them with it (conv_relu; conv_affine at inference). The chain runs at
    // the position of its last node (`head` there names the Conv's step: the residual is ready
    // then); the Conv's and the absorbed nodes' own steps are skipped.
    const ::onnx::NodeProto* bn = nullptr;
    std::vector<int> bn_in;
    int residual = -1, head = -1;
    bool relu = false, relu_after = false, skip = false;
    int chain = -1;  // the last member of chains[chain]: the chain runs here
  };
  std::vector<Step> steps;
  // Fusion (load time) of other chains: Gemm + Relu as Dense's fused linear, and attention
  // (Mul by a constant scale, MatMul with a transposed K, Softmax on the last axis, MatMul with V, then
  // optionally the heads joined by Transpose [0, 2, 1, 3]) as the fused attention kernel, its Q, K and
  // V read in place from the projection (N, T, 3, H, d) where they are its Transpose [2, 0, 3, 1, 4],
  // Slice and Reshape. Each runs at its last member's position; where its fast path does not apply at
  // run time (shapes, a tape without the kernel, an ONNX trace), its members run one by one instead.
  struct Source {  // one of attention's Q, K, V
    int slot = -1;     // (B, H, T, d); or, when part >= 0, the projection (N, T, S, H, d)
    int64_t part = -1;  // which of the S parts (the Slice on axis 0 of the Transpose)
    bool to_end = false;  // the Slice's end is past the axis: part must be the last
    int target = -1;    // the Reshape's shape input (checked at run time)
  };
  struct Chain {
    bool attention = false;  // else Gemm + Relu
    std::vector<int> members;  // steps, in graph order
    Source q, k, v;
    double scale = 1.0;
    bool heads_last = false;  // the output is written (B, T, H, dv): the Transpose after was fused
  };
  std::vector<Chain> chains;
  std::vector<int> input_slots, output_slots, param_slots, buffer_slots;
  std::vector<std::string> input_names, output_names;
  std::vector<std::string> input_shapes, output_shapes;
};

namespace {

// ---- tensors ----
Tensor host_tensor(Shape shape, DType t, const void* data, size_t bytes) {
  Tensor out = Tensor::empty(shape, t);
  if (bytes) out.backend().copy_from_host(0, flux::detail::buffer_of(out), data, bytes);
  return out;
}

/// A TensorProto's tensor (on the CPU), its data checked against its shape: the data must be in the
/// file, so what is allocated is bounded by the file's size.
/// A tensor kept in an external data file (ONNX's external_data: location relative to the model's
/// folder, offset, length), checked against the file's size and against the memory the CPU can give
/// (a sparse file may declare terabytes) before it is allocated, then read straight into the tensor.
Tensor external_tensor(const ::onnx::TensorProto& p, const std::string& folder, const Shape& shape, DType t,
                       const std::string& what) {
  const size_t bytes = size_t(shape.numel()) * dtype_size(t);
  if (folder.empty())
    fail(what, " keeps its data in an external file: load the model with onnx::load(path), which knows its folder");
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      fail(what, ": external_data '", kv.key(), "' = '", kv.value(), "' is not a number");
    }
  }
  if (location.empty() || location[0] == '/' || location.find("..") != std::string::npos)
    fail(what, ": external data location '", location, "' must be a file name relative to the model's folder");
  if (offset < 0 || (length >= 0 && size_t(length) != bytes))
    fail(what, ": external data offset ", offset, ", length ", length, "; its shape and type need ", bytes, " bytes");
  const std::string file = folder + "/" + location;
  std::ifstream f(file, std::ios::binary | std::ios::ate);
  if (!f) fail(what, ": cannot open its external data file '", file, "'");
  const auto size = int64_t(f.tellg());
  if (size < 0 || offset > size || int64_t(bytes) > size - offset)
    fail(what, ": external data file '", file, "' holds ", size, " bytes; the tensor needs ", bytes, " at offset ", offset);
  const backend::MemoryInfo m = Device().memory();
  if (bytes > m.total - std::min(m.total, m.used))
    fail(what, ": its shape ", to_string(shape), " and type ", dtype_name(t), " need ", OutOfMemory::bytes_text(bytes),
         "; the CPU can give at most ", OutOfMemory::bytes_text(m.total - std::min(m.total, m.used)),
         " (its memory or FLUX_CPU_MEMORY_LIMIT, less what tensors hold)");
  Tensor out = Tensor::empty(shape, t);  // flux::OutOfMemory where the system refuses
  f.seekg(offset);
  std::string chunk;
  backend::Buffer dst = flux::detail::buffer_of(out);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, size_t(64) << 20);
    chunk.resize(n);
    if (!f.read(chunk.data(), std::streamsize(n))) fail(what, ": cannot read its external data from '", file, "'");
    out.backend().copy_from_host(0, {dst.handle, dst.offset + done}, chunk.data(), n);
    done += n;
  }
  return out;
}

}  // namespace

Tensor from_proto(const ::onnx::TensorProto& p, const std::string& context, const std::string& folder) {
  const std::string what = context + ": tensor '" + p.name() + "'";
  const bool external = p.data_location() == ::onnx::TensorProto::EXTERNAL;
  if (!external && p.external_data_size() > 0) fail(what, " has external_data entries but its data_location is DEFAULT");
  if (p.has_segment()) fail(what, " is segmented, which this importer does not read");
  const DType t = flux_dtype(p.data_type(), what);
  if (p.dims_size() > int(backend::kMaxDims)) fail(what, " has ", p.dims_size(), " dimensions; flux supports up to ", backend::kMaxDims);
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (int64_t d : p.dims()) {
    if (d < 0) fail(what, " has a negative dimension ", d);
    if (d > 0 && numel > (int64_t(1) << 40) / d) fail(what, " has more elements than any file could hold");
    numel *= d;
    dims.push_back(d);
  }
  const Shape shape(dims);
  const size_t size = dtype_size(t), bytes = size_t(numel) * size;
  if (external) return external_tensor(p, folder, shape, t, what);
  if (p.has_raw_data()) {
    if (p.raw_data().size() != bytes)
      fail(what, " holds ", p.raw_data().size(), " bytes of data; its shape ", to_string(shape), " and type ",
           dtype_name(t), " need ", bytes);
    return host_tensor(shape, t, p.raw_data().data(), bytes);
  }
  auto count_check = [&](int64_t n) {
    if (n != numel) fail(what, " holds ", n, " values; its shape ", to_string(shape), " needs ", numel);
  };
  switch (t) {
    case DType::f32:
      count_check(p.float_data_size());
      return host_tensor(shape, t, p.float_data().data(), bytes);
    case DType::f64:
      count_check(p.double_data_size());
      return host_tensor(shape, t, p.double_data().data(), bytes);
    case DType::i64:
      count_check(p.int64_data_size());
      return host_tensor(shape, t, p.int64_data().data(), bytes);
    case DType::i32:
      count_check(p.int32_data_size());
      return host_tensor(shape, t, p.int32_data().data(), bytes);
    default: {  // int32_data holds the narrower types, one per value
      count_check(p.int32_data_size());
      std::vector<uint8_t> raw(bytes);
      for (int64_t i = 0; i < numel; ++i) {
        const uint32_t v = uint32_t(p.int32_data(int(i)));
        std::memcpy(raw.data() + size_t(i) * size, &v, size);  // little-endian: the low bytes
      }
      return host_tensor(shape, t, raw.data(), bytes);
    }
  }
}

namespace {

/// A Conv with the BatchNormalization (bn: its 5 inputs) and/or Relu fused at load: at inference (no
/// tape, no trace) the backend's conv_affine with the statistics folded in (as the Conv + BatchNorm
/// layers fuse), else conv_relu, else the ops composed (what a tape records).
Tensor fused_conv(const ::onnx::NodeProto& n, const std::vector<Tensor>& in, const ::onnx::NodeProto* bn_node,
                  const std::vector<Tensor>& bn, bool relu, Tensor residual, bool relu_after) {
  const Device d = device_of(in);
  if (in.size() < 2 || !in[0].defined() || !in[1].defined()) fail("[onnx] ", where(n), ": needs X and W");
  Tensor x = on(in[0], d), w = on(in[1], d), b = on(in_or(in, 2), d);
  residual = on(residual, d);
  const ConvParams p = conv_params(n, w);
  if (!bn_node && !residual.defined()) return flux::detail::conv_relu(x, w, b, p);
  Tensor s, sh, mean, var;
  double eps = 0;
  if (bn_node) {
    for (size_t k = 1; k < 5; ++k)
      if (k >= bn.size() || !bn[k].defined()) fail("[onnx] ", where(*bn_node), ": its input ", k, " is missing");
    s = on(bn[1], d), sh = on(bn[2], d), mean = on(bn[3], d), var = on(bn[4], d);
    eps = attr_f(*bn_node, "epsilon", 1e-5);
  }
  if (!autodiff::recording() && !trace::active() && w.dtype() == x.dtype() && (!bn_node || s.dtype() == x.dtype())) {
    // The BatchNormalization (or ones and the conv bias) folded once, kept with var or w (fold_batchnorm).
    auto [scale, shift] = flux::detail::fold_batchnorm(s, sh, mean, var, eps, b, w);
    Tensor y = flux::detail::conv_affine(x, w, scale, shift, residual, p, relu, relu_after);
    if (y.defined()) return y;
  }
  Tensor y = conv(x, w, b, p);
  if (bn_node) y = batchnorm(y, s, sh, mean, var, eps);
  if (relu) y = flux::relu(y);
  if (residual.defined()) y = y + residual;
  return relu_after ? flux::relu(y) : y;
}

/// A node's runner with every failure a flux::Error naming the node: the ops' own errors (which name
/// the op and shapes, not the node) get the node's name in front; a standard exception (std::bad_alloc,
/// std::out_of_range, ...) from anywhere beneath becomes one. flux::OutOfMemory passes unchanged.
std::vector<Tensor> run_checked(const ::onnx::NodeProto& n, const Operator& op, int64_t opset, const std::vector<Tensor>& in) {
  try {
    return op.run({n, opset, op.entry}, in);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    if (std::strstr(e.what(), "[onnx] node '")) throw;
    fail("[onnx] ", where(n), ": ", e.what());
  } catch (const std::exception& e) {
    fail("[onnx] ", where(n), ": ", e.what(), " (a C++ exception inside the importer: please report it)");
  }
}

// ---- the other fused chains (Graph::Chain) ----

std::vector<int64_t> ints_attribute(const ::onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute())
    if (a.name() == name && a.type() == ::onnx::AttributeProto::INTS) return {a.ints().begin(), a.ints().end()};
  return {};
}

/// Finds the Gemm + Relu and attention chains (Graph::Chain) among the steps no Conv chain took.
void find_chains(Graph& g, const ::onnx::GraphProto& graph, const std::unordered_map<std::string, int>& slot) {
  const size_t ns = size_t(g.nslots);
  std::vector<int> uses(ns, 0), producer(ns, -1);
  std::vector<std::vector<int>> readers(ns);
  for (size_t i = 0; i < g.steps.size(); ++i) {
    const Graph::Step& st = g.steps[i];
    for (int s : st.in)
      if (s >= 0) ++uses[size_t(s)], readers[size_t(s)].push_back(int(i));
    if (!st.skip && st.head < 0)
      for (int s : st.out)
        if (s >= 0) producer[size_t(s)] = int(i);
  }
  for (const auto& o : graph.output())
    if (auto it = slot.find(o.name()); it != slot.end()) uses[size_t(it->second)] += 2;
  std::vector<char> taken(g.steps.size(), 0);
  auto free_step = [&](int i, const char* op) {
    if (i < 0) return false;
    const Graph::Step& st = g.steps[size_t(i)];
    return !taken[size_t(i)] && !st.skip && st.head < 0 && st.out.size() == 1 && st.node->op_type() == op;
  };
  // The step of type `op` that makes s, when s is read by one step alone.
  auto made_by = [&](int s, const char* op) {
    return s >= 0 && uses[size_t(s)] == 1 && free_step(producer[size_t(s)], op) ? producer[size_t(s)] : -1;
  };
  // The one step that reads s, as its first input, when it is of type `op`.
  auto only_reader = [&](int s, const char* op) {
    if (s < 0 || uses[size_t(s)] != 1 || !free_step(readers[size_t(s)][0], op)) return -1;
    const int r = readers[size_t(s)][0];
    return g.steps[size_t(r)].in[0] == s ? r : -1;
  };
  auto in_at = [&](int i, size_t k) { return k < g.steps[size_t(i)].in.size() ? g.steps[size_t(i)].in[k] : -1; };
  auto perm = [&](int i) { return ints_attribute(*g.steps[size_t(i)].node, "perm"); };
  // A value known at load: an initialiser or a Constant node's value (host tensor), else undefined.
  auto constant = [&](int s) -> Tensor {
    if (s < 0) return Tensor();
    for (const auto& t : graph.initializer())
      if (slot.at(t.name()) == s)
        return t.data_location() == ::onnx::TensorProto::EXTERNAL ? Tensor() : from_proto(t, g.context);
    const int p = producer[size_t(s)];
    if (p >= 0 && g.steps[size_t(p)].node->op_type() == "Constant")
      for (const auto& a : g.steps[size_t(p)].node->attribute())
        if (a.name() == "value" && a.type() == ::onnx::AttributeProto::TENSOR) return from_proto(a.t(), g.context);
    return Tensor();
  };
  auto scalar = [&](int s, double* value) {
    Tensor t = constant(s);
    if (!t.defined() || t.numel() != 1 || !is_floating(t.dtype())) return false;
    *value = t.item<double>();
    return true;
  };
  auto ints = [&](int s, std::vector<int64_t>* value) {
    Tensor t = constant(s);
    if (!t.defined() || is_floating(t.dtype()) || t.numel() > 8) return false;
    *value = t.to_vector<int64_t>();
    return true;
  };
  auto add_chain = [&](Graph::Chain c) {
    std::sort(c.members.begin(), c.members.end());
    for (int m : c.members) taken[size_t(m)] = 1, g.steps[size_t(m)].skip = true;
    g.steps[size_t(c.members.back())].chain = int(g.chains.size());
    g.chains.push_back(std::move(c));
  };
  for (size_t i = 0; i < g.steps.size(); ++i) {
    if (!free_step(int(i), "Gemm")) continue;
    if (const int r = only_reader(g.steps[i].out[0], "Relu"); r >= 0) {
      Graph::Chain c;
      c.members = {int(i), r};
      add_chain(std::move(c));
    }
  }
  if (g.opset < 13) return;  // Softmax over the last axis alone from opset 13
  for (size_t i = 0; i < g.steps.size(); ++i) {
    if (!free_step(int(i), "Softmax")) continue;
    const int64_t axis = [&] {
      for (const auto& a : g.steps[i].node->attribute())
        if (a.name() == "axis") return a.i();
      return int64_t(-1);
    }();
    const int scores = made_by(in_at(int(i), 0), "MatMul"), product = only_reader(g.steps[i].out[0], "MatMul");
    if ((axis != -1 && axis != 3) || scores < 0 || product < 0 || in_at(product, 1) == g.steps[i].out[0]) continue;
    const int kt = made_by(in_at(scores, 1), "Transpose");
    if (kt < 0 || perm(kt) != std::vector<int64_t>{0, 1, 3, 2}) continue;
    Graph::Chain c;
    c.attention = true, c.members = {scores, int(i), product, kt};
    int q = in_at(scores, 0);
    if (const int mul = made_by(q, "Mul"); mul >= 0) {  // q * scale (either order)
      for (size_t k = 0; k < 2; ++k)
        if (scalar(in_at(mul, k), &c.scale)) {
          q = in_at(mul, 1 - k), c.members.push_back(mul);
          break;
        }
    } else if (const int div = made_by(q, "Div"); div >= 0 && scalar(in_at(div, 1), &c.scale) && c.scale != 0) {
      c.scale = 1.0 / c.scale, q = in_at(div, 0), c.members.push_back(div);
    }
    if (q == in_at(scores, 0) && c.members.size() == 4) c.scale = 1.0;  // no scale node
    if (const int joined = only_reader(g.steps[size_t(product)].out[0], "Transpose");
        joined >= 0 && perm(joined) == std::vector<int64_t>{0, 2, 1, 3})
      c.heads_last = true, c.members.push_back(joined);
    c.q.slot = q, c.k.slot = in_at(kt, 0), c.v.slot = in_at(product, 1);
    // Q, K and V as parts of one projection: Reshape(Slice(Transpose(R, [2, 0, 3, 1, 4]), axis 0, [p, p + 1])).
    std::vector<int> split;
    Graph::Source parts[3];
    int heads = -1;
    for (int k = 0; k < 3; ++k) {
      const Graph::Source& src = k == 0 ? c.q : k == 1 ? c.k : c.v;
      const int reshape = made_by(src.slot, "Reshape");
      const int sl = reshape < 0 ? -1 : made_by(in_at(reshape, 0), "Slice");
      std::vector<int64_t> starts, ends, axes, steps{1};
      if (sl < 0 || !ints(in_at(sl, 1), &starts) || !ints(in_at(sl, 2), &ends) || !ints(in_at(sl, 3), &axes) ||
          (in_at(sl, 4) >= 0 && !ints(in_at(sl, 4), &steps)) || starts.size() != 1 || ends.size() != 1 ||
          axes != std::vector<int64_t>{0} || steps != std::vector<int64_t>{1} || starts[0] < 0 ||
          (ends[0] != starts[0] + 1 && ends[0] < (int64_t(1) << 31)))
        break;
      const int t = producer[size_t(in_at(sl, 0))];
      if (t < 0 || (heads >= 0 && t != heads) || !free_step(t, "Transpose") || perm(t) != std::vector<int64_t>{2, 0, 3, 1, 4})
        break;
      heads = t;
      parts[k] = {.slot = in_at(t, 0), .part = starts[0], .to_end = ends[0] != starts[0] + 1, .target = in_at(reshape, 1)};
      split.push_back(reshape), split.push_back(sl);
    }
    if (split.size() == 6 && uses[size_t(g.steps[size_t(heads)].out[0])] == 3) {
      c.q = parts[0], c.k = parts[1], c.v = parts[2];
      c.members.insert(c.members.end(), split.begin(), split.end());
      c.members.push_back(heads);
    }
    add_chain(std::move(c));
  }
}

/// One plain step: its runner on its inputs, its outputs stored.
void run_step(const Graph& g, const Graph::Step& step, std::vector<Tensor>& v) {
  std::vector<Tensor> in;
  for (int s : step.in) in.push_back(s < 0 ? Tensor() : v[size_t(s)]);
  std::vector<Tensor> out = run_checked(*step.node, *step.op, g.opset, in);
  for (size_t k = 0; k < step.out.size(); ++k) {
    if (step.out[k] < 0) continue;
    if (k >= out.size()) fail("[onnx::Model] ", where(*step.node), ": output ", k, " is not supported");
    v[size_t(step.out[k])] = out[k];
  }
}

/// A chain's fast path (Graph::Chain); false when it does not apply to these values (the caller then
/// runs the members). Its output is stored in the last member's output slot.
bool run_chain(const Graph& g, const Graph::Chain& c, std::vector<Tensor>& v) {
  auto value = [&](int s) { return s < 0 ? Tensor() : v[size_t(s)]; };
  const Graph::Step& last = g.steps[size_t(c.members.back())];
  if (!c.attention) {
    const Graph::Step& gemm = g.steps[size_t(c.members[0])];
    Tensor a = value(gemm.in[0]), b = value(gemm.in.size() > 1 ? gemm.in[1] : -1), bias = value(gemm.in.size() > 2 ? gemm.in[2] : -1);
    if (!a.defined() || !b.defined()) return false;
    const Device d = device_of({a, b, bias});
    Tensor y = gemm_linear(*gemm.node, on(a, d), on(b, d), on(bias, d), true);
    if (!y.defined()) return false;
    v[size_t(last.out[0])] = y;
    return true;
  }
  // Each of Q, K, V as (b0, b1, rows, width) and its view.
  struct Part {
    int64_t b0 = 0, b1 = 0, rows = 0, width = 0;
    flux::detail::AttentionView view;
  };
  auto part = [&](const Graph::Source& s, Part* p) {
    const Tensor x = value(s.slot);
    if (!x.defined()) return false;
    const Shape& sh = x.shape();
    if (s.part < 0) {  // (B, H, T, d), contiguous
      if (x.ndim() != 4) return false;
      *p = {sh[0], sh[1], sh[2], sh[3], {x, 0, {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3]}}};
      return true;
    }
    // The projection (N, T, S, H, d): part s.part of its axis 2, read as (N, H, T, d).
    if (x.ndim() != 5 || s.part >= sh[2] || (s.to_end && s.part + 1 != sh[2])) return false;
    const Tensor target = value(s.target);
    if (!target.defined() || is_floating(target.dtype()) || target.numel() != 4) return false;
    const std::vector<int64_t> want = target.to_vector<int64_t>(), dims{sh[0], sh[3], sh[1], sh[4]};
    for (size_t k = 0; k < 4; ++k)
      if (want[k] != dims[k] && want[k] != -1) return false;
    *p = {sh[0], sh[3], sh[1], sh[4], {x, s.part * sh[3] * sh[4], {sh[1] * sh[2] * sh[3] * sh[4], sh[4], sh[2] * sh[3] * sh[4]}}};
    return true;
  };
  Part q, k, w;
  if (!part(c.q, &q) || !part(c.k, &k) || !part(c.v, &w)) return false;
  if (q.b0 != k.b0 || q.b0 != w.b0 || q.b1 != k.b1 || q.b1 != w.b1 || q.width != k.width || k.rows != w.rows) return false;
  backend::Attention a;
  a.b0 = q.b0, a.b1 = q.b1, a.tq = q.rows, a.tk = k.rows, a.d = q.width, a.dv = w.width, a.scale = c.scale;
  if (c.heads_last) a.o_stride[0] = a.tq * a.b1 * a.dv, a.o_stride[1] = a.dv, a.o_stride[2] = a.b1 * a.dv;
  else a.o_stride[0] = a.b1 * a.tq * a.dv, a.o_stride[1] = a.tq * a.dv, a.o_stride[2] = a.dv;
  const Shape out = c.heads_last ? Shape{a.b0, a.tq, a.b1, a.dv} : Shape{a.b0, a.b1, a.tq, a.dv};
  Tensor y = flux::detail::fused_attention(q.view, k.view, w.view, Tensor(), a, out);
  if (!y.defined()) return false;
  v[size_t(last.out[0])] = y;
  return true;
}

std::string shape_string(const ::onnx::ValueInfoProto& v) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return "(?)";
  std::string s = "(";
  const auto& dims = v.type().tensor_type().shape().dim();
  for (int i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].has_dim_value() ? std::to_string(dims[i].dim_value()) : dims[i].dim_param().empty() ? "?" : dims[i].dim_param();
  }
  return s + ")";
}

}  // namespace
}  // namespace detail

using detail::fail;

std::vector<std::string> supported_operators() {
  std::vector<std::string> out;
  for (const auto& [op, entry] : detail::operator_table()) out.push_back(op);
  return out;
}

namespace {
Model parse(const std::string& bytes, const std::string& context, const std::string& folder);
}

Model load_from_bytes(const std::string& bytes, const std::string& context) { return parse(bytes, context, ""); }

namespace {
Model parse_unchecked(const std::string& bytes, const std::string& context, const std::string& folder);

/// parse_unchecked with any standard exception from beneath (protobuf, the allocator) a flux::Error.
Model parse(const std::string& bytes, const std::string& context, const std::string& folder) {
  try {
    return parse_unchecked(bytes, context, folder);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("[onnx::load] ", context, ": ", e.what(), " while reading the model");
  }
}

Model parse_unchecked(const std::string& bytes, const std::string& context, const std::string& folder) {
  auto g = std::make_shared<detail::Graph>();
  g->context = context;
  const std::string api = "[onnx::load] " + context;
  if (bytes.size() > size_t(INT32_MAX)) fail(api, ": ", bytes.size(), " bytes, over protobuf's 2 GiB limit");
  if (!g->proto.ParseFromArray(bytes.data(), int(bytes.size())))
    fail(api, ": not an ONNX model (protobuf could not parse its ", bytes.size(), " bytes: truncated or corrupt?)");
  const ::onnx::ModelProto& m = g->proto;
  if (!m.has_graph()) fail(api, ": the file holds no graph");
  // The default domain's opset; other domains may be imported (exporters list some they do not use),
  // but a node from one is refused below. Newer protobuf fields (IR 9, 10) are kept as unknown fields.
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") g->opset = o.version();
  if (g->opset == 0) fail(api, ": the file imports no default-domain (ai.onnx) opset");
  if (g->opset > detail::kMaxImportOpset || g->opset < detail::kMinImportOpset)
    fail(api, ": opset ", g->opset, " is ", g->opset > detail::kMaxImportOpset ? "newer" : "older",
         " than this importer reads (opsets ", detail::kMinImportOpset, " to ", detail::kMaxImportOpset, ")");
  if (m.ir_version() > detail::kMaxIrVersion)
    fail(api, ": IR version ", m.ir_version(), " is newer than this importer reads (up to ", detail::kMaxIrVersion, ")");
  const ::onnx::GraphProto& graph = m.graph();
  // Every unsupported operator (or attribute) at once, each with its node name.
  std::ostringstream bad;
  int nbad = 0;
  std::vector<const detail::Operator*> ops;
  for (const auto& n : graph.node()) {
    std::string why;
    const detail::Operator* op = nullptr;
    if (!n.domain().empty() && n.domain() != "ai.onnx") why = "domain '" + n.domain() + "'";
    else if (auto it = detail::operator_table().find(n.op_type()); it == detail::operator_table().end()) why = "unsupported operator";
    else if (g->opset < it->second.since || g->opset > it->second.until)
      why = "this importer reads it in opsets " + std::to_string(it->second.since) + " to " + std::to_string(it->second.until) +
            "; the file's is " + std::to_string(g->opset);
    else {
      op = &it->second;
      try {
        if (op->check) why = op->check({n, g->opset});
      } catch (const Error& e) {
        why = e.what();
      }
    }
    ops.push_back(op);
    if (!why.empty()) bad << (nbad++ ? ", " : "") << n.op_type() << " (node '" << n.name() << "': " << why << ")";
  }
  if (nbad)
    fail(api, ": ", nbad, " node(s) this importer cannot run: ", bad.str(), ". Supported operators: see onnx::supported_operators()");
  // Wiring: slots for initialisers, inputs and node outputs; every use after its definition.
  std::unordered_map<std::string, int> slot;
  auto define = [&](const std::string& name, const char* what) {
    if (name.empty()) fail(api, ": a ", what, " has an empty name");
    if (!slot.emplace(name, g->nslots).second) fail(api, ": the name '", name, "' is defined twice");
    return g->nslots++;
  };
  Model model;
  if (graph.sparse_initializer_size()) fail(api, ": sparse initialisers are not supported");
  std::set<std::string> statistics;  // BatchNormalization's mean and var: NonTrainable
  for (const auto& n : graph.node())
    if (n.op_type() == "BatchNormalization")
      for (int k = 3; k < n.input_size() && k < 5; ++k) statistics.insert(n.input(k));
  for (const auto& t : graph.initializer()) {
    Tensor v = detail::from_proto(t, api, folder);
    int s = define(t.name(), "initialiser");
    // Exporters write constants (attention scales, GELU's factors, masks' fill values) as one-element
    // initialisers with generated names (PyTorch 2: "val_67"); parameters keep their module path
    // ("proj.bias"), so a one-element tensor is trainable only when its name has one. Tensors holding
    // infinities or NaN (attention masks the exporter folded: 0 and -inf) are constants too.
    const bool floating = is_floating(v.dtype());
    const bool constant = floating && ((v.numel() == 1 && (v.shape().empty() || t.name().find('.') == std::string::npos)) ||
                                       (v.numel() > 0 && std::isnan(sum(v * 0.0).item<double>())));
    if (floating && !statistics.count(t.name()) && !constant) {
      model.parameters.emplace_back(t.name(), v);
      g->param_slots.push_back(s);
    } else {
      model.buffers.emplace_back(t.name(), NonTrainable(v));
      g->buffer_slots.push_back(s);
    }
  }
  for (const auto& v : graph.input()) {
    if (slot.count(v.name())) continue;  // an initialiser listed as an input (older exporters)
    g->input_slots.push_back(define(v.name(), "graph input"));
    g->input_names.push_back(v.name());
    g->input_shapes.push_back(detail::shape_string(v));
  }
  for (const auto& n : graph.node()) {
    detail::Graph::Step step;
    step.node = &n;
    step.op = ops[g->steps.size()];
    for (const auto& name : n.input()) {
      if (name.empty()) {
        step.in.push_back(-1);
        continue;
      }
      auto it = slot.find(name);
      if (it == slot.end())
        fail(api, ": node '", n.name(), "' (", n.op_type(), ") reads '", name, "' before anything defines it");
      step.in.push_back(it->second);
    }
    for (const auto& name : n.output()) step.out.push_back(name.empty() ? -1 : define(name, "node output"));
    g->steps.push_back(step);
  }
  // Fusion: Conv -> BatchNormalization -> Relu chains whose intermediate values nothing else reads.
  {
    std::vector<int> uses(size_t(g->nslots), 0), user(size_t(g->nslots), -1);
    for (size_t i = 0; i < g->steps.size(); ++i)
      for (int s : g->steps[i].in)
        if (s >= 0) ++uses[size_t(s)], user[size_t(s)] = int(i);
    for (const auto& v : graph.output())
      if (auto it = slot.find(v.name()); it != slot.end()) uses[size_t(it->second)] += 2;
    auto sole_reader = [&](int s, const char* op) -> detail::Graph::Step* {
      if (s < 0 || uses[size_t(s)] != 1) return nullptr;
      detail::Graph::Step& r = g->steps[size_t(user[size_t(s)])];
      if (r.node->op_type() != op || r.in.empty() || r.in[0] != s || r.out.size() != 1 || r.skip) return nullptr;
      return &r;
    };
    auto index_of = [&](const detail::Graph::Step* s) { return int(s - g->steps.data()); };
    for (size_t i = 0; i < g->steps.size(); ++i) {
      auto& step = g->steps[i];
      if (step.node->op_type() != "Conv" || step.out.size() != 1 || step.skip) continue;
      int last = int(i);
      auto constant = [&](int s) {  // an initialiser: defined before the Conv runs
        return std::find(g->param_slots.begin(), g->param_slots.end(), s) != g->param_slots.end() ||
               std::find(g->buffer_slots.begin(), g->buffer_slots.end(), s) != g->buffer_slots.end();
      };
      auto* bn = sole_reader(step.out[0], "BatchNormalization");
      if (bn && bn->in.size() >= 5 && constant(bn->in[1]) && constant(bn->in[2]) && constant(bn->in[3]) && constant(bn->in[4])) {
        step.bn = bn->node, step.bn_in = bn->in, step.out = bn->out, bn->skip = true, last = index_of(bn);
      }
      const int s = step.out[0];
      if (auto* r = sole_reader(s, "Relu")) {
        step.relu = true, step.out = r->out, r->skip = true, last = index_of(r);
      } else if (s >= 0 && uses[size_t(s)] == 1) {
        auto& a = g->steps[size_t(user[size_t(s)])];  // a residual Add: conv + other, in either order
        // (not an Add another chain took already: both operands of a downsampling block's Add are chains)
        if (a.node->op_type() == "Add" && !a.skip && a.in.size() == 2 && a.out.size() == 1 && (a.in[0] == s) != (a.in[1] == s)) {
          step.residual = a.in[0] == s ? a.in[1] : a.in[0];
          step.out = a.out, a.skip = true, last = index_of(&a);
          if (auto* r = sole_reader(step.out[0], "Relu")) step.relu_after = true, step.out = r->out, r->skip = true, last = index_of(r);
        }
      }
      if (last != int(i)) {
        g->steps[size_t(last)].head = int(i);
        step.skip = true;
      }
    }
  }
  detail::find_chains(*g, graph, slot);
  if (graph.output_size() == 0) fail(api, ": the graph has no output");
  for (const auto& v : graph.output()) {
    auto it = slot.find(v.name());
    if (it == slot.end()) fail(api, ": graph output '", v.name(), "' is never computed");
    g->output_slots.push_back(it->second);
    g->output_names.push_back(v.name());
    g->output_shapes.push_back(detail::shape_string(v));
  }
  model.graph = g;
  return model;
}
}  // namespace

Model load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("[onnx::load] cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f.good() && !f.eof()) fail("[onnx::load] cannot read '", path, "'");
  const size_t slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  return parse(ss.str(), "'" + path + "'", folder);
}

std::vector<Tensor> Model::forward(const std::vector<Tensor>& inputs) const {
  if (!graph) fail("[onnx::Model] the model is empty (default-constructed); make it with onnx::load");
  const detail::Graph& g = *graph;
  if (inputs.size() != g.input_slots.size())
    fail("[onnx::Model] ", g.context, " takes ", g.input_slots.size(), " input(s); got ", inputs.size());
  std::vector<Tensor> v(size_t(g.nslots));
  for (size_t i = 0; i < parameters.size() && i < g.param_slots.size(); ++i) v[size_t(g.param_slots[i])] = parameters[i].second;
  for (size_t i = 0; i < buffers.size() && i < g.buffer_slots.size(); ++i) v[size_t(g.buffer_slots[i])] = buffers[i].second;
  for (size_t i = 0; i < inputs.size(); ++i) v[size_t(g.input_slots[i])] = inputs[i];
  std::vector<Tensor> in;
  std::vector<Tensor> bn;
  for (const auto& at : g.steps) {
    if (at.chain >= 0) {
      const detail::Graph::Chain& c = g.chains[size_t(at.chain)];
      if (!detail::run_chain(g, c, v))
        for (int m : c.members) detail::run_step(g, g.steps[size_t(m)], v);
      continue;
    }
    if (at.skip && at.head < 0) continue;
    const auto& step = at.head >= 0 ? g.steps[size_t(at.head)] : at;  // a fused chain runs at its last node
    in.clear();
    for (int s : step.in) in.push_back(s < 0 ? Tensor() : v[size_t(s)]);
    std::vector<Tensor> out;
    if (at.head >= 0) {
      bn.clear();
      for (int s : step.bn_in) bn.push_back(s < 0 ? Tensor() : v[size_t(s)]);
      out = {detail::fused_conv(*step.node, in, step.bn, bn, step.relu,
                                step.residual >= 0 ? v[size_t(step.residual)] : Tensor(), step.relu_after)};
    } else {
      out = detail::run_checked(*step.node, *step.op, g.opset, in);
    }
    for (size_t k = 0; k < step.out.size(); ++k) {
      if (step.out[k] < 0) continue;
      if (k >= out.size()) fail("[onnx::Model] ", detail::where(*step.node), ": output ", k, " is not supported");
      v[size_t(step.out[k])] = out[k];
    }
  }
  std::vector<Tensor> out;
  for (int s : g.output_slots) out.push_back(v[size_t(s)]);
  return out;
}

Tensor Model::operator()(const Tensor& x) const { return forward({x})[0]; }

std::vector<std::string> Model::input_names() const { return graph ? graph->input_names : std::vector<std::string>{}; }
std::vector<std::string> Model::output_names() const { return graph ? graph->output_names : std::vector<std::string>{}; }

std::string Model::summary() const {
  if (!graph) return "onnx::Model()";
  std::map<std::string, int> counts;
  for (const auto& s : graph->steps) ++counts[s.node->op_type()];
  std::vector<std::pair<int, std::string>> sorted;
  for (const auto& [op, c] : counts) sorted.emplace_back(-c, op);
  std::sort(sorted.begin(), sorted.end());
  std::ostringstream os;
  os << "onnx::Model(" << graph->context << ": " << graph->steps.size() << " nodes (";
  for (size_t i = 0; i < sorted.size(); ++i) os << (i ? ", " : "") << sorted[i].second << " × " << -sorted[i].first;
  os << "), opset " << graph->opset;
  int fused = 0;
  for (const auto& s : graph->steps) fused += s.head >= 0;
  if (fused) os << ", " << fused << " Conv fused with their BatchNormalization/Relu/residual Add";
  int attention = 0;
  for (const auto& c : graph->chains) attention += c.attention;
  if (attention) os << ", " << attention << " attention fused";
  if (graph->chains.size() > size_t(attention)) os << ", " << graph->chains.size() - size_t(attention) << " Gemm fused with their Relu";
  os << "; ";
  for (size_t i = 0; i < graph->input_names.size(); ++i)
    os << (i ? ", " : "") << graph->input_names[i] << " " << graph->input_shapes[i];
  os << " -> ";
  for (size_t i = 0; i < graph->output_names.size(); ++i)
    os << (i ? ", " : "") << graph->output_names[i] << " " << graph->output_shapes[i];
  int64_t np = 0, nb = 0;
  for (const auto& [name, t] : parameters) np += t.numel();
  for (const auto& [name, t] : buffers) nb += is_floating(t.dtype()) ? t.numel() : 0;
  os << ")  # " << np << " parameters";
  if (nb) os << ", plus " << nb << " non-trainable";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Model& m) { return os << m.summary(); }

}  // namespace flux::onnx

#else  // built without ONNX

namespace flux::onnx {
namespace {
[[noreturn]] void unavailable() {
  flux::detail::fail("[onnx::load] this flux-cpp was built without ONNX (CMake FLUX_ONNX; on Debian 12: scripts/deps.sh onnx, "
                     "i.e. libonnx-dev libprotobuf-dev, then reconfigure)");
}
}  // namespace
namespace detail {
struct Graph {};
}  // namespace detail
Model load(const std::string&) { unavailable(); }
Model load_from_bytes(const std::string&, const std::string&) { unavailable(); }
std::vector<std::string> supported_operators() { return {}; }
std::vector<Tensor> Model::forward(const std::vector<Tensor>&) const { unavailable(); }
Tensor Model::operator()(const Tensor&) const { unavailable(); }
std::vector<std::string> Model::input_names() const { return {}; }
std::vector<std::string> Model::output_names() const { return {}; }
std::string Model::summary() const { return "onnx::Model()"; }
std::ostream& operator<<(std::ostream& os, const Model& m) { return os << m.summary(); }
}  // namespace flux::onnx

#endif
