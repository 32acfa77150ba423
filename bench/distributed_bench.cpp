// Data-parallel training speed (issue 13): one process, or one rank of `mpirun -np N`, training a model
// on synthetic data with a FIXED batch per rank (weak scaling, as DDP reports it), through
// distributed::withgradient + Adam. Rank 0 prints "key value" lines for bench/distributed_bench.py,
// which runs 1 rank and 2 ranks (overlapped and not) side by side and computes the scaling efficiency
// and the hidden fraction of the allreduce.
//
// Usage: distributed_bench [--model wide|mnist|cnn] [--batch N] [--steps N] [--warmup N]
//                          [--bucket-mb X] [--no-overlap] [--no-progress-thread] [--stage 1|2|3] [--wire-bf16]
//   --stage: sharded training (distributed::shard, ZeRO-1/2/3) instead of plain data-parallel;
//   --wire-bf16: with --stage, gradients in bf16 on the wire.
// Memory per rank: peak RSS, and the library's live tensor storage (src/storage_stats.hpp): its peak
// over the timed steps and what stays between steps (model, optimiser state, masters).
//   wide  : Dense 1024 -> 4096 -> 4096 -> 1024 (relu), mse, batch 256 per rank by default (row 3 of bench/)
//   mnist : Dense 784 -> 1024 -> 1024 -> 10 (relu), logitcrossentropy (examples/distributed_mnist's MLP)
//   cnn   : examples/distributed_mnist's Fashion-MNIST CNN on 28x28 images
// Threads come from FLUX_NUM_THREADS / OPENBLAS_NUM_THREADS (the driver sets 1 per rank).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <flux/flux.hpp>
#include <flux/nn/conv.hpp>
#include <flux/nn/pooling.hpp>

namespace flux::detail {
const char* cpu_isa_name();  // src/backends/cpu/isa.cpp (not installed)
size_t live_storage_bytes();  // src/storage_stats.hpp (not installed)
size_t peak_storage_bytes();
void reset_peak_storage_bytes();
}

using namespace flux;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  std::string model = "wide";
  int64_t batch = 0;  // 0: the model's default
  int steps = 8, warmup = 2;
  double bucket_mb = 0;  // 0: the library's default
  bool overlap = true;
  bool progress_thread = true;
  int stage = 0;  // 0: plain data-parallel
  bool wire_bf16 = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "distributed_bench: %s\nusage: distributed_bench [--model wide|mnist|cnn] [--batch N] [--steps N] "
               "[--warmup N] [--bucket-mb X] [--no-overlap] [--no-progress-thread] [--stage 1|2|3] [--wire-bf16]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--model") {
      o.model = value();
      if (o.model != "wide" && o.model != "mnist" && o.model != "cnn") usage("--model must be wide, mnist or cnn");
    } else if (a == "--batch") {
      o.batch = std::atoll(value().c_str());
      if (o.batch < 1) usage("--batch must be positive");
    } else if (a == "--steps") {
      o.steps = std::atoi(value().c_str());
      if (o.steps < 1) usage("--steps must be positive");
    } else if (a == "--warmup") {
      o.warmup = std::atoi(value().c_str());
      if (o.warmup < 0) usage("--warmup must be >= 0");
    } else if (a == "--bucket-mb") {
      o.bucket_mb = std::atof(value().c_str());
      if (!(o.bucket_mb > 0)) usage("--bucket-mb must be positive");
    } else if (a == "--no-overlap") {
      o.overlap = false;
    } else if (a == "--no-progress-thread") {
      o.progress_thread = false;
    } else if (a == "--stage") {
      o.stage = std::atoi(value().c_str());
      if (o.stage < 1 || o.stage > 3) usage("--stage must be 1, 2 or 3");
    } else if (a == "--wire-bf16") {
      o.wire_bf16 = true;
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// make(): the model (rank 0's is broadcast); at stage 3 no whole copy of it stays alive.
template <class Make, class Loss>
int run(const Options& o, const distributed::Communicator& comm, Make make, const Tensor& x, const Tensor& y, Loss loss) {
  using Model = decltype(make());
  const bool root = comm.rank() == 0;
  std::optional<Model> whole(distributed::broadcast(comm, make(), 0));
  int64_t nparams = 0;
  for (const Tensor& p : params(*whole)) nparams += p.numel();
  // Plain data-parallel: the whole Adam state; sharded: this rank's chunks only (made on the chunks).
  std::optional<optimisers::State> opt;
  std::optional<distributed::ShardResult<Model>> sharded;
  if (o.stage == 0) opt = optimisers::setup(optimisers::Adam(1e-4), *whole);
  else {
    sharded.emplace(distributed::shard(comm, *whole, optimisers::Adam(1e-4),
                                       {.stage = o.stage,
                                        .bucket_bytes = o.bucket_mb > 0 ? int64_t(o.bucket_mb * double(1 << 20)) : int64_t(25) << 20,
                                        .wire = o.wire_bf16 ? std::optional<DType>(DType::bf16) : std::nullopt}));
    whole.reset();  // stages 1, 2: sharded->model holds the arrays; stage 3: nothing holds them whole
  }
  // Bytes of optimiser state and master copies this rank holds (the part sharding divides).
  double state_bytes = 0;
  {
    std::function<void(const optimisers::LeafState&)> add = [&](const optimisers::LeafState& l) {
      for (const Tensor& b : l.buffers) state_bytes += double(b.nbytes());
      for (const auto& c : l.children) add(c);
    };
    for (const auto& l : (opt ? *opt : sharded->state.opt).leaves) add(l);
    if (sharded) {  // masters that are views of the model's own arrays (stages 1, 2, float32) take nothing
      std::vector<const Storage*> model_storage;
      for (const Tensor& p : params(sharded->model.model)) model_storage.push_back(p.impl()->storage.get());
      for (const Tensor& m : sharded->state.masters)
        if (std::find(model_storage.begin(), model_storage.end(), m.impl()->storage.get()) == model_storage.end())
          state_bytes += double(m.nbytes());
    }
  }
  distributed::GradientOptions g;
  if (o.bucket_mb > 0) g.bucket_bytes = int64_t(o.bucket_mb * double(1 << 20));
  g.overlap = o.overlap;
  g.progress_thread = o.progress_thread;

  std::vector<double> step_s, grad_s, update_s, bwd_s, wait_s;
  int buckets = 0, launched = 0, helped = 0;
  float last_loss = 0;
  rusage r0{}, r1{};
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      distributed::barrier(comm);  // every rank starts the timed steps together
      getrusage(RUSAGE_SELF, &r0);
      detail::reset_peak_storage_bytes();
    }
    auto t0 = Clock::now();
    double tg = 0, tu = 0;
    if (opt) {
      auto [l, grads] = distributed::withgradient(comm, [&](auto& m) { return loss(m(x), y); }, *whole, g);
      tg = since(t0);
      auto t1 = Clock::now();
      optimisers::update(*opt, *whole, grads);
      tu = since(t1);
      last_loss = l.template item<float>();
    } else {
      auto [l, grads] = distributed::withgradient(comm, [&](auto& m) { return loss(m(x), y); }, sharded->model, g);
      tg = since(t0);
      auto t1 = Clock::now();
      optimisers::update(sharded->state, sharded->model, grads);  // the chunks, then the all-gather
      tu = since(t1);
      last_loss = l.template item<float>();
    }
    double ts = since(t0);
    if (i < o.warmup) continue;
    step_s.push_back(ts);
    grad_s.push_back(tg);
    update_s.push_back(tu);
    if (comm.size() > 1) {  // the sharded reducer reports the same figures
      distributed::GradientStats st = distributed::last_gradient_stats();
      bwd_s.push_back(st.backward_seconds);
      wait_s.push_back(st.wait_seconds);
      buckets = st.buckets;
      launched = st.launched_during_backward;
      helped += st.progress_thread;
    }
  }
  getrusage(RUSAGE_SELF, &r1);
  const double pool_peak = double(detail::peak_storage_bytes()) / double(1 << 20);
  const double pool_held = double(detail::live_storage_bytes()) / double(1 << 20);
  auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_usec - a.tv_usec); };
  const double user = secs(r0.ru_utime, r1.ru_utime), sys = secs(r0.ru_stime, r1.ru_stime);
  // Peak resident memory of every rank (the largest is the job's limit).
  std::vector<double> peaks = distributed::allgather(comm, Tensor(std::vector<double>{double(r1.ru_maxrss) / 1024.0}, Shape{1}))
                                  .to_vector<double>();
  std::vector<double> states = distributed::allgather(comm, Tensor(std::vector<double>{state_bytes / double(1 << 20)}, Shape{1}))
                                   .to_vector<double>();
  std::vector<double> pool = distributed::allgather(comm, Tensor(std::vector<double>{pool_peak, pool_held}, Shape{2}))
                                 .to_vector<double>();
  double pool_peak_max = 0, pool_held_max = 0;
  for (size_t r = 0; r < pool.size(); r += 2) {
    pool_peak_max = std::max(pool_peak_max, pool[r]);
    pool_held_max = std::max(pool_held_max, pool[r + 1]);
  }
  // Rank 0's step times are the job's: every step ends with the allreduce all ranks take part in.
  if (root) {
    // CPU time of this process (all its threads) per step: far less sensitive to other load than
    // the wall times; with one thread per rank, wall - cpu is time spent waiting or descheduled.
    std::printf("cpu_ms_per_step %.6g\nsys_ms_per_step %.6g\nminflt_per_step %.6g\n", 1e3 * (user + sys) / o.steps,
                1e3 * sys / o.steps, double(r1.ru_minflt - r0.ru_minflt) / o.steps);
    double step = median(step_s);
    std::printf("ranks %d\nmodel %s\nbatch_per_rank %lld\nparams %lld\ngrad_mb %.6g\n", comm.size(), o.model.c_str(),
                (long long)o.batch, (long long)nparams, double(nparams) * 4.0 / double(1 << 20));
    std::printf("overlap %d\nbucket_mb %.6g\nbuckets %d\nlaunched_during_backward %d\n", int(o.overlap),
                double(g.bucket_bytes) / double(1 << 20), buckets, launched);
    std::printf("progress_thread_steps %d\n", helped);  // timed steps in which the helper thread ran
    std::printf("steps %d\nstep_ms %.6g\nstep_ms_mean %.6g\nstep_ms_min %.6g\n", o.steps, 1e3 * step,
                1e3 * [&] { double s = 0; for (double v : step_s) s += v; return s / double(step_s.size()); }(),
                1e3 * *std::min_element(step_s.begin(), step_s.end()));
    std::printf("withgradient_ms %.6g\nupdate_ms %.6g\n", 1e3 * median(grad_s), 1e3 * median(update_s));
    std::printf("stage %d\nwire_bf16 %d\n", o.stage, int(o.wire_bf16));
    std::printf("peak_rss_mb_max %.6g\nstate_mb_max %.6g\n", *std::max_element(peaks.begin(), peaks.end()),
                *std::max_element(states.begin(), states.end()));
    std::printf("storage_peak_mb_max %.6g\nstorage_held_mb_max %.6g\n", pool_peak_max, pool_held_max);
    if (o.stage == 3) {
      distributed::LayerGatherStats gs = distributed::last_layer_gather_stats();
      std::printf("layer_gathers %d\nlayer_gathers_ready %d\nlayer_gather_wait_ms %.6g\n", gs.gathers, gs.ready_when_needed,
                  1e3 * gs.wait_seconds);
    }
    if (!bwd_s.empty()) std::printf("fwd_bwd_ms %.6g\nwait_ms %.6g\n", 1e3 * median(bwd_s), 1e3 * median(wait_s));
    std::printf("samples_per_s %.6g\nloss %.6g\n", double(comm.size() * o.batch) / step, double(last_loss));
    std::fflush(stdout);
  }
  return 0;
}

// Targets with class i % classes, rotated by the rank (the ranks see different data).
Tensor onehot_targets(int64_t batch, int64_t classes, int rank) {
  std::vector<float> v(size_t(batch * classes), 0.f);
  for (int64_t i = 0; i < batch; ++i) v[size_t(i * classes + (i * 7 + rank) % classes)] = 1.f;
  return Tensor(v, Shape{batch, classes});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    auto comm = distributed::initialize();
    if (o.batch == 0) o.batch = o.model == "wide" ? 256 : 128;
    if (comm.rank() == 0)
      std::printf("flux_cpu_isa %s\nbackend %s\nthreads_env %s\n", detail::cpu_isa_name(), comm.backend().c_str(),
                  std::getenv("FLUX_NUM_THREADS") ? std::getenv("FLUX_NUM_THREADS") : "unset");
    seed(uint64_t(1000 + comm.rank()));  // each rank its own batch
    auto ce = [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); };
    if (o.model == "wide") {
      Tensor x = rand({o.batch, 1024}), y = rand({o.batch, 1024});
      seed(42);
      return run(o, comm, [] { return Chain(Dense(1024, 4096, relu), Dense(4096, 4096, relu), Dense(4096, 1024)); }, x, y,
                 [](const Tensor& a, const Tensor& b) { return mse(a, b); });
    }
    if (o.model == "mnist") {
      Tensor x = rand({o.batch, 784}), y = onehot_targets(o.batch, 10, comm.rank());
      seed(42);
      return run(o, comm, [] { return Chain(Dense(784, 1024, relu), Dense(1024, 1024, relu), Dense(1024, 10)); }, x, y, ce);
    }
    Tensor x = rand({o.batch, 1, 28, 28}), y = onehot_targets(o.batch, 10, comm.rank());
    seed(42);
    return run(o, comm,
               [] {
                 return Chain(Conv({3, 3}, 1, 16, relu, {.pad = 1}), MaxPool({2, 2}), Conv({3, 3}, 16, 32, relu, {.pad = 1}),
                              MaxPool({2, 2}), flatten, Dense(32 * 7 * 7, 128, relu), Dense(128, 10));
               },
               x, y, ce);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_bench: error: %s\n", e.what());
    return 1;
  }
}
