// DataLoader: batches of tensors sliced along the first (observation) axis.
//   DataLoader loader({X, Y}, {.batchsize = 64, .shuffle = true});
//   for (auto [x, y] : loader) ...
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "flux/ops.hpp"

namespace flux {

struct DataLoaderOptions {
  int64_t batchsize = 1;
  bool shuffle = false;
  bool partial = true;  // keep the last, smaller batch
};

namespace detail {
/// Observation order for one epoch (a fresh permutation when shuffling).
std::vector<int64_t> epoch_order(int64_t n, bool shuffle);
/// Rows `order[begin:end]` of x (a view when they are consecutive).
Tensor take_rows(const Tensor& x, const std::vector<int64_t>& order, int64_t begin, int64_t end, bool consecutive);
void check_loader(const Tensor* data, size_t count, const DataLoaderOptions& o);
}  // namespace detail

template <size_t N> class DataLoader {
 public:
  using Batch = std::array<Tensor, N>;

  DataLoader(const Tensor (&data)[N], DataLoaderOptions options = {}) : options_(options) {
    for (size_t i = 0; i < N; ++i) data_[i] = data[i];
    detail::check_loader(data_.data(), N, options_);
  }
  DataLoader(const std::array<Tensor, N>& data, DataLoaderOptions options = {}) : data_(data), options_(options) {
    detail::check_loader(data_.data(), N, options_);
  }

  int64_t nobs() const { return data_[0].shape()[0]; }
  /// Batches per epoch.
  int64_t size() const {
    int64_t n = nobs(), b = options_.batchsize;
    return options_.partial ? (n + b - 1) / b : n / b;
  }
  const DataLoaderOptions& options() const { return options_; }
  const std::array<Tensor, N>& data() const { return data_; }

  class iterator {
   public:
    iterator(const DataLoader* loader, int64_t batch) : loader_(loader), batch_(batch) {
      if (loader_) order_ = detail::epoch_order(loader_->nobs(), loader_->options_.shuffle);
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

  /// Batch number i of the epoch with observation order `order`.
  Batch batch(const std::vector<int64_t>& order, int64_t i) const {
    int64_t b = options_.batchsize, start = i * b, stop = std::min(nobs(), start + b);
    Batch out;
    for (size_t k = 0; k < N; ++k) out[k] = detail::take_rows(data_[k], order, start, stop, !options_.shuffle);
    return out;
  }

 private:
  std::array<Tensor, N> data_;
  DataLoaderOptions options_;
};

/// A loader over one tensor yields one-element arrays: for (auto [x] : DataLoader(X, ...)).
inline DataLoader<1> make_loader(const Tensor& x, DataLoaderOptions o = {}) { return DataLoader<1>({x}, o); }

}  // namespace flux
