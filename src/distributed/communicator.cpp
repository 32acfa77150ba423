// distributed::initialize, the communicator and the tensor collectives over Open MPI. Every MPI
// collective here is non-blocking (MPI_Iallreduce, MPI_Ibcast, ...) and waited for by polling
// MPI_Test against the communicator's timeout, so a rank that died, hangs or never joined ends the
// others with an error instead of a hang; after such an error the job is aborted at exit
// (MPI_Abort), since MPI_Finalize would wait for the missing rank. Device tensors are staged
// through host memory (backend copy_to_host / copy_from_host), except on a backend with device
// collectives (NCCL in the CUDA plugin), where they stay on the device.
#include "src/distributed/transport.hpp"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#if FLUX_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (no MPI C++ bindings to link)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"

namespace flux::distributed {
namespace detail {

#if FLUX_HAVE_MPI
struct CommunicatorState::Mpi {
  MPI_Comm comm = MPI_COMM_NULL;
};
struct InFlight::Impl {
  MPI_Request request = MPI_REQUEST_NULL;
  CommunicatorState* state = nullptr;
  bool done = false;
};
#else
struct CommunicatorState::Mpi {};
struct InFlight::Impl {
  bool done = true;
};
#endif

CommunicatorState::CommunicatorState() = default;
CommunicatorState::~CommunicatorState() = default;
InFlight::InFlight() = default;
InFlight::~InFlight() = default;
InFlight::InFlight(InFlight&&) noexcept = default;
InFlight& InFlight::operator=(InFlight&&) noexcept = default;

namespace {

// Set when a collective timed out: MPI_Finalize would wait for the missing rank, so exit aborts.
std::atomic<bool> g_broken{false};  // atomic: the reducer's progress thread tests requests too

#if FLUX_HAVE_MPI
[[noreturn]] void mpi_fail(const char* api, const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  g_broken = true;
  flux::detail::fail("[", api, "] ", call, " failed: ", std::string(text, size_t(len)));
}

void check_mpi(int code, const char* api, const char* call) {
  if (code != MPI_SUCCESS) mpi_fail(api, call, code);
}

MPI_Datatype mpi_type(DType t, const char* api) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8:
    case DType::boolean: return MPI_UINT8_T;
    default: flux::detail::fail("[", api, "] no MPI type for dtype ", dtype_name(t));
  }
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_broken) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}
#endif

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (const char* v = std::getenv(var); v && *v) return true;
  return false;
}

double timeout_from(const InitOptions& o) {
  if (std::isnan(o.timeout) || std::isinf(o.timeout))
    flux::detail::fail("[distributed::initialize] timeout must be a finite number of seconds (<= 0: FLUX_DISTRIBUTED_TIMEOUT, ",
                       "else 60), got ", o.timeout);
  if (o.timeout > 0) return o.timeout;
  return environment::positive_number("FLUX_DISTRIBUTED_TIMEOUT", 60);
}

std::shared_ptr<CommunicatorState> make_world(const InitOptions& o) {
  auto s = std::make_shared<CommunicatorState>();
  s->timeout = timeout_from(o);
  if (!launched_by_mpirun()) return s;  // a plain run: one rank, MPI is never started
#if FLUX_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI's non-blocking allreduce (coll/libnbc, which MPI_Iallreduce uses) takes a binomial tree
    // for fewer than 4 ranks: rank 0 receives everything, adds it alone while the others wait, and
    // sends the whole sum back, so the critical path moves the message twice and adds it once. The
    // ring moves and adds 1/p of it per round on every rank at once, which is faster for 2 and 3
    // ranks. Only when the user has not chosen (an OMPI_MCA_ variable, or mpirun --mca, which sets
    // one, wins); other MPIs ignore the variable.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    // MPI_Init waits for every rank of the job; a rank that never starts would block it forever.
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    double timeout = s->timeout;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(m);
      if (!cv.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return done; })) {
        std::fprintf(stderr,
                     "[distributed::initialize] MPI start-up did not complete within %g s: a rank died or "
                     "never joined (FLUX_DISTRIBUTED_TIMEOUT sets the limit)\n",
                     timeout);
        std::fflush(stderr);
        std::_Exit(1);
      }
    });
    // SERIALIZED: the gradient reducer's progress thread calls MPI_Test while the main thread runs
    // backward, one of them at a time (the reducer's mutex); every other call stays on one thread.
    int provided = 0;
    int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
    if (code != MPI_SUCCESS) flux::detail::fail("[distributed::initialize] MPI_Init_thread failed with code ", code);
    std::atexit(finalize_at_exit);
  }
  s->mpi = std::make_unique<CommunicatorState::Mpi>();
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);  // also when the user started MPI, with whatever level they asked for
  s->helper_threads = level >= MPI_THREAD_SERIALIZED;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s->mpi->comm), "distributed::initialize", "MPI_Comm_dup");
  MPI_Comm_set_errhandler(s->mpi->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->mpi->comm, &s->rank);
  MPI_Comm_size(s->mpi->comm, &s->size);
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(s->mpi->comm, MPI_COMM_TYPE_SHARED, s->rank, MPI_INFO_NULL, &local),
            "distributed::initialize", "MPI_Comm_split_type");
  MPI_Comm_rank(local, &s->local_rank);
  MPI_Comm_free(&local);
  s->backend = "MPI";
  return s;
#else
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (n && std::atoi(n) > 1)
    flux::detail::fail("[distributed::initialize] started by mpirun with ", n,
                       " ranks, but flux was built without MPI (find_package(MPI) failed); install "
                       "libopenmpi-dev and rebuild");
  return s;
#endif
}

}  // namespace

bool InFlight::test() {
#if FLUX_HAVE_MPI
  if (!impl || impl->done) return true;
  int flag = 0;
  check_mpi(MPI_Test(&impl->request, &flag, MPI_STATUS_IGNORE), "distributed", "MPI_Test");
  impl->done = flag != 0;
  return impl->done;
#else
  return true;
#endif
}

void InFlight::wait(const char* api, double timeout, bool busy) {
  using clock = std::chrono::steady_clock;
  auto start = clock::now();
  for (int spins = 0; !test(); ++spins) {
    double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > timeout) {
      g_broken = true;
      flux::detail::fail("[", api, "] no answer from the other ranks within ", timeout,
                         " s: a rank died, hangs or never joined this collective (FLUX_DISTRIBUTED_TIMEOUT or "
                         "InitOptions::timeout sets the limit)");
    }
    // Spin briefly (a collective on this host completes in microseconds), then give the core away:
    // 20 us naps, growing to 1 ms after 20,000 tests unless `busy` (a large message moves only while
    // it is tested, so those keep the 20 us naps: no spinning that would count as CPU time).
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 && !busy ? 1000 : 20));
    else std::this_thread::yield();
  }
}

InFlight start_allreduce_sum(CommunicatorState& s, void* data, int64_t count, DType t) {
  return start_allreduce_sum(s, data, data, count, t);
}

InFlight start_allreduce_sum(CommunicatorState& s, const void* send, void* recv, int64_t count, DType t) {
  InFlight op;
  op.impl = std::make_unique<InFlight::Impl>();
#if FLUX_HAVE_MPI
  if (s.mpi && s.size > 1) {
    op.impl->state = &s;
    check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count), mpi_type(t, "distributed::allreduce"),
                             MPI_SUM, s.mpi->comm, &op.impl->request),
              "distributed::allreduce", "MPI_Iallreduce");
    return op;
  }
#else
  (void)s;
#endif
  op.impl->done = true;
  if (send != recv && count) std::memcpy(recv, send, size_t(count) * dtype_size(t));
  return op;
}

#if FLUX_HAVE_MPI
namespace {
// MPI counts are int; the sharded collectives are cut into buckets far below that.
int mpi_count(int64_t n, const char* api) {
  if (n > (int64_t(1) << 30)) flux::detail::fail("[", api, "] ", n, " elements per rank in one collective; at most 2^30");
  return int(n);
}
}  // namespace
#endif

namespace {
// A sharded collective: the nonblocking MPI call `start(comm, request)` where there are several
// ranks, else this rank's `bytes` copied and done at once.
template <class Start>
InFlight start_sharded(CommunicatorState& s, const void* send, void* recv, size_t bytes, Start&& start) {
  InFlight op;
  op.impl = std::make_unique<InFlight::Impl>();
#if FLUX_HAVE_MPI
  if (s.mpi && s.size > 1) {
    op.impl->state = &s;
    start(s.mpi->comm, &op.impl->request);
    return op;
  }
#else
  (void)s, (void)start;
#endif
  op.impl->done = true;
  if (bytes) std::memcpy(recv, send, bytes);
  return op;
}
#if FLUX_HAVE_MPI
constexpr const char* kShardApi = "distributed::shard";
#endif
}  // namespace

InFlight start_alltoall_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes) {
  return start_sharded(s, send, recv, bytes, [&](auto comm, auto* request) {
#if FLUX_HAVE_MPI
    check_mpi(MPI_Ialltoall(send, mpi_count(int64_t(bytes), kShardApi), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm, request),
              kShardApi, "MPI_Ialltoall");
#else
    (void)comm, (void)request;
#endif
  });
}

InFlight start_allgather_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes) {
  return start_sharded(s, send, recv, bytes, [&](auto comm, auto* request) {
#if FLUX_HAVE_MPI
    check_mpi(MPI_Iallgather(send, mpi_count(int64_t(bytes), kShardApi), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm, request),
              kShardApi, "MPI_Iallgather");
#else
    (void)comm, (void)request;
#endif
  });
}

InFlight start_allgather_inplace(CommunicatorState& s, void* data, size_t bytes) {
  InFlight op;
  op.impl = std::make_unique<InFlight::Impl>();
#if FLUX_HAVE_MPI
  if (s.mpi && s.size > 1) {
    op.impl->state = &s;
    check_mpi(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, mpi_count(int64_t(bytes), kShardApi), MPI_BYTE,
                             s.mpi->comm, &op.impl->request),
              kShardApi, "MPI_Iallgather");
    return op;
  }
#else
  (void)s, (void)data, (void)bytes;
#endif
  op.impl->done = true;  // one rank: its block is already in place
  return op;
}

void allreduce_sum(CommunicatorState& s, void* data, int64_t count, DType t, const char* api) {
  // MPI counts are int: long arrays go in pieces of at most 2^30 elements.
  const int64_t piece = int64_t(1) << 30;
  for (int64_t at = 0; at < count; at += piece) {
    auto* p = static_cast<uint8_t*>(data) + size_t(at) * dtype_size(t);
    start_allreduce_sum(s, p, std::min(piece, count - at), t).wait(api, s.timeout);
  }
}

void broadcast_bytes(CommunicatorState& s, void* data, size_t bytes, int root, const char* api) {
#if FLUX_HAVE_MPI
  if (!s.mpi || s.size == 1 || bytes == 0) return;
  const size_t piece = size_t(1) << 30;
  for (size_t at = 0; at < bytes; at += piece) {
    InFlight op;
    op.impl = std::make_unique<InFlight::Impl>();
    check_mpi(MPI_Ibcast(static_cast<uint8_t*>(data) + at, int(std::min(piece, bytes - at)), MPI_BYTE, root,
                         s.mpi->comm, &op.impl->request),
              api, "MPI_Ibcast");
    op.wait(api, s.timeout);
  }
#else
  (void)s, (void)data, (void)bytes, (void)root, (void)api;
#endif
}

void allgather_bytes(CommunicatorState& s, const void* send, void* recv, size_t bytes_per_rank, const char* api) {
#if FLUX_HAVE_MPI
  if (s.mpi && s.size > 1) {
    if (bytes_per_rank > (size_t(1) << 30))
      flux::detail::fail("[", api, "] ", bytes_per_rank, " bytes per rank; at most 2^30 are supported");
    InFlight op;
    op.impl = std::make_unique<InFlight::Impl>();
    check_mpi(MPI_Iallgather(send, int(bytes_per_rank), MPI_BYTE, recv, int(bytes_per_rank), MPI_BYTE,
                             s.mpi->comm, &op.impl->request),
              api, "MPI_Iallgather");
    op.wait(api, s.timeout);
    return;
  }
#else
  (void)s, (void)api;
#endif
  if (bytes_per_rank) std::memcpy(recv, send, bytes_per_rank);
}

void barrier(CommunicatorState& s, const char* api) {
#if FLUX_HAVE_MPI
  if (!s.mpi || s.size == 1) return;
  InFlight op;
  op.impl = std::make_unique<InFlight::Impl>();
  check_mpi(MPI_Ibarrier(s.mpi->comm, &op.impl->request), api, "MPI_Ibarrier");
  op.wait(api, s.timeout);
#else
  (void)s, (void)api;
#endif
}

void check_same_on_all_ranks(CommunicatorState& s, const std::string& desc, const char* api, const char* what) {
  if (s.size == 1 || !s.mpi) return;
  constexpr size_t kWidth = 200;
  std::vector<char> mine(kWidth, '\0'), all(kWidth * size_t(s.size), '\0');
  std::memcpy(mine.data(), desc.data(), std::min(desc.size(), kWidth - 1));
  allgather_bytes(s, mine.data(), all.data(), kWidth, api);
  bool same = true;
  for (int r = 1; r < s.size; ++r) same = same && std::strncmp(&all[0], &all[size_t(r) * kWidth], kWidth) == 0;
  if (same) return;
  std::ostringstream msg;
  msg << "[" << api << "] " << what << " differ between ranks:";
  for (int r = 0; r < s.size; ++r) msg << (r ? "," : "") << " " << &all[size_t(r) * kWidth] << " on rank " << r;
  flux::detail::fail(msg.str());
}

void* device_comm(CommunicatorState& s, const Tensor& x, const char* api) {
  if (!s.mpi || s.size == 1 || x.device().is_cpu()) return nullptr;
  backend::Backend& be = x.backend();
  const size_t id_bytes = be.collective_id_bytes();
  if (id_bytes == 0) return nullptr;
  auto key = std::make_pair(static_cast<const void*>(&be), x.device().index());
  if (auto it = s.device_comms.find(key); it != s.device_comms.end()) return it->second;
  std::vector<uint8_t> id(id_bytes);
  if (s.rank == 0) be.collective_unique_id(id.data());
  broadcast_bytes(s, id.data(), id.size(), 0, api);
  void* comm = be.collective_join(x.device().index(), id.data(), s.size, s.rank);
  s.device_comms.emplace(key, comm);
  return comm;
}

void device_wait(CommunicatorState& s, const Tensor& x, void* comm, const char* api) {
  if (!x.backend().collective_wait(comm, x.device().index(), s.timeout)) {
    g_broken = true;
    flux::detail::fail("[", api, "] no answer from the other ranks within ", s.timeout, " s on ", to_string(x.device()),
                       ": a rank died, hangs or never joined this collective (FLUX_DISTRIBUTED_TIMEOUT or "
                       "InitOptions::timeout sets the limit)");
  }
}

namespace {
std::string describe(const Tensor& x) { return to_string(x.shape()) + " " + dtype_name(x.dtype()); }

void check_tensor(const Tensor& x, const char* api) {
  if (!x.defined()) flux::detail::fail("[", api, "] the tensor is undefined");
}

/// x's values in host memory, f16/bf16 widened to f32 (MPI has no half types).
std::vector<uint8_t> to_host(const Tensor& x, DType& staged) {
  Tensor y = x;
  staged = x.dtype();
  if (staged == DType::f16 || staged == DType::bf16) {
    y = x.cast(DType::f32);
    staged = DType::f32;
  }
  std::vector<uint8_t> host(y.nbytes());
  if (!host.empty()) y.backend().copy_to_host(y.device().index(), host.data(), flux::detail::buffer_of(y), host.size());
  return host;
}

/// A tensor of `shape` on `like`'s device from host values of dtype `staged`, cast to like's dtype.
Tensor from_host(const std::vector<uint8_t>& host, Shape shape, DType staged, const Tensor& like) {
  Tensor out = Tensor::empty(shape, staged, like.device());
  if (!host.empty()) out.backend().copy_from_host(out.device().index(), flux::detail::buffer_of(out), host.data(), host.size());
  return staged == like.dtype() ? out : out.cast(like.dtype());
}
}  // namespace

}  // namespace detail

Communicator::Communicator() : state_(std::make_shared<detail::CommunicatorState>()) {}
int Communicator::rank() const { return state_->rank; }
int Communicator::size() const { return state_->size; }
int Communicator::local_rank() const { return state_->local_rank; }
std::string Communicator::backend() const { return state_->backend; }
double Communicator::timeout() const { return state_->timeout; }

Communicator initialize(InitOptions options) {
  static std::mutex m;
  static std::shared_ptr<detail::CommunicatorState> world;
  std::lock_guard<std::mutex> lock(m);
  if (!world) world = detail::make_world(options);
  return Communicator(world);
}

bool mpi_available() { return FLUX_HAVE_MPI != 0; }

Tensor allreduce(const Communicator& comm, const Tensor& x, ReduceOp op) {
  const char* api = "distributed::allreduce";
  detail::check_tensor(x, api);
  if (op == ReduceOp::mean && !is_floating(x.dtype()))
    flux::detail::fail("[", api, "] the mean needs a floating-point tensor; got ", dtype_name(x.dtype()));
  if (comm.size() == 1) return x;
  detail::CommunicatorState& s = comm.state();
  detail::check_same_on_all_ranks(s, detail::describe(x), api, "the tensors' shapes or dtypes");
  if (void* dc = detail::device_comm(s, x, api)) {  // NCCL: on the device, no host copies
    Tensor out = x.contiguous_copy();
    x.backend().collective_allreduce_sum(dc, x.device().index(), x.dtype(), flux::detail::buffer_of(out), x.numel());
    detail::device_wait(s, x, dc, api);
    return op == ReduceOp::mean ? mul(out, full({}, 1.0 / s.size, x.dtype(), x.device())) : out;
  }
  DType staged;
  std::vector<uint8_t> host = detail::to_host(x, staged);
  detail::allreduce_sum(s, host.data(), x.numel(), staged, api);
  if (op == ReduceOp::mean) {
    if (staged == DType::f64)
      for (double* p = reinterpret_cast<double*>(host.data()), *e = p + x.numel(); p != e; ++p) *p /= s.size;
    else
      for (float* p = reinterpret_cast<float*>(host.data()), *e = p + x.numel(); p != e; ++p) *p /= float(s.size);
  }
  return detail::from_host(host, x.shape(), staged, x);
}

Tensor broadcast(const Communicator& comm, const Tensor& x, int root) {
  const char* api = "distributed::broadcast";
  detail::check_tensor(x, api);
  if (root < 0 || root >= comm.size())
    flux::detail::fail("[", api, "] root ", root, " is not a rank of this communicator (size ", comm.size(), ")");
  if (comm.size() == 1) return x;
  detail::CommunicatorState& s = comm.state();
  detail::check_same_on_all_ranks(s, detail::describe(x), api, "the tensors' shapes or dtypes");
  if (void* dc = detail::device_comm(s, x, api)) {
    Tensor out = comm.rank() == root ? x.contiguous_copy() : Tensor::empty(x.shape(), x.dtype(), x.device());
    x.backend().collective_broadcast(dc, x.device().index(), flux::detail::buffer_of(out), out.nbytes(), root);
    detail::device_wait(s, x, dc, api);
    return out;
  }
  std::vector<uint8_t> host(x.nbytes());
  if (comm.rank() == root && !host.empty())
    x.backend().copy_to_host(x.device().index(), host.data(), flux::detail::buffer_of(x), host.size());
  detail::broadcast_bytes(s, host.data(), host.size(), root, api);
  return detail::from_host(host, x.shape(), x.dtype(), x);
}

Tensor allgather(const Communicator& comm, const Tensor& x) {
  const char* api = "distributed::allgather";
  detail::check_tensor(x, api);
  std::vector<int64_t> dims = x.shape().vec();
  if (dims.empty()) dims.push_back(1);
  dims[0] *= comm.size();
  if (comm.size() == 1) return x.reshape(Shape(dims));
  detail::CommunicatorState& s = comm.state();
  detail::check_same_on_all_ranks(s, detail::describe(x), api, "the tensors' shapes or dtypes");
  if (void* dc = detail::device_comm(s, x, api)) {
    Tensor out = Tensor::empty(Shape(dims), x.dtype(), x.device());
    x.backend().collective_allgather(dc, x.device().index(), flux::detail::buffer_of(x), flux::detail::buffer_of(out), x.nbytes());
    detail::device_wait(s, x, dc, api);
    return out;
  }
  std::vector<uint8_t> mine(x.nbytes()), all(x.nbytes() * size_t(s.size));
  if (!mine.empty()) x.backend().copy_to_host(x.device().index(), mine.data(), flux::detail::buffer_of(x), mine.size());
  detail::allgather_bytes(s, mine.data(), all.data(), mine.size(), api);
  return detail::from_host(all, Shape(dims), x.dtype(), x);
}

void barrier(const Communicator& comm) { detail::barrier(comm.state(), "distributed::barrier"); }

namespace detail {

void check_same_leaves(const Communicator& comm, const std::vector<std::pair<std::string, std::string>>& leaves,
                       const char* api) {
  CommunicatorState& s = comm.state();
  if (s.size == 1 || !s.mpi) return;
  std::string text;
  for (const auto& [name, desc] : leaves) text += name + "\t" + desc + "\n";
  // FNV-1a of the description, compared across ranks (one small allgather per call).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  std::vector<uint64_t> all(size_t(s.size));
  allgather_bytes(s, &h, all.data(), sizeof(h), api);
  bool same = std::all_of(all.begin(), all.end(), [&](uint64_t v) { return v == all[0]; });
  if (same) return;
  // Find the first tensor that differs from rank 0's on any rank.
  int64_t len = int64_t(text.size());
  broadcast_bytes(s, &len, sizeof(len), 0, api);
  std::string root_text(size_t(len), '\0');
  if (s.rank == 0) root_text = text;
  broadcast_bytes(s, root_text.data(), root_text.size(), 0, api);
  std::vector<std::pair<std::string, std::string>> root_leaves;
  {
    std::istringstream in(root_text);
    std::string line;
    while (std::getline(in, line)) {
      size_t tab = line.find('\t');
      root_leaves.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
    }
  }
  int64_t first = int64_t(std::max(leaves.size(), root_leaves.size()));
  for (size_t i = 0; i < std::max(leaves.size(), root_leaves.size()); ++i)
    if (i >= leaves.size() || i >= root_leaves.size() || leaves[i] != root_leaves[i]) {
      first = int64_t(i);
      break;
    }
  std::vector<int64_t> firsts(size_t(s.size));
  allgather_bytes(s, &first, firsts.data(), sizeof(first), api);
  int64_t at = *std::min_element(firsts.begin(), firsts.end());
  std::string name = size_t(at) < root_leaves.size() ? root_leaves[size_t(at)].first
                     : size_t(at) < leaves.size()    ? leaves[size_t(at)].first
                                                     : "?";
  std::string mine = size_t(at) < leaves.size() ? leaves[size_t(at)].first + " " + leaves[size_t(at)].second
                                                 : std::string("no such tensor");
  std::ostringstream what;
  what << "the models' tensors (first mismatch: tensor " << at << ", \"" << name << "\")";
  check_same_on_all_ranks(s, mine, api, what.str().c_str());
  flux::detail::fail("[", api, "] the models' tensor lists differ between ranks after tensor ", at);
}

}  // namespace detail
}  // namespace flux::distributed
