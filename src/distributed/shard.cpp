// Sharded training (include/flux/distributed/shard.hpp): the plan, the chunks, the gradient
// reduce-scatter, the optimiser step on the chunks and the parameter all-gather.
//
// Layout: array i of numel n is flattened and cut into `ranks` chunks of c = ceil(n / ranks) elements;
// rank r owns elements [r c, min(n, (r + 1) c)), zero-padded to c. Every rule keeps the padding at
// zero (a zero gradient moves no element), so the padding never reaches the model. A bucket of arrays
// is sent as `ranks` blocks of S = sum of its members' c: block r holds chunk r of each member, so one
// MPI_Ireduce_scatter_block gives each rank the sums of exactly its chunks, and one MPI_Iallgather of
// each rank's chunks gives everyone the whole arrays. Everything crosses MPI in host memory (device
// tensors are copied there and back, CUDA included).
#include "flux/distributed/shard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "flux/autodiff.hpp"
#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/distributed/transport.hpp"
#include "src/internal.hpp"

namespace flux::distributed::detail {

namespace {
constexpr const char* kApi = "distributed::shard";

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

// n elements of x (any device) into host memory at `dst`.
void to_host_bytes(const Tensor& x, void* dst) {
  if (x.numel()) x.backend().copy_to_host(x.device().index(), dst, flux::detail::buffer_of(x), x.nbytes());
}

// bf16 <-> float32 on the host (round to nearest even, as the library's casts).
float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

std::shared_ptr<const ShardPlan> make_plan(const Communicator& comm, const std::vector<std::string>& names,
                                           const std::vector<Tensor>& params, const ShardOptions& options,
                                           std::vector<std::vector<size_t>> units) {
  if (options.stage < 1 || options.stage > 3)
    flux::detail::fail("[", kApi, "] .stage must be 1, 2 or 3, got ", options.stage);
  if (options.bucket_bytes <= 0) flux::detail::fail("[", kApi, "] bucket_bytes must be positive, got ", options.bucket_bytes);
  if (options.wire && *options.wire != DType::bf16)
    flux::detail::fail("[", kApi, "] .wire must be BFloat16 (or none), got ", dtype_name(*options.wire));
  if (names.size() != params.size())
    flux::detail::fail("[", kApi, "] ", names.size(), " names for ", params.size(), " trainable arrays");
  std::vector<std::pair<std::string, std::string>> leaves;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!is_floating(params[i].dtype()))
      flux::detail::fail("[", kApi, "] trainable array ", names[i], " is ", dtype_name(params[i].dtype()),
                         "; only floating-point arrays can be trained");
    leaves.emplace_back(names[i], to_string(params[i].shape()) + " " + dtype_name(params[i].dtype()));
  }
  check_same_leaves(comm, leaves, kApi);
  auto plan = std::make_shared<ShardPlan>();
  plan->comm = comm;
  plan->options = options;
  plan->names = names;
  plan->rank = comm.rank();
  plan->ranks = comm.size();
  if (options.stage == 3) {  // every array in exactly one layer (shard() builds them so)
    std::vector<int> seen(params.size(), 0);
    for (const auto& u : units)
      for (size_t i : u) {
        if (i >= params.size() || seen[i]++)
          flux::detail::fail("[", kApi, "] stage 3: array index ", i, " is out of range or in two layers");
      }
    for (size_t i = 0; i < params.size(); ++i)
      if (!seen[i]) flux::detail::fail("[", kApi, "] stage 3: array ", names[i], " belongs to no layer");
    plan->units = std::move(units);
  }
  for (const Tensor& p : params) {
    plan->shapes.push_back(p.shape());
    plan->dtypes.push_back(p.dtype());
    plan->master_dtypes.push_back(is_half(p.dtype()) ? DType::f32 : p.dtype());
    plan->devices.push_back(p.device());
    plan->chunk.push_back(std::max<int64_t>(1, (p.numel() + plan->ranks - 1) / plan->ranks));
  }
  return plan;
}

Tensor chunk_of(const ShardPlan& plan, size_t i, const Tensor& x, DType master) {
  const int64_t n = plan.shapes[i].numel(), c = plan.chunk[i];
  if (x.numel() != n)
    flux::detail::fail("[", kApi, "] array ", plan.names[i], " has ", x.numel(), " elements where ", n, " were expected");
  const int64_t lo = std::min(n, plan.rank * c), hi = std::min(n, lo + c);
  std::vector<Tensor> parts;
  if (hi > lo) {
    Tensor piece = x.contiguous_copy().reshape({-1}).slice(lo, hi);
    parts.push_back(piece.dtype() == master ? piece.contiguous_copy() : piece.cast(master));
  }
  if (hi - lo < c) parts.push_back(zeros({c - (hi - lo)}, master, x.device()));
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

namespace {
void chunk_leaf(const ShardPlan& plan, size_t i, const optimisers::LeafState& full, optimisers::LeafState& out) {
  out.t = full.t;
  out.buffers.clear();
  for (const Tensor& b : full.buffers) out.buffers.push_back(chunk_of(plan, i, b, plan.master_dtypes[i]));
  out.children.assign(full.children.size(), {});
  for (size_t k = 0; k < full.children.size(); ++k) chunk_leaf(plan, i, full.children[k], out.children[k]);
}
}  // namespace

optimisers::State chunk_state(const ShardPlan& plan, const optimisers::State& full) {
  if (!full.rule) flux::detail::fail("[", kApi, "] the optimiser state is empty; make it with optimisers::setup(rule, model)");
  if (full.leaves.size() != plan.shapes.size())
    flux::detail::fail("[", kApi, "] the optimiser state has ", full.leaves.size(), " arrays but the model has ",
                       plan.shapes.size(), " trainable arrays; call optimisers::setup(rule, model) for this model");
  optimisers::State out{full.rule->clone(), {}, full.steps};
  out.leaves.resize(full.leaves.size());
  for (size_t i = 0; i < full.leaves.size(); ++i) chunk_leaf(plan, i, full.leaves[i], out.leaves[i]);
  return out;
}

void gather_params(const ShardPlan& plan, const std::vector<Tensor>& masters, const std::vector<Tensor>& params) {
  if (masters.size() != plan.shapes.size() || params.size() != plan.shapes.size())
    flux::detail::fail("[", kApi, "] ", params.size(), " arrays and ", masters.size(), " master chunks for a plan of ",
                       plan.shapes.size());
  CommunicatorState& s = plan.comm.state();
  const int64_t ranks = plan.ranks;
  // Buckets in parameter order, one dtype (the model's: half arrays travel in half) each.
  struct Bucket {
    std::vector<size_t> members;
    std::vector<int64_t> offsets;
    int64_t block = 0;  // elements per rank
    DType t = DType::f32;
    std::vector<uint8_t> send, recv;
    InFlight op;
  };
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < params.size(); ++i) {
    const DType t = plan.dtypes[i];
    const int64_t es = int64_t(dtype_size(t));
    if (buckets.empty() || buckets.back().t != t || (buckets.back().block + plan.chunk[i]) * es * ranks > plan.options.bucket_bytes) {
      if (buckets.empty() || !buckets.back().members.empty()) buckets.emplace_back();
      buckets.back().t = t;
    }
    Bucket& b = buckets.back();
    b.members.push_back(i);
    b.offsets.push_back(b.block);
    b.block += plan.chunk[i];
  }
  // At most two buckets in flight: bucket k + 1 moves while bucket k is unpacked into the arrays.
  auto start = [&](Bucket& b) {
    const size_t es = dtype_size(b.t);
    b.send.resize(size_t(b.block) * es);
    b.recv.resize(size_t(b.block * ranks) * es);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& m = masters[b.members[k]];
      to_host_bytes(m.dtype() == b.t ? m : m.cast(b.t), b.send.data() + size_t(b.offsets[k]) * es);
    }
    b.op = start_allgather_bytes(s, b.send.data(), b.recv.data(), b.send.size());
  };
  if (!buckets.empty()) start(buckets[0]);
  for (size_t k0 = 0; k0 < buckets.size(); ++k0) {
    Bucket& b = buckets[k0];
    if (k0 + 1 < buckets.size()) start(buckets[k0 + 1]);
    b.op.wait("distributed::update", s.timeout, true);
    const size_t es = dtype_size(b.t);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const size_t i = b.members[k];
      const int64_t n = plan.shapes[i].numel(), c = plan.chunk[i];
      const Tensor& p = params[i];
      if (p.dtype() != b.t || p.numel() != n)
        flux::detail::fail("[distributed::update] array ", plan.names[i], " is ", summary(p), "; it was sharded as ",
                           to_string(plan.shapes[i]), " ", dtype_name(b.t));
      if (!n) continue;
      const backend::Buffer dst = p.buffer();  // a write: whatever was derived from the array is dropped
      for (int64_t r = 0; r < ranks; ++r) {  // each rank's piece straight into the array
        const int64_t lo = std::min(n, r * c), hi = std::min(n, lo + c);
        if (hi > lo)
          p.backend().copy_from_host(p.device().index(), backend::Buffer{dst.handle, dst.offset + size_t(lo) * es},
                                     b.recv.data() + size_t(r * b.block + b.offsets[k]) * es, size_t(hi - lo) * es);
      }
    }
    b.send = {};
    b.recv = {};
  }
}

namespace {
bool has_clip_norm(const optimisers::Rule& rule) {
  if (dynamic_cast<const optimisers::ClipNorm*>(&rule)) return true;
  if (auto* chain = dynamic_cast<const optimisers::OptimiserChain*>(&rule))
    for (const auto& r : chain->rules)
      if (has_clip_norm(*r)) return true;
  return false;
}

// Each array's ClipNorm norm over all ranks: the ranks' partial sums of |d|^p (or maxima) gathered
// and combined in rank order, so every rank computes the same norm.
void clip_norm(const ShardPlan& plan, const optimisers::ClipNorm& rule, std::vector<Tensor>& ds) {
  const bool inf = std::isinf(rule.p);
  std::vector<double> mine(ds.size()), all(ds.size() * size_t(plan.ranks));
  for (size_t i = 0; i < ds.size(); ++i)
    mine[i] = inf ? max(abs(ds[i])).item<double>() : sum(pow(abs(ds[i]).f64(), rule.p)).item<double>();
  allgather_bytes(plan.comm.state(), mine.data(), all.data(), mine.size() * sizeof(double), "ClipNorm");
  for (size_t i = 0; i < ds.size(); ++i) {
    double total = 0;
    for (int r = 0; r < plan.ranks; ++r) {
      double v = all[size_t(r) * ds.size() + i];
      total = inf ? std::max(total, v) : total + v;
    }
    const double norm = inf ? total : std::pow(total, 1.0 / rule.p);
    if (!std::isfinite(norm))
      flux::detail::fail("[ClipNorm] the gradient's ", rule.p, "-norm is ", norm, "; refusing to rescale a non-finite gradient");
    if (norm > rule.omega) ds[i] = ds[i] * (rule.omega / norm);
  }
}

// The rule applied to every array before the next rule starts (ClipNorm needs every rank's part of
// each array, so it is one collective for all arrays).
void apply_in_stages(const ShardPlan& plan, const optimisers::Rule& rule, std::vector<optimisers::LeafState*> states,
                     const std::vector<Tensor>& xs, std::vector<Tensor>& ds) {
  if (auto* chain = dynamic_cast<const optimisers::OptimiserChain*>(&rule)) {
    for (size_t k = 0; k < chain->rules.size(); ++k) {
      std::vector<optimisers::LeafState*> children;
      for (optimisers::LeafState* st : states) children.push_back(&st->children[k]);
      apply_in_stages(plan, *chain->rules[k], children, xs, ds);
    }
  } else if (auto* clip = dynamic_cast<const optimisers::ClipNorm*>(&rule)) {
    clip_norm(plan, *clip, ds);
  } else {
    for (size_t i = 0; i < xs.size(); ++i) ds[i] = rule.apply(*states[i], xs[i], ds[i]);
  }
}
}  // namespace

void step_chunks(const ShardPlan& plan, optimisers::State& opt, std::vector<Tensor>& masters,
                 const std::vector<Tensor>& grads) {
  if (grads.size() != masters.size())
    flux::detail::fail("[distributed::update] ", grads.size(), " gradient chunks for ", masters.size(),
                       " arrays; pass the gradient distributed::withgradient returned for this sharded model");
  std::vector<Tensor> gs(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || g.shape() != masters[i].shape() || g.device() != masters[i].device())
      flux::detail::fail("[distributed::update] gradient chunk ", i, " (", plan.names[i], ") is ",
                         g.defined() ? summary(g) : std::string("undefined"), "; expected ", summary(masters[i]));
    gs[i] = g.dtype() == masters[i].dtype() ? g : g.cast(masters[i].dtype());
  }
  if (!has_clip_norm(*opt.rule)) {
    optimisers::detail::update_arrays(opt, masters, gs);
    return;
  }
  if (opt.leaves.size() != masters.size())
    flux::detail::fail("[update] the sharded optimiser state has ", opt.leaves.size(), " arrays for ", masters.size());
  autodiff::NoGrad no_grad;
  std::vector<optimisers::LeafState*> states;
  for (auto& l : opt.leaves) states.push_back(&l);
  apply_in_stages(plan, *opt.rule, states, masters, gs);
  for (size_t i = 0; i < masters.size(); ++i) sub_(masters[i], gs[i].dtype() == masters[i].dtype() ? gs[i] : gs[i].cast(masters[i].dtype()));
  ++opt.steps;
}

// ---- the gradient reduce-scatter ----

struct ShardReducer::State {
  struct Bucket {
    std::vector<size_t> members;
    std::vector<int64_t> offsets;  // of each member's chunk inside a block
    int64_t block = 0;             // elements per rank
    DType t = DType::f32;          // on the wire
    DType sum = DType::f32;        // of the result (float32 for a bf16 wire)
    int pending = 0;
    bool launched = false;
    std::vector<uint8_t> send, recv;
    InFlight op;
  };
  std::shared_ptr<const ShardPlan> plan;
  autodiff::Tape* tape = nullptr;
  std::vector<Tensor> leaves;
  std::unordered_map<int64_t, size_t> leaf_of_tape_id;
  std::vector<size_t> bucket_of;
  std::vector<bool> reported;
  std::vector<Bucket> buckets;

  void launch(Bucket& b) {
    b.launched = true;
    const int64_t ranks = plan->ranks;
    const size_t es = dtype_size(b.t);
    b.send.resize(size_t(b.block * ranks) * es);
    std::vector<uint8_t> flat;
    for (size_t k = 0; k < b.members.size(); ++k) {
      const size_t i = b.members[k];
      Tensor g = tape->grad(leaves[i]);  // zeros for an array f did not use
      tape->release_grad(leaves[i]);     // the gradient's memory goes with its bucket
      if (g.dtype() != b.t) g = g.cast(b.t);
      const int64_t n = g.numel(), c = plan->chunk[i];
      const uint8_t* src;
      if (g.device().is_cpu()) {  // read where it is
        backend::Buffer buf = flux::detail::buffer_of(g);
        src = static_cast<const uint8_t*>(buf.handle) + buf.offset;
      } else {
        flat.resize(size_t(n) * es);
        to_host_bytes(g, flat.data());
        src = flat.data();
      }
      for (int64_t r = 0; r < ranks; ++r) {
        const int64_t lo = std::min(n, r * c), hi = std::min(n, lo + c);
        uint8_t* dst = b.send.data() + size_t(r * b.block + b.offsets[k]) * es;
        if (hi > lo) std::memcpy(dst, src + size_t(lo) * es, size_t(hi - lo) * es);
        if (hi - lo < c) std::memset(dst + size_t(hi - lo) * es, 0, size_t(c - (hi - lo)) * es);  // the padding
      }
    }
    CommunicatorState& s = plan->comm.state();
    if (b.t == DType::bf16) {  // every rank's block r to rank r, summed here in float32
      b.recv.resize(size_t(b.block * ranks) * es);
      b.op = start_alltoall_bytes(s, b.send.data(), b.recv.data(), size_t(b.block) * es);
    } else {
      b.recv.resize(size_t(b.block) * es);
      b.op = start_reduce_scatter_block(s, b.send.data(), b.recv.data(), b.block, b.t);
    }
  }

  // Lets MPI move the buckets in flight; a completed bucket's send buffer goes at once.
  void progress() {
    for (Bucket& b : buckets)
      if (b.launched && !b.send.empty() && b.op.test()) b.send = {};
  }
};

ShardReducer::ShardReducer(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> leaves, autodiff::Tape& tape)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.plan = std::move(plan);
  s.tape = &tape;
  s.leaves = std::move(leaves);
  const ShardPlan& p = *s.plan;
  if (s.leaves.size() != p.shapes.size())
    flux::detail::fail("[distributed::withgradient] the model has ", s.leaves.size(), " trainable arrays; it was sharded with ",
                       p.shapes.size());
  s.bucket_of.assign(s.leaves.size(), 0);
  s.reported.assign(s.leaves.size(), false);
  for (size_t i = s.leaves.size(); i-- > 0;) {  // reverse order: the order backward finishes them
    const Tensor& x = s.leaves[i];
    if (x.shape() != p.shapes[i] || x.dtype() != p.dtypes[i])
      flux::detail::fail("[distributed::withgradient] array ", p.names[i], " is ", summary(x), "; it was sharded as ",
                         to_string(p.shapes[i]), " ", dtype_name(p.dtypes[i]));
    s.leaf_of_tape_id[x.impl()->tape_id] = i;
    const DType master = p.master_dtypes[i];
    const DType wire = p.options.wire && master == DType::f32 ? *p.options.wire : master;
    const int64_t es = int64_t(dtype_size(wire));
    if (s.buckets.empty() || s.buckets.back().t != wire ||
        (s.buckets.back().block + p.chunk[i]) * es * p.ranks > p.options.bucket_bytes) {
      if (s.buckets.empty() || !s.buckets.back().members.empty()) s.buckets.emplace_back();
      s.buckets.back().t = wire;
      s.buckets.back().sum = master;
    }
    State::Bucket& b = s.buckets.back();
    b.members.push_back(i);
    b.offsets.push_back(b.block);
    b.block += p.chunk[i];
    ++b.pending;
    s.bucket_of[i] = s.buckets.size() - 1;
  }
}

ShardReducer::~ShardReducer() = default;

void ShardReducer::ready(int64_t tape_id) {
  State& s = *state_;
  auto it = s.leaf_of_tape_id.find(tape_id);
  if (it == s.leaf_of_tape_id.end() || s.reported[it->second]) return;
  s.reported[it->second] = true;
  State::Bucket& b = s.buckets[s.bucket_of[it->second]];
  if (--b.pending == 0 && s.plan->options.stage >= 2) s.launch(b);
  s.progress();
}

std::vector<Tensor> ShardReducer::finish() {
  State& s = *state_;
  const ShardPlan& p = *s.plan;
  for (State::Bucket& b : s.buckets)
    if (!b.launched) s.launch(b);
  std::vector<Tensor> out(s.leaves.size());
  std::vector<float> sums;
  for (State::Bucket& b : s.buckets) {
    b.op.wait("distributed::withgradient", p.comm.state().timeout, true);
    const void* result = b.recv.data();
    if (b.t == DType::bf16) {  // the ranks' bf16 blocks summed in float32, in rank order
      sums.assign(size_t(b.block), 0.0f);
      const auto* h = reinterpret_cast<const uint16_t*>(b.recv.data());
      for (int64_t r = 0; r < p.ranks; ++r)
        for (int64_t e = 0; e < b.block; ++e) sums[size_t(e)] += bf16_to_float(h[r * b.block + e]);
      result = sums.data();
    }
    const size_t es = dtype_size(b.sum);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const size_t i = b.members[k];
      Tensor g = Tensor::empty({p.chunk[i]}, b.sum, p.devices[i]);
      g.backend().copy_from_host(g.device().index(), flux::detail::buffer_of(g),
                                 static_cast<const uint8_t*>(result) + size_t(b.offsets[k]) * es, g.nbytes());
      out[i] = g;
    }
    b.send = {};
    b.recv = {};
  }
  return out;
}

}  // namespace flux::distributed::detail
