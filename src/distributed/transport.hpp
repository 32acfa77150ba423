// The transport under distributed.hpp (not installed): host-memory collectives over Open MPI, each
// non-blocking underneath and waited for with the communicator's timeout. Without MPI (or without
// mpirun) the communicator has one rank and these calls return at once.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "flux/distributed.hpp"

namespace flux::distributed::detail {

struct CommunicatorState {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  double timeout = 60;
  /// MPI's thread level lets a helper thread make MPI calls, one thread at a time (SERIALIZED or
  /// MULTIPLE): the gradient reducer's progress thread.
  bool helper_threads = false;
  std::string backend = "single";
  struct Mpi;                 // MPI_Comm and friends (communicator.cpp)
  std::unique_ptr<Mpi> mpi;   // null for the single-process communicator
  /// Device communicators (NCCL) by (backend, device index), joined on first use.
  std::map<std::pair<const void*, int>, void*> device_comms;
  CommunicatorState();
  ~CommunicatorState();
};

/// One non-blocking collective in flight.
class InFlight {
 public:
  InFlight();
  ~InFlight();
  InFlight(InFlight&&) noexcept;
  InFlight& operator=(InFlight&&) noexcept;
  /// Lets MPI progress; true once the collective has completed.
  bool test();
  /// Blocks until it completes; fails (and marks the job for MPI_Abort at exit) after `timeout` s.
  /// busy: keep testing every ~20 us instead of backing off to 1 ms naps after a while: a large
  /// message moves only as fast as it is tested (the sharded collectives, tens of MB each).
  void wait(const char* api, double timeout, bool busy = false);
  struct Impl;
  std::unique_ptr<Impl> impl;
};

/// In-place sum of `count` host elements of dtype t (f32, f64, i32, i64, u8) over all ranks.
InFlight start_allreduce_sum(CommunicatorState& s, void* data, int64_t count, DType t);
/// The same from `send` (only read) into `recv` (count < 2^31; send == recv: in place). Open MPI's
/// non-blocking allreduce copies an in-place buffer aside first; a separate send buffer saves that pass.
InFlight start_allreduce_sum(CommunicatorState& s, const void* send, void* recv, int64_t count, DType t);
/// Block r of every rank's `send` (ranks blocks of `bytes` each) lands in rank r's `recv`, in rank
/// order (MPI_Ialltoall): a reduce-scatter whose sum the caller does itself, in a wider dtype.
InFlight start_alltoall_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes);
/// Every rank's `bytes` of `send` concatenated in rank order into `recv` (MPI_Iallgather).
InFlight start_allgather_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes);
/// The same in place: `data` holds `ranks` blocks of `bytes`; this rank's block r is sent, the others
/// are received (MPI_Iallgather with MPI_IN_PLACE: no send buffer, no copy).
InFlight start_allgather_inplace(CommunicatorState& s, void* data, size_t bytes);
/// Blocking forms (with the timeout): in-place sum, root's bytes to all, every rank's bytes in rank order.
void allreduce_sum(CommunicatorState& s, void* data, int64_t count, DType t, const char* api);
void broadcast_bytes(CommunicatorState& s, void* data, size_t bytes, int root, const char* api);
void allgather_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes_per_rank, const char* api);
void barrier(CommunicatorState& s, const char* api);

/// The backend's communicator for x's device (NCCL for CUDA), joined on first use, which every rank
/// reaches in the same collective; null when the backend has none (then: host memory and MPI).
void* device_comm(CommunicatorState& s, const Tensor& x, const char* api);
/// Waits for the device collectives enqueued on x's device; fails after the timeout.
void device_wait(CommunicatorState& s, const Tensor& x, void* comm, const char* api);

/// What last_gradient_stats() reports on this thread (the sharded reducer's figures).
void set_gradient_stats(const GradientStats& stats);

/// Fails on every rank when `desc` (e.g. "(3, 4) Float32") differs between ranks, listing each
/// rank's value; a no-op on one rank.
void check_same_on_all_ranks(CommunicatorState& s, const std::string& desc, const char* api, const char* what);

}  // namespace flux::distributed::detail
