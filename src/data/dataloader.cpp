#include "flux/data/dataloader.hpp"

#include <numeric>
#include <random>
#include <string>

#include "src/distributed/transport.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::detail {

void check_loader(const Tensor* data, size_t count, const DataLoaderOptions& o) {
  if (o.batchsize <= 0) fail("[DataLoader] batchsize must be positive, got ", o.batchsize);
  int64_t global = 0;
  if (__builtin_mul_overflow(o.batchsize, int64_t(o.shard.size()), &global))
    fail("[DataLoader] batchsize ", o.batchsize, " times ", o.shard.size(), " ranks overflows int64");
  for (size_t i = 0; i < count; ++i) {
    if (!data[i].defined()) fail("[DataLoader] tensor ", i, " is undefined");
    if (data[i].ndim() == 0) fail("[DataLoader] tensor ", i, " is 0-dimensional; observations go along the first axis");
  }
  for (size_t i = 1; i < count; ++i)
    if (data[i].shape()[0] != data[0].shape()[0])
      fail("[DataLoader] all tensors need the same number of observations (first dimension): tensor 0 has shape ",
           to_string(data[0].shape()), " but tensor ", i, " has shape ", to_string(data[i].shape()));
}

std::vector<int64_t> identity_order(int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  return order;
}

Tensor take_rows(const Tensor& x, const std::vector<int64_t>& order, int64_t begin, int64_t end, bool consecutive) {
  if (consecutive) return x.slice(order[begin], order[end - 1] + 1);
  std::vector<int64_t> idx(order.begin() + begin, order.begin() + end);
  Tensor i = to(Tensor(idx, Shape{int64_t(idx.size())}), x.device());
  return index_select(x, 0, i);
}

uint64_t shared_shuffle_seed(int64_t nobs, const DataLoaderOptions& o) {
  if (o.shard.size() <= 1) return o.shuffle ? uint64_t(rand({1}, DType::f64).item<double>() * 9007199254740992.0) : 0;
  distributed::detail::CommunicatorState& s = o.shard.state();
  distributed::detail::check_same_on_all_ranks(s, std::to_string(nobs) + " observations", "DataLoader",
                                               "the data sets of a sharded loader");
  if (!o.shuffle) return 0;
  // Every rank draws (their generators stay in step); rank 0's draw is the one used.
  uint64_t seed = uint64_t(rand({1}, DType::f64).item<double>() * 9007199254740992.0);
  distributed::detail::broadcast_bytes(s, &seed, sizeof(seed), 0, "DataLoader");
  return seed;
}

std::vector<int64_t> seeded_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::mt19937_64 gen(seed ^ (0x9E3779B97F4A7C15ull * uint64_t(epoch + 1)));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(gen() % uint64_t(i + 1))]);
  return order;
}

std::vector<int64_t> shard_rows(const std::vector<int64_t>& order, int64_t i, const DataLoaderOptions& o) {
  const int64_t n = int64_t(order.size()), ranks = o.shard.size(), global = o.batchsize * ranks;
  const int64_t start = i * global, stop = std::min(n, start + global);
  if (i < 0 || start >= n) fail("[DataLoader] batch ", i, " is out of range for ", n, " observations");
  const int64_t per_rank = (stop - start + ranks - 1) / ranks;  // batchsize, except in the last batch
  std::vector<int64_t> rows;
  rows.reserve(size_t(per_rank));
  for (int64_t j = 0; j < per_rank; ++j) {
    int64_t at = start + o.shard.rank() * per_rank + j;
    rows.push_back(order[size_t(at < stop ? at : (at - stop) % n)]);  // past the end: pad from the start
  }
  return rows;
}

bool consecutive(const std::vector<int64_t>& rows) {
  for (size_t k = 1; k < rows.size(); ++k)
    if (rows[k] != rows[k - 1] + 1) return false;
  return !rows.empty();
}

}  // namespace flux::detail
