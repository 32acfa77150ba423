// onnx::load: reads an ONNX file with ONNX's protobuf classes, checks it whole (opset, every operator
// and its attributes, the graph's wiring, every initialiser's data against its shape) and runs it as a
// layer: each node becomes flux ops on the device of its data, so autodiff records it like any layer.
// Integer "shape" values (Shape, Gather on shapes, Concat, ...) are small host tensors on the CPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <shared_mutex>
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
    std::vector<int> in, out;  // slots; -1 for an absent optional input / output
    // Fusion (load time): a Conv whose value only a BatchNormalization, then a Relu or a residual Add
    // (then a Relu) read runs them with it (conv_relu; conv_affine at inference). The chain runs at
    // the position of its last node (`head` there names the Conv's step: the residual is ready
    // then); the Conv's and the absorbed nodes' own steps are skipped.
    const ::onnx::NodeProto* bn = nullptr;
    std::vector<int> bn_in;
    int residual = -1, head = -1;
    bool relu = false, relu_after = false, skip = false;
  };
  std::vector<Step> steps;
  std::vector<int> input_slots, output_slots, param_slots, buffer_slots;
  std::vector<std::string> input_names, output_names;
  std::vector<std::string> input_shapes, output_shapes;
  // Folded BatchNorm (scale, shift) of fused Convs at inference, by the content stamps and offsets of
  // the statistics, BatchNorm parameters and conv bias (as the Conv + BatchNorm layers keep theirs):
  // five small ops per Conv per call otherwise, a fifth of ResNet-18's time at batch 1.
  mutable std::shared_mutex fold_mutex;  // lookups share it
  mutable std::map<std::array<uint64_t, 11>, std::pair<Tensor, Tensor>> folds;
};

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
double attr_f(const ::onnx::NodeProto& n, const char* name, double dflt) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::FLOAT);
  return a ? a->f() : dflt;
}
std::string attr_s(const ::onnx::NodeProto& n, const char* name, const std::string& dflt) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::STRING);
  return a ? a->s() : dflt;
}
std::vector<int64_t> attr_ints(const ::onnx::NodeProto& n, const char* name, std::vector<int64_t> dflt = {}) {
  const auto* a = attr(n, name, ::onnx::AttributeProto::INTS);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : dflt;
}

std::string where(const ::onnx::NodeProto& n) { return "node '" + n.name() + "' (" + n.op_type() + ")"; }

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

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

Tensor from_proto(const ::onnx::TensorProto& p, const std::string& context, const std::string& folder = "") {
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

std::vector<int64_t> host_ints(const Tensor& t, const ::onnx::NodeProto& n, const char* what) {
  if (!t.defined()) fail("[onnx] ", where(n), ": its input '", what, "' is missing");
  if (is_floating(t.dtype())) fail("[onnx] ", where(n), ": its input '", what, "' must be integer; got ", summary(t));
  if (t.numel() > (1 << 20)) fail("[onnx] ", where(n), ": its input '", what, "' has ", t.numel(), " values");
  return t.to_vector<int64_t>();
}

Tensor on(const Tensor& x, const Device& d) { return !x.defined() || x.device() == d ? x : to(x, d); }

/// The device where the op runs: that of its first input not on the CPU (data), else the CPU.
Device device_of(const std::vector<Tensor>& in) {
  for (const Tensor& t : in)
    if (t.defined() && !t.device().is_cpu()) return t.device();
  return Device();
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

Tensor in_or(const std::vector<Tensor>& in, size_t k) { return k < in.size() ? in[k] : Tensor(); }

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

/// A Conv with the BatchNormalization (bn: its 5 inputs) and/or Relu fused at load: at inference (no
/// tape, no trace) the backend's conv_affine with the statistics folded in (as the Conv + BatchNorm
/// layers fuse), else conv_relu, else the ops composed (what a tape records).
/// The folded (scale, shift) of a fused Conv's BatchNormalization (or ones and the conv bias), kept in g.
std::pair<Tensor, Tensor> folded(const Graph& g, const Tensor& s, const Tensor& sh, const Tensor& mean, const Tensor& var,
                                 const Tensor& b, double eps, int64_t channels, DType t, const Device& d) {
  const Tensor* parts[] = {&s, &sh, &mean, &var, &b};
  std::array<uint64_t, 11> key{};
  for (size_t i = 0; i < 5; ++i) {
    key[2 * i] = parts[i]->defined() ? flux::detail::content_version(*parts[i]) : 0;
    key[2 * i + 1] = parts[i]->defined() ? uint64_t(parts[i]->impl()->offset) : 0;
  }
  std::memcpy(&key[10], &eps, sizeof(double));
  {
    std::shared_lock<std::shared_mutex> lock(g.fold_mutex);
    auto it = g.folds.find(key);
    if (it != g.folds.end() && it->second.first.device() == d) return it->second;
  }
  Tensor scale, shift;
  if (s.defined()) {
    scale = s / sqrt(var + eps), shift = sh - mean * scale;
    if (b.defined()) shift = shift + b * scale;
  } else {
    scale = ones(Shape{channels}, t, d);
    shift = b.defined() ? b : zeros(Shape{channels}, t, d);
  }
  std::unique_lock<std::shared_mutex> lock(g.fold_mutex);
  if (g.folds.size() >= 1024) g.folds.clear();
  g.folds[key] = {scale, shift};
  return {scale, shift};
}

Tensor fused_conv(const Graph& g, const ::onnx::NodeProto& n, const std::vector<Tensor>& in, const ::onnx::NodeProto* bn_node,
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
    auto [scale, shift] = folded(g, s, sh, mean, var, b, eps, w.size(0), x.dtype(), d);
    Tensor y = flux::detail::conv_affine(x, w, scale, shift, residual, p, relu, relu_after);
    if (y.defined()) return y;
  }
  Tensor y = conv(x, w, b, p);
  if (bn_node) y = batchnorm(y, s, sh, mean, var, eps);
  if (relu) y = flux::relu(y);
  if (residual.defined()) y = y + residual;
  return relu_after ? flux::relu(y) : y;
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

/// The gate blocks of (G, ...) rows reordered: block b of the result is block order[b] of x.
Tensor gates(const Tensor& x, const std::vector<int64_t>& order, int64_t h) {
  std::vector<int64_t> rows;
  for (int64_t b : order)
    for (int64_t i = 0; i < h; ++i) rows.push_back(b * h + i);
  return index_select(x, 0, on(Tensor(rows, Shape{int64_t(rows.size())}), x.device()));
}

/// ONNX LSTM / GRU / RNN (forward, layout 0) on flux's recurrence ops: xg = X Wᵀ + Wb with the gate
/// blocks in PyTorch's order (flux's), then the recurrence with R and Rb likewise.
std::vector<Tensor> recurrent(const ::onnx::NodeProto& n, const std::vector<Tensor>& in) {
  const std::string& op = n.op_type();
  const bool lstm = op == "LSTM", gru = op == "GRU";
  const int64_t ngates = lstm ? 4 : gru ? 3 : 1;
  const Device dev = device_of(in);
  Tensor x = on(in[0], dev), w = on(in[1], dev), r = on(in[2], dev);
  if (!x.defined() || !w.defined() || !r.defined() || x.ndim() != 3 || w.ndim() != 3 || r.ndim() != 3 || w.size(0) != 1)
    fail("[onnx] ", where(n), ": needs X (T, N, I), W (1, G, I) and R (1, G, H)");
  if (in.size() > 4 && in[4].defined()) fail("[onnx] ", where(n), ": sequence_lens is not supported");
  const int64_t h = attr_i(n, "hidden_size", r.size(2)), steps = x.size(0), batch = x.size(1);
  const int64_t g = ngates * h;
  if (w.size(1) != g || r.size(1) != g || r.size(2) != h || w.size(2) != x.size(2))
    fail("[onnx] ", where(n), ": W ", to_string(w.shape()), " and R ", to_string(r.shape()), " do not fit hidden_size ", h,
         " and X ", to_string(x.shape()));
  // Flux's (PyTorch's) block b is ONNX's block order[b]: LSTM i f g o <- i o f c; GRU r z n <- z r h.
  const std::vector<int64_t> order = lstm ? std::vector<int64_t>{0, 2, 3, 1} : gru ? std::vector<int64_t>{1, 0, 2} : std::vector<int64_t>{0};
  Tensor wp = gates(w[0], order, h), rp = gates(r[0], order, h);
  Tensor xg = matmul(x, wp, false, true);
  Tensor rb;
  if (in.size() > 3 && in[3].defined()) {
    Tensor b = on(in[3], dev);
    if (b.shape() != Shape{1, 2 * g}) fail("[onnx] ", where(n), ": B must be (1, ", 2 * g, "); got ", to_string(b.shape()));
    xg = xg + gates(b[0].slice(0, g), order, h);
    rb = gates(b[0].slice(g, 2 * g), order, h);
  }
  auto state = [&](size_t k) {
    if (in.size() > k && in[k].defined()) {
      Tensor s = on(in[k], dev);
      if (s.shape() != Shape{1, batch, h}) fail("[onnx] ", where(n), ": initial state must be (1, ", batch, ", ", h, ")");
      return s[0];
    }
    return zeros(Shape{batch, h}, x.dtype(), dev);
  };
  Tensor h0 = state(5);
  if (lstm) {
    Tensor y = lstm_recurrence(xg, rp, rb, h0, state(6));  // rows h_1..h_T, then c_T
    return {y.slice(0, steps).reshape({steps, 1, batch, h}), y.slice(steps - 1, steps), y.slice(steps, steps + 1)};
  }
  Tensor y = gru ? gru_recurrence(xg, rp, rb, h0)
                 : rnn_recurrence(xg, rp, rb, h0, n.attribute_size() && attr(n, "activations", ::onnx::AttributeProto::STRINGS) &&
                                                      attr(n, "activations", ::onnx::AttributeProto::STRINGS)->strings(0) == "Relu");
  return {y.reshape({steps, 1, batch, h}), y.slice(steps - 1, steps)};
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

Tensor binary_op(const std::string& op, Tensor a, Tensor b) {
  const Device d = device_of({a, b});
  a = on(a, d), b = on(b, d);
  if (op == "Add") return add(a, b);
  if (op == "Sub") return sub(a, b);
  if (op == "Mul") return mul(a, b);
  if (op == "Div") {
    if (!is_floating(a.dtype()) && !is_floating(b.dtype()))  // ONNX integer division truncates
      return div(a, b).cast(DType::f64).cast(a.dtype());
    return div(a, b);
  }
  if (op == "Pow") return pow(a, b.cast(a.dtype()));
  if (op == "Max") return maximum(a, b);
  if (op == "Min") return minimum(a, b);
  if (op == "Equal") return eq(a, b);
  if (op == "Less") return lt(a, b);
  if (op == "Greater") return gt(a, b);
  if (op == "LessOrEqual") return le(a, b);
  return ge(a, b);
}

using Run = std::vector<Tensor> (*)(const ::onnx::NodeProto&, const std::vector<Tensor>&);

std::vector<Tensor> run_node(const ::onnx::NodeProto& n, const std::vector<Tensor>& in) {
  const std::string& op = n.op_type();
  auto need = [&](size_t k) -> const Tensor& {
    if (k >= in.size() || !in[k].defined()) fail("[onnx] ", where(n), ": its input ", k, " is missing");
    return in[k];
  };
  static const std::set<std::string> binary = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal",
                                               "Less", "Greater", "LessOrEqual", "GreaterOrEqual"};
  if (binary.count(op)) {
    Tensor y = binary_op(op, need(0), need(1));
    for (size_t k = 2; k < in.size() && (op == "Max" || op == "Min"); ++k) y = binary_op(op, y, need(k));
    return {y};
  }
  if (op == "Identity" || op == "Dropout") return {need(0)};
  if (op == "Relu") return {relu(need(0))};
  if (op == "Sigmoid") return {sigmoid(need(0))};
  if (op == "Tanh") return {flux::detail::tanh_op(need(0))};
  if (op == "Exp") return {exp(need(0))};
  if (op == "Log") return {log(need(0))};
  if (op == "Erf") return {erf(need(0))};
  if (op == "Sqrt") return {sqrt(need(0))};
  if (op == "Neg") return {neg(need(0))};
  if (op == "Abs") return {abs(need(0))};
  if (op == "Reciprocal") return {1.0 / need(0)};
  if (op == "LeakyRelu") return {leakyrelu(need(0), attr_f(n, "alpha", 0.01))};
  if (op == "Clip") {
    double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
    if (in.size() > 1 && in[1].defined()) lo = in[1].item<double>();
    if (in.size() > 2 && in[2].defined()) hi = in[2].item<double>();
    return {clamp(need(0), lo, hi)};
  }
  if (op == "Where") {
    const Device d = device_of(in);
    return {flux::where(on(need(0), d), on(need(1), d), on(need(2), d))};
  }
  if (op == "Constant") {
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
  if (op == "Shape") {
    const Tensor& x = need(0);
    const int r = x.ndim();
    int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r), end = std::clamp<int64_t>(end, start, r);
    std::vector<int64_t> dims(x.shape().begin() + start, x.shape().begin() + end);
    Tensor s(dims, Shape{int64_t(dims.size())});
    // Traced as an op (onnx::save of an imported model): the sizes follow the input.
    if (trace::active()) trace::emit("shape", {x}, s, {{"range", {start, end}, {}}});
    return {s};
  }
  if (op == "Gather") return {gather(need(0), need(1), attr_i(n, "axis", 0), n)};
  if (op == "Unsqueeze" || op == "Squeeze") {
    const Tensor& x = need(0);
    std::vector<int64_t> axes = in.size() > 1 && in[1].defined() ? host_ints(in[1], n, "axes") : std::vector<int64_t>{};
    return {x.reshape(squeezed_shape(x.shape(), axes, op == "Unsqueeze", n))};
  }
  if (op == "Concat") {
    const Device d = device_of(in);
    std::vector<Tensor> xs;
    for (const Tensor& t : in)
      if (t.defined()) xs.push_back(on(t, d));
    if (xs.empty()) fail("[onnx] ", where(n), ": nothing to concatenate");
    return {concat(xs, norm_axis(attr_i(n, "axis", 0), xs[0].ndim(), n))};
  }
  if (op == "Slice") {
    Tensor x = need(0);
    std::vector<int64_t> starts = host_ints(need(1), n, "starts"), ends = host_ints(need(2), n, "ends");
    std::vector<int64_t> axes = in.size() > 3 && in[3].defined() ? host_ints(in[3], n, "axes") : std::vector<int64_t>{};
    std::vector<int64_t> steps = in.size() > 4 && in[4].defined() ? host_ints(in[4], n, "steps") : std::vector<int64_t>{};
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
    if (ends.size() != starts.size() || axes.size() != starts.size() || (!steps.empty() && steps.size() != starts.size()))
      fail("[onnx] ", where(n), ": starts, ends, axes and steps differ in length");
    for (size_t i = 0; i < starts.size(); ++i) {
      if (!steps.empty() && steps[i] != 1) fail("[onnx] ", where(n), ": only step 1 is supported; got ", steps[i]);
      const int a = norm_axis(axes[i], x.ndim(), n);
      const int64_t len = x.shape()[a];
      auto clampi = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + len : v, 0, len); };
      const int64_t s = clampi(starts[i]), e = std::max(s, clampi(ends[i]));
      if (s != 0 || e != len) x = slice(x, a, s, e);
    }
    return {x};
  }
  if (op == "Reshape") {
    const Tensor& x = need(0);
    std::vector<int64_t> s = host_ints(need(1), n, "shape");
    if (attr_i(n, "allowzero", 0)) fail("[onnx] ", where(n), ": allowzero = 1 is not supported");
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] == 0) {
        if (int(i) >= x.ndim()) fail("[onnx] ", where(n), ": shape entry 0 at ", i, " beyond the input's rank");
        s[i] = x.shape()[int(i)];
      }
    return {x.reshape(Shape(s))};
  }
  if (op == "Flatten") {
    const Tensor& x = need(0);
    int64_t axis = attr_i(n, "axis", 1);
    if (axis < 0) axis += x.ndim();
    if (axis < 0 || axis > x.ndim()) fail("[onnx] ", where(n), ": axis ", axis, " out of range");
    int64_t outer = 1;
    for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
    return {x.reshape(Shape{outer, outer ? x.numel() / outer : 0})};
  }
  if (op == "Transpose") {
    const Tensor& x = need(0);
    std::vector<int64_t> p = attr_ints(n, "perm");
    std::vector<int> perm;
    for (int i = 0; i < x.ndim(); ++i) perm.push_back(p.empty() ? x.ndim() - 1 - i : int(p[size_t(i)]));
    if (!p.empty() && int(p.size()) != x.ndim()) fail("[onnx] ", where(n), ": perm has ", p.size(), " axes for rank ", x.ndim());
    return {permute(x, perm)};
  }
  if (op == "Expand") {
    const Tensor& x = need(0);
    std::vector<int64_t> s = host_ints(need(1), n, "shape");
    Shape target = flux::detail::broadcast_shapes("onnx Expand", x.shape(), checked_shape(s, n));
    checked_shape(target.vec(), n);
    return {broadcast_to(x, target)};
  }
  if (op == "ConstantOfShape") {
    Shape s = checked_shape(host_ints(need(0), n, "shape"), n);
    if (const auto* a = attr(n, "value", ::onnx::AttributeProto::TENSOR)) {
      Tensor v = from_proto(a->t(), "[onnx] " + where(n));
      if (v.numel() != 1) fail("[onnx] ", where(n), ": value must hold one element");
      return {full(s, v.item<double>(), v.dtype())};
    }
    return {zeros(s)};
  }
  if (op == "Cast") return {need(0).cast(flux_dtype(int32_t(attr_i(n, "to", 1)), "[onnx] " + where(n)))};
  if (op == "MatMul") {
    const Device d = device_of(in);
    return {matmul(on(need(0), d), on(need(1), d))};
  }
  if (op == "Gemm") {
    const Device d = device_of(in);
    Tensor a = on(need(0), d), b = on(need(1), d), c = on(in_or(in, 2), d);
    const bool ta = attr_i(n, "transA", 0), tb = attr_i(n, "transB", 0);
    const double alpha = attr_f(n, "alpha", 1.0), beta = attr_f(n, "beta", 1.0);
    if (!ta && tb && alpha == 1.0 && beta == 1.0 && c.defined() && c.ndim() == 1) {
      Tensor y = flux::detail::linear(a, b, c);  // Dense's fused path where the operands fit
      if (y.defined()) return {y};
    }
    Tensor y = matmul(a, b, ta, tb);
    if (alpha != 1.0) y = y * alpha;
    if (c.defined()) y = y + (beta != 1.0 ? c * beta : c);
    return {y};
  }
  if (op == "Conv") {
    const Device d = device_of(in);
    return {conv(on(need(0), d), on(need(1), d), on(in_or(in, 2), d), conv_params(n, in[1]))};
  }
  if (op == "BatchNormalization") {
    const Device d = device_of(in);
    return {batchnorm(on(need(0), d), on(need(1), d), on(need(2), d), on(need(3), d), on(need(4), d),
                      attr_f(n, "epsilon", 1e-5))};
  }
  if (op == "MaxPool" || op == "AveragePool") {
    const Tensor& x = need(0);
    std::vector<int64_t> k = attr_ints(n, "kernel_shape");
    const int spatial = int(k.size());
    PoolParams p;
    p.stride = Dims(attr_ints(n, "strides", std::vector<int64_t>(size_t(spatial), 1)));
    p.pad = pads_of(n, spatial);
    return {op == "MaxPool" ? maxpool(x, Dims(k), p) : meanpool(x, Dims(k), p)};
  }
  if (op == "GlobalAveragePool") return {global_meanpool(need(0))};
  if (op == "GlobalMaxPool") return {global_maxpool(need(0))};
  if (op == "Softmax" || op == "LogSoftmax") {
    const Tensor& x = need(0);
    const int a = norm_axis(attr_i(n, "axis", -1), x.ndim(), n);
    return {op == "Softmax" ? flux::detail::softmax_op(x, a) : flux::detail::logsoftmax_op(x, a)};
  }
  if (op == "LayerNormalization") {
    const Device d = device_of(in);
    Tensor x = on(need(0), d), scale = on(need(1), d), bias = on(in_or(in, 2), d);
    const int a = norm_axis(attr_i(n, "axis", -1), x.ndim(), n);
    int64_t inner = 1;
    for (int i = a; i < x.ndim(); ++i) inner *= x.shape()[i];
    if (scale.numel() != inner || (bias.defined() && bias.numel() != inner))
      fail("[onnx] ", where(n), ": scale and bias must hold ", inner, " values");
    Tensor y = layernorm(x.reshape(Shape{-1, inner}), scale.reshape(Shape{inner}),
                         bias.defined() ? bias.reshape(Shape{inner}) : Tensor(), attr_f(n, "epsilon", 1e-5));
    return {y.reshape(x.shape())};
  }
  if (op == "ReduceMean" || op == "ReduceSum") {
    const Tensor& x = need(0);
    std::vector<int64_t> axes = op == "ReduceSum" ? (in.size() > 1 && in[1].defined() ? host_ints(in[1], n, "axes") : std::vector<int64_t>{})
                                                  : attr_ints(n, "axes");
    const bool keep = attr_i(n, "keepdims", 1);
    std::vector<int> a;
    for (int64_t v : axes) a.push_back(norm_axis(v, x.ndim(), n));
    if (a.empty())
      for (int i = 0; i < x.ndim(); ++i) a.push_back(i);
    std::sort(a.rbegin(), a.rend());
    Tensor y = x;
    for (int v : a) y = op == "ReduceMean" ? mean(y, v, true) : sum(y, v, true);
    if (!keep) {
      std::vector<int64_t> s;
      for (int i = 0; i < x.ndim(); ++i)
        if (std::find(a.begin(), a.end(), i) == a.end()) s.push_back(x.shape()[i]);
      y = y.reshape(Shape(s));
    }
    return {y};
  }
  if (op == "LSTM" || op == "GRU" || op == "RNN") return recurrent(n, in);
  fail("[onnx] ", where(n), ": no implementation");  // load() refused such nodes already
}

/// run_node with every failure a flux::Error naming the node: the ops' own errors (which name the op
/// and shapes, not the node) get the node's name in front; a standard exception (std::bad_alloc,
/// std::out_of_range, ...) from anywhere beneath becomes one. flux::OutOfMemory passes unchanged.
std::vector<Tensor> run_checked(const ::onnx::NodeProto& n, const std::vector<Tensor>& in) {
  try {
    return run_node(n, in);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    if (std::strstr(e.what(), "[onnx] node '")) throw;
    fail("[onnx] ", where(n), ": ", e.what());
  } catch (const std::exception& e) {
    fail("[onnx] ", where(n), ": ", e.what(), " (a C++ exception inside the importer: please report it)");
  }
}

/// The operators run_node implements, and a load-time check of each node's attributes ("" when fine).
const std::map<std::string, std::string (*)(const ::onnx::NodeProto&)>& operators() {
  static const auto* ops = [] {
    auto* m = new std::map<std::string, std::string (*)(const ::onnx::NodeProto&)>();
    auto fine = [](const ::onnx::NodeProto&) { return std::string(); };
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
                           "GreaterOrEqual", "Identity", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Erf", "Sqrt", "Neg", "Abs",
                           "Reciprocal", "LeakyRelu", "Clip", "Where", "Constant", "Shape", "Gather", "Unsqueeze", "Squeeze",
                           "Concat", "Slice", "Reshape", "Flatten", "Transpose", "Expand", "ConstantOfShape", "Cast",
                           "MatMul", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Softmax", "LogSoftmax",
                           "LayerNormalization", "ReduceMean", "ReduceSum"})
      (*m)[op] = fine;
    (*m)["Dropout"] = [](const ::onnx::NodeProto& n) {
      return n.input_size() > 2 && !n.input(2).empty() ? std::string("a training_mode input (only inference Dropout)")
                                                       : std::string();
    };
    (*m)["Conv"] = [](const ::onnx::NodeProto& n) {
      std::string pad = attr_s(n, "auto_pad", "NOTSET");
      return pad == "NOTSET" || pad == "VALID" ? std::string() : "auto_pad " + pad + " (explicit pads only)";
    };
    (*m)["BatchNormalization"] = [](const ::onnx::NodeProto& n) {
      return attr_i(n, "training_mode", 0) || n.output_size() > 1 ? std::string("training_mode (inference form only)")
                                                                   : std::string();
    };
    auto pool = [](const ::onnx::NodeProto& n) {
      if (attr_ints(n, "kernel_shape").empty()) return std::string("no kernel_shape");
      if (attr_i(n, "ceil_mode", 0)) return std::string("ceil_mode 1");
      std::string pad = attr_s(n, "auto_pad", "NOTSET");
      if (pad != "NOTSET" && pad != "VALID") return "auto_pad " + pad;
      for (int64_t d : attr_ints(n, "dilations"))
        if (d != 1) return std::string("dilations other than 1");
      if (n.output_size() > 1 && !n.output(1).empty()) return std::string("the Indices output");
      if (n.op_type() == "AveragePool" && !attr_i(n, "count_include_pad", 0))
        for (int64_t p : attr_ints(n, "pads"))
          if (p != 0) return std::string("count_include_pad 0 with padding");
      return std::string();
    };
    (*m)["MaxPool"] = pool;
    (*m)["AveragePool"] = pool;
    auto rnn = [](const ::onnx::NodeProto& n) {
      if (attr_s(n, "direction", "forward") != "forward") return "direction " + attr_s(n, "direction", "");
      if (attr_i(n, "layout", 0) != 0) return std::string("layout 1");
      if (attr(n, "clip", ::onnx::AttributeProto::FLOAT)) return std::string("clip");
      if (n.op_type() == "GRU" && attr_i(n, "linear_before_reset", 0) != 1)
        return std::string("linear_before_reset 0 (PyTorch's GRU exports 1)");
      if (n.op_type() == "LSTM" && (attr_i(n, "input_forget", 0) || (n.input_size() > 7 && !n.input(7).empty())))
        return std::string("peepholes or input_forget");
      if (const auto* a = attr(n, "activations", ::onnx::AttributeProto::STRINGS)) {
        std::vector<std::string> want = n.op_type() == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                      : n.op_type() == "GRU"  ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                              : std::vector<std::string>{"Tanh"};
        std::vector<std::string> got(a->strings().begin(), a->strings().end());
        if (n.op_type() == "RNN" && got == std::vector<std::string>{"Relu"}) return std::string();
        if (got != want) return std::string("activations other than the defaults");
      }
      return std::string();
    };
    (*m)["LSTM"] = rnn;
    (*m)["GRU"] = rnn;
    (*m)["RNN"] = rnn;
    return m;
  }();
  return *ops;
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
  for (const auto& [op, check] : detail::operators()) out.push_back(op);
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
  for (const auto& o : m.opset_import()) {
    if (!o.domain().empty() && o.domain() != "ai.onnx")
      fail(api, ": operator set domain '", o.domain(), "' is not supported (only the default ONNX domain)");
    g->opset = o.version();
  }
  if (g->opset == 0) fail(api, ": the file imports no ONNX opset");
  if (g->opset > detail::kMaxOpset)
    fail(api, ": opset ", g->opset, " is newer than this build supports (opset ", detail::kMaxOpset, ", ONNX ",
         detail::kOnnxVersion, "); export it with opset_version=", detail::kMaxOpset);
  if (g->opset < 11) fail(api, ": opset ", g->opset, " is older than this importer reads (11 to ", detail::kMaxOpset, ")");
  const ::onnx::GraphProto& graph = m.graph();
  // Every unsupported operator (or attribute) at once, each with its node name.
  std::ostringstream bad;
  int nbad = 0;
  for (const auto& n : graph.node()) {
    std::string why;
    if (!n.domain().empty() && n.domain() != "ai.onnx") why = "domain '" + n.domain() + "'";
    else if (auto it = detail::operators().find(n.op_type()); it == detail::operators().end()) why = "unsupported operator";
    else {
      try {
        why = it->second(n);
      } catch (const Error& e) {
        why = e.what();
      }
    }
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
    if (is_floating(v.dtype()) && !statistics.count(t.name())) {
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
    if (at.skip && at.head < 0) continue;
    const auto& step = at.head >= 0 ? g.steps[size_t(at.head)] : at;  // a fused chain runs at its last node
    in.clear();
    for (int s : step.in) in.push_back(s < 0 ? Tensor() : v[size_t(s)]);
    std::vector<Tensor> out;
    if (at.head >= 0) {
      bn.clear();
      for (int s : step.bn_in) bn.push_back(s < 0 ? Tensor() : v[size_t(s)]);
      out = {detail::fused_conv(g, *step.node, in, step.bn, bn, step.relu,
                                step.residual >= 0 ? v[size_t(step.residual)] : Tensor(), step.relu_after)};
    } else {
      out = detail::run_checked(*step.node, in);
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
