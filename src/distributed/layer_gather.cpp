// Stage 3 of sharded training (include/flux/distributed/shard.hpp): one layer's arrays all-gathered
// from the ranks' master chunks, with at most one layer's gather in flight beside the layer that
// computes. A layer's arrays travel in the model's dtype (half arrays in half), one MPI_Iallgather per
// dtype: block r of the receive buffer holds chunk r of each member, as in gather_params; a rank-major
// CPU array (rank_major) is made whole first and gathered into its own memory (MPI_IN_PLACE). The host
// buffers are CPU tensors, so the live-storage counter (src/storage_stats.hpp) sees them.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "flux/backend.hpp"
#include "flux/distributed/layer_gather.hpp"
#include "flux/ops.hpp"
#include "src/distributed/transport.hpp"
#include "src/internal.hpp"

namespace flux::distributed {

namespace {
thread_local LayerGatherStats g_layer_stats;
}  // namespace

LayerGatherStats last_layer_gather_stats() { return g_layer_stats; }

namespace detail {

namespace {
uint8_t* host_bytes(const Tensor& t) {
  backend::Buffer b = flux::detail::buffer_of(t);
  return static_cast<uint8_t*>(b.handle) + b.offset;
}
}  // namespace

Tensor shell_of(const Tensor& x) {
  auto impl = std::make_shared<TensorImpl>(*x.impl());
  impl->storage = Tensor::empty({0}, x.dtype(), x.device()).impl()->storage;
  impl->offset = 0;
  impl->tape_id = -1;
  return Tensor(impl);
}

struct LayerGather::State {
  struct Group {  // the members of one dtype
    DType t = DType::f32;
    std::vector<size_t> members;   // indices into the layer's list
    std::vector<int64_t> offsets;  // of each member's chunk inside a block
    int64_t block = 0;             // elements per rank
    Tensor send, recv;             // u8 on the CPU
    InFlight op;
  };
  struct InPlace {  // a rank-major CPU array gathered straight into its own (new) memory
    size_t member = 0;  // index into the layer's list
    Tensor array;
    InFlight op;
  };
  struct Gather {
    size_t unit = 0;
    std::vector<Group> groups;
    std::vector<InPlace> in_place;
  };
  std::shared_ptr<const ShardPlan> plan;
  std::vector<Tensor> masters;
  autodiff::Tape* tape = nullptr;
  const char* api = "distributed::shard";
  std::vector<size_t> order;                 // the layers that have arrays, in call order
  std::vector<int64_t> position;             // of each layer in `order`, -1 for none
  std::optional<Gather> in_flight;
  std::vector<std::vector<Tensor>> held;     // each layer's arrays as handed out (their impls)
  std::vector<bool> whole;                   // held[k] has its memory
  std::vector<bool> called;
  std::vector<Tensor> leaves;                // params() order, with a tape
  std::unordered_map<int64_t, size_t> unit_of_tape_id;
  std::vector<int64_t> pending;              // arrays of each layer whose gradient is not final yet
  LayerGatherStats stats;

  void start(size_t k) {
    if (in_flight) {  // at most one in flight: an earlier one (every rank issued it) ends first, unused
      if (in_flight->unit == k) return;
      complete(*in_flight);
      in_flight.reset();
    }
    const ShardPlan& p = *plan;
    Gather g;
    g.unit = k;
    const std::vector<size_t>& members = p.units[k];
    for (size_t j = 0; j < members.size(); ++j) {
      const size_t i = members[j];
      if (rank_major(p, i, p.dtypes[i])) {  // this rank's chunk into its place, the others' received there
        InPlace& ip = g.in_place.emplace_back();
        ip.member = j;
        ip.array = Tensor::empty(p.shapes[i], p.dtypes[i], p.devices[i]);
        const Tensor& master = masters[i];
        Tensor own = ip.array.reshape({-1}).slice(p.rank * p.chunk[i], (p.rank + 1) * p.chunk[i]);
        copy_(own, master.dtype() == p.dtypes[i] ? master : master.cast(p.dtypes[i]));
        ip.op = start_allgather_inplace(p.comm.state(), host_bytes(ip.array), size_t(p.chunk[i]) * dtype_size(p.dtypes[i]));
        continue;
      }
      auto it = std::find_if(g.groups.begin(), g.groups.end(), [&](const Group& gr) { return gr.t == p.dtypes[i]; });
      if (it == g.groups.end()) {
        g.groups.emplace_back();
        g.groups.back().t = p.dtypes[i];
        it = g.groups.end() - 1;
      }
      it->members.push_back(j);
      it->offsets.push_back(it->block);
      it->block += p.chunk[i];
    }
    for (Group& gr : g.groups) {
      const size_t es = dtype_size(gr.t), bytes = size_t(gr.block) * es;
      gr.send = Tensor::empty({int64_t(bytes)}, DType::u8);
      gr.recv = Tensor::empty({int64_t(bytes) * p.ranks}, DType::u8);
      for (size_t m = 0; m < gr.members.size(); ++m) {
        const Tensor& master = masters[members[gr.members[m]]];
        const Tensor src = master.dtype() == gr.t ? master : master.cast(gr.t);
        src.backend().copy_to_host(src.device().index(), host_bytes(gr.send) + size_t(gr.offsets[m]) * es,
                                   flux::detail::buffer_of(src), src.nbytes());
      }
      gr.op = start_allgather_bytes(p.comm.state(), host_bytes(gr.send), host_bytes(gr.recv), bytes);
    }
    in_flight = std::move(g);
  }

  // Lets MPI move the gather in flight (Open MPI advances it only inside an MPI call).
  void progress() {
    if (!in_flight) return;
    for (Group& gr : in_flight->groups) gr.op.test();
    for (InPlace& ip : in_flight->in_place) ip.op.test();
  }

  void complete(Gather& g) {
    for (Group& gr : g.groups) gr.op.wait(api, plan->comm.state().timeout, true);
    for (InPlace& ip : g.in_place) ip.op.wait(api, plan->comm.state().timeout, true);
  }

  // Layer k's arrays, whole: its gather waited for (started now when another layer's, or none, moves).
  std::vector<Tensor> finish(size_t k) {
    ++stats.gathers;
    if (!in_flight || in_flight->unit != k) {
      start(k);
    } else {
      ++stats.prefetched;
      bool done = true;
      for (Group& gr : in_flight->groups) done = gr.op.test() && done;
      for (InPlace& ip : in_flight->in_place) done = ip.op.test() && done;
      stats.ready_when_needed += done ? 1 : 0;
    }
    Gather g = std::move(*in_flight);
    in_flight.reset();
    const auto t0 = std::chrono::steady_clock::now();
    complete(g);
    stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ShardPlan& p = *plan;
    const std::vector<size_t>& members = p.units[k];
    std::vector<Tensor> out(members.size());
    for (Group& gr : g.groups) {
      const size_t es = dtype_size(gr.t);
      const uint8_t* recv = host_bytes(gr.recv);
      for (size_t m = 0; m < gr.members.size(); ++m) {
        const size_t i = members[gr.members[m]];
        const int64_t n = p.shapes[i].numel(), c = p.chunk[i];
        Tensor a = Tensor::empty(p.shapes[i], gr.t, p.devices[i]);
        const backend::Buffer dst = flux::detail::buffer_of(a);
        for (int64_t r = 0; r < p.ranks; ++r) {  // each rank's piece straight into the array
          const int64_t lo = std::min(n, r * c), hi = std::min(n, lo + c);
          if (hi > lo)
            a.backend().copy_from_host(a.device().index(), backend::Buffer{dst.handle, dst.offset + size_t(lo) * es},
                                       recv + size_t(r * gr.block + gr.offsets[m]) * es, size_t(hi - lo) * es);
        }
        out[gr.members[m]] = a;
      }
    }
    for (InPlace& ip : g.in_place) out[ip.member] = ip.array;
    return out;
  }

  void free(size_t k) {
    if (!whole[k]) return;
    for (Tensor& t : held[k]) {
      t.impl()->storage = Tensor::empty({0}, t.dtype(), t.device()).impl()->storage;
      t.impl()->offset = 0;
    }
    whole[k] = false;
  }

  // Layer k's arrays back into the handles the tape holds.
  void restore(size_t k) {
    if (whole[k]) return;
    std::vector<Tensor> fresh = finish(k);
    for (size_t j = 0; j < fresh.size(); ++j) {
      held[k][j].impl()->storage = fresh[j].impl()->storage;
      held[k][j].impl()->offset = fresh[j].impl()->offset;
    }
    whole[k] = true;
  }
};

LayerGather::LayerGather(std::shared_ptr<const ShardPlan> plan, std::vector<Tensor> masters, autodiff::Tape* tape)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.plan = std::move(plan);
  s.masters = std::move(masters);
  s.tape = tape;
  if (tape) s.api = "distributed::withgradient";
  const ShardPlan& p = *s.plan;
  if (p.options.stage != 3 || p.units.empty())
    flux::detail::fail("[distributed::shard] a layer-by-layer gather needs a stage-3 model");
  if (s.masters.size() != p.shapes.size())
    flux::detail::fail("[", s.api, "] ", s.masters.size(), " master chunks for a model of ", p.shapes.size(), " arrays");
  s.position.assign(p.units.size(), -1);
  for (size_t k = 0; k < p.units.size(); ++k)
    if (!p.units[k].empty()) {
      s.position[k] = int64_t(s.order.size());
      s.order.push_back(k);
    }
  s.held.resize(p.units.size());
  s.whole.assign(p.units.size(), false);
  s.called.assign(p.units.size(), false);
  s.leaves.resize(p.shapes.size());
  s.pending.assign(p.units.size(), 0);
}

LayerGather::~LayerGather() {
  // After a failure mid-step: MPI may still write into a gather's buffers; let it end first (a rank
  // that is gone was already reported, and the wait gives up after the timeout).
  if (state_->in_flight) {
    try {
      state_->complete(*state_->in_flight);
    } catch (...) {
    }
  }
}

std::vector<Tensor> LayerGather::arrays(size_t k, bool keep) {
  State& s = *state_;
  const ShardPlan& p = *s.plan;
  if (k >= p.units.size()) flux::detail::fail("[", s.api, "] layer ", k, " of a model of ", p.units.size(), " layers");
  if (p.units[k].empty()) return {};
  if (s.called[k] && !keep)
    flux::detail::fail("[", s.api, "] stage 3: the model was called more than once in one step; each layer's "
                       "arrays are gathered for one forward and its backward (call it once, on the whole batch)");
  std::vector<Tensor> out = s.finish(k);
  // The next gather: the next layer's in the forward; after the last layer, the one before it, whose
  // arrays the backward needs next.
  const int64_t at = s.position[k];
  if (size_t(at + 1) < s.order.size()) s.start(s.order[size_t(at) + 1]);
  else if (s.tape && !keep && at > 0) s.start(s.order[size_t(at) - 1]);
  if (keep) return out;
  s.called[k] = true;
  if (s.tape) {
    for (size_t j = 0; j < out.size(); ++j) {
      out[j] = s.tape->leaf(out[j]);
      s.leaves[p.units[k][j]] = out[j];
      s.unit_of_tape_id[out[j].impl()->tape_id] = k;
    }
    s.pending[k] = int64_t(out.size());
  }
  s.held[k] = out;
  s.whole[k] = true;
  return out;
}

void LayerGather::leave(size_t k) {
  State& s = *state_;
  if (k >= s.held.size() || s.held[k].empty()) return;
  s.progress();
  if (s.tape && s.position[k] == int64_t(s.order.size()) - 1) return;  // its backward comes next
  s.free(k);
}

void LayerGather::ready(int64_t tape_id) {
  State& s = *state_;
  auto it = s.unit_of_tape_id.find(tape_id);
  if (it == s.unit_of_tape_id.end()) return;
  const size_t k = it->second;
  s.unit_of_tape_id.erase(it);
  s.progress();
  if (--s.pending[k] > 0) return;
  // Layer k's backward no longer reads its arrays; the layer before it is next.
  s.free(k);
  const int64_t at = s.position[k];
  if (at > 0) {
    const size_t previous = s.order[size_t(at) - 1];
    if (s.called[previous]) s.restore(previous);
    if (at > 1 && s.called[s.order[size_t(at) - 2]]) s.start(s.order[size_t(at) - 2]);
  }
}

std::vector<Tensor> LayerGather::leaves() const {
  const State& s = *state_;
  for (size_t k : s.order)
    if (!s.called[k])
      flux::detail::fail("[", s.api, "] stage 3: f did not call the model (layer ", k, " never ran); a stage-3 model's ",
                         "arrays exist only inside its call: write f as [&](auto& m) { return loss(m(x), y); }");
  return s.leaves;
}

void LayerGather::release() {
  State& s = *state_;
  for (size_t k = 0; k < s.held.size(); ++k) s.free(k);
  if (s.in_flight) {
    s.complete(*s.in_flight);
    s.in_flight.reset();
  }
  g_layer_stats = s.stats;
}

}  // namespace detail
}  // namespace flux::distributed
