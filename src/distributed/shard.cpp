// Sharded training (include/flux/distributed/shard.hpp): the plan, the chunks, the gradient
// reduce-scatter, the optimiser step on the chunks and the parameter all-gather.
//
// Layout: array i of numel n is flattened and cut into `ranks` chunks of c = ceil(n / ranks) elements;
// rank r owns elements [r c, min(n, (r + 1) c)), zero-padded to c. Every rule keeps the padding at
// zero (a zero gradient moves no element), so the padding never reaches the model. A bucket of arrays
// is sent as `ranks` blocks of S = sum of its members' c: block r holds chunk r of each member, so one
// MPI_Ialltoall gives each rank every rank's copy of exactly its chunks (summed there, in rank order),
// and one MPI_Iallgather of each rank's chunks gives everyone the whole arrays. An array whose n is
// exactly ranks x c is already in that order: on the CPU its gradient is sent from its own memory,
// its master chunk is a view of the model's array (float32 models, stages 1 and 2) and the all-gather
// lands in the array itself (MPI_IN_PLACE), so no pass copies it. Everything crosses MPI in host
// memory (device tensors are copied there and back, CUDA included).
#include "flux/distributed/shard.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

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

namespace {
// sums[e] = sum over r (in rank order) of widen(blocks[r * n + e]).
template <class T, class A, class W> void sum_blocks(const T* blocks, A* sums, int64_t n, int64_t ranks, W widen) {
  for (int64_t e = 0; e < n; ++e) sums[e] = widen(blocks[e]);
  for (int64_t r = 1; r < ranks; ++r) {
    const T* block = blocks + r * n;
    for (int64_t e = 0; e < n; ++e) sums[e] += widen(block[e]);
  }
}

// Arrays of at least this many bytes whose elements are exactly `ranks` chunks (no padding) on the CPU
// cross MPI from and into their own memory (in rank-major order already): no staging copy. Smaller
// ones share a bucket's one collective. (Bounded by the bucket size so that small test models take
// both paths.)
int64_t direct_bytes(const ShardPlan& plan) { return std::min<int64_t>(int64_t(64) << 10, plan.options.bucket_bytes / 4); }

uint8_t* host_ptr(const backend::Buffer& b) { return static_cast<uint8_t*>(b.handle) + b.offset; }
}  // namespace

bool rank_major(const ShardPlan& plan, size_t i, DType t) {
  const int64_t n = plan.shapes[i].numel();
  return plan.devices[i].is_cpu() && n > 0 && n == plan.chunk[i] * plan.ranks &&
         n * int64_t(dtype_size(t)) >= direct_bytes(plan);
}

Tensor master_of(const ShardPlan& plan, size_t i, const Tensor& x) {
  const int64_t n = plan.shapes[i].numel(), c = plan.chunk[i], lo = int64_t(plan.rank) * c;
  if (plan.options.stage < 3 && x.dtype() == plan.master_dtypes[i] && x.numel() == n && lo + c <= n)
    return x.reshape({-1}).slice(lo, lo + c);
  return chunk_of(plan, i, x, plan.master_dtypes[i]);
}

void gather_params(const ShardPlan& plan, const std::vector<Tensor>& masters, const std::vector<Tensor>& params) {
  if (masters.size() != plan.shapes.size() || params.size() != plan.shapes.size())
    flux::detail::fail("[", kApi, "] ", params.size(), " arrays and ", masters.size(), " master chunks for a plan of ",
                       plan.shapes.size());
  CommunicatorState& s = plan.comm.state();
  const int64_t ranks = plan.ranks;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (p.dtype() != plan.dtypes[i] || p.numel() != plan.shapes[i].numel())
      flux::detail::fail("[distributed::update] array ", plan.names[i], " is ", summary(p), "; it was sharded as ",
                         to_string(plan.shapes[i]), " ", dtype_name(plan.dtypes[i]));
  }
  // Rank-major CPU arrays: this rank's chunk written into the array (nothing to do when the master is
  // a view of it), then the others' received in place. Every rank starts them in parameter order.
  std::vector<InFlight> direct;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!rank_major(plan, i, plan.dtypes[i])) continue;
    const Tensor& p = params[i];
    const int64_t c = plan.chunk[i];
    Tensor own = p.reshape({-1}).slice(plan.rank * c, (plan.rank + 1) * c);
    const Tensor& m = masters[i];
    if (!m.same_storage(own) || m.impl()->offset != own.impl()->offset || m.numel() != c)
      copy_(own, m.dtype() == p.dtype() ? m : m.cast(p.dtype()));
    direct.push_back(start_allgather_inplace(s, host_ptr(p.buffer()), size_t(c) * dtype_size(p.dtype())));
  }
  // The others in buckets in parameter order, one dtype (the model's: half arrays travel in half) each.
  struct Bucket {
    std::vector<size_t> members;
    std::vector<int64_t> offsets;
    int64_t block = 0;  // elements per rank
    DType t = DType::f32;
    Tensor send, recv;  // CPU tensors (pooled)
    InFlight op;
  };
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < params.size(); ++i) {
    const DType t = plan.dtypes[i];
    if (rank_major(plan, i, t)) continue;
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
    b.send = Tensor::empty({b.block}, b.t, Device{});
    b.recv = Tensor::empty({b.block * ranks}, b.t, Device{});
    uint8_t* send = host_ptr(flux::detail::buffer_of(b.send));
    for (size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& m = masters[b.members[k]];
      to_host_bytes(m.dtype() == b.t ? m : m.cast(b.t), send + size_t(b.offsets[k]) * es);
    }
    b.op = start_allgather_bytes(s, send, host_ptr(flux::detail::buffer_of(b.recv)), size_t(b.block) * es);
  };
  if (!buckets.empty()) start(buckets[0]);
  for (size_t k0 = 0; k0 < buckets.size(); ++k0) {
    Bucket& b = buckets[k0];
    if (k0 + 1 < buckets.size()) start(buckets[k0 + 1]);
    for (InFlight& op : direct) op.test();  // let MPI move the large ones meanwhile
    b.op.wait("distributed::update", s.timeout, true);
    const size_t es = dtype_size(b.t);
    const uint8_t* recv = host_ptr(flux::detail::buffer_of(b.recv));
    for (size_t k = 0; k < b.members.size(); ++k) {
      const size_t i = b.members[k];
      const int64_t n = plan.shapes[i].numel(), c = plan.chunk[i];
      const Tensor& p = params[i];
      if (!n) continue;
      const backend::Buffer dst = p.buffer();  // a write: whatever was derived from the array is dropped
      for (int64_t r = 0; r < ranks; ++r) {  // each rank's piece straight into the array
        const int64_t lo = std::min(n, r * c), hi = std::min(n, lo + c);
        if (hi > lo)
          p.backend().copy_from_host(p.device().index(), backend::Buffer{dst.handle, dst.offset + size_t(lo) * es},
                                     recv + size_t(r * b.block + b.offsets[k]) * es, size_t(hi - lo) * es);
      }
    }
    b.send = Tensor();
    b.recv = Tensor();
  }
  for (InFlight& op : direct) op.wait("distributed::update", s.timeout, true);
  // The arrays were written behind the library's back: drop what was derived from them.
  for (size_t i = 0; i < params.size(); ++i)
    if (rank_major(plan, i, plan.dtypes[i])) (void)params[i].buffer();
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
  static constexpr size_t kInFlight = 2;
  struct Bucket {
    std::vector<size_t> members;
    std::vector<int64_t> offsets;  // of each member's chunk inside a block
    int64_t block = 0;             // elements per rank
    DType t = DType::f32;          // on the wire
    DType sum = DType::f32;        // of the result (float32 for a bf16 wire)
    int pending = 0;
    bool launched = false, done = false;
    bool arrived = false;  // the exchange completed (seen by the progress thread); done once summed
    // One rank-major CPU array: MPI reads the gradient itself (`source`, cast to the wire dtype if
    // needed) instead of a packed copy.
    bool direct = false;
    Tensor source;  // direct: the gradient MPI reads; else the packed send buffer (CPU, pooled)
    Tensor recv;    // CPU: every rank's copy of this rank's block (ranks x block), until summed
    Tensor result;  // CPU: the sums (block elements, the master dtype)
    InFlight op;
  };
  std::shared_ptr<const ShardPlan> plan;
  autodiff::Tape* tape = nullptr;
  std::vector<Tensor> leaves;
  std::unordered_map<int64_t, size_t> leaf_of_tape_id;
  std::vector<size_t> bucket_of;
  std::vector<bool> reported;
  std::vector<Bucket> buckets;
  int launched_during_backward = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  // The progress thread (stage 2), as the data-parallel reducer's: `mutex` guards the buckets and
  // every MPI call while it lives; it tests the buckets in flight every 100 us and sleeps otherwise.
  bool use_thread = false;
  std::mutex mutex;
  std::condition_variable wake;
  std::thread helper;
  bool in_flight = false, stop = false;
  std::exception_ptr helper_error;

  void help() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      if (!in_flight) {
        wake.wait(lock, [&] { return stop || in_flight; });
        continue;
      }
      try {
        if (progress(false)) in_flight = false;
      } catch (...) {  // a rank died: finish() rethrows it on the main thread
        helper_error = std::current_exception();
        return;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
    }
  }

  void stop_helper() {
    if (!helper.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_one();
    helper.join();
  }

  ~State() {  // after a failure mid-step: the thread stops, then MPI may still use the buffers in flight
    stop_helper();
    for (Bucket& b : buckets)
      if (b.launched && !b.arrived) {
        try {
          b.op.wait("distributed::withgradient", plan->comm.state().timeout, true);
        } catch (...) {  // a rank that is gone was already reported; one timeout is enough
          break;
        }
      }
  }

  void launch(Bucket& b) {
    // At most kInFlight exchanges at once (each holds its send buffer or gradient and the ranks'
    // copies of this rank's block, both as large as the bucket): the oldest is waited for first, so
    // the memory a step adds stays bounded.
    std::vector<Bucket*> open;
    for (Bucket& o : buckets)
      if (o.launched && !o.done) open.push_back(&o);
    for (size_t k = 0; k + kInFlight <= open.size(); ++k) {
      if (!open[k]->arrived) open[k]->op.wait("distributed::withgradient", plan->comm.state().timeout, true);
      complete(*open[k]);
    }
    b.launched = true;
    const int64_t ranks = plan->ranks;
    const size_t es = dtype_size(b.t);
    uint8_t* send = nullptr;
    if (b.direct) {
      const size_t i = b.members[0];
      Tensor g = tape->grad(leaves[i]);
      tape->release_grad(leaves[i]);
      b.source = g.dtype() == b.t ? g : g.cast(b.t);
      send = host_ptr(flux::detail::buffer_of(b.source));
    } else {
      b.source = Tensor::empty({b.block * ranks}, b.t, Device{});
      send = host_ptr(flux::detail::buffer_of(b.source));
      std::vector<uint8_t> flat;
      for (size_t k = 0; k < b.members.size(); ++k) {
        const size_t i = b.members[k];
        Tensor g = tape->grad(leaves[i]);  // zeros for an array f did not use
        tape->release_grad(leaves[i]);     // the gradient's memory goes with its bucket
        if (g.dtype() != b.t) g = g.cast(b.t);
        const int64_t n = g.numel(), c = plan->chunk[i];
        const uint8_t* src;
        if (g.device().is_cpu()) {  // read where it is
          src = host_ptr(flux::detail::buffer_of(g));
        } else {
          flat.resize(size_t(n) * es);
          to_host_bytes(g, flat.data());
          src = flat.data();
        }
        for (int64_t r = 0; r < ranks; ++r) {
          const int64_t lo = std::min(n, r * c), hi = std::min(n, lo + c);
          uint8_t* dst = send + size_t(r * b.block + b.offsets[k]) * es;
          if (hi > lo) std::memcpy(dst, src + size_t(lo) * es, size_t(hi - lo) * es);
          if (hi - lo < c) std::memset(dst + size_t(hi - lo) * es, 0, size_t(c - (hi - lo)) * es);  // the padding
        }
      }
    }
    // Every rank's block r to rank r, summed there (complete()). Not MPI_Ireduce_scatter_block: Open
    // MPI's non-blocking one (coll/libnbc) reduces everything to rank 0, which adds it alone, and then
    // scatters it; the exchange moves each block once and every rank adds its own at the same time.
    b.recv = Tensor::empty({b.block * ranks}, b.t, Device{});
    b.op = start_alltoall_bytes(plan->comm.state(), send, host_ptr(flux::detail::buffer_of(b.recv)), size_t(b.block) * es);
  }

  // A bucket whose exchange completed: its send buffer (or gradient) goes, the ranks' blocks are
  // summed at once (so only block elements stay until finish()).
  void complete(Bucket& b) {
    b.done = true;
    b.source = Tensor();
    // The ranks' blocks summed in rank order (bf16 ones in float32).
    Tensor result = b.recv;
    if (plan->ranks > 1 || b.t != b.sum) {
      result = Tensor::empty({b.block}, b.t == DType::bf16 ? DType::f32 : b.t, Device{});
      const uint8_t* blocks = host_ptr(flux::detail::buffer_of(b.recv));
      uint8_t* out_sums = host_ptr(flux::detail::buffer_of(result));
      if (b.t == DType::bf16)
        sum_blocks(reinterpret_cast<const uint16_t*>(blocks), reinterpret_cast<float*>(out_sums), b.block, plan->ranks,
                   bf16_to_float);
      else if (b.t == DType::f64)
        sum_blocks(reinterpret_cast<const double*>(blocks), reinterpret_cast<double*>(out_sums), b.block, plan->ranks,
                   [](double v) { return v; });
      else
        sum_blocks(reinterpret_cast<const float*>(blocks), reinterpret_cast<float*>(out_sums), b.block, plan->ranks,
                   [](float v) { return v; });
    }
    if (result.dtype() != b.sum) result = result.cast(b.sum);
    b.result = result;
    b.recv = Tensor();
  }

  // Lets MPI move the buckets in flight; true when none is left in flight. On the main thread
  // (`sum`) a completed bucket is summed and its buffers go at once; the progress thread only marks it
  // (no tensor is made or freed off the main thread).
  bool progress(bool sum = true) {
    bool all = true;
    for (Bucket& b : buckets)
      if (b.launched && !b.done) {
        if (!b.arrived) b.arrived = b.op.test();
        if (b.arrived && sum) complete(b);
        all = all && b.arrived;
      }
    return all;
  }
};

ShardReducer::ShardReducer(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> leaves, autodiff::Tape& tape,
                           bool progress_thread)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.use_thread = progress_thread && plan->options.stage == 2 && plan->comm.state().helper_threads;
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
    const bool direct = rank_major(p, i, wire);
    if (direct || s.buckets.empty() || s.buckets.back().direct || s.buckets.back().t != wire ||
        (s.buckets.back().block + p.chunk[i]) * es * p.ranks > p.options.bucket_bytes) {
      if (s.buckets.empty() || !s.buckets.back().members.empty()) s.buckets.emplace_back();
      s.buckets.back().t = wire;
      s.buckets.back().sum = master;
      s.buckets.back().direct = direct;
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
  const bool launch = --b.pending == 0 && s.plan->options.stage >= 2;
  if (s.helper.joinable()) {  // the thread tests the buckets; this thread sums those that arrived
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      for (State::Bucket& o : s.buckets)
        if (o.arrived && !o.done) s.complete(o);
      if (launch) {
        s.launch(b);
        ++s.launched_during_backward;
        s.in_flight = true;
      }
    }
    if (launch) s.wake.notify_one();
    return;
  }
  if (launch) {
    s.launch(b);
    ++s.launched_during_backward;
  }
  const bool all_done = s.progress();
  if (launch && !all_done && s.use_thread) {  // the first bucket still in flight starts the thread
    s.in_flight = true;
    s.helper = std::thread([&s] { s.help(); });
  }
}

std::vector<Tensor> ShardReducer::finish() {
  State& s = *state_;
  const ShardPlan& p = *s.plan;
  const auto backward_end = std::chrono::steady_clock::now();
  GradientStats stats;
  stats.buckets = int(s.buckets.size());
  stats.launched_during_backward = s.launched_during_backward;
  stats.backward_seconds = std::chrono::duration<double>(backward_end - s.start).count();
  stats.progress_thread = s.helper.joinable();
  s.stop_helper();
  if (s.helper_error) std::rethrow_exception(s.helper_error);
  for (State::Bucket& b : s.buckets)
    if (!b.launched) {
      s.launch(b);
      s.progress();
    }
  std::vector<Tensor> out(s.leaves.size());
  for (State::Bucket& b : s.buckets) {
    if (!b.done) {
      if (!b.arrived) b.op.wait("distributed::withgradient", p.comm.state().timeout, true);
      s.complete(b);
    }
    for (size_t k = 0; k < b.members.size(); ++k) {
      const size_t i = b.members[k];
      Tensor chunk = b.result.slice(b.offsets[k], b.offsets[k] + p.chunk[i]);  // CPU: the sums themselves
      if (!p.devices[i].is_cpu()) chunk = to(chunk, p.devices[i]);
      out[i] = chunk;
    }
    b.result = Tensor();
  }
  stats.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - backward_end).count();
  set_gradient_stats(stats);
  return out;
}

}  // namespace flux::distributed::detail
