// DataLoader: batches along the first axis, seeded shuffling, partial last batch.
#include <algorithm>
#include <set>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

namespace {
// X row i holds (i, 10 i); Y[i] = 100 i: every observation is identifiable.
Tensor make_x(int64_t n) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) {
    v.push_back(float(i));
    v.push_back(float(10 * i));
  }
  return Tensor(v, Shape{n, 2});
}
Tensor make_y(int64_t n) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(float(100 * i));
  return Tensor(v, Shape{n});
}
// The observation ids of one epoch, batch by batch; checks that X and Y rows stay paired.
std::vector<std::vector<int64_t>> epoch(const DataLoader<2>& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto [x, y] : loader) {
    EXPECT_EQ(x.shape()[0], y.shape()[0]);
    EXPECT_EQ(x.shape()[1], 2);
    auto xv = x.to_vector<float>();
    auto yv = y.to_vector<float>();
    std::vector<int64_t> ids;
    for (size_t i = 0; i < yv.size(); ++i) {
      EXPECT_EQ(xv[2 * i] * 100, yv[i]);
      EXPECT_EQ(xv[2 * i + 1] * 10, yv[i]);
      ids.push_back(int64_t(xv[2 * i]));
    }
    out.push_back(ids);
  }
  return out;
}
std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& e) {
  std::vector<int64_t> f;
  for (auto& b : e) f.insert(f.end(), b.begin(), b.end());
  return f;
}
}  // namespace

TEST(DataLoader, BatchesInOrderWithPartialLastBatch) {
  DataLoader<2> loader({make_x(10), make_y(10)}, {.batchsize = 4});
  EXPECT_EQ(loader.nobs(), 10);
  EXPECT_EQ(loader.size(), 3);
  auto e = epoch(loader);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(e[1], (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(e[2], (std::vector<int64_t>{8, 9}));
  // unshuffled batches are views of the data
  Tensor X = make_x(10);
  DataLoader<1> views({X}, {.batchsize = 5});
  auto first = *views.begin();
  EXPECT_EQ(first[0].impl()->storage, X.impl()->storage);
}

TEST(DataLoader, PartialFalseDropsTheLastBatch) {
  DataLoader<2> loader({make_x(10), make_y(10)}, {.batchsize = 4, .partial = false});
  EXPECT_EQ(loader.size(), 2);
  auto e = epoch(loader);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1], (std::vector<int64_t>{4, 5, 6, 7}));
  DataLoader<2> exact({make_x(8), make_y(8)}, {.batchsize = 4, .partial = false});
  EXPECT_EQ(epoch(exact).size(), 2u);
  DataLoader<2> too_small({make_x(3), make_y(3)}, {.batchsize = 4, .partial = false});
  EXPECT_EQ(epoch(too_small).size(), 0u);
  DataLoader<2> kept({make_x(3), make_y(3)}, {.batchsize = 4});
  EXPECT_EQ(epoch(kept), (std::vector<std::vector<int64_t>>{{0, 1, 2}}));
}

TEST(DataLoader, ShuffleIsSeededAndCoversEveryObservation) {
  // The loader draws its shuffling seed from the global generator when it is made (as a PyTorch
  // DataLoader given a generator), so a seed before construction fixes every epoch's order.
  seed(99);
  DataLoader<2> loader({make_x(23), make_y(23)}, {.batchsize = 5, .shuffle = true});
  auto a1 = epoch(loader), a2 = epoch(loader);
  seed(99);
  DataLoader<2> again({make_x(23), make_y(23)}, {.batchsize = 5, .shuffle = true});
  auto b1 = epoch(again), b2 = epoch(again);
  EXPECT_EQ(a1, b1);  // same seed, same order
  EXPECT_EQ(a2, b2);
  EXPECT_NE(flat(a1), flat(a2));  // a fresh order each epoch
  std::vector<int64_t> ordered(23);
  for (int i = 0; i < 23; ++i) ordered[i] = i;
  EXPECT_NE(flat(a1), ordered);
  for (auto* e : {&a1, &a2}) {
    ASSERT_EQ(e->size(), 5u);
    EXPECT_EQ(e->back().size(), 3u);  // 23 = 4 * 5 + 3
    auto f = flat(*e);
    std::sort(f.begin(), f.end());
    EXPECT_EQ(f, ordered);  // every observation exactly once
  }
  seed(100);
  DataLoader<2> other({make_x(23), make_y(23)}, {.batchsize = 5, .shuffle = true});
  EXPECT_NE(flat(epoch(other)), flat(a1));
  again.set_epoch(0);  // an epoch's order is a function of the seed and the epoch alone
  EXPECT_EQ(epoch(again), a1);
  EXPECT_EQ(again.epoch(), 1);
}

TEST(DataLoader, SingleTensorAndHigherRankData) {
  Tensor images = arange(0, 2 * 3 * 4 * 5, 1).reshape({5, 2, 3, 4});
  auto loader = make_loader(images, {.batchsize = 2});
  int batches = 0;
  int64_t seen = 0;
  for (auto [x] : loader) {
    EXPECT_EQ(x.ndim(), 4);
    EXPECT_EQ(x.shape()[1], 2);
    EXPECT_EQ(x.to_vector<float>()[0], float(seen * 24));
    seen += x.shape()[0];
    ++batches;
  }
  EXPECT_EQ(batches, 3);
  EXPECT_EQ(seen, 5);
  // integer labels come through shuffling unchanged in dtype
  Tensor labels(std::vector<int64_t>{0, 1, 2, 3}, Shape{4});
  DataLoader<2> l2({make_x(4), labels}, {.batchsize = 3, .shuffle = true});
  for (auto [x, y] : l2) {
    EXPECT_EQ(y.dtype(), DType::i64);
    auto xv = x.to_vector<float>();
    auto yv = y.to_vector<int64_t>();
    for (size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(int64_t(xv[2 * i]), yv[i]);
  }
}

TEST(DataLoader, Errors) {
  EXPECT_THAT([] { DataLoader<2>({make_x(10), make_y(9)}); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  "[DataLoader] all tensors need the same number of observations (first dimension): tensor 0 has shape "
                  "(10, 2) but tensor 1 has shape (9,)")));
  EXPECT_THAT([] { DataLoader<1>({make_x(4)}, {.batchsize = 0}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[DataLoader] batchsize must be positive, got 0")));
  EXPECT_THAT([] { DataLoader<1>({Tensor()}); }, ::testing::ThrowsMessage<Error>(HasSubstr("[DataLoader] tensor 0 is undefined")));
  EXPECT_THAT([] { DataLoader<1>({Tensor::scalar(1)}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[DataLoader] tensor 0 is 0-dimensional")));
}

TEST(DataLoader, EmptyDataGivesNoBatches) {
  DataLoader<1> loader({zeros({0, 3})}, {.batchsize = 2, .shuffle = true});
  EXPECT_EQ(loader.size(), 0);
  int n = 0;
  for (auto [x] : loader) {
    (void)x;
    ++n;
  }
  EXPECT_EQ(n, 0);
}

class DataLoaderOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(DataLoaderOnDevice, BatchesOfDeviceTensorsStayOnTheDevice) {
  Device d = GetParam();
  DataLoader<2> loader({to(make_x(7), d), to(make_y(7), d)}, {.batchsize = 3, .shuffle = true});
  seed(1);
  std::vector<int64_t> ids;
  for (auto [x, y] : loader) {
    EXPECT_EQ(x.device(), d);
    EXPECT_EQ(y.device(), d);
    auto xv = x.to_vector<float>();
    auto yv = y.to_vector<float>();
    for (size_t i = 0; i < yv.size(); ++i) {
      EXPECT_EQ(xv[2 * i] * 100, yv[i]);
      ids.push_back(int64_t(xv[2 * i]));
    }
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}
FLUX_DEVICE_SUITE(DataLoaderOnDevice);
