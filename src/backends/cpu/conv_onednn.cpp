// Convolution through oneDNN (float32, and bf16 with float32 accumulation where the CPU has bf16 units):
// forward with fused bias / relu / BatchNorm affine + residual, data gradient, weight + bias gradient.
// bf16: activations and weights bf16; the bias enters the kernel as float32 (reordered from the
// caller's bf16), the fused BatchNorm's scale and shift are float32 (conv.cpp converts them), and the
// weight and bias gradients are computed in float32 and rounded to bf16 once, after the chunks' sum.
//   x (N, C, in...), w (O, C / G, k...) = (G, O / G, C / G, k...), y (N, O, out...), all plain
//   row-major (oneDNN's ncw/nchw/ncdhw and (g)oi(h)(w)); up to 3 spatial axes, unused ones 1.
// Primitives are created once per geometry and then only read (read_mostly.hpp): any number of
// threads run one at once, each binding its own buffers and scratch memory (onednn.hpp). Layout:
// with plain memory descriptors oneDNN 2.6 picks its gemm kernel; with format_tag::any its blocked
// direct kernels, whose operands are reordered into and out of its layout on every call (the weights
// of an inference forward once, kept prepared in the weight tensor's cache: prepared.hpp). "auto"
// asks for `any` when C / G * prod(kernel) >= 64, and for a dense conv on 1-3 channels keeps the
// source plain and lets oneDNN choose dst/weights (LibTorch's choice); FLUX_ONEDNN_LAYOUT=plain|any|
// plain-src forces one. Each call splits its batch (or, for one image, its output channels) over our
// pool, one oneDNN call per thread on a one-thread OpenMP team (onednn.hpp says why).
#include "src/backends/cpu/cpu_backend.hpp"

#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "src/backends/cpu/onednn.hpp"
#include "src/backends/cpu/onednn_relu.hpp"
#include "src/backends/cpu/prepared.hpp"
#include "src/backends/cpu/read_mostly.hpp"
#include "src/environment.hpp"

namespace flux::cpu_backend {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

bool is_forward(ConvKind k) { return k == ConvKind::forward || k == ConvKind::forward_relu || k == ConvKind::forward_affine; }

using Key = std::array<int64_t, 32>;

/// The primitive's key: kind, bias, geometry, dtype and which post-ops the epilogue asks (not its arrays).
Key make_key(ConvKind kind, bool bias, const backend::ConvGeometry& g, const ConvEpilogue& ep, DType dt) {
  Key k{};
  k[k.size() - 1] = int64_t(ep.relu) | int64_t(ep.residual != nullptr) << 1 | int64_t(ep.relu_after) << 2;
  k[k.size() - 2] = int64_t(dt);
  size_t i = 0;
  k[i++] = int64_t(kind), k[i++] = bias, k[i++] = g.spatial, k[i++] = g.batch, k[i++] = g.in_channels;
  k[i++] = g.out_channels, k[i++] = g.groups;
  for (int a = 0; a < g.spatial; ++a) {
    k[i++] = g.in[a], k[i++] = g.out[a], k[i++] = g.kernel[a], k[i++] = g.stride[a];
    k[i++] = g.pad_lo[a], k[i++] = g.pad_hi[a], k[i++] = g.dilation[a];
  }
  return k;
}

constexpr int kNoArgument = -1;

/// One primitive argument: its plain (user) layout and the layout the primitive chose, with the
/// reorder between them when they differ (plain -> chosen for an input, back for an output).
struct Operand {
  int arg = 0;  // kNoArgument: read by a reorder, not by the primitive
  bool input = true;
  int scales = -1;  // >= 0: the reorder multiplies output channel o by operand[scales][o] (runtime output scales)
  memory::desc plain, inner;
  dnnl::reorder reorder;
  bool reordered = false;
};

/// How a fused forward adds its residual: not at all, or by oneDNN's sum post-op (the residual is
/// first written into the destination, reordered to its layout).
enum class Residual { none, sum };

struct Entry {
  uint64_t id = next_id();  // names the entry for the per-thread memory objects (bound_of)
  static uint64_t next_id() {
    static std::atomic<uint64_t> n{1};
    return n.fetch_add(1, std::memory_order_relaxed);
  }
  dnnl::primitive primitive;
  memory::desc scratchpad;
  std::vector<Operand> operands;
  Residual residual = Residual::none;
  Operand residual_operand;  // plain (N, O, out...) residual -> the destination's layout
  bool relu = false;         // relu over the destination after the kernel (onednn_relu.hpp)
};

struct Config {
  int layout = 0;  // FLUX_ONEDNN_LAYOUT: 0 auto, 1 plain, 2 any, 3 plain-src (dst/weights any)
  bool pool_threading = true;  // false (FLUX_ONEDNN_THREADING=omp): one call on an OpenMP team
  Config() {
    const std::string v = environment::choice("FLUX_ONEDNN_LAYOUT");
    layout = v == "plain" ? 1 : v == "any" ? 2 : v == "plain-src" ? 3 : 0;
    pool_threading = environment::choice("FLUX_ONEDNN_THREADING") == "pool";
  }
};
const Config& config() {
  static const Config c;
  return c;
}

ReadMostly<Key, Entry>& entries() {
  static auto* e = new ReadMostly<Key, Entry>(512);  // never destroyed, as the backend
  return *e;
}

memory::dims activation_dims(const backend::ConvGeometry& g, int64_t channels, const int64_t* sizes) {
  memory::dims d{g.batch, channels};
  for (int i = 0; i < g.spatial; ++i) d.push_back(sizes[i]);
  return d;
}

Tag activation_tag(int spatial) { return spatial == 1 ? Tag::ncw : spatial == 2 ? Tag::nchw : Tag::ncdhw; }

memory::data_type onednn_type(DType t) { return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

memory::desc weight_desc(const backend::ConvGeometry& g, bool any, memory::data_type type) {
  memory::dims d;
  if (g.groups > 1) d = {g.groups, g.out_channels / g.groups, g.in_channels / g.groups};
  else d = {g.out_channels, g.in_channels};
  for (int i = 0; i < g.spatial; ++i) d.push_back(g.kernel[i]);
  Tag tag = any ? Tag::any
            : g.groups > 1 ? (g.spatial == 1 ? Tag::goiw : g.spatial == 2 ? Tag::goihw : Tag::goidhw)
                           : (g.spatial == 1 ? Tag::oiw : g.spatial == 2 ? Tag::oihw : Tag::oidhw);
  return memory::desc(d, type, tag);
}

struct Descs {
  memory::desc src, weights, dst, bias;
  memory::dims strides, dilates, pad_l, pad_r;
};

/// any: oneDNN chooses the layouts of dst and weights, and of src too unless plain_src. Activations and
/// weights of dtype dt, the bias float32.
Descs make_descs(const backend::ConvGeometry& g, bool any, bool bias, bool plain_src, DType dt) {
  Descs d;
  Tag act = any ? Tag::any : activation_tag(g.spatial);
  d.src = memory::desc(activation_dims(g, g.in_channels, g.in), onednn_type(dt),
                       plain_src ? activation_tag(g.spatial) : act);
  d.dst = memory::desc(activation_dims(g, g.out_channels, g.out), onednn_type(dt), act);
  d.weights = weight_desc(g, any, onednn_type(dt));
  if (bias) d.bias = memory::desc({g.out_channels}, memory::data_type::f32, Tag::x);
  for (int i = 0; i < g.spatial; ++i) {
    d.strides.push_back(g.stride[i]);
    d.dilates.push_back(g.dilation[i] - 1);  // oneDNN counts the gaps
    d.pad_l.push_back(g.pad_lo[i]);
    d.pad_r.push_back(g.pad_hi[i]);
  }
  return d;
}

/// The forward's primitive (a forward_relu's relu runs after it: Entry::relu).
dnnl::convolution_forward::primitive_desc forward_pd(const Descs& d, bool bias) {
  using F = dnnl::convolution_forward;
  auto desc = bias ? F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                   : F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights,
                             d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return F::primitive_desc(desc, onednn::user_scratchpad(), onednn::engine());
}

Operand make_operand(int arg, bool input, const memory::desc& plain, const memory::desc& chosen) {
  Operand op;
  op.arg = arg;
  op.input = input;
  op.plain = plain;
  op.inner = chosen;
  if (chosen != plain) {
    const dnnl::engine& e = onednn::engine();
    op.reordered = true;
    op.reorder = input ? dnnl::reorder(dnnl::reorder::primitive_desc(e, plain, e, chosen))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(e, chosen, e, plain));
  }
  return op;
}

/// The fused inference forward. The BatchNorm's per-channel scale multiplies the weights in their
/// reorder into the kernel's blocked layout (the reorder's runtime output scales: no extra pass), its
/// shift is the conv's bias, then relu, the residual (sum post-op) and relu again as asked: the kernels
/// and layouts of the unfused forward (LibTorch's conv + bias + sum + relu pattern), which measured
/// faster than binary mul/add post-ops on the output. Null when the layouts are plain (oneDNN's gemm
/// kernel) or oneDNN offers a reference kernel only: the core then runs the unfused composition.
std::unique_ptr<Entry> create_affine(const Descs& plain, const Descs& asked, const backend::ConvGeometry& g,
                                     const ConvEpilogue& ep) {
  using F = dnnl::convolution_forward;
  if (asked.dst == plain.dst) return nullptr;
  const dnnl::engine& engine = onednn::engine();
  F::primitive_desc unfused = forward_pd(asked, false);  // the unfused forward's layouts
  memory::desc channels({g.out_channels}, memory::data_type::f32, Tag::x);
  // A relu between the conv and the residual sum is a post-op; the last relu runs after the kernel.
  dnnl::post_ops ops;
  if (ep.relu && ep.residual) append_relu_keeping_nan(ops);
  if (ep.residual) ops.append_sum(1.0f);
  dnnl::primitive_attr attr = onednn::user_scratchpad();
  attr.set_post_ops(ops);
  F::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, unfused.src_desc(),
               unfused.weights_desc(), channels, unfused.dst_desc(), asked.strides, asked.dilates, asked.pad_l,
               asked.pad_r);
  F::primitive_desc pd(desc, attr, engine);
  if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return nullptr;
  auto e = std::make_unique<Entry>();
  e->relu = ep.relu_after || (ep.relu && !ep.residual);
  e->primitive = F(pd);
  e->scratchpad = pd.scratchpad_desc();
  e->operands.push_back(make_operand(DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
  // Weights (O, C/G, k...) or (G, O/G, C/G, k...): the output channel is axis 0, or axes 0 and 1.
  Operand weights;
  weights.arg = DNNL_ARG_WEIGHTS;
  weights.plain = plain.weights;
  weights.inner = pd.weights_desc();
  weights.reordered = true;
  weights.scales = 2;
  dnnl::primitive_attr scaled;
  scaled.set_output_scales(g.groups > 1 ? 3 : 1, {DNNL_RUNTIME_F32_VAL});
  weights.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain.weights, engine, pd.weights_desc(), scaled));
  e->operands.push_back(std::move(weights));
  Operand scale;
  scale.arg = kNoArgument;
  scale.plain = scale.inner = channels;
  e->operands.push_back(std::move(scale));
  e->operands.push_back(make_operand(DNNL_ARG_BIAS, true, channels, pd.bias_desc()));
  e->operands.push_back(make_operand(DNNL_ARG_DST, false, plain.dst, pd.dst_desc()));
  if (ep.residual) {
    // Written into the destination (its blocked scratch memory) before the conv adds onto it.
    const Operand& dst = e->operands.back();
    e->residual = Residual::sum;
    e->residual_operand = make_operand(DNNL_ARG_DST, true, plain.dst, dst.inner);
  }
  return e;
}

/// Whether pd is oneDNN's reference kernel, which a bf16 call declines (the core's float32 path is faster).
template <class PrimitiveDesc> bool reference_kernel(const PrimitiveDesc& pd) {
  return std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
}

std::unique_ptr<Entry> create(ConvKind kind, bool bias, const backend::ConvGeometry& g, const ConvEpilogue& ep,
                              DType dt) {
  const Config& c = config();
  auto e = std::make_unique<Entry>();
  const bool low = dt != DType::f32;
  // The caller's layouts: plain, of dtype dt; the bias too, except bf16 weight gradients, which the
  // kernel writes in float32 into rows that onednn_conv sums and rounds.
  Descs plain = make_descs(g, false, bias, false, dt);
  const bool float_grads = low && kind == ConvKind::backward_weight;
  if (float_grads) plain.weights = weight_desc(g, false, memory::data_type::f32);
  if (bias && low && !float_grads) plain.bias = memory::desc({g.out_channels}, onednn_type(dt), Tag::x);
  // oneDNN's blocked kernels (jit:avx2/avx512 on nChw8c/16c) beat its plain-layout gemm kernel when
  // the work per pixel (C / G * prod(kernel)) repays reordering the activations; below that (a
  // first layer on 1 channel, depthwise) the reorders cost more than they save.
  int64_t per_pixel = g.in_channels / g.groups;
  for (int i = 0; i < g.spatial; ++i) per_pixel *= g.kernel[i];
  // A few-channel dense conv (a first layer: 1-3 channels) keeps its source plain and lets oneDNN
  // choose blocked dst/weights, as LibTorch does: its direct kernels read a plain source with few
  // channels, and the source is not padded to 8/16 channels by a reorder.
  bool few = g.groups == 1 && g.in_channels < 4;
  // bf16: blocked layouts always (oneDNN's bf16 and AMX kernels are written for them).
  bool any = c.layout == 2 || c.layout == 3 || (c.layout == 0 && (per_pixel >= 64 || few || low));
  bool plain_src = c.layout == 3 || (c.layout == 0 && per_pixel < 64 && few);
  Descs asked = make_descs(g, any, bias, plain_src, dt);
  if (kind == ConvKind::forward_affine) return create_affine(plain, asked, g, ep);
  if (kind == ConvKind::forward || kind == ConvKind::forward_relu) {
    auto pd = forward_pd(asked, bias);
    if (low && reference_kernel(pd)) return nullptr;
    e->relu = kind == ConvKind::forward_relu;
    e->primitive = dnnl::convolution_forward(pd);
    e->scratchpad = pd.scratchpad_desc();
    e->operands.push_back(make_operand(DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_WEIGHTS, true, plain.weights, pd.weights_desc()));
    if (bias) e->operands.push_back(make_operand(DNNL_ARG_BIAS, true, plain.bias, pd.bias_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_DST, false, plain.dst, pd.dst_desc()));
  } else if (kind == ConvKind::backward_data) {
    using B = dnnl::convolution_backward_data;
    auto hint = forward_pd(asked, false);
    B::desc desc(dnnl::algorithm::convolution_direct, asked.src, asked.weights, asked.dst, asked.strides,
                 asked.dilates, asked.pad_l, asked.pad_r);
    B::primitive_desc pd(desc, onednn::user_scratchpad(), onednn::engine(), hint);
    if (low && reference_kernel(pd)) return nullptr;
    e->primitive = B(pd);
    e->scratchpad = pd.scratchpad_desc();
    e->operands.push_back(make_operand(DNNL_ARG_DIFF_DST, true, plain.dst, pd.diff_dst_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_WEIGHTS, true, plain.weights, pd.weights_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_DIFF_SRC, false, plain.src, pd.diff_src_desc()));
  } else {
    using B = dnnl::convolution_backward_weights;
    auto hint = forward_pd(asked, bias);
    // bf16: the weight gradient accumulates and is written in float32.
    const memory::desc diff_weights = float_grads ? weight_desc(g, any, memory::data_type::f32) : asked.weights;
    auto desc = bias ? B::desc(dnnl::algorithm::convolution_direct, asked.src, diff_weights, asked.bias, asked.dst,
                               asked.strides, asked.dilates, asked.pad_l, asked.pad_r)
                     : B::desc(dnnl::algorithm::convolution_direct, asked.src, diff_weights, asked.dst,
                               asked.strides, asked.dilates, asked.pad_l, asked.pad_r);
    B::primitive_desc pd(desc, onednn::user_scratchpad(), onednn::engine(), hint);
    if (low && reference_kernel(pd)) return nullptr;
    e->primitive = B(pd);
    e->scratchpad = pd.scratchpad_desc();
    e->operands.push_back(make_operand(DNNL_ARG_SRC, true, plain.src, pd.src_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_DIFF_DST, true, plain.dst, pd.diff_dst_desc()));
    e->operands.push_back(make_operand(DNNL_ARG_DIFF_WEIGHTS, false, plain.weights, pd.diff_weights_desc()));
    if (bias) e->operands.push_back(make_operand(DNNL_ARG_DIFF_BIAS, false, plain.bias, pd.diff_bias_desc()));
  }
  return e;
}

/// The entry for (kind, bias, g), created on first use; null when oneDNN refuses the case (remembered,
/// so the portable path runs without asking again).
const Entry* lookup(ConvKind kind, bool bias, const backend::ConvGeometry& g, const ConvEpilogue& ep, DType dt) {
  return entries().get(make_key(kind, bias, g, ep, dt), [&]() -> std::unique_ptr<const Entry> {
    try {
      return create(kind, bias, g, ep, dt);
    } catch (const dnnl::error&) {
      return nullptr;
    }
  });
}

/// The calling thread's scratch block for an operand reordered into the primitive's layout.
onednn::Scratch scratch_of(int arg) {
  switch (arg) {
    case DNNL_ARG_SRC: case DNNL_ARG_DIFF_SRC: return onednn::Scratch::src;
    case DNNL_ARG_WEIGHTS: case DNNL_ARG_DIFF_WEIGHTS: return onednn::Scratch::weights;
    case DNNL_ARG_BIAS: case DNNL_ARG_DIFF_BIAS: return onednn::Scratch::bias;
    default: return onednn::Scratch::dst;
  }
}

/// The forward weights of every chunk in its kernel's layout (scaled by the fused BatchNorm's scale
/// for an affine forward: `scales` holds the values it was made with).
struct ConvWeights final : backend::Prepared {
  std::vector<memory> chunks;
  std::vector<float> scales;
};

/// op's reorder from `from` into `to`, multiplying in the runtime output scales (`scales`, the array of
/// operand op.scales) where it has them.
void reorder_input(const Entry& e, const Operand& op, memory from, memory to, const void* scales) {
  if (op.scales >= 0)
    op.reorder.execute(onednn::stream(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to},
                                          {DNNL_ARG_ATTR_OUTPUT_SCALES,
                                           memory(e.operands[size_t(op.scales)].plain, onednn::engine(),
                                                  const_cast<void*>(scales))}});
  else
    op.reorder.execute(onednn::stream(), from, to);
}

/// The calling thread's memory objects for one entry, made on its first call there and rebound to
/// each call's buffers (set_data_handle), which costs less than making them anew every call.
struct Bound {
  std::vector<memory> user, inner;  // per operand; inner: null where not reordered
  memory residual, scratchpad;
};
Bound& bound_of(const Entry& e) {
  thread_local std::unordered_map<uint64_t, Bound> bound;  // by Entry::id (never reused)
  if (bound.size() > 1024) bound.clear();
  auto [it, made] = bound.try_emplace(e.id);
  Bound& b = it->second;
  if (made) {
    const dnnl::engine& engine = onednn::engine();
    for (const Operand& op : e.operands) {
      b.user.push_back(memory(op.plain, engine, DNNL_MEMORY_NONE));
      b.inner.push_back(op.reordered ? memory(op.inner, engine, DNNL_MEMORY_NONE) : memory());
    }
    if (e.residual == Residual::sum) b.residual = memory(e.residual_operand.plain, engine, DNNL_MEMORY_NONE);
    if (e.scratchpad.get_size()) b.scratchpad = memory(e.scratchpad, engine, DNNL_MEMORY_NONE);
  }
  return b;
}

/// Runs entry `e` on this thread over `buffers` (in the order of its operands: operands_of); `weights`:
/// the weights already in the kernel's layout (null memory: reorder them now); residual: a fused
/// forward's residual (plain, the destination's shape), or null.
void execute(const Entry& e, const std::vector<void*>& buffers, const void* residual, const memory& weights) {
  dnnl::stream& stream = onednn::stream();
  onednn::set_team(config().pool_threading ? 1 : num_threads());
  Bound& b = bound_of(e);
  onednn::CallScratch scratch;
  std::unordered_map<int, memory> args;
  memory dst;
  for (size_t i = 0; i < e.operands.size(); ++i) {
    const Operand& op = e.operands[i];
    memory& user = b.user[i];
    user.set_data_handle(buffers[i]);
    if (!op.reordered) {
      if (op.arg != kNoArgument) args[op.arg] = user;
      if (op.arg == DNNL_ARG_DST) dst = user;
      continue;
    }
    if (op.arg == DNNL_ARG_WEIGHTS && weights) {
      args[op.arg] = weights;
      continue;
    }
    memory& inner = b.inner[i];
    inner.set_data_handle(scratch.get(scratch_of(op.arg), op.inner.get_size()));
    if (op.input) reorder_input(e, op, user, inner, op.scales >= 0 ? buffers[size_t(op.scales)] : nullptr);
    if (op.arg == DNNL_ARG_DST) dst = inner;
    args[op.arg] = inner;
  }
  if (e.residual == Residual::sum) {
    const Operand& r = e.residual_operand;
    b.residual.set_data_handle(const_cast<void*>(residual));
    if (r.reordered) r.reorder.execute(stream, b.residual, dst);
    else std::memcpy(dst.get_data_handle(), residual, r.plain.get_size());  // plain: dst starts as it
  }
  if (const size_t bytes = e.scratchpad.get_size()) {
    b.scratchpad.set_data_handle(scratch.get(onednn::Scratch::scratchpad, bytes));
    args[DNNL_ARG_SCRATCHPAD] = b.scratchpad;
  }
  e.primitive.execute(stream, args);
  for (size_t i = 0; i < e.operands.size(); ++i) {
    const Operand& op = e.operands[i];
    if (op.reordered && !op.input) op.reorder.execute(stream, b.inner[i], b.user[i]);
  }
  stream.wait();
  if (e.relu)
    for (size_t i = 0; i < e.operands.size(); ++i) {
      const Operand& op = e.operands[i];
      if (op.arg != DNNL_ARG_DST || op.input) continue;
      const DType t = op.plain.data_type() == memory::data_type::bf16 ? DType::bf16 : DType::f32;
      const size_t size = dtype_size(t);
      char* y = static_cast<char*>(buffers[i]);
      parallel_for(int64_t(op.plain.get_size() / size), 1 << 15, [&](int64_t lo, int64_t hi) {
        relu_rows(t, y + size_t(lo) * size, 1, hi - lo, hi - lo);  // inline inside a chunk's pool task
      });
    }
}

const Operand* operand(const Entry& e, int arg) {
  for (const Operand& op : e.operands)
    if (op.arg == arg) return &op;
  return nullptr;
}

/// The forward weights of `entries` (one per chunk, chunk c from output channel o0[c]) in their
/// kernels' layouts, from the weight tensor's cache or made now (null: a layout that needs no reorder).
/// weights: the call's whole weight array; scale: forward_affine's (float32, (O,)), else null.
std::shared_ptr<const ConvWeights> forward_weights(const std::vector<const Entry*>& chunk_entries,
                                                   const std::vector<int64_t>& o0, const std::vector<void*>& w_of,
                                                   const void* weights, const void* scale,
                                                   const backend::ConvGeometry& g, const Key& key, DType dt) {
  const Operand* w = operand(*chunk_entries[0], DNNL_ARG_WEIGHTS);
  if (!w || !w->reordered) return nullptr;
  const bool scaled = w->scales >= 0;
  // The fused BatchNorm's scale the weights are multiplied by (none: an empty range).
  const float* scales = scaled ? static_cast<const float*>(scale) : nullptr;
  const int64_t n_scales = scaled ? g.out_channels : 0;
  backend::PreparedKey pk{};
  pk[0] = int64_t(dt == DType::bf16 ? PreparedKind::onednn_conv_bf16 : PreparedKind::onednn_conv);
  pk[1] = reinterpret_cast<intptr_t>(weights);
  pk[2] = int64_t(chunk_entries.size());
  std::copy(key.begin(), key.end(), pk.begin() + 3);
  auto make = [&] {
    auto cw = std::make_shared<ConvWeights>();
    cw->scales.assign(scales, scales + n_scales);
    onednn::set_team(1);
    for (size_t c = 0; c < chunk_entries.size(); ++c) {
      const Entry& e = *chunk_entries[c];
      const Operand& op = *operand(e, DNNL_ARG_WEIGHTS);
      memory to(op.inner, onednn::engine());
      reorder_input(e, op, memory(op.plain, onednn::engine(), w_of[c]), to, scaled ? scales + o0[c] : nullptr);
      cw->chunks.push_back(std::move(to));
    }
    onednn::stream().wait();
    return cw;
  };
  backend::PreparedCache* cache = g.weight_cache;
  if (cache)
    if (auto kept = std::static_pointer_cast<const ConvWeights>(cache->find(pk));
        kept && std::equal(kept->scales.begin(), kept->scales.end(), scales, scales + n_scales))
      return kept;
  std::shared_ptr<const ConvWeights> made = make();
  if (cache) cache->insert(pk, made);
  return made;
}

/// The call's arrays in the order of its entry's operands (create, create_affine): the one place that
/// turns the named arrays into the positional list the primitive's arguments are bound from.
std::vector<void*> operands_of(ConvKind kind, const ConvArrays& a, const ConvEpilogue& ep) {
  auto input = [](const void* p) { return const_cast<void*>(p); };  // oneDNN's memory takes void*
  switch (kind) {
    case ConvKind::forward:
    case ConvKind::forward_relu:
      if (ep.shift) return {a.x, a.w, input(ep.shift), a.y};
      return {a.x, a.w, a.y};
    case ConvKind::forward_affine: return {a.x, a.w, input(ep.scale), input(ep.shift), a.y};
    case ConvKind::backward_data: return {a.dy, a.w, a.dx};
    case ConvKind::backward_weight:
      if (a.dbias) return {a.x, a.dy, a.dw, a.dbias};
      return {a.x, a.dy, a.dw};
  }
  return {};
}

}  // namespace

bool onednn_conv(ConvKind kind, const backend::ConvGeometry& g, const ConvArrays& arrays, const ConvEpilogue& epilogue,
                 DType dt) {
  // Whether the primitive has a bias operand: a plain forward's bias, a weight gradient's dbias.
  const bool bias = kind == ConvKind::backward_weight ? arrays.dbias != nullptr
                    : kind == ConvKind::forward || kind == ConvKind::forward_relu ? epilogue.shift != nullptr
                                                                                   : false;
  const Config& cfg = config();
  const size_t size = dtype_size(dt);
  int64_t in_size = g.in_channels, out_size = g.out_channels;
  for (int i = 0; i < g.spatial; ++i) in_size *= g.in[i], out_size *= g.out[i];
  int64_t flops = 2 * g.batch * out_size * (g.in_channels / g.groups);
  for (int i = 0; i < g.spatial; ++i) flops *= g.kernel[i];
  int64_t weight_size = (g.in_channels / g.groups) * g.out_channels;
  for (int i = 0; i < g.spatial; ++i) weight_size *= g.kernel[i];
  const size_t partial_size = size_t(weight_size + (bias ? g.out_channels : 0));
  // p advanced by `elements` of the activations' dtype (of float32: shift_float, the affine's scale and shift).
  auto shift = [size](const void* p, int64_t elements) -> void* {
    return p ? const_cast<char*>(static_cast<const char*>(p)) + size_t(elements) * size : nullptr;
  };
  auto shift_float = [](const void* p, int64_t elements) -> void* {
    return p ? const_cast<float*>(static_cast<const float*>(p)) + elements : nullptr;
  };
  // Before creating primitives too: oneDNN fixes some kernels' thread count when it creates them.
  onednn::set_team(cfg.pool_threading ? 1 : num_threads());

  // The chunks: one image (inference at batch 1) has no batch to split, so a forward splits its output
  // channels instead, in multiples of 16 (oneDNN's block); each chunk reads the whole input. Otherwise
  // samples. A chunk per 2^20 FLOPs (2^21 for samples).
  struct Chunk {
    const Entry* entry;
    ConvArrays a;
    ConvEpilogue ep;
    int64_t o0;
  };
  std::vector<Chunk> chunks;
  int64_t oc_chunks = 1;
  if (is_forward(kind) && cfg.pool_threading && g.batch == 1 && g.groups == 1)
    oc_chunks = std::min<int64_t>({num_threads(), g.out_channels / 16, std::max<int64_t>(1, flops >> 20)});
  if (oc_chunks > 1) {
    const int64_t blocks = g.out_channels / 16, per_oc_w = weight_size / g.out_channels,
                  per_oc_y = out_size / g.out_channels;
    for (int64_t c = 0; c < oc_chunks; ++c) {
      const int64_t o0 = blocks * c / oc_chunks * 16;
      const int64_t o1 = c + 1 == oc_chunks ? g.out_channels : blocks * (c + 1) / oc_chunks * 16;
      backend::ConvGeometry part = g;
      part.out_channels = o1 - o0;
      const Entry* e = lookup(kind, bias, part, epilogue, dt);
      if (!e) return false;
      ConvArrays a = arrays;
      ConvEpilogue ep = epilogue;
      a.w = shift(a.w, o0 * per_oc_w);
      if (bias) ep.shift = shift(ep.shift, o0);
      if (kind == ConvKind::forward_affine) ep.scale = shift_float(ep.scale, o0), ep.shift = shift_float(ep.shift, o0);
      a.y = shift(a.y, o0 * per_oc_y);
      ep.residual = shift(ep.residual, o0 * per_oc_y);
      chunks.push_back({e, a, ep, o0});
    }
  } else {
    const int64_t n = cfg.pool_threading ? std::min<int64_t>({num_threads(), g.batch, std::max<int64_t>(1, flops >> 21)}) : 1;
    for (int64_t c = 0; c < n; ++c) {
      const int64_t b0 = g.batch * c / n, b1 = g.batch * (c + 1) / n;
      backend::ConvGeometry part = g;
      part.batch = b1 - b0;
      const Entry* e = lookup(kind, bias, part, epilogue, dt);
      if (!e) return false;
      ConvArrays a = arrays;
      ConvEpilogue ep = epilogue;
      a.x = shift(a.x, b0 * in_size), a.y = shift(a.y, b0 * out_size);
      a.dy = shift(a.dy, b0 * out_size), a.dx = shift(a.dx, b0 * in_size);
      ep.residual = shift(ep.residual, b0 * out_size);
      chunks.push_back({e, a, ep, 0});
    }
  }
  // Inference forwards read their weights prepared (kept with the weight tensor).
  std::shared_ptr<const ConvWeights> weights;
  if (is_forward(kind) && g.inference) {
    std::vector<const Entry*> es;
    std::vector<int64_t> o0;
    std::vector<void*> w_of;
    for (const Chunk& c : chunks) es.push_back(c.entry), o0.push_back(c.o0), w_of.push_back(c.a.w);
    if (oc_chunks == 1) es.resize(1), o0.resize(1), w_of.resize(1);  // sample chunks share one set
    weights = forward_weights(es, o0, w_of, arrays.w, epilogue.scale, g, make_key(kind, bias, g, epilogue, dt), dt);
  }
  auto weights_of = [&](size_t c) {
    if (!weights) return memory();
    const memory& m = weights->chunks[oc_chunks > 1 ? c : 0];
    // Sample chunks of unequal sizes have entries of their own, whose layouts may differ.
    return operand(*chunks[c].entry, DNNL_ARG_WEIGHTS)->inner == m.get_desc() ? m : memory();
  };
  // Weight gradients of later sample chunks go to float32 scratch rows, summed into the first in
  // order; bf16 gradients: every chunk's, the sum rounded to bf16 at the end, unless the caller takes
  // them in float32 (float32_grads: written as a float32 call's, no rounding pass).
  const bool float_grads = kind == ConvKind::backward_weight && dt != DType::f32 && !arrays.float32_grads;
  const size_t first_row = float_grads ? 0 : 1;
  std::vector<std::vector<float>> partials(
      kind == ConvKind::backward_weight && chunks.size() > first_row ? chunks.size() - first_row : 0);
  for (size_t c = first_row; c < chunks.size() && kind == ConvKind::backward_weight; ++c) {
    std::vector<float>& row = partials[c - first_row];
    row.resize(partial_size);
    chunks[c].a.dw = row.data();
    if (bias) chunks[c].a.dbias = row.data() + weight_size;
  }
  auto run = [&](size_t c) {
    const Chunk& k = chunks[c];
    execute(*k.entry, operands_of(kind, k.a, k.ep), k.ep.residual, weights_of(c));
  };
  if (chunks.size() == 1) {
    run(0);
  } else {
    parallel_for(int64_t(chunks.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) run(size_t(c));
    });
  }
  if (float_grads) {
    std::vector<float>& sum = partials[0];
    for (size_t c = 1; c < partials.size(); ++c)
      for (size_t i = 0; i < partial_size; ++i) sum[i] += partials[c][i];
    float_to_half_storage(dt, sum.data(), static_cast<uint16_t*>(arrays.dw), weight_size);
    if (bias) float_to_half_storage(dt, sum.data() + weight_size, static_cast<uint16_t*>(arrays.dbias), g.out_channels);
  } else if (kind == ConvKind::backward_weight) {
    float* dw = static_cast<float*>(arrays.dw);
    float* db = bias ? static_cast<float*>(arrays.dbias) : nullptr;
    for (const std::vector<float>& row : partials) {
      for (int64_t i = 0; i < weight_size; ++i) dw[i] += row[size_t(i)];
      for (int64_t i = 0; db && i < g.out_channels; ++i) db[i] += row[size_t(weight_size + i)];
    }
  }
  return true;
}

}  // namespace flux::cpu_backend

#else  // built without oneDNN (FLUX_ONEDNN=OFF or libdnnl-dev missing)

namespace flux::cpu_backend {
bool onednn_conv(ConvKind, const backend::ConvGeometry&, const ConvArrays&, const ConvEpilogue&, DType) {
  return false;
}
}  // namespace flux::cpu_backend

#endif  // FLUX_HAVE_ONEDNN
