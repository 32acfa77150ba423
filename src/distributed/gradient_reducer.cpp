// distributed::withgradient's gradient averaging, as PyTorch's DDP reducer does it: the trainable
// parameters are grouped, in reverse order (the order backward finishes them), into buckets of
// about GradientOptions::bucket_bytes of one staged dtype. The tape reports each parameter's
// gradient as final (autodiff::Tape::on_gradient_final); when a bucket's last gradient is final,
// its values are copied to host memory and its MPI_Iallreduce starts, while backward goes on with
// the earlier layers. Every report also lets MPI progress the buckets in flight (Open MPI moves
// non-blocking collectives forward inside MPI calls). finish() waits for all, divides by the number
// of ranks and copies the means back to the parameters' devices. On a backend with device
// collectives (NCCL) a bucket is concatenated on its device and reduced there, on the device's
// stream, without host copies.
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/distributed/transport.hpp"

namespace flux::distributed {

namespace {
thread_local GradientStats g_stats;
using Clock = std::chrono::steady_clock;
}  // namespace

GradientStats last_gradient_stats() { return g_stats; }

namespace detail {

struct GradientReducer::State {
  struct Bucket {
    std::vector<size_t> members;  // indices into leaves
    std::vector<int64_t> offsets;  // element offset of each member in host
    DType staged = DType::f32;
    int64_t count = 0;
    int pending = 0;
    bool launched = false;
    std::vector<uint8_t> host;
    InFlight op;
    void* device_comm = nullptr;  // NCCL: the bucket is reduced on its device, in `flat`
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

  static DType staged_dtype(DType t) { return t == DType::f16 || t == DType::bf16 ? DType::f32 : t; }

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
      b.flat.backend().collective_allreduce_sum(b.device_comm, b.flat.device().index(), b.staged, b.flat.buffer(),
                                                b.count);
      return;
    }
    b.host.resize(size_t(b.count) * dtype_size(b.staged));
    for (size_t k = 0; k < b.members.size(); ++k) {
      Tensor g = tape->grad(leaves[b.members[k]]);  // zeros for a parameter f did not use
      if (g.dtype() != b.staged) g = g.cast(b.staged);
      if (g.numel())
        g.backend().copy_to_host(g.device().index(), b.host.data() + size_t(b.offsets[k]) * dtype_size(b.staged),
                                 g.buffer(), g.nbytes());
    }
    b.op = start_allreduce_sum(*comm, b.host.data(), b.count, b.staged);
  }
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
    if (b.count + p.numel() > int64_t(1) << 30)
      flux::detail::fail("[distributed::withgradient] parameter ", i, " of shape ", to_string(p.shape()),
                         " exceeds 2^30 elements per bucket");
    b.members.push_back(i);
    b.offsets.push_back(b.count);
    b.count += p.numel();
    ++b.pending;
    s.bucket_of[i] = s.buckets.size() - 1;
  }
  // Buckets on one device of a backend with device collectives reduce there (joining is collective:
  // every rank has the same buckets, checked before).
  for (State::Bucket& b : s.buckets) {
    const Tensor& first = s.leaves[b.members[0]];
    bool one_device = true;
    for (size_t m : b.members) one_device = one_device && s.leaves[m].device() == first.device();
    if (one_device) b.device_comm = device_comm(*s.comm, first, "distributed::withgradient");
  }
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::ready(int64_t tape_id) {
  State& s = *state_;
  auto it = s.leaf_of_tape_id.find(tape_id);
  if (it == s.leaf_of_tape_id.end() || s.reported[it->second]) return;  // non-trainable state
  s.reported[it->second] = true;
  State::Bucket& b = s.buckets[s.bucket_of[it->second]];
  if (--b.pending == 0 && s.options.overlap) s.launch(b);
  for (State::Bucket& other : s.buckets)
    if (other.launched) other.op.test();
}

std::unordered_map<const TensorImpl*, Tensor> GradientReducer::finish() {
  State& s = *state_;
  auto backward_end = Clock::now();
  GradientStats stats;
  stats.buckets = int(s.buckets.size());
  stats.launched_during_backward = s.launched;
  stats.backward_seconds = std::chrono::duration<double>(backward_end - s.start).count();
  std::unordered_map<const TensorImpl*, Tensor> out;
  for (State::Bucket& b : s.buckets) {
    if (!b.launched) s.launch(b);
  }
  for (State::Bucket& b : s.buckets) {
    if (b.device_comm) {
      device_wait(*s.comm, b.flat, b.device_comm, "distributed::withgradient");
      Tensor mean = mul(b.flat, full({}, 1.0 / s.comm->size, b.staged, b.flat.device()));
      for (size_t k = 0; k < b.members.size(); ++k) {
        const Tensor& leaf = s.leaves[b.members[k]];
        Tensor g = mean.slice(b.offsets[k], b.offsets[k] + leaf.numel()).reshape(leaf.shape());
        out.emplace(leaf.impl(), g.dtype() == leaf.dtype() ? g : g.cast(leaf.dtype()));
      }
      continue;
    }
    b.op.wait("distributed::withgradient", s.comm->timeout);
    const double n = s.comm->size;
    if (b.staged == DType::f64)
      for (double *p = reinterpret_cast<double*>(b.host.data()), *e = p + b.count; p != e; ++p) *p /= n;
    else if (b.staged == DType::f32)
      for (float *p = reinterpret_cast<float*>(b.host.data()), *e = p + b.count; p != e; ++p) *p /= float(n);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& leaf = s.leaves[b.members[k]];
      Tensor g = Tensor::empty(leaf.shape(), b.staged, leaf.device());
      if (g.numel())
        g.backend().copy_from_host(g.device().index(), g.buffer(),
                                   b.host.data() + size_t(b.offsets[k]) * dtype_size(b.staged), g.nbytes());
      out.emplace(leaf.impl(), g.dtype() == leaf.dtype() ? g : g.cast(leaf.dtype()));
    }
  }
  stats.wait_seconds = std::chrono::duration<double>(Clock::now() - backward_end).count();
  g_stats = stats;
  return out;
}

}  // namespace detail
}  // namespace flux::distributed
