// Tensor: a small handle to shape, dtype, device and shared storage. Row-major and contiguous;
// observations along the first axis.
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "flux/device.hpp"
#include "flux/dtype.hpp"
#include "flux/error.hpp"

namespace flux {

/// Up to 8 dimensions stored inline (no heap allocation per tensor).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  Shape(const std::vector<int64_t>& dims);
  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t numel() const;
  void push_back(int64_t v);
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  std::vector<int64_t> vec() const { return {d_, d_ + n_}; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  int64_t d_[backend::kMaxDims] = {};
  int n_ = 0;
};
/// "(3, 4)".
std::string to_string(const Shape& s);
std::ostream& operator<<(std::ostream& os, const Shape& s);

namespace detail {
class StorageCache;
}  // namespace detail

/// Device memory shared by tensors (views along the first axis share it).
struct Storage {
  backend::Backend* backend = nullptr;
  Device device;
  backend::Buffer buffer;
  size_t bytes = 0;
  /// What the library derives from the content (weights in a kernel's layout), created on first
  /// use and emptied by every write; internal (src/storage_cache.hpp).
  std::atomic<detail::StorageCache*> derived{nullptr};
  Storage(backend::Backend* b, Device d, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;
  size_t offset = 0;              // bytes into storage
  int64_t tape_id = -1;           // position on the active tape, if recorded
  uint64_t tape_generation = 0;   // which tape recorded it
};

class Tensor {
 public:
  /// An undefined tensor (defined() == false).
  Tensor() = default;
  /// From data; a flat list of values is a 1-D tensor, `shape` reshapes it.
  Tensor(std::initializer_list<float> values);
  Tensor(std::initializer_list<std::initializer_list<float>> rows);
  Tensor(const std::vector<float>& values, Shape shape);
  Tensor(const std::vector<double>& values, Shape shape);
  Tensor(const std::vector<int32_t>& values, Shape shape);
  Tensor(const std::vector<int64_t>& values, Shape shape);
  Tensor(const std::vector<uint8_t>& values, Shape shape, DType t = DType::u8);
  /// A scalar (0-d) float32 tensor.
  static Tensor scalar(double value, DType t = DType::f32, Device d = {});
  /// Uninitialised memory of the given shape.
  static Tensor empty(Shape shape, DType t = DType::f32, Device d = {});
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t size(int axis) const;  // negative axes count from the end
  int ndim() const { return shape().size(); }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }

  /// The single value of a one-element tensor, converted to T (a host sync).
  template <class T> T item() const;
  /// All values, converted to T, in row-major order (a host sync).
  template <class T> std::vector<T> to_vector() const;

  Tensor reshape(Shape shape) const;           // one axis may be -1; shares storage
  Tensor transpose() const;                     // 2-D: swap axes; N-D: reverse the last two
  Tensor slice(int64_t start, int64_t stop) const;  // rows [start, stop) of the first axis; shares storage
  Tensor operator[](int64_t i) const;           // row i of the first axis (drops it); shares storage
  Tensor cast(DType t) const;
  Tensor f32() const { return cast(DType::f32); }
  Tensor f64() const { return cast(DType::f64); }
  Tensor contiguous_copy() const;               // a fresh copy on the same device
  bool same_storage(const Tensor& o) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// The storage buffer with this tensor's offset applied, for reading and writing in place: each
  /// call counts as a write, so whatever the library derived from the content (prepared weights) is
  /// dropped and remade on next use. Call it again after writing if you keep the pointer across
  /// library calls.
  backend::Buffer buffer() const;
  backend::Backend& backend() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Julia-style display: "3×2 Tensor{Float32, CPU}:" then the values, elided when large.
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string summary(const Tensor& t);  // "3×2 Tensor{Float32, CPU}"

// ---- construction ----
Tensor zeros(Shape shape, DType t = DType::f32, Device d = {});
Tensor ones(Shape shape, DType t = DType::f32, Device d = {});
Tensor full(Shape shape, double value, DType t = DType::f32, Device d = {});
Tensor zeros_like(const Tensor& x);
Tensor ones_like(const Tensor& x);
Tensor full_like(const Tensor& x, double value);
/// MLUtils' fill_like: full_like under its Julia name (x's shape, dtype and device).
Tensor fill_like(const Tensor& x, double value);
/// Uniform on [0, 1) / standard normal, from the global seeded generator.
Tensor rand(Shape shape, DType t = DType::f32, Device d = {});
Tensor randn(Shape shape, DType t = DType::f32, Device d = {});
/// start, start+step, ... < stop.
Tensor arange(double start, double stop, double step = 1, DType t = DType::f32, Device d = {});
Tensor arange(int64_t stop, DType t = DType::i64, Device d = {});
/// Seeds the global generator (rand, randn, Dense init, DataLoader shuffle).
void seed(uint64_t s);
/// A random permutation of 0..n-1 from the global generator.
std::vector<int64_t> randperm(int64_t n);
/// Copies to `d` keeping the dtype; returns `x` itself when already there.
Tensor to(const Tensor& x, const Device& d);

}  // namespace flux
