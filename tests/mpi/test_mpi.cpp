// Data-parallel training under mpirun (tests/mpi.cmake runs this binary with -np 2 and -np 3, and
// once without mpirun, where the communicator has one rank and the cross-rank checks skip). Every
// rank runs every test in the same order: the tests themselves are collective.
#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::test_devices;
using flux::testing::error_of;

namespace {

distributed::Communicator world() { return distributed::initialize(); }

template <class M> M on(const M& m, const Device& d) {
  return fmap([&](const Tensor& t) { return to(t, d); }, m);
}

// True when x holds the same values on every rank.
bool same_on_all_ranks(const Tensor& x) {
  auto comm = world();
  std::vector<double> all = distributed::allgather(comm, x.reshape({1, -1}).f64()).to_vector<double>();
  size_t n = size_t(x.numel());
  for (int r = 1; r < comm.size(); ++r)
    if (!std::equal(all.begin(), all.begin() + long(n), all.begin() + long(n * size_t(r)))) return false;
  return true;
}

// The device this rank tests on: `d` itself, except on a backend with device collectives (NCCL in
// the CUDA plugin), which needs a device per rank: rank r takes device local_rank there, and the test
// is skipped (on every rank alike) when the host has fewer such devices than ranks, since NCCL
// refuses two ranks of one communicator on one GPU.
std::optional<Device> rank_device(const Device& d, std::string& why) {
  auto comm = world();
  if (d.is_cpu() || comm.size() == 1) return d;
  backend::Backend& be = detail::backend_for(d);
  if (be.collective_id_bytes() == 0) return d;
  if (be.device_count() < comm.size()) {
    why = d.backend() + " has device collectives (NCCL), which need one device per rank: " +
          std::to_string(comm.size()) + " ranks, " + std::to_string(be.device_count()) + " device(s) on this host";
    return std::nullopt;
  }
  return Device(d.backend(), comm.local_rank());
}

}  // namespace

#define FLUX_RANK_DEVICE(dev, param)                    \
  std::string why_not_;                                 \
  std::optional<Device> maybe_ = rank_device(param, why_not_); \
  if (!maybe_) GTEST_SKIP() << why_not_;                \
  const Device dev = *maybe_

TEST(Mpi, CommunicatorFromTheEnvironment) {
  auto comm = world();
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(comm.size(), n ? std::atoi(n) : 1);
  if (n) {
    EXPECT_EQ(comm.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
    EXPECT_EQ(comm.local_rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")));  // one host
    EXPECT_EQ(comm.backend(), "MPI");
  } else {
    EXPECT_EQ(comm.backend(), "single");
  }
  EXPECT_TRUE(distributed::mpi_available());
  distributed::barrier(comm);
}

class MpiDevices : public ::testing::TestWithParam<Device> {};
FLUX_DEVICE_SUITE(MpiDevices);

TEST_P(MpiDevices, Collectives) {
  auto comm = world();
  FLUX_RANK_DEVICE(dev, GetParam());
  const int p = comm.size(), r = comm.rank();
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::i64}) {
    SCOPED_TRACE(dtype_name(t));
    // x = (r + 1) * [0 1 2; 3 4 5]: the sum is p (p + 1) / 2 times that, the mean (p + 1) / 2.
    Tensor x = to(mul(arange(0, 6, 1, DType::f64).reshape({2, 3}), Tensor::scalar(r + 1, DType::f64)).cast(t), dev);
    Tensor s = distributed::allreduce(comm, x);
    EXPECT_EQ(s.device(), dev);
    EXPECT_EQ(s.dtype(), t);
    EXPECT_EQ(s.shape(), Shape({2, 3}));
    std::vector<double> got = s.to_vector<double>();
    for (int k = 0; k < 6; ++k) EXPECT_EQ(got[size_t(k)], k * p * (p + 1) / 2.0);
    if (is_floating(t)) {
      std::vector<double> mean = distributed::allreduce(comm, x, distributed::ReduceOp::mean).to_vector<double>();
      for (int k = 0; k < 6; ++k) EXPECT_EQ(mean[size_t(k)], k * (p + 1) / 2.0);
    }
    Tensor b = distributed::broadcast(comm, to(full({3}, r, t), dev), p - 1);
    EXPECT_EQ(b.device(), dev);
    EXPECT_EQ(b.to_vector<double>(), std::vector<double>(3, p - 1));
    Tensor g = distributed::allgather(comm, to(full({1, 2}, 10 * r, t), dev));
    EXPECT_EQ(g.shape(), Shape({p, 2}));
    EXPECT_EQ(g.device(), dev);
    std::vector<double> gv = g.to_vector<double>();
    for (int q = 0; q < p; ++q) EXPECT_EQ(gv[size_t(2 * q)], 10 * q);
  }
  distributed::barrier(comm);
}

TEST(Mpi, DifferentTensorShapesAreNamed) {
  auto comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  std::string want = "[distributed::allreduce] the tensors' shapes or dtypes differ between ranks:";
  for (int r = 0; r < comm.size(); ++r) want += std::string(r ? "," : "") + " (" + std::to_string(2 + r) + ",) Float32 on rank " + std::to_string(r);
  EXPECT_EQ(error_of([&] { distributed::allreduce(comm, ones({2 + comm.rank()})); }), want);
}

// Parameters whose shapes differ between ranks: every rank fails, naming the first such tensor (by
// its state() name), before any data moves or any training starts.
TEST(Mpi, DifferentModelsFailBeforeTraining) {
  auto comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  int64_t hidden = comm.rank() == 1 ? 9 : 8;
  auto model = Chain(Dense(6, 6), Dense(6, hidden, relu), Dense(hidden, 3));
  auto expected = [&](const char* api) {
    std::string s = std::string("[") + api +
                    "] the models' tensors (first mismatch: tensor 2, \"layers.1.weight\") differ between ranks:";
    for (int r = 0; r < comm.size(); ++r)
      s += std::string(r ? "," : "") + " layers.1.weight (" + (r == 1 ? "9" : "8") + ", 6) Float32 on rank " + std::to_string(r);
    return s;
  };
  EXPECT_EQ(error_of([&] { distributed::broadcast(comm, model, 0); }), expected("distributed::broadcast"));
  Tensor x = ones({2, 6}), y = ones({2, 3});
  bool ran = false;
  EXPECT_EQ(error_of([&] {
              distributed::withgradient(
                  comm, [&](auto& m) { ran = true; return mse(m(x), y); }, model);
            }),
            expected("distributed::withgradient"));
  EXPECT_FALSE(ran);
}

// Every tensor leaf comes from the root: parameters and BatchNorm's running statistics.
TEST_P(MpiDevices, BroadcastModelIncludingBatchNormState) {
  auto comm = world();
  FLUX_RANK_DEVICE(dev, GetParam());
  seed(100 + uint64_t(comm.rank()));  // a different initial model on every rank
  auto model = Chain(Dense(3, 4), BatchNorm(4, relu));
  std::get<1>(model.layers).running_mean = full({4}, comm.rank() + 1.0);
  std::get<1>(model.layers).num_batches_tracked = full(Shape{}, 5 * comm.rank(), DType::i64);
  const int root = comm.size() - 1;
  auto synced = distributed::broadcast(comm, on(model, dev), root);
  int leaves = 0;
  auto check = [&](const std::string& name, const Tensor& t) {
    ++leaves;
    EXPECT_EQ(t.device(), dev) << name;
    EXPECT_TRUE(same_on_all_ranks(t)) << name;
  };
  functor::walk(synced, "", check);
  EXPECT_EQ(leaves, 7);  // weight, bias, BatchNorm weight, bias, running_mean, running_var, num_batches_tracked
  EXPECT_EQ(std::get<1>(synced.layers).running_mean.to_vector<float>(), std::vector<float>(4, float(root + 1)));
  EXPECT_EQ(std::get<1>(synced.layers).num_batches_tracked.item<int64_t>(), 5 * root);
  if (comm.rank() == root) {
    EXPECT_EQ(std::get<0>(synced.layers).weight.to_vector<float>(), std::get<0>(model.layers).weight.to_vector<float>());
  }
}

// The parity test: k optimiser steps under mpirun, each rank on its shard of batchsize b, give the
// parameters of one process training on the concatenated batches (batchsize b * ranks), in float64.
// Several buckets, launched during backward or after it; an unused Dense too. Three layouts:
//  - hidden 16, bucket_bytes 512: three buckets of small gradients, each copied into one message;
//  - hidden 2048, 1 MiB: one bucket mixing the 0.0.weight gradient (96 KiB, on the CPU read by MPI
//    where it is) with the small ones (copied);
//  - hidden 2048, 40,000 bytes: four buckets, 0.0.weight cut into three pieces of at most 40,000 bytes.
struct ParityCase {
  int64_t hidden, bucket_bytes;
  int buckets;
};
class MpiParity : public ::testing::TestWithParam<std::tuple<Device, ParityCase>> {};
INSTANTIATE_TEST_SUITE_P(Layouts, MpiParity,
                         ::testing::Combine(::testing::ValuesIn(test_devices()),
                                            ::testing::Values(ParityCase{16, 512, 3}, ParityCase{2048, 1 << 20, 1},
                                                              ParityCase{2048, 40000, 4})),
                         [](const auto& info) {
                           std::string name = to_string(std::get<0>(info.param)) + "_hidden" +
                                              std::to_string(std::get<1>(info.param).hidden) + "_bucket" +
                                              std::to_string(std::get<1>(info.param).bucket_bytes);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST_P(MpiParity, TrainingMatchesOneProcessOnTheConcatenatedBatch) {
  auto comm = world();
  FLUX_RANK_DEVICE(dev, std::get<0>(GetParam()));
  const ParityCase pc = std::get<1>(GetParam());
  const int64_t b = 4, steps = 3, p = comm.size(), h = pc.hidden;
  seed(7);
  Tensor X = randn({steps * b * p, 6}, DType::f64), Y = randn({steps * b * p, 3}, DType::f64);
  // overlapped with the progress thread (the default), overlapped without it, after backward
  for (int mode : {0, 1, 2}) {
    const bool overlap = mode < 2, helper = mode == 0;
    SCOPED_TRACE(mode == 0 ? "overlapped buckets, progress thread"
                           : mode == 1 ? "overlapped buckets, no progress thread" : "reduced after backward");
    int helped = 0;
    seed(200 + uint64_t(comm.rank()));  // a different model per rank until broadcast
    auto init = fmap([](const Tensor& t) { return t.f64(); },
                     std::make_tuple(Chain(Dense(6, h, tanh_act), Dense(h, 3)), Dense(3, 3)));
    auto model = distributed::broadcast(comm, on(init, dev), 0);
    auto reference = fmap([](const Tensor& t) { return t.contiguous_copy(); }, model);
    std::vector<std::vector<double>> start;
    for (const Tensor& t : params(model)) start.push_back(t.to_vector<double>());
    auto f = [](const Tensor& x, const Tensor& y) {
      return [x, y](auto& m) { return mse(std::get<0>(m)(x), y); };  // std::get<1> is never used
    };

    auto opt = optimisers::setup(optimisers::Adam(0.05), model);
    auto loader = DataLoader({X, Y}, {.batchsize = b, .shard = comm}) | dev;
    int taken = 0;
    for (auto [x, y] : loader) {
      EXPECT_EQ(x.shape(), Shape({b, 6}));
      auto [loss, grads] =
          distributed::withgradient(comm, f(x, y), model,
                                    {.bucket_bytes = pc.bucket_bytes, .overlap = overlap, .progress_thread = helper});
      auto stats = distributed::last_gradient_stats();
      if (!helper) {
        EXPECT_FALSE(stats.progress_thread);
      }
      helped += stats.progress_thread;
      if (p > 1) {
        // hidden 16, reverse order: [1.bias 1.weight 0.1.bias 0.1.weight] 504 B, [0.0.bias], [0.0.weight]
        EXPECT_EQ(stats.buckets, pc.buckets);
        EXPECT_EQ(stats.launched_during_backward, overlap ? pc.buckets : 0);
      }
      // the averaged gradients are separate tensors of the parameters' shapes, devices and dtypes
      std::vector<Tensor> gs = params(grads), ps = params(model);
      ASSERT_EQ(gs.size(), ps.size());
      for (size_t i = 0; i < gs.size(); ++i) {
        EXPECT_EQ(gs[i].shape(), ps[i].shape()) << "gradient " << i;
        EXPECT_EQ(gs[i].device(), dev) << "gradient " << i;
        EXPECT_EQ(gs[i].dtype(), DType::f64) << "gradient " << i;
      }
      optimisers::update(opt, model, grads);
      ++taken;
    }
    EXPECT_EQ(taken, steps);

    auto opt_ref = optimisers::setup(optimisers::Adam(0.05), reference);
    for (auto [x, y] : DataLoader({X, Y}, {.batchsize = b * p}) | dev) {
      auto [loss, grads] = withgradient(f(x, y), reference);
      optimisers::update(opt_ref, reference, grads);
    }

    std::vector<Tensor> got = params(model), want = params(reference);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(same_on_all_ranks(got[i])) << "parameter " << i;
      std::vector<double> g = got[i].to_vector<double>(), w = want[i].to_vector<double>();
      for (size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::abs(g[k] - w[k]));
    }
    EXPECT_LT(worst, 1e-5);
    if (comm.rank() == 0)
      std::printf("[parity] %s, hidden %lld, buckets of %lld B, %lld ranks, %s: max |difference| %.3g (%d of %d "
                  "steps used the progress thread)\n",
                  to_string(dev).c_str(), (long long)h, (long long)pc.bucket_bytes, (long long)p,
                  mode == 0 ? "progress thread" : mode == 1 ? "no progress thread" : "after backward", worst, helped,
                  taken);
    // training moved the used parameters; the unused Dense (zero gradients) stayed where it was
    EXPECT_NE(got[0].to_vector<double>(), start[0]);
    EXPECT_EQ(got[4].to_vector<double>(), start[4]);
    EXPECT_EQ(got[5].to_vector<double>(), start[5]);
  }
}

// The progress thread starts when a launched bucket is still in flight after its first MPI_Test: the
// other ranks start their backward 300 ms late, so rank 0's first bucket cannot complete at once.
// The averaged gradients are the same with and without it.
TEST(Mpi, ProgressThreadStartsWhenABucketIsInFlight) {
  auto comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  seed(11);
  auto model = distributed::broadcast(comm, fmap([](const Tensor& t) { return t.f64(); }, Chain(Dense(6, 32, relu), Dense(32, 3))), 0);
  seed(20 + uint64_t(comm.rank()));
  Tensor x = randn({5, 6}, DType::f64), y = randn({5, 3}, DType::f64);
  auto f = [&](auto& m) { return mse(m(x), y); };
  std::vector<std::vector<double>> first;
  for (bool helper : {true, false}) {
    SCOPED_TRACE(helper ? "progress thread" : "no progress thread");
    distributed::barrier(comm);
    if (comm.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto [loss, grads] = distributed::withgradient(comm, f, model, {.bucket_bytes = 512, .progress_thread = helper});
    auto stats = distributed::last_gradient_stats();
    EXPECT_EQ(stats.launched_during_backward, stats.buckets);
    if (comm.rank() == 0) {
      EXPECT_EQ(stats.progress_thread, helper);
    }
    std::vector<Tensor> gs = params(grads);
    for (size_t i = 0; i < gs.size(); ++i) {
      EXPECT_TRUE(same_on_all_ranks(gs[i])) << "gradient " << i;
      if (helper) {
        first.push_back(gs[i].to_vector<double>());
      } else {
        EXPECT_EQ(gs[i].to_vector<double>(), first[i]) << "gradient " << i;
      }
    }
  }
}

// State that is not trainable is not averaged: its gradient (BatchNorm's running statistics, used
// in test mode) is the rank's own, as withgradient on the rank's batch alone gives it; the trainable
// parameters' gradients are the mean over the ranks.
TEST(Mpi, NonTrainableStateKeepsTheRanksOwnGradient) {
  auto comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  seed(31);
  auto model = distributed::broadcast(comm, Chain(Dense(3, 4), BatchNorm(4, relu)), 0);
  std::get<1>(model.layers).active = false;  // test mode: the running statistics enter the loss
  seed(40 + uint64_t(comm.rank()));
  Tensor x = randn({5, 3}), y = randn({5, 4});
  auto f = [&](auto& m) { return mse(m(x), y); };
  auto [loss, grads] = distributed::withgradient(comm, f, model);
  auto [local_loss, local] = withgradient(f, model);
  EXPECT_EQ(loss.item<float>(), local_loss.item<float>());
  const BatchNorm& g = std::get<1>(grads.layers);
  const BatchNorm& w = std::get<1>(local.layers);
  EXPECT_NE(w.running_mean.to_vector<float>(), std::vector<float>(4, 0.f));  // it does enter the loss
  // (backward ran from 1/ranks and the result is scaled back: exact for 2 ranks, an ulp for 3)
  auto expect_close = [](const Tensor& got, const Tensor& want, const char* what) {
    std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
    ASSERT_EQ(g.size(), w.size()) << what;
    for (size_t k = 0; k < g.size(); ++k) EXPECT_NEAR(g[k], w[k], 1e-6f * std::max(1.f, std::abs(w[k]))) << what << " " << k;
  };
  expect_close(g.running_mean, w.running_mean, "running_mean");
  expect_close(g.running_var, w.running_var, "running_var");
  // the trainable ones: the mean over the ranks of the local gradients
  expect_close(std::get<0>(grads.layers).weight,
               distributed::allreduce(comm, std::get<0>(local.layers).weight, distributed::ReduceOp::mean), "weight");
}

// Sharded and shuffled: every epoch the ranks' shards are disjoint and cover the data (12
// observations, batches of 2 per rank), and the order changes from one epoch to the next.
TEST(Mpi, ShardedShuffleCoversTheDataOnce) {
  auto comm = world();
  const int64_t n = 12;
  auto loader = DataLoader<1>({arange(n).reshape({n, 1})}, {.batchsize = 2, .shuffle = true, .shard = comm});
  std::vector<int64_t> previous;
  for (int e = 0; e < 2; ++e) {
    std::vector<Tensor> mine;
    for (auto [x] : loader) mine.push_back(x.reshape({-1}));
    std::vector<int64_t> local;
    for (const Tensor& t : mine)
      for (int64_t v : t.to_vector<int64_t>()) local.push_back(v);
    ASSERT_EQ(int64_t(local.size()), n / comm.size());
    std::vector<int64_t> all =
        distributed::allgather(comm, Tensor(local, Shape{int64_t(local.size())})).to_vector<int64_t>();
    std::vector<int64_t> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> want(static_cast<size_t>(n), 0);
    std::iota(want.begin(), want.end(), int64_t(0));
    EXPECT_EQ(sorted, want) << "epoch " << e;
    if (e == 1) {
      EXPECT_NE(all, previous);
    }
    previous = all;
  }
}

// ---- loss scaling (flux/optimisers/grad_scaler.hpp): every rank takes the same skip decision ----

namespace {
struct ScaledPair {
  Tensor a, b;
};
FLUX_LAYER(ScaledPair, a, b)
}  // namespace

// Only the last rank's gradient holds an inf (each rank unscales its own, unaveraged gradient): with
// the communicator every rank skips, and all scales stay equal; a rank-local scaler would step on
// the other ranks (what the flag's allreduce prevents).
TEST_P(MpiDevices, GradScalerSkipsOnEveryRankWhenOneRankOverflows) {
  auto comm = world();
  FLUX_RANK_DEVICE(dev, GetParam());
  const int p = comm.size(), r = comm.rank();
  for (DType t : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    ScaledPair model{to(Tensor(std::vector<double>{1, -2, 3}, Shape{3}).cast(t), dev),
                     to(Tensor(std::vector<double>{0.5}, Shape{1}).cast(t), dev)};
    ScaledPair alone = deepcopy(model);
    optimisers::State opt = optimisers::setup(optimisers::Descent(0.1), model);
    optimisers::State alone_opt = optimisers::setup(optimisers::Descent(0.1), alone);
    optimisers::GradScaler shared({.init_scale = 1024, .comm = comm});
    optimisers::GradScaler local({.init_scale = 1024});  // this rank alone
    const double x1 = r == p - 1 ? std::numeric_limits<double>::infinity() : 2.0;
    Tensor x = to(Tensor(std::vector<double>{1, x1, 3}, Shape{3}).cast(t), dev);
    auto grads_of = [&](const ScaledPair& m, optimisers::GradScaler& s) {
      return gradient([&](auto& mm) { return s.scale(add(sum(mul(mm.a, x)).f32(), sum(mm.b).f32())); }, m);
    };
    const bool stepped = shared.step(opt, model, grads_of(model, shared));
    shared.update();
    EXPECT_FALSE(stepped) << "rank " << r;
    EXPECT_EQ(shared.get_scale(), 512.0);
    EXPECT_EQ(model.a.to_vector<double>(), (std::vector<double>{1, -2, 3})) << "rank " << r << " stepped";
    EXPECT_TRUE(same_on_all_ranks(Tensor(std::vector<double>{stepped ? 1.0 : 0.0, shared.get_scale()}, Shape{2})));
    // Without the communicator each rank decides alone: only the last rank skips.
    EXPECT_EQ(local.step(alone_opt, alone, grads_of(alone, local)), r != p - 1);
    local.update();
    // A finite iteration: every rank steps, and the tracker counts it everywhere.
    auto fine = gradient([&](auto& m) { return shared.scale(add(sum(m.a).f32(), sum(m.b).f32())); }, model);
    EXPECT_TRUE(shared.step(opt, model, fine));
    shared.update();
    EXPECT_EQ(shared.growth_tracker(), 1);
    EXPECT_TRUE(same_on_all_ranks(model.a.f64()));
  }
  distributed::barrier(comm);
}

// The whole pipeline: distributed::withgradient averages the scaled gradients (an inf on one rank
// makes every rank's average inf), the scaler skips everywhere, and a finite step keeps the replicas
// equal.
TEST_P(MpiDevices, GradScalerWithDistributedWithgradient) {
  auto comm = world();
  FLUX_RANK_DEVICE(dev, GetParam());
  const int p = comm.size(), r = comm.rank();
  seed(5);
  auto model = distributed::broadcast(comm, Chain(Dense(3, 4, relu), Dense(4, 1)) | dev, 0);
  optimisers::State opt = optimisers::setup(optimisers::Adam(1e-2), model);
  optimisers::GradScaler scaler({.init_scale = 256, .growth_interval = 2, .comm = comm});
  Tensor x = to(mul(ones({2, 3}), Tensor::scalar(double(r + 1))), dev), y = to(zeros({2, 1}), dev);
  for (int step = 0; step < 4; ++step) {
    const bool poison = step == 1 && r == p - 1;
    Tensor weight = Tensor::scalar(poison ? std::numeric_limits<double>::quiet_NaN() : 1.0);
    auto [loss, grads] = distributed::withgradient(
        comm, [&](auto& m) { return scaler.scale(mul(mse(m(x), y), to(weight, dev))); }, model);
    const bool stepped = scaler.step(opt, model, grads);
    scaler.update();
    EXPECT_EQ(stepped, step != 1) << "step " << step << " rank " << r;
    for (const Tensor& w : params(model)) EXPECT_TRUE(same_on_all_ranks(w)) << "step " << step;
  }
  // 256, skip -> 128, then two finite steps -> 256.
  EXPECT_EQ(scaler.get_scale(), 256.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  distributed::barrier(comm);
}

int main(int argc, char** argv) {
  distributed::initialize();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
