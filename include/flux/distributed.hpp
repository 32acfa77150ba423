// Data-parallel training across processes (Flux's DistributedUtils, PyTorch's DDP): the same program
// runs under `mpirun -np N`, each rank on its own batch shard, gradients averaged across ranks.
//   auto comm = distributed::initialize();
//   auto model = distributed::broadcast(comm, Chain(...) | dev, 0);      // every rank starts equal
//   auto loader = DataLoader({X, Y}, {.batchsize = 64, .shuffle = true, .shard = comm}) | dev;
//   auto [loss, grads] = distributed::withgradient(comm, f, model);      // averaged across ranks
// Transport: Open MPI (device tensors are staged through host memory); without mpirun, or in a
// build without MPI, a single-process communicator whose collectives return their input.
// Every collective is called by all ranks in the same order; a rank that died, hangs or never
// joined ends the others with a flux::Error after the communicator's timeout (never a hang).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flux/functor.hpp"
#include "flux/gradient.hpp"
#include "flux/ops.hpp"
#include "flux/tensor.hpp"

namespace flux::distributed {

enum class ReduceOp { sum, mean };

struct InitOptions {
  /// Seconds a collective (and MPI start-up) waits for the other ranks before failing; <= 0: the
  /// environment's FLUX_DISTRIBUTED_TIMEOUT, else 60.
  double timeout = 0;
};

namespace detail {
struct CommunicatorState;
}

/// A group of ranks. Default-constructed: the single-process communicator (rank 0 of 1).
class Communicator {
 public:
  Communicator();
  explicit Communicator(std::shared_ptr<detail::CommunicatorState> state) : state_(std::move(state)) {}
  int rank() const;
  int size() const;
  /// The rank among the processes on this host (pick the GPU with it).
  int local_rank() const;
  /// "MPI" under mpirun, "single" for the single-process communicator.
  std::string backend() const;
  /// Seconds a collective waits for the other ranks.
  double timeout() const;
  detail::CommunicatorState& state() const { return *state_; }

 private:
  std::shared_ptr<detail::CommunicatorState> state_;
};

/// The world communicator from mpirun's environment (Open MPI, PMIx); a size-1 communicator when
/// the program was not started by mpirun. Later calls return the same communicator.
Communicator initialize(InitOptions options = {});
/// True when flux was built with MPI (find_package(MPI) succeeded).
bool mpi_available();

// ---- collectives on tensors of any device; results are new tensors on x's device ----
/// The element-wise sum (or mean, floating point only) of x over all ranks.
Tensor allreduce(const Communicator& comm, const Tensor& x, ReduceOp op = ReduceOp::sum);
/// Root's x on every rank (x's shape and dtype must agree on all ranks).
Tensor broadcast(const Communicator& comm, const Tensor& x, int root);
/// Every rank's x concatenated along the first axis in rank order: (N, ...) -> (size * N, ...);
/// a 0-d x gives (size,).
Tensor allgather(const Communicator& comm, const Tensor& x);
/// Returns once every rank has called it.
void barrier(const Communicator& comm);

struct GradientOptions {
  /// Gradients are reduced in buckets of about this many bytes, in reverse parameter order.
  int64_t bucket_bytes = int64_t(25) << 20;
  /// Launch each bucket's allreduce as soon as its gradients are final during backward (true), or
  /// all of them after backward (false; for measurements).
  bool overlap = true;
  /// With overlap: a helper thread lets MPI move the buckets in flight forward while backward runs
  /// (Open MPI advances a non-blocking collective only inside an MPI call, and backward makes none
  /// between its gradient reports). It polls every 100 us while an allreduce is in flight and sleeps
  /// otherwise; it shares the rank's cores with backward. false: MPI progresses only at each gradient
  /// report. Without an MPI thread level of SERIALIZED or more (a user who started MPI with FUNNELED)
  /// there is no helper thread either way. Not used by device collectives (NCCL runs on its stream).
  bool progress_thread = true;
  /// Runs f under autocast to this dtype, as flux::withgradient(f, model, {.autocast = ...}).
  std::optional<DType> autocast = std::nullopt;
};

/// What the last distributed::withgradient on this thread did (for tests and measurements).
struct GradientStats {
  int buckets = 0;
  int launched_during_backward = 0;  // buckets whose allreduce started before backward ended
  double backward_seconds = 0;       // forward + backward, including the launches
  double wait_seconds = 0;           // after backward: waiting for the allreduces and unpacking
  bool progress_thread = false;      // the progress thread started: a host allreduce launched during
                                     // backward was still in flight after its first MPI_Test
};
GradientStats last_gradient_stats();

namespace detail {

/// Name, shape and dtype of each leaf, e.g. `1.weight (8, 6) Float64`.
template <class M> std::vector<std::pair<std::string, std::string>> describe_leaves(const M& m, bool trainable_only) {
  std::vector<std::pair<std::string, std::string>> out;
  std::unordered_map<const TensorImpl*, bool> seen;
  auto visit = [&](const std::string& name, const Tensor& t, bool trainable) {
    if ((trainable || !trainable_only) && seen.emplace(t.impl(), true).second)
      out.emplace_back(name, to_string(t.shape()) + " " + dtype_name(t.dtype()));
  };
  functor::walk(m, "", visit);
  return out;
}

/// Fails on every rank, naming the first tensor whose shape or dtype differs between ranks.
void check_same_leaves(const Communicator& comm, const std::vector<std::pair<std::string, std::string>>& leaves,
                       const char* api);

/// Averages the gradients of `leaves` (tracked parameters on `tape`) in buckets, launched as the
/// tape reports each gradient final.
class GradientReducer {
 public:
  GradientReducer(const Communicator& comm, std::vector<Tensor> leaves, autodiff::Tape& tape, GradientOptions o);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  /// The tape reports that tape entry `tape_id`'s gradient is final.
  void ready(int64_t tape_id);
  /// Waits for every bucket; the averaged gradient of each leaf, keyed by the leaf's impl.
  std::unordered_map<const TensorImpl*, Tensor> finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace detail

/// The model with every tensor leaf (parameters and non-trainable state such as BatchNorm's
/// running statistics) replaced by root's values. Fails before moving any data, naming the first
/// tensor whose shape or dtype differs between ranks.
template <class M> M broadcast(const Communicator& comm, const M& model, int root) {
  if (comm.size() == 1) return model;
  detail::check_same_leaves(comm, detail::describe_leaves(model, false), "distributed::broadcast");
  return fmap([&](const Tensor& t) { return broadcast(comm, t, root); }, model);
}

/// withgradient(f, model) with the gradient averaged over all ranks. Each bucket's allreduce starts
/// as soon as backward has finished its gradients, overlapping the rest of backward; parameters
/// that f does not use contribute zeros. Fails before differentiating when the trainable
/// parameters' shapes differ between ranks (naming the first such tensor).
template <class F, class M>
WithGradient<M> withgradient(const Communicator& comm, F&& f, const M& model, GradientOptions options = {}) {
  if (comm.size() == 1) return flux::withgradient(std::forward<F>(f), model, flux::GradientOptions{options.autocast});
  detail::check_same_leaves(comm, detail::describe_leaves(model, true), "distributed::withgradient");
  autodiff::Tape tape;
  M tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, model);
  detail::GradientReducer reducer(comm, params(tracked), tape, options);
  tape.on_gradient_final([&](int64_t id) { reducer.ready(id); });
  Tensor value;
  {
    AutocastScope scope(options.autocast);  // the forward only: the backward follows its dtypes
    value = f(tracked);
  }
  if (!value.defined()) flux::detail::fail("[distributed::withgradient] the function returned an undefined tensor");
  // Backward from 1/ranks instead of 1: every gradient comes out divided by the number of ranks,
  // and the allreduce's sum is the mean (no pass over the gradients to divide them).
  tape.backward(value, 1.0 / comm.size());
  std::unordered_map<const TensorImpl*, Tensor> averaged = reducer.finish();
  M grads = fmap(
      [&](const Tensor& t) {
        auto it = averaged.find(t.impl());
        if (it != averaged.end()) return it->second;
        // Not averaged (state that is not trainable, e.g. BatchNorm's running statistics): this
        // rank's own gradient, without the 1/ranks backward started from.
        Tensor g = tape.grad(t);
        return comm.size() > 1 && is_floating(g.dtype()) ? mul(g, full({}, double(comm.size()), g.dtype(), g.device()))
                                                         : g;
      },
      tracked);
  Tensor plain(std::make_shared<TensorImpl>(*value.impl()));
  plain.impl()->tape_id = -1;
  return WithGradient<M>{plain, std::move(grads)};
}

}  // namespace flux::distributed
