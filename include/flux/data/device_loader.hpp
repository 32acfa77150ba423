// DeviceLoader: a DataLoader whose batches arrive on a device (Flux's `DataLoader(...) |> gpu`,
// CUDA.jl's CuIterator). A background thread slices and copies the next batch while the current
// one is in use; the previous batch is released as the loop moves on.
//   auto loader = DataLoader({X, Y}, {.batchsize = 64}) | dev;
//   for (auto [x, y] : loader) ...   // x, y on dev
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "flux/data/dataloader.hpp"
#include "flux/move.hpp"

namespace flux {

namespace detail {

/// Produces batches 0..count-1 in order on one background thread, at most `depth` ahead of the
/// consumer. An exception thrown by `produce` is rethrown by next() for that batch and after it.
/// The destructor stops the thread and joins it, mid-epoch included.
class BatchPrefetcher {
 public:
  struct Batch {
    std::vector<Tensor> tensors;     // what the consumer gets
    std::vector<Tensor> keep_alive;  // sources of the copies, held until the batch is released
  };
  using Producer = std::function<Batch(int64_t index)>;

  BatchPrefetcher(int64_t count, Producer produce, int depth = 1);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  /// The next batch (blocks until it is ready); releases the one returned before.
  std::vector<Tensor> next();
  /// Batches produced so far (for tests).
  int64_t produced() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Throws unless `d` names a loaded backend's existing device.
void check_loader_device(const Device& d);

}  // namespace detail

/// Batches of a DataLoader moved to one device. Iterating it twice runs two epochs.
template <size_t N> class DeviceLoader {
 public:
  using Batch = std::array<Tensor, N>;

  /// `gpu_conversion`: convert float64 to float32 as gpu() does.
  DeviceLoader(DataLoader<N> loader, Device device, bool gpu_conversion = false)
      : loader_(std::make_shared<const DataLoader<N>>(std::move(loader))),
        device_(std::move(device)),
        gpu_conversion_(gpu_conversion && !device_.is_cpu()) {
    detail::check_loader_device(device_);
    moves_ = false;
    for (const Tensor& t : loader_->data())
      if (t.device() != device_ || (gpu_conversion_ && t.dtype() == DType::f64)) moves_ = true;
  }

  const Device& device() const { return device_; }
  const DataLoader<N>& loader() const { return *loader_; }
  /// Batches per epoch.
  int64_t size() const { return loader_->size(); }
  /// DataLoader::set_epoch / epoch of the loader inside (the epoch the next begin() starts).
  void set_epoch(int64_t e) const { loader_->set_epoch(e); }
  int64_t epoch() const { return loader_->epoch(); }
  /// False when the data already lives on the device: batches are the DataLoader's own (no copy,
  /// no thread).
  bool moves() const { return moves_; }

  class iterator {
   public:
    iterator() = default;
    Batch operator*() const {
      fetch();
      return *current_;
    }
    iterator& operator++() {
      fetch();          // keeps the order when a batch is skipped without being read
      current_.reset(); // releases it
      ++index_;
      return *this;
    }
    bool operator==(const iterator& o) const { return index_ == o.index_; }
    bool operator!=(const iterator& o) const { return index_ != o.index_; }

   private:
    friend class DeviceLoader;
    void fetch() const {
      if (current_) return;
      Batch b;
      if (prefetch_) {
        std::vector<Tensor> v = prefetch_->next();
        for (size_t k = 0; k < N; ++k) b[k] = std::move(v[k]);
      } else {
        b = loader_->batch(order_, index_);
      }
      current_ = std::move(b);
    }

    std::shared_ptr<const DataLoader<N>> loader_;
    std::shared_ptr<detail::BatchPrefetcher> prefetch_;
    std::vector<int64_t> order_;
    int64_t index_ = 0;
    mutable std::optional<Batch> current_;
  };

  /// Starts an epoch (reshuffled when the DataLoader shuffles) and its background copies.
  iterator begin() const {
    iterator it;
    it.loader_ = loader_;
    std::vector<int64_t> order = loader_->epoch_order();
    if (!moves_) {
      it.order_ = std::move(order);
      return it;
    }
    auto produce = [loader = loader_, order = std::move(order), device = device_,
                    convert = gpu_conversion_](int64_t i) {
      Batch host = loader->batch(order, i);
      detail::BatchPrefetcher::Batch out;
      for (const Tensor& t : host) {
        out.tensors.push_back(convert ? detail::to_gpu_tensor(t, device) : to(t, device));
        out.keep_alive.push_back(t);
      }
      return out;
    };
    it.prefetch_ = std::make_shared<detail::BatchPrefetcher>(size(), std::move(produce));
    return it;
  }
  iterator end() const {
    iterator it;
    it.index_ = size();
    return it;
  }

 private:
  std::shared_ptr<const DataLoader<N>> loader_;
  Device device_;
  bool gpu_conversion_ = false;
  bool moves_ = false;
};

/// DataLoader(...) | dev: batches arrive on dev (dtypes kept), copied in the background.
template <size_t N> DeviceLoader<N> operator|(const DataLoader<N>& loader, const Device& d) {
  return DeviceLoader<N>(loader, d);
}
/// to(loader, dev): the same as loader | dev.
template <size_t N> DeviceLoader<N> to(const DataLoader<N>& loader, const Device& d) {
  return DeviceLoader<N>(loader, d);
}
/// gpu(loader), loader | gpu: batches on the default GPU, float64 converted to float32; no copy
/// without a GPU.
template <size_t N> DeviceLoader<N> flux_move(const DataLoader<N>& loader, const GpuMover&) {
  return DeviceLoader<N>(loader, detail::default_gpu(), true);
}
/// cpu(loader), loader | cpu: batches on the CPU.
template <size_t N> DeviceLoader<N> flux_move(const DataLoader<N>& loader, const CpuMover&) {
  return DeviceLoader<N>(loader, Device());
}

}  // namespace flux
