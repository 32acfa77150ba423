// distributed::withgradient's gradient averaging, as PyTorch's DDP reducer does it: the trainable
// parameters are grouped, in reverse order (the order backward finishes them), into buckets of
// about GradientOptions::bucket_bytes of one staged dtype. Backward runs from 1/ranks, so every
// gradient is already divided by the number of ranks and the allreduce's sum is the mean. The tape
// reports each parameter's gradient as final (autodiff::Tape::on_gradient_final); when a bucket's
// last gradient is final its MPI_Iallreduce starts, while backward goes on with the earlier layers.
// MPI reads a large CPU gradient where it is; the small ones, and those on other devices, are
// copied into one host buffer first; the sums land in a pooled host buffer whose slices ARE the
// averaged CPU gradients (other devices get a copy). Open MPI moves a non-blocking collective
// forward only inside an MPI call, and backward makes none for the length of a big layer's GEMMs: a
// progress thread (GradientOptions::progress_thread) calls MPI_Test on the pieces in flight every
// 100 us while any is in flight, and sleeps otherwise; the reducer's mutex keeps its MPI calls and
// the main thread's launches one at a time (MPI_THREAD_SERIALIZED). Without it, every gradient
// report lets MPI progress. finish() stops the thread and waits for the rest. On a backend with
// device collectives (NCCL) a bucket is concatenated on its device and reduced there, on the device's
// stream, without host copies.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/distributed/transport.hpp"

namespace flux::distributed {

namespace {
thread_local GradientStats g_stats;
using Clock = std::chrono::steady_clock;
}  // namespace

GradientStats last_gradient_stats() { return g_stats; }

namespace detail {

void set_gradient_stats(const GradientStats& stats) { g_stats = stats; }

struct GradientReducer::State {
  struct Bucket {
    std::vector<size_t> members;   // indices into leaves
    std::vector<int64_t> offsets;  // element offset of each member in `result`
    std::vector<bool> direct;      // reduced straight from the gradient's own memory (CPU, staged dtype)
    int64_t packed_count = 0;      // elements of the other members, copied to `packed`: result[0, packed_count)
    DType staged = DType::f32;
    int64_t count = 0;
    int pending = 0;
    bool launched = false;
    Tensor packed, result;         // host (CPU tensors from the caching pool): send buffer, sums
    std::vector<Tensor> keep;      // the gradients MPI reads, alive until their allreduces complete
    struct Piece {
      InFlight op;
      int64_t begin = 0, end = 0;  // elements of `result` it produces
    };
    std::vector<Piece> pieces;
    void* device_comm = nullptr;   // NCCL: the bucket is reduced on its device, in `flat`
    Tensor flat;
  };
  CommunicatorState* comm = nullptr;
  autodiff::Tape* tape = nullptr;
  std::vector<Tensor> leaves;
  GradientOptions options;
  std::unordered_map<int64_t, size_t> leaf_of_tape_id;
  std::vector<size_t> bucket_of;
  std::vector<bool> reported;
  std::vector<Bucket> buckets;
  int launched = 0;
  Clock::time_point start = Clock::now();
  // The progress thread: `mutex` guards the buckets' pieces and every MPI call the reducer makes
  // while the thread lives; `in_flight` tells it that some host piece may still be incomplete.
  std::mutex mutex;
  std::condition_variable wake;
  std::thread helper;
  bool in_flight = false, stop = false, helped = false;
  std::exception_ptr helper_error;  // an MPI error met by the thread, rethrown by finish()

  static DType staged_dtype(DType t) { return t == DType::f16 || t == DType::bf16 ? DType::f32 : t; }

  static void* host_ptr(const Tensor& t) {
    backend::Buffer b = flux::detail::buffer_of(t);
    return static_cast<uint8_t*>(b.handle) + b.offset;
  }

  // One MPI_Iallreduce per piece of at most bucket_bytes (a parameter larger than a bucket is cut):
  // Open MPI's non-blocking allreduce allocates a temporary as large as its message on every call,
  // and pieces of one bounded size are served again from the heap instead of fresh pages each step.
  void start_pieces(Bucket& b, const uint8_t* send, int64_t begin, int64_t count) {
    const size_t es = dtype_size(b.staged);
    const int64_t most = std::max<int64_t>(1, std::min<int64_t>(int64_t(1) << 30, options.bucket_bytes / int64_t(es)));
    uint8_t* recv = static_cast<uint8_t*>(host_ptr(b.result));
    for (int64_t at = 0; at < count; at += most) {
      Bucket::Piece& piece = b.pieces.emplace_back();
      piece.begin = begin + at;
      piece.end = begin + std::min(count, at + most);
      piece.op = start_allreduce_sum(*comm, send + size_t(at) * es, recv + size_t(piece.begin) * es,
                                     piece.end - piece.begin, b.staged);
    }
  }

  void launch(Bucket& b) {
    b.launched = true;
    ++launched;
    if (b.device_comm) {  // concatenate on the device and enqueue the allreduce on its stream
      std::vector<Tensor> pieces;
      for (size_t m : b.members) {
        Tensor g = tape->grad(leaves[m]);
        pieces.push_back((g.dtype() == b.staged ? g : g.cast(b.staged)).reshape({-1}));
      }
      b.flat = pieces.size() == 1 ? pieces[0].contiguous_copy() : concat(pieces, 0);
      b.flat.backend().collective_allreduce_sum(b.device_comm, b.flat.device().index(), b.staged, flux::detail::buffer_of(b.flat),
                                                b.count);
      return;
    }
    const size_t es = dtype_size(b.staged);
    b.result = Tensor::empty({b.count}, b.staged, Device{});
    if (b.packed_count) b.packed = Tensor::empty({b.packed_count}, b.staged, Device{});
    for (size_t k = 0; k < b.members.size(); ++k) {
      Tensor g = tape->grad(leaves[b.members[k]]);  // zeros for a parameter f did not use
      if (g.dtype() != b.staged) g = g.cast(b.staged);
      if (b.direct[k]) {  // MPI reads the gradient where it is (it is final: backward writes it no more)
        b.keep.push_back(g);
        start_pieces(b, static_cast<const uint8_t*>(host_ptr(g)), b.offsets[k], g.numel());
      } else if (g.numel()) {
        g.backend().copy_to_host(g.device().index(), static_cast<uint8_t*>(host_ptr(b.packed)) + size_t(b.offsets[k]) * es,
                                 flux::detail::buffer_of(g), g.nbytes());
      }
    }
    if (b.packed_count) start_pieces(b, static_cast<const uint8_t*>(host_ptr(b.packed)), 0, b.packed_count);
  }

  // Lets MPI progress every bucket in flight; true when no host piece is left incomplete.
  bool progress() {
    bool all = true;
    for (Bucket& b : buckets)
      if (b.launched && !b.device_comm)
        for (Bucket::Piece& piece : b.pieces) all = piece.op.test() && all;
    return all;
  }

  void help() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      if (!in_flight) {
        wake.wait(lock, [&] { return stop || in_flight; });
        continue;
      }
      try {
        if (progress()) in_flight = false;
      } catch (...) {  // e.g. a rank died: finish() rethrows it on the main thread
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

  ~State() { stop_helper(); }  // before the pieces it tests go (an exception in backward)
};

GradientReducer::GradientReducer(const Communicator& comm, std::vector<Tensor> leaves, autodiff::Tape& tape,
                                 GradientOptions o)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.comm = &comm.state();
  s.tape = &tape;
  s.leaves = std::move(leaves);
  s.options = o;
  if (o.bucket_bytes <= 0)
    flux::detail::fail("[distributed::withgradient] bucket_bytes must be positive, got ", o.bucket_bytes);
  s.bucket_of.assign(s.leaves.size(), 0);
  s.reported.assign(s.leaves.size(), false);
  for (size_t i = s.leaves.size(); i-- > 0;) {
    const Tensor& p = s.leaves[i];
    s.leaf_of_tape_id[p.impl()->tape_id] = i;
    DType staged = State::staged_dtype(p.dtype());
    int64_t bytes = p.numel() * int64_t(dtype_size(staged));
    bool fresh = s.buckets.empty() || s.buckets.back().staged != staged ||
                 s.buckets.back().count * int64_t(dtype_size(staged)) + bytes > o.bucket_bytes;
    if (fresh) {
      s.buckets.emplace_back();
      s.buckets.back().staged = staged;
    }
    State::Bucket& b = s.buckets.back();
    b.members.push_back(i);
    b.count += p.numel();
    ++b.pending;
    s.bucket_of[i] = s.buckets.size() - 1;
  }
  // Host layout of each bucket: the members copied into the packed send buffer first, then those MPI
  // reads in place: CPU gradients of the staged dtype from kDirectBytes up (a copy costs more than the
  // extra MPI call there).
  constexpr int64_t kDirectBytes = int64_t(64) << 10;
  for (State::Bucket& b : s.buckets) {
    b.offsets.assign(b.members.size(), 0);
    b.direct.assign(b.members.size(), false);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& p = s.leaves[b.members[k]];
      b.direct[k] = p.device().is_cpu() && p.dtype() == b.staged && int64_t(p.nbytes()) >= kDirectBytes;
      if (!b.direct[k]) {
        b.offsets[k] = b.packed_count;
        b.packed_count += p.numel();
      }
    }
    int64_t at = b.packed_count;
    for (size_t k = 0; k < b.members.size(); ++k)
      if (b.direct[k]) {
        b.offsets[k] = at;
        at += s.leaves[b.members[k]].numel();
      }
  }
  // Buckets on one device of a backend with device collectives reduce there (joining is collective:
  // every rank has the same buckets, checked before).
  for (State::Bucket& b : s.buckets) {
    const Tensor& first = s.leaves[b.members[0]];
    bool one_device = true;
    for (size_t m : b.members) one_device = one_device && s.leaves[m].device() == first.device();
    if (one_device) b.device_comm = device_comm(*s.comm, first, "distributed::withgradient");
    if (b.device_comm && b.count > int64_t(1) << 30)
      flux::detail::fail("[distributed::withgradient] a bucket of ", b.count,
                         " elements exceeds the 2^30 a device collective takes; lower bucket_bytes");
  }
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::ready(int64_t tape_id) {
  State& s = *state_;
  auto it = s.leaf_of_tape_id.find(tape_id);
  if (it == s.leaf_of_tape_id.end() || s.reported[it->second]) return;  // non-trainable state
  s.reported[it->second] = true;
  State::Bucket& b = s.buckets[s.bucket_of[it->second]];
  const bool launch = --b.pending == 0 && s.options.overlap;
  if (s.helper.joinable()) {  // the thread progresses the pieces; only a launch needs the mutex
    if (launch) {
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        s.launch(b);
        s.in_flight = true;
      }
      s.wake.notify_one();
    }
    return;
  }
  if (launch) s.launch(b);
  bool all_done = s.progress();
  // The first host bucket in flight starts the helper (one rank's decision only: it makes no
  // collective call of its own, so ranks may differ).
  if (launch && !b.device_comm && !all_done && s.options.progress_thread && s.comm->helper_threads) {
    s.in_flight = true;
    s.helped = true;
    s.helper = std::thread([&s] { s.help(); });
  }
}

std::unordered_map<const TensorImpl*, Tensor> GradientReducer::finish() {
  State& s = *state_;
  auto backward_end = Clock::now();
  GradientStats stats;
  stats.buckets = int(s.buckets.size());
  stats.launched_during_backward = s.launched;
  stats.backward_seconds = std::chrono::duration<double>(backward_end - s.start).count();
  std::unordered_map<const TensorImpl*, Tensor> out;
  s.stop_helper();
  stats.progress_thread = s.helped;
  if (s.helper_error) std::rethrow_exception(s.helper_error);
  for (State::Bucket& b : s.buckets) {
    if (!b.launched) s.launch(b);
  }
  for (State::Bucket& b : s.buckets) {
    if (b.device_comm) {
      device_wait(*s.comm, b.flat, b.device_comm, "distributed::withgradient");
      for (size_t k = 0; k < b.members.size(); ++k) {
        const Tensor& leaf = s.leaves[b.members[k]];
        Tensor g = b.flat.slice(b.offsets[k], b.offsets[k] + leaf.numel()).reshape(leaf.shape());
        out.emplace(leaf.impl(), g.dtype() == leaf.dtype() ? g : g.cast(leaf.dtype()));
      }
      continue;
    }
    for (State::Bucket::Piece& piece : b.pieces) piece.op.wait("distributed::withgradient", s.comm->timeout);
    b.keep.clear();
    b.packed = Tensor();
    for (size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& leaf = s.leaves[b.members[k]];
      Tensor mean = b.result.slice(b.offsets[k], b.offsets[k] + leaf.numel()).reshape(leaf.shape());
      if (!leaf.device().is_cpu()) {  // back to the parameter's device
        Tensor g = Tensor::empty(leaf.shape(), b.staged, leaf.device());
        if (g.numel()) g.backend().copy_from_host(g.device().index(), flux::detail::buffer_of(g), State::host_ptr(mean), g.nbytes());
        mean = g;
      }
      out.emplace(leaf.impl(), mean.dtype() == leaf.dtype() ? mean : mean.cast(leaf.dtype()));
    }
  }
  stats.wait_seconds = std::chrono::duration<double>(Clock::now() - backward_end).count();
  g_stats = stats;
  return out;
}

}  // namespace detail
}  // namespace flux::distributed
