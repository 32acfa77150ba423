#include "flux/data/dataloader.hpp"

#include <numeric>

#include "src/ops/ops_internal.hpp"

namespace flux::detail {

void check_loader(const Tensor* data, size_t count, const DataLoaderOptions& o) {
  if (o.batchsize <= 0) fail("[DataLoader] batchsize must be positive, got ", o.batchsize);
  for (size_t i = 0; i < count; ++i) {
    if (!data[i].defined()) fail("[DataLoader] tensor ", i, " is undefined");
    if (data[i].ndim() == 0) fail("[DataLoader] tensor ", i, " is 0-dimensional; observations go along the first axis");
  }
  for (size_t i = 1; i < count; ++i)
    if (data[i].shape()[0] != data[0].shape()[0])
      fail("[DataLoader] all tensors need the same number of observations (first dimension): tensor 0 has shape ",
           to_string(data[0].shape()), " but tensor ", i, " has shape ", to_string(data[i].shape()));
}

std::vector<int64_t> epoch_order(int64_t n, bool shuffle) {
  if (shuffle) return randperm(n);
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

}  // namespace flux::detail
