// DataLoader: batches of tensors sliced along the first (observation) axis.
//   DataLoader loader({X, Y}, {.batchsize = 64, .shuffle = true});
//   for (auto [x, y] : loader) ...
// Sharded across ranks (.shard = comm, data-parallel training): batch i of the epoch is the global
// batch of observations order[i*G, (i+1)*G) with G = batchsize * comm.size(), and rank r gets rows
// [r*batchsize, (r+1)*batchsize) of it, so the ranks' shards are disjoint and together are the
// batch a single process with batchsize G would see. Shuffling draws every epoch's order from one
// seed (shared by all ranks: rank 0's draw) taken from the global generator when the loader is made,
// so epoch e's order is a function of that seed and e alone (set_epoch resumes a run there). The last,
// uneven global batch of m < G observations is dropped when partial = false; otherwise it is
// padded with the epoch's first observations to a multiple of comm.size() and split evenly, so
// every rank runs the same number of equally sized steps.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "flux/distributed.hpp"
#include "flux/ops.hpp"

namespace flux {

struct DataLoaderOptions {
  int64_t batchsize = 1;
  bool shuffle = false;
  bool partial = true;  // keep the last, smaller batch
  /// Each rank of this communicator sees its own disjoint shard (see above); one rank: no sharding.
  distributed::Communicator shard = {};
};

namespace detail {
/// 0, 1, ..., n-1: the order of every epoch without shuffling.
std::vector<int64_t> identity_order(int64_t n);
/// Rows `order[begin:end]` of x (a view when they are consecutive).
Tensor take_rows(const Tensor& x, const std::vector<int64_t>& order, int64_t begin, int64_t end, bool consecutive);
void check_loader(const Tensor* data, size_t count, const DataLoaderOptions& o);
/// The shuffling seed, drawn from the global generator when shuffling (every rank of o.shard shares
/// rank 0's draw); 0 without shuffling.
uint64_t shared_shuffle_seed(int64_t nobs, const DataLoaderOptions& o);
/// Epoch `epoch`'s permutation of 0..n-1 from `seed` (the same on every rank).
std::vector<int64_t> seeded_order(int64_t n, uint64_t seed, int64_t epoch);
/// The observations of this rank's part of batch i (see the comment at the top).
std::vector<int64_t> shard_rows(const std::vector<int64_t>& order, int64_t i, const DataLoaderOptions& o);
/// True when rows are k, k+1, k+2, ... (then a batch is a view).
bool consecutive(const std::vector<int64_t>& rows);
}  // namespace detail

template <size_t N> class DataLoader {
 public:
  using Batch = std::array<Tensor, N>;

  DataLoader(const Tensor (&data)[N], DataLoaderOptions options = {}) : options_(options) {
    for (size_t i = 0; i < N; ++i) data_[i] = data[i];
    detail::check_loader(data_.data(), N, options_);
    seed_ = detail::shared_shuffle_seed(nobs(), options_);
  }
  DataLoader(const std::array<Tensor, N>& data, DataLoaderOptions options = {}) : data_(data), options_(options) {
    detail::check_loader(data_.data(), N, options_);
    seed_ = detail::shared_shuffle_seed(nobs(), options_);
  }

  int64_t nobs() const { return data_[0].shape()[0]; }
  /// Batches per epoch.
  int64_t size() const {
    int64_t n = nobs(), b = options_.batchsize * options_.shard.size();
    return n / b + (options_.partial && n % b != 0 ? 1 : 0);  // (n + b - 1) / b would overflow for a huge b
  }
  const DataLoaderOptions& options() const { return options_; }
  const std::array<Tensor, N>& data() const { return data_; }

  class iterator {
   public:
    iterator(const DataLoader* loader, int64_t batch) : loader_(loader), batch_(batch) {
      if (loader_) order_ = loader_->epoch_order();
    }
    Batch operator*() const { return loader_->batch(order_, batch_); }
    iterator& operator++() {
      ++batch_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return batch_ != o.batch_; }
    bool operator==(const iterator& o) const { return batch_ == o.batch_; }

   private:
    const DataLoader* loader_;
    int64_t batch_;
    std::vector<int64_t> order_;
  };
  /// Each begin() starts an epoch (reshuffled when shuffle = true).
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(nullptr, size()); }

  /// The observation order of the next epoch (a fresh permutation when shuffling; each call starts
  /// an epoch).
  std::vector<int64_t> epoch_order() const {
    if (options_.shuffle) return detail::seeded_order(nobs(), seed_, epoch_++);
    ++epoch_;
    return detail::identity_order(nobs());
  }
  /// The next epoch begin() starts is epoch e (0-based, as counted since the loader was made), with
  /// that epoch's order: train() calls it to resume a run mid-way (PyTorch's sampler.set_epoch).
  void set_epoch(int64_t e) const {
    if (e < 0) detail::fail("[DataLoader::set_epoch] the epoch must be >= 0, got ", e);
    epoch_ = e;
  }
  /// The number of epochs begin() has started (the next one's index).
  int64_t epoch() const { return epoch_; }

  /// Batch number i of the epoch with observation order `order` (this rank's shard of it).
  Batch batch(const std::vector<int64_t>& order, int64_t i) const {
    Batch out;
    if (options_.shard.size() > 1) {
      std::vector<int64_t> rows = detail::shard_rows(order, i, options_);
      bool consecutive = detail::consecutive(rows);
      for (size_t k = 0; k < N; ++k) out[k] = detail::take_rows(data_[k], rows, 0, int64_t(rows.size()), consecutive);
      return out;
    }
    int64_t b = options_.batchsize, start = i * b, stop = std::min(nobs(), start + b);
    for (size_t k = 0; k < N; ++k) out[k] = detail::take_rows(data_[k], order, start, stop, !options_.shuffle);
    return out;
  }

 private:
  std::array<Tensor, N> data_;
  DataLoaderOptions options_;
  uint64_t seed_ = 0;
  mutable int64_t epoch_ = 0;
};

/// A loader over one tensor yields one-element arrays: for (auto [x] : DataLoader(X, ...)).
inline DataLoader<1> make_loader(const Tensor& x, DataLoaderOptions o = {}) { return DataLoader<1>({x}, o); }

}  // namespace flux
