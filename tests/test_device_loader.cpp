// DataLoader | dev: batches on the device, prefetched in the background, released as the loop
// moves on; errors from the background thread reach the loop; stopping mid-epoch joins cleanly.
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "test_devices.hpp"

using namespace flux;
using namespace std::chrono_literals;

namespace {

// X[i] = (i, i + 0.5) in float64, Y[i] = i in int64: every row says where it came from.
struct Rows {
  Tensor X, Y;
  explicit Rows(int64_t n) {
    std::vector<double> x;
    std::vector<int64_t> y;
    for (int64_t i = 0; i < n; ++i) {
      x.push_back(double(i));
      x.push_back(double(i) + 0.5);
      y.push_back(i);
    }
    X = Tensor(x, Shape{n, 2});
    Y = Tensor(y, Shape{n});
  }
};

template <class F> bool eventually(F&& condition, std::chrono::milliseconds limit = 10s) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return condition();
}

detail::BatchPrefetcher::Batch scalar_batch(int64_t i) {
  detail::BatchPrefetcher::Batch b;
  b.tensors.push_back(Tensor::scalar(double(i)));
  return b;
}

}  // namespace

class DeviceLoaderOn : public ::testing::TestWithParam<Device> {};

TEST_P(DeviceLoaderOn, BatchesArriveOnTheDeviceInOrder) {
  Device d = GetParam();
  Rows data(10);
  DataLoader<2> base({data.X, data.Y}, {.batchsize = 4});
  auto loader = base | d;
  EXPECT_EQ(loader.size(), 3);
  EXPECT_EQ(loader.device(), d);
  int64_t row = 0, batches = 0;
  for (auto [x, y] : loader) {
    EXPECT_EQ(x.device(), d);
    EXPECT_EQ(y.device(), d);
    EXPECT_EQ(x.dtype(), DType::f64) << "| dev keeps dtypes";
    EXPECT_EQ(y.dtype(), DType::i64);
    int64_t n = batches < 2 ? 4 : 2;  // partial last batch
    ASSERT_EQ(x.shape(), (Shape{n, 2}));
    std::vector<double> xv = x.to_vector<double>();
    std::vector<int64_t> yv = y.to_vector<int64_t>();
    for (int64_t k = 0; k < n; ++k, ++row) {
      EXPECT_EQ(yv[k], row);
      EXPECT_EQ(xv[2 * k], double(row));
      EXPECT_EQ(xv[2 * k + 1], double(row) + 0.5);
    }
    ++batches;
  }
  EXPECT_EQ(batches, 3);
  EXPECT_EQ(row, 10);
}

TEST_P(DeviceLoaderOn, ShuffledEpochsCoverEveryRowOnceAndKeepPairs) {
  Device d = GetParam();
  Rows data(37);
  seed(3);
  auto loader = DataLoader({data.X, data.Y}, {.batchsize = 8, .shuffle = true}) | d;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    int batches = 0;
    for (auto [x, y] : loader) {
      EXPECT_EQ(x.device(), d);
      std::vector<double> xv = x.to_vector<double>();
      std::vector<int64_t> yv = y.to_vector<int64_t>();
      for (size_t k = 0; k < yv.size(); ++k) {
        EXPECT_EQ(xv[2 * k], double(yv[k])) << "x and y rows stay paired";
        seen.insert(yv[k]);
      }
      ++batches;
    }
    EXPECT_EQ(batches, 5);
    ASSERT_EQ(seen.size(), 37u);
    for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
  }
}

TEST_P(DeviceLoaderOn, DropsThePartialBatchWhenAsked) {
  Device d = GetParam();
  Rows data(10);
  auto loader = DataLoader({data.X, data.Y}, {.batchsize = 4, .partial = false}) | d;
  int batches = 0;
  for (auto [x, y] : loader) {
    EXPECT_EQ(x.size(0), 4);
    ++batches;
  }
  EXPECT_EQ(batches, 2);
  auto none = DataLoader({data.X, data.Y}, {.batchsize = 20, .partial = false}) | d;
  for (auto [x, y] : none) ADD_FAILURE() << "no full batch exists";
}

TEST_P(DeviceLoaderOn, ReleasesThePreviousBatch) {
  Device d = GetParam();
  Rows data(64);
  auto loader = DataLoader({data.X, data.Y}, {.batchsize = 8}) | d;
  auto it = loader.begin();
  std::weak_ptr<TensorImpl> first = (*it)[0].impl_ptr();
  EXPECT_FALSE(first.expired());
  ++it;
  (void)*it;  // the loader now holds batch 1 only
  EXPECT_TRUE(first.expired()) << "batch 0 must be released once the loop moved past it";

  // Over a whole epoch, the device holds a bounded number of batches.
  Tensor big = rand({4096, 64});  // 1 MiB of float32; batches of 64 KiB
  auto big_loader = make_loader(big, {.batchsize = 256}) | d;
  size_t base = d.memory().used, peak = base;
  for (auto [x] : big_loader) {
    d.synchronize();
    peak = std::max(peak, d.memory().used);
  }
  size_t batch_bytes = 256 * 64 * 4;
  EXPECT_LE(peak, base + 4 * batch_bytes) << "current, prefetched and in-flight batches at most";
}

TEST_P(DeviceLoaderOn, StoppingMidEpochJoinsCleanly) {
  Device d = GetParam();
  Tensor big = rand({2000, 16});
  {
    auto loader = make_loader(big, {.batchsize = 2}) | d;
    int seen = 0;
    for (auto [x] : loader) {
      EXPECT_EQ(x.device(), d);
      if (++seen == 3) break;  // the worker is mid-epoch, maybe waiting on a full queue
    }
    EXPECT_EQ(seen, 3);
  }  // destroyed here: joins without hanging
  // An iterator outlives the loader it came from.
  auto it = (make_loader(big, {.batchsize = 500}) | d).begin();
  EXPECT_EQ((*it)[0].size(0), 500);
  ++it;
  EXPECT_EQ((*it)[0].device(), d);
}

TEST_P(DeviceLoaderOn, DataAlreadyOnTheDeviceIsNotCopiedAndCanComeBack) {
  Device d = GetParam();
  Rows data(9);
  Tensor X = to(data.X, d), Y = to(data.Y, d);
  auto here = DataLoader({X, Y}, {.batchsize = 4}) | d;
  EXPECT_FALSE(here.moves()) << "nothing to move: no thread, no copy";
  for (auto [x, y] : here) {
    EXPECT_EQ(x.impl()->storage, X.impl()->storage);
    EXPECT_EQ(y.device(), d);
  }
  auto back = DataLoader({X, Y}, {.batchsize = 4, .shuffle = true}) | cpu;
  EXPECT_EQ(back.moves(), !d.is_cpu());
  std::multiset<int64_t> seen;
  for (auto [x, y] : back) {
    EXPECT_EQ(x.device(), Device());
    std::vector<double> xv = x.to_vector<double>();
    std::vector<int64_t> yv = y.to_vector<int64_t>();
    for (size_t k = 0; k < yv.size(); ++k) {
      EXPECT_EQ(xv[2 * k], double(yv[k]));
      seen.insert(yv[k]);
    }
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST_P(DeviceLoaderOn, TrainsTheSeedsModel) {
  Device d = GetParam();
  seed(11);
  Tensor X = rand({256, 4}), W(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f}, Shape{4, 1});
  Tensor Y = matmul(X, W);
  auto model = Chain(Dense(4, 1)) | d;
  auto loader = DataLoader({X, Y}, {.batchsize = 32, .shuffle = true}) | d;
  auto state = optimisers::setup(optimisers::Adam(0.05), model);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 30; ++epoch) {
    double total = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
      optimisers::update(state, model, grads);
      total += loss.item<double>();
    }
    if (epoch == 0) first = total;
    last = total;
  }
  EXPECT_LT(last, 0.05 * first) << "first epoch " << first << ", last " << last;
}
FLUX_DEVICE_SUITE(DeviceLoaderOn);

// ---------------- the CPU and gpu cases ----------------

TEST(DeviceLoader, OnTheCpuItDoesNotCopy) {
  Rows data(10);
  DataLoader<2> base({data.X, data.Y}, {.batchsize = 4});
  for (const auto& loader : {base | Device(), base | cpu}) {
    EXPECT_FALSE(loader.moves());
    int64_t i = 0;
    for (auto [x, y] : loader) {
      EXPECT_EQ(x.impl()->storage, data.X.impl()->storage) << "a view of the data, not a copy";
      EXPECT_EQ(y.impl()->storage, data.Y.impl()->storage);
      EXPECT_EQ(x.dtype(), DType::f64);
      if (i++ == 0) { EXPECT_TRUE(x.same_storage(data.X)); }
    }
  }
}

TEST(DeviceLoader, GpuFollowsDefaultGpu) {
  Rows data(12);
  auto loader = DataLoader({data.X, data.Y}, {.batchsize = 5}) | gpu;
  const Device& g = detail::default_gpu();
  EXPECT_EQ(loader.device(), g);
  EXPECT_EQ(loader.moves(), !g.is_cpu()) << "no GPU: gpu is a no-op, batches are views";
  for (auto [x, y] : loader) {
    EXPECT_EQ(x.device(), g);
    EXPECT_EQ(x.dtype(), g.is_cpu() ? DType::f64 : DType::f32) << "gpu converts Float64 to Float32";
    EXPECT_EQ(y.dtype(), DType::i64) << "and keeps integers";
  }
  DataLoader<2> base({data.X, data.Y}, {.batchsize = 5});
  static_assert(std::is_same_v<decltype(gpu(base)), DeviceLoader<2>>, "gpu(loader) is a device loader");
  static_assert(std::is_same_v<decltype(cpu(base)), DeviceLoader<2>>);
  static_assert(std::is_same_v<decltype(base | cpu), DeviceLoader<2>>);
  static_assert(std::is_same_v<decltype(to(base, Device())), DeviceLoader<2>>);
  EXPECT_EQ(gpu(base).device(), g);
  EXPECT_EQ(cpu(base).device(), Device());
  EXPECT_EQ(to(base, Device()).size(), 3);
}

TEST(DeviceLoader, RefusesDevicesThatDoNotExist) {
  Rows data(4);
  DataLoader<2> base({data.X, data.Y}, {.batchsize = 2});
  try {
    auto l = base | Device("CPU", 2);
    ADD_FAILURE() << "CPU:2 accepted";
  } catch (const flux::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU"), std::string::npos) << e.what();
  }
  if (!loaded("Metal")) {
    try {
      auto l = base | Device("Metal", 0);
      ADD_FAILURE() << "Metal accepted";
    } catch (const flux::Error& e) {
      EXPECT_NE(std::string(e.what()).find("Metal"), std::string::npos) << e.what();
    }
  }
  if (functional("OpenCL")) {
    int n = detail::backend_for("OpenCL").device_count();
    try {
      auto l = base | Device("OpenCL", n);
      ADD_FAILURE() << "OpenCL:" << n << " accepted";
    } catch (const flux::Error& e) {
      EXPECT_NE(std::string(e.what()).find("OpenCL:" + std::to_string(n)), std::string::npos) << e.what();
    }
  }
}

// ---------------- the background engine ----------------

TEST(BatchPrefetcher, ProducesTheNextBatchWhileTheCurrentIsUsed) {
  std::atomic<int64_t> calls{0};
  detail::BatchPrefetcher p(5, [&](int64_t i) {
    ++calls;
    return scalar_batch(i);
  });
  EXPECT_EQ(p.next()[0].item<double>(), 0.0);
  // While batch 0 is "in use", batch 1 gets ready in the background...
  EXPECT_TRUE(eventually([&] { return p.produced() == 2; })) << p.produced();
  // ... and no further: one batch ahead at most.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(p.produced(), 2);
  EXPECT_EQ(p.next()[0].item<double>(), 1.0);
  EXPECT_TRUE(eventually([&] { return p.produced() == 3; }));
  EXPECT_EQ(p.next()[0].item<double>(), 2.0);
  EXPECT_EQ(p.next()[0].item<double>(), 3.0);
  EXPECT_EQ(p.next()[0].item<double>(), 4.0);
  EXPECT_EQ(calls.load(), 5);
  try {
    p.next();
    ADD_FAILURE() << "a sixth batch of five";
  } catch (const flux::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[DeviceLoader]"), std::string::npos) << e.what();
  }
}

TEST(BatchPrefetcher, ExceptionsReachTheConsumer) {
  detail::BatchPrefetcher p(6, [](int64_t i) {
    if (i == 2) throw std::runtime_error("batch 2 could not be copied");
    return scalar_batch(i);
  });
  EXPECT_EQ(p.next()[0].item<double>(), 0.0);
  EXPECT_EQ(p.next()[0].item<double>(), 1.0);
  for (int attempt = 0; attempt < 2; ++attempt) {  // and again: the epoch cannot go on
    try {
      p.next();
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "batch 2 could not be copied");
    }
  }
  // A flux::Error keeps its type.
  detail::BatchPrefetcher q(3, [](int64_t) -> detail::BatchPrefetcher::Batch { flux::detail::fail("[to] no memory"); });
  EXPECT_THROW(q.next(), flux::Error);
}

TEST(BatchPrefetcher, DestroyingMidEpochJoins) {
  auto start = std::chrono::steady_clock::now();
  {
    detail::BatchPrefetcher p(1000, [](int64_t i) {
      std::this_thread::sleep_for(20ms);  // slow copies: destroyed while one is in flight
      return scalar_batch(i);
    });
    p.next();
  }
  {
    detail::BatchPrefetcher idle(1000, scalar_batch);  // destroyed while waiting on a full queue
    EXPECT_TRUE(eventually([&] { return idle.produced() == 1; }));
  }
  { detail::BatchPrefetcher never_read(1000, scalar_batch); }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(BatchPrefetcher, ReleasesTheBatchItHandedOut) {
  std::vector<std::weak_ptr<TensorImpl>> made;
  std::mutex m;
  detail::BatchPrefetcher p(3, [&](int64_t i) {
    auto b = scalar_batch(i);
    b.keep_alive.push_back(Tensor::scalar(-1.0));
    std::lock_guard<std::mutex> lock(m);
    made.push_back(b.tensors[0].impl_ptr());
    made.push_back(b.keep_alive[0].impl_ptr());
    return b;
  });
  p.next();
  p.next();  // releases batch 0 and its keep-alive sources
  std::lock_guard<std::mutex> lock(m);
  EXPECT_TRUE(made[0].expired());
  EXPECT_TRUE(made[1].expired());
  EXPECT_FALSE(made[2].expired());
}
