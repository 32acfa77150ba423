// Data-parallel pieces that need no mpirun: the single-process communicator (a program run
// without mpirun), the autodiff hook that reports final gradients (what lets withgradient overlap
// its allreduces with backward), and the DataLoader's shard layout, checked for every rank of
// 2- and 3-rank communicators made in this one process. The multi-process behaviour is in
// tests/mpi/ (tests/mpi.cmake runs it under mpirun).
#include <algorithm>
#include <map>
#include <set>

#include <gmock/gmock.h>

#include "src/distributed/transport.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::error_of;
using ::testing::HasSubstr;

namespace {

// Rank `rank` of a `size`-rank communicator with no transport: enough for the loader's layout.
distributed::Communicator fake_comm(int rank, int size) {
  auto s = std::make_shared<distributed::detail::CommunicatorState>();
  s->rank = rank;
  s->size = size;
  return distributed::Communicator(s);
}

Tensor ids(int64_t n) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(float(i));
  return Tensor(v, Shape{n, 1});
}

std::vector<std::vector<int64_t>> shard_epoch(const DataLoader<1>& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto [x] : loader) {
    std::vector<int64_t> rows;
    for (float v : x.to_vector<float>()) rows.push_back(int64_t(v));
    out.push_back(rows);
  }
  return out;
}

}  // namespace

TEST(DistributedSingle, WithoutMpirunIsOneRank) {
  auto comm = distributed::initialize();
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.local_rank(), 0);
  EXPECT_EQ(comm.backend(), "single");
  EXPECT_GT(comm.timeout(), 0);
  EXPECT_LE(comm.timeout(), 60);
  EXPECT_EQ(distributed::initialize().state().rank, 0);  // the same world again
  EXPECT_EQ(&distributed::initialize().state(), &comm.state());
  distributed::Communicator plain;
  EXPECT_EQ(plain.size(), 1);
  EXPECT_EQ(plain.backend(), "single");
}

TEST(DistributedSingle, CollectivesAreIdentities) {
  auto comm = distributed::initialize();
  Tensor x({1.5f, -2.f, 3.f});
  EXPECT_EQ(distributed::allreduce(comm, x).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(distributed::allreduce(comm, x, distributed::ReduceOp::mean).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(distributed::broadcast(comm, x, 0).to_vector<float>(), x.to_vector<float>());
  Tensor g = distributed::allgather(comm, x.reshape({3, 1}));
  EXPECT_EQ(g.shape(), Shape({3, 1}));
  EXPECT_EQ(distributed::allgather(comm, Tensor::scalar(4.0)).shape(), Shape({1}));
  distributed::barrier(comm);
  auto model = Chain(Dense(3, 2, relu), BatchNorm(2));
  auto same = distributed::broadcast(comm, model, 0);
  EXPECT_TRUE(std::get<0>(same.layers).weight.same_storage(std::get<0>(model.layers).weight));
}

TEST(DistributedSingle, BadInputErrors) {
  auto comm = distributed::initialize();
  Tensor x({1.f, 2.f});
  EXPECT_EQ(error_of([&] { distributed::broadcast(comm, x, 1); }),
            "[distributed::broadcast] root 1 is not a rank of this communicator (size 1)");
  EXPECT_EQ(error_of([&] { distributed::allreduce(comm, arange(3), distributed::ReduceOp::mean); }),
            "[distributed::allreduce] the mean needs a floating-point tensor; got Int64");
  EXPECT_EQ(error_of([&] { distributed::allreduce(comm, Tensor()); }), "[distributed::allreduce] the tensor is undefined");
  auto model = Dense(2, 1);
  EXPECT_EQ(error_of([&] {
              distributed::withgradient(
                  fake_comm(0, 2), [](auto& m) { return sum(m(ones({1, 2}))); }, model, {.bucket_bytes = 0});
            }),
            "[distributed::withgradient] bucket_bytes must be positive, got 0");
}

TEST(DistributedSingle, WithGradientOnOneRankIsWithGradient) {
  seed(3);
  auto model = Chain(Dense(4, 5, tanh_act), Dense(5, 2));
  Tensor x = randn({6, 4}), y = randn({6, 2});
  auto f = [&](auto& m) { return mse(m(x), y); };
  auto [l1, g1] = withgradient(f, model);
  auto [l2, g2] = distributed::withgradient(distributed::initialize(), f, model);
  EXPECT_EQ(l1.item<float>(), l2.item<float>());
  auto p1 = params(g1), p2 = params(g2);
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>());
}

// The hook: each leaf once, its gradient already final when reported, the last layer's before the
// first layer's, unused leaves first of all.
TEST(DistributedSingle, TapeReportsEachLeafWhenItsGradientIsFinal) {
  seed(5);
  auto model = std::make_tuple(Chain(Dense(3, 4, tanh_act), Dense(4, 2)), Dense(2, 2));  // the second is unused
  Tensor x = randn({5, 3}).f64(), y = randn({5, 2}).f64();
  auto m64 = fmap([](const Tensor& t) { return t.f64(); }, model);
  auto f = [&](auto& m) { return mse(std::get<0>(m)(x), y); };
  auto want = gradient(f, m64);

  autodiff::Tape tape;
  auto tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, m64);
  std::vector<Tensor> leaves = params(tracked);  // 0.0.weight, 0.0.bias, 0.1.weight, 0.1.bias, 1.weight, 1.bias
  std::map<int64_t, size_t> leaf_of;
  for (size_t i = 0; i < leaves.size(); ++i) leaf_of[leaves[i].impl()->tape_id] = i;
  std::vector<size_t> order;
  std::vector<std::vector<double>> at_report(leaves.size());
  tape.on_gradient_final([&](int64_t id) {
    size_t i = leaf_of.at(id);
    order.push_back(i);
    at_report[i] = tape.grad(leaves[i]).to_vector<double>();
  });
  Tensor loss = f(tracked);
  tape.backward(loss);
  ASSERT_EQ(order.size(), leaves.size());
  EXPECT_EQ(std::set<size_t>(order.begin(), order.end()).size(), leaves.size());
  auto pos = [&](size_t leaf) { return std::find(order.begin(), order.end(), leaf) - order.begin(); };
  EXPECT_LT(std::max(pos(4), pos(5)), 2);                   // unused: reported before any op ran
  EXPECT_LT(std::max(pos(2), pos(3)), std::min(pos(0), pos(1)));  // layer 2 before layer 1
  std::vector<Tensor> final_grads = params(want);
  for (size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(at_report[i], final_grads[i].to_vector<double>()) << "leaf " << i;
    EXPECT_EQ(tape.grad(leaves[i]).to_vector<double>(), at_report[i]) << "leaf " << i;
  }
}

// backward(output, seed) differentiates seed * output: the gradients are seed times those of
// backward(output) (distributed::withgradient passes 1/ranks so the ranks' sum is their mean); a
// power of two scales every intermediate exactly, so the results are equal bit for bit.
TEST(DistributedSingle, TapeBackwardFromASeedScalesEveryGradient) {
  seed(6);
  auto model = fmap([](const Tensor& t) { return t.f64(); }, Chain(Dense(3, 5, tanh_act), Dense(5, 2)));
  Tensor x = randn({4, 3}).f64(), y = randn({4, 2}).f64();
  auto f = [&](auto& m) { return mse(m(x), y); };
  std::vector<Tensor> want = params(gradient(f, model));
  for (double s : {0.5, 0.25, 1.0 / 3}) {
    SCOPED_TRACE(s);
    autodiff::Tape tape;
    auto tracked = fmap([&](const Tensor& t) { return tape.leaf(t); }, model);
    Tensor loss = f(tracked);
    tape.backward(loss, s);
    std::vector<Tensor> leaves = params(tracked);
    ASSERT_EQ(leaves.size(), want.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      std::vector<double> got = tape.grad(leaves[i]).to_vector<double>(), w = want[i].to_vector<double>();
      ASSERT_EQ(got.size(), w.size());
      for (size_t k = 0; k < got.size(); ++k) {
        if (s == 1.0 / 3) EXPECT_NEAR(got[k], w[k] * s, 1e-15 * std::max(1.0, std::abs(w[k]))) << "leaf " << i;
        else EXPECT_EQ(got[k], w[k] * s) << "leaf " << i;
      }
    }
  }
}

TEST(DistributedSingle, TapeReportsEveryLeafWhenTheOutputIgnoresThem) {
  autodiff::Tape tape;
  Tensor a = tape.leaf(ones({2})), b = tape.leaf(ones({3}));
  std::vector<int64_t> seen;
  tape.on_gradient_final([&](int64_t id) { seen.push_back(id); });
  tape.backward(Tensor::scalar(1.0));
  EXPECT_EQ(seen, (std::vector<int64_t>{a.impl()->tape_id, b.impl()->tape_id}));
  // f returns a leaf itself: reported once, with gradient one.
  autodiff::Tape tape2;
  Tensor c = tape2.leaf(Tensor::scalar(2.0));
  Tensor unused_use = mul(c, c);
  int reports = 0;
  tape2.on_gradient_final([&](int64_t id) {
    EXPECT_EQ(id, c.impl()->tape_id);
    EXPECT_EQ(tape2.grad(c).item<float>(), 1.f);
    ++reports;
  });
  tape2.backward(c);
  EXPECT_EQ(reports, 1);
}

// Shard layout: for every rank of P ranks, disjoint shards that together are the batch of a
// single loader with batchsize B * P, the last uneven batch padded (or dropped) equally.
TEST(DistributedSingle, ShardedLoaderSplitsEachGlobalBatch) {
  const int64_t n = 10, b = 2;
  for (int ranks : {2, 3}) {
    DataLoader<1> whole({ids(n)}, {.batchsize = b * ranks});
    std::vector<std::vector<int64_t>> global = shard_epoch(whole);
    std::vector<std::vector<std::vector<int64_t>>> per_rank;
    for (int r = 0; r < ranks; ++r) {
      DataLoader<1> shard({ids(n)}, {.batchsize = b, .shard = fake_comm(r, ranks)});
      EXPECT_EQ(shard.size(), int64_t(global.size()));
      per_rank.push_back(shard_epoch(shard));
      ASSERT_EQ(per_rank.back().size(), global.size());
    }
    for (size_t i = 0; i < global.size(); ++i) {
      std::vector<int64_t> joined;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(per_rank[r][i].size(), per_rank[0][i].size()) << "equal steps on every rank";
        joined.insert(joined.end(), per_rank[r][i].begin(), per_rank[r][i].end());
      }
      if (global[i].size() == size_t(b * ranks)) {
        EXPECT_EQ(joined, global[i]) << ranks << " ranks, batch " << i;
      } else {  // the last batch, padded from the epoch's start to a multiple of the ranks
        std::vector<int64_t> padded = global[i];
        for (int64_t k = 0; padded.size() % size_t(ranks); ++k) padded.push_back(k);
        EXPECT_EQ(joined, padded) << ranks << " ranks, last batch";
      }
    }
    // n = 10: 2 ranks -> batches of 4, 4, 2 (1 each); 3 ranks -> 6, 4 (+2 padding, 2 each).
    EXPECT_EQ(per_rank[0].back().size(), ranks == 2 ? 1u : 2u);
    DataLoader<1> dropped({ids(n)}, {.batchsize = b, .partial = false, .shard = fake_comm(ranks - 1, ranks)});
    EXPECT_EQ(dropped.size(), n / (b * ranks));
    EXPECT_EQ(shard_epoch(dropped).size(), size_t(n / (b * ranks)));
  }
}

TEST(DistributedSingle, ShardedShuffleIsSharedAndChangesPerEpoch) {
  const int64_t n = 12;
  std::vector<std::vector<int64_t>> epochs_of_rank[2];
  for (int r = 0; r < 2; ++r) {
    seed(11);  // no transport here: each fake rank draws the shared seed from the same generator state
    DataLoader<1> shard({ids(n)}, {.batchsize = 3, .shuffle = true, .shard = fake_comm(r, 2)});
    for (int e = 0; e < 2; ++e) {
      std::vector<int64_t> all;
      for (auto& batch : shard_epoch(shard)) all.insert(all.end(), batch.begin(), batch.end());
      epochs_of_rank[r].push_back(all);
    }
  }
  for (int e = 0; e < 2; ++e) {
    std::vector<int64_t> both = epochs_of_rank[0][e];
    both.insert(both.end(), epochs_of_rank[1][e].begin(), epochs_of_rank[1][e].end());
    std::sort(both.begin(), both.end());
    std::vector<int64_t> want(n);
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i;
    EXPECT_EQ(both, want) << "epoch " << e << ": disjoint shards covering the data";
  }
  EXPECT_NE(epochs_of_rank[0][0], epochs_of_rank[0][1]);
  // The permutation is a function of (seed, epoch) only.
  EXPECT_EQ(detail::seeded_order(n, 99, 4), detail::seeded_order(n, 99, 4));
  EXPECT_NE(detail::seeded_order(n, 99, 4), detail::seeded_order(n, 99, 5));
}

// The device collectives (NCCL in the CUDA plugin) on a one-rank communicator, straight through the
// backend: what one GPU can check (the core never calls them for one rank, and NCCL refuses two
// ranks of one communicator on one GPU). Sum, broadcast and gather of one rank return the data.
TEST(DistributedSingle, DeviceCollectivesOnOneRank) {
  int tried = 0;
  for (const Device& d : flux::testing::test_devices()) {
    if (d.is_cpu()) continue;
    backend::Backend& be = detail::backend_for(d);
    if (be.collective_id_bytes() == 0) continue;
    SCOPED_TRACE(to_string(d));
    ++tried;
    std::vector<uint8_t> id(be.collective_id_bytes());
    be.collective_unique_id(id.data());
    void* comm = be.collective_join(d.index(), id.data(), 1, 0);
    ASSERT_NE(comm, nullptr);
    for (DType t : {DType::f32, DType::f64, DType::f16, DType::i64}) {
      SCOPED_TRACE(dtype_name(t));
      Tensor x = to(Tensor(std::vector<double>{1.5, -2, 3.25, 0, 7, -0.5}, Shape{2, 3}).cast(t), d);
      const std::vector<double> want = x.to_vector<double>();
      Tensor sum = x.contiguous_copy();
      be.collective_allreduce_sum(comm, d.index(), t, sum.buffer(), sum.numel());
      Tensor root = x.contiguous_copy();
      be.collective_broadcast(comm, d.index(), root.buffer(), root.nbytes(), 0);
      Tensor all = Tensor::empty(x.shape(), t, d);
      be.collective_allgather(comm, d.index(), x.buffer(), all.buffer(), x.nbytes());
      ASSERT_TRUE(be.collective_wait(comm, d.index(), 60));
      EXPECT_EQ(sum.to_vector<double>(), want);
      EXPECT_EQ(root.to_vector<double>(), want);
      EXPECT_EQ(all.to_vector<double>(), want);
    }
  }
  if (tried == 0) GTEST_SKIP() << "no functional device backend with device collectives (NCCL needs a GPU)";
}
