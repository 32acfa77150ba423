#include "flux/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/checked_size.hpp"
#include "src/internal.hpp"
#include "src/storage_cache.hpp"
#include "src/storage_stats.hpp"

namespace flux {

// ---------------- Shape ----------------
Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}
Shape::Shape(const std::vector<int64_t>& dims) {
  for (int64_t d : dims) push_back(d);
}
void Shape::push_back(int64_t v) {
  if (n_ >= backend::kMaxDims)
    detail::fail("[Shape] at most ", backend::kMaxDims, " dimensions are supported");
  d_[n_++] = v;
}
int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < n_; ++i)
    if (__builtin_mul_overflow(n, d_[i], &n))
      detail::fail("[numel] shape ", to_string(*this), " has more elements than an int64 can count");
  return n;
}
bool Shape::operator==(const Shape& o) const {
  if (n_ != o.n_) return false;
  for (int i = 0; i < n_; ++i)
    if (d_[i] != o.d_[i]) return false;
  return true;
}
std::string to_string(const Shape& s) {
  std::string out = "(";
  for (int i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << to_string(s); }

// ---------------- Storage ----------------
namespace {
std::atomic<size_t> g_live_bytes{0}, g_peak_bytes{0};  // src/storage_stats.hpp
}
size_t detail::live_storage_bytes() { return g_live_bytes.load(std::memory_order_relaxed); }
size_t detail::peak_storage_bytes() { return g_peak_bytes.load(std::memory_order_relaxed); }
void detail::reset_peak_storage_bytes() { g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed); }

Storage::Storage(backend::Backend* b, Device d, size_t nbytes) : backend(b), device(std::move(d)), bytes(nbytes) {
  buffer = backend->allocate(device.index(), bytes);
  const size_t live = g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
Storage::~Storage() {
  delete derived.load(std::memory_order_acquire);
  backend->deallocate(device.index(), buffer, bytes);
  g_live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

// ---------------- Tensor basics ----------------
// A fresh tensor for the public API `api` (its name is in the errors of a bad shape).
static Tensor empty_for(const char* api, const Shape& shape, DType t, const Device& d) {
  const int64_t n = detail::checked_numel(api, shape, t);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = t;
  backend::Backend& b = detail::backend_for(d);
  impl->storage = std::make_shared<Storage>(&b, d, size_t(n) * dtype_size(t));
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(Shape shape, DType t, Device d) { return empty_for("empty", shape, t, d); }

static Tensor from_host(const void* data, size_t count, Shape shape, DType t, const char* api) {
  if (shape.numel() != int64_t(count))
    detail::fail("[", api, "] ", count, " values do not fill shape ", to_string(shape), " (",
                 shape.numel(), " elements)");
  Tensor out = empty_for(api, shape, t, Device());
  if (count) out.backend().copy_from_host(0, flux::detail::buffer_of(out), data, count * dtype_size(t));
  return out;
}

Tensor::Tensor(std::initializer_list<float> values)
    : Tensor(from_host(values.begin(), values.size(), Shape{int64_t(values.size())}, DType::f32, "Tensor")) {}

Tensor::Tensor(std::initializer_list<std::initializer_list<float>> rows) {
  std::vector<float> flat;
  int64_t cols = rows.size() ? int64_t(rows.begin()->size()) : 0;
  for (auto& r : rows) {
    if (int64_t(r.size()) != cols)
      detail::fail("[Tensor] ragged rows: expected ", cols, " values per row, got ", r.size());
    flat.insert(flat.end(), r.begin(), r.end());
  }
  *this = from_host(flat.data(), flat.size(), Shape{int64_t(rows.size()), cols}, DType::f32, "Tensor");
}
Tensor::Tensor(const std::vector<float>& v, Shape s) : Tensor(from_host(v.data(), v.size(), s, DType::f32, "Tensor")) {}
Tensor::Tensor(const std::vector<double>& v, Shape s) : Tensor(from_host(v.data(), v.size(), s, DType::f64, "Tensor")) {}
Tensor::Tensor(const std::vector<int32_t>& v, Shape s) : Tensor(from_host(v.data(), v.size(), s, DType::i32, "Tensor")) {}
Tensor::Tensor(const std::vector<int64_t>& v, Shape s) : Tensor(from_host(v.data(), v.size(), s, DType::i64, "Tensor")) {}
Tensor::Tensor(const std::vector<uint8_t>& v, Shape s, DType t) {
  if (t != DType::u8 && t != DType::boolean)
    detail::fail("[Tensor] a uint8 vector makes a UInt8 or Bool tensor, not ", dtype_name(t));
  *this = from_host(v.data(), v.size(), s, t, "Tensor");
}

Tensor Tensor::scalar(double value, DType t, Device d) { return full(Shape{}, value, t, d); }

static const TensorImpl& need(const Tensor& t, const char* what) {
  if (!t.defined()) detail::fail("[", what, "] the tensor is undefined (default-constructed)");
  return *t.impl();
}
const Shape& Tensor::shape() const { return need(*this, "shape").shape; }
DType Tensor::dtype() const { return need(*this, "dtype").dtype; }
Device Tensor::device() const { return need(*this, "device").storage->device; }
int64_t Tensor::size(int axis) const {
  int n = ndim();
  int a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n) detail::fail("[size] axis ", axis, " is out of range for shape ", to_string(shape()));
  return shape()[a];
}
backend::Buffer Tensor::buffer() const {
  need(*this, "buffer");
  detail::mark_written(*this);  // the caller may write through it: what was derived from it goes
  return detail::buffer_of(*this);
}
backend::Backend& Tensor::backend() const { return *need(*this, "backend").storage->backend; }
bool Tensor::same_storage(const Tensor& o) const {
  return defined() && o.defined() && impl_->storage == o.impl_->storage && impl_->offset == o.impl_->offset;
}

namespace {
template <class T> const char* host_type_name() {
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else return "uint8";
}

// The values of t as T; `api` names the caller in errors. To an integer T, a value T cannot hold (NaN,
// ±Inf, out of range) is a flux::Error, as for Tensor::cast (no undefined C++ conversion).
template <class T> std::vector<T> host_values(const Tensor& t, const char* api) {
  const TensorImpl& i = need(t, api);
  int64_t n = t.numel();
  std::vector<unsigned char> raw = detail::host_vector<unsigned char>(api, int64_t(t.nbytes()));
  if (n) t.backend().copy_to_host(t.device().index(), raw.data(), flux::detail::buffer_of(t), raw.size());
  std::vector<T> out = detail::host_vector<T>(api, n);
  constexpr bool integral = std::is_integral_v<T> && !std::is_same_v<T, bool>;
  const bool exact_int64 = integral && i.dtype == DType::i64;
  for (int64_t k = 0; k < n; ++k) {
    // Int64 to an integer type without a double in between: doubles hold integers exactly only up to
    // 2^53, and 2^63 - 1 rounds to 2^63, which no int64_t holds (UB; found by tests/fuzz/fuzz_csv).
    if (exact_int64) {
      int64_t v;
      std::memcpy(&v, raw.data() + size_t(k) * sizeof(int64_t), sizeof v);
      if constexpr (integral) {
        if (v < int64_t(std::numeric_limits<T>::min()) || v > int64_t(std::numeric_limits<T>::max()))
          detail::fail("[", api, "] cannot convert ", v, " to ", host_type_name<T>(), " (element ", k, " of ", summary(t), ")");
      }
      out[size_t(k)] = T(v);
    } else {
      const double v = detail::load_as_double(raw.data(), i.dtype, k);
      if constexpr (integral) {
        // Open bounds on v: its truncation toward zero is within T exactly when v lies inside them.
        const double below = double(std::numeric_limits<T>::min()) - 1.0, above = double(std::numeric_limits<T>::max()) + 1.0;
        const bool fits = std::is_same_v<T, int64_t> ? (v >= -9223372036854775808.0 && v < 9223372036854775808.0)
                                                      : (v > below && v < above);
        if (!fits) {
          std::ostringstream os;
          if (std::isnan(v)) os << "NaN";
          else if (std::isinf(v)) os << (v > 0 ? "Inf" : "-Inf");
          else os << v;
          detail::fail("[", api, "] cannot convert ", os.str(), " to ", host_type_name<T>(), " (element ", k, " of ",
                       summary(t), "): NaN, Inf and out-of-range values have no integer value");
        }
      }
      out[size_t(k)] = T(v);
    }
  }
  return out;
}
}  // namespace

template <class T> std::vector<T> Tensor::to_vector() const { return host_values<T>(*this, "to_vector"); }
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

template <class T> T Tensor::item() const {
  if (numel() != 1)
    detail::fail("[item] needs a one-element tensor; got shape ", to_string(shape()));
  return host_values<T>(*this, "item")[0];
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template uint8_t Tensor::item<uint8_t>() const;
template bool Tensor::item<bool>() const;

Tensor Tensor::transpose() const {
  int n = ndim();
  if (n < 2) detail::fail("[transpose] needs at least 2 dimensions; got shape ", to_string(shape()));
  std::vector<int> axes(n);
  std::iota(axes.begin(), axes.end(), 0);
  std::swap(axes[n - 1], axes[n - 2]);
  return permute(*this, axes);
}

Tensor Tensor::slice(int64_t start, int64_t stop) const { return flux::slice(*this, 0, start, stop); }

Tensor Tensor::operator[](int64_t i) const {
  if (ndim() == 0) detail::fail("[index] cannot index a 0-dimensional tensor");
  int64_t n = shape()[0];
  if (i < 0) i += n;
  if (i < 0 || i >= n) detail::fail("[index] index ", i, " is out of range for first axis of length ", n);
  Shape rest;
  for (int k = 1; k < ndim(); ++k) rest.push_back(shape()[k]);
  return slice(i, i + 1).reshape(rest);
}

// ---------------- construction ----------------
static Tensor filled(const char* api, const Shape& shape, double value, DType t, const Device& d) {
  Tensor out = empty_for(api, shape, t, d);
  if (out.numel()) out.backend().fill(d.index(), t, flux::detail::buffer_of(out), out.numel(), value);
  return out;
}
Tensor full(Shape shape, double value, DType t, Device d) { return filled("full", shape, value, t, d); }
Tensor zeros(Shape shape, DType t, Device d) { return filled("zeros", shape, 0.0, t, d); }
Tensor ones(Shape shape, DType t, Device d) { return filled("ones", shape, 1.0, t, d); }
Tensor zeros_like(const Tensor& x) { return zeros(x.shape(), x.dtype(), x.device()); }
Tensor ones_like(const Tensor& x) { return ones(x.shape(), x.dtype(), x.device()); }
Tensor full_like(const Tensor& x, double v) { return full(x.shape(), v, x.dtype(), x.device()); }
Tensor fill_like(const Tensor& x, double v) { return full_like(x, v); }

namespace {
std::mutex g_rng_mutex;
std::mt19937_64& rng() {
  static std::mt19937_64 gen(0x5eed);
  return gen;
}
// Host values of dtype t from doubles, then one upload.
Tensor upload(const std::vector<double>& v, Shape shape, DType t, Device d, const char* api) {
  if (!is_floating(t)) detail::fail("[", api, "] needs a floating-point dtype, got ", dtype_name(t));
  if (t == DType::f32) {  // convert on the host: no float64 device tensor (it would stay in the pool)
    std::vector<float> f(v.begin(), v.end());
    return to(Tensor(f, shape), d);
  }
  Tensor host = Tensor(v, shape);
  Tensor cast = t == DType::f64 ? host : host.cast(t);
  return to(cast, d);
}
// n values of draw() (doubles, in order, under the generator's lock) as a Float32 host tensor, drawn
// and converted in chunks: no float64 buffer of the tensor's size, whose freed pages (glibc keeps
// large freed blocks on its heap once its mmap threshold has risen) would stay in the process's RSS.
template <class Draw> Tensor float32_draws(int64_t n, Shape shape, const char* api, Draw draw) {
  Tensor host = empty_for(api, shape, DType::f32, Device());
  constexpr int64_t kChunk = 4096;
  float chunk[kChunk];
  backend::Backend& b = host.backend();
  const backend::Buffer buf = detail::buffer_of(host);
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    for (int64_t j = 0; j < m; ++j) chunk[j] = float(draw());
    b.copy_from_host(0, {buf.handle, buf.offset + size_t(i) * sizeof(float)}, chunk, size_t(m) * sizeof(float));
  }
  return host;
}
}  // namespace

void seed(uint64_t s) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  rng().seed(s);
  detail::reset_random_stream(s);
}

namespace detail {
std::mt19937_64 host_generator() {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  return rng();
}
void set_host_generator(const std::mt19937_64& g) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  rng() = g;
}
}  // namespace detail

std::vector<int64_t> randperm(int64_t n) {
  if (n < 0) detail::fail("[randperm] needs a non-negative length, got ", n);
  std::vector<int64_t> p = detail::host_vector<int64_t>("randperm", n);
  std::iota(p.begin(), p.end(), int64_t(0));
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  for (int64_t i = n - 1; i > 0; --i) {
    std::uniform_int_distribution<int64_t> dist(0, i);
    std::swap(p[i], p[dist(rng())]);
  }
  return p;
}

// The device tensor first (a size the device cannot hold is OutOfMemory there, before any host
// work), then the values drawn on the host in float64 and uploaded.
Tensor rand(Shape shape, DType t, Device d) {
  const int64_t n = detail::checked_numel("rand", shape, t);
  if (!is_floating(t)) detail::fail("[rand] needs a floating-point dtype, got ", dtype_name(t));
  empty_for("rand", shape, t, d);
  if (t == DType::f32) return to(float32_draws(n, shape, "rand", [] { return double(rng()() >> 11) * 0x1.0p-53; }), d);
  std::vector<double> v = detail::host_vector<double>("rand", n);
  {
    std::lock_guard<std::mutex> lock(g_rng_mutex);
    for (double& x : v) x = double(rng()() >> 11) * 0x1.0p-53;
  }
  return upload(v, shape, t, d, "rand");
}

Tensor randn(Shape shape, DType t, Device d) {
  const int64_t n = detail::checked_numel("randn", shape, t);
  if (!is_floating(t)) detail::fail("[randn] needs a floating-point dtype, got ", dtype_name(t));
  empty_for("randn", shape, t, d);
  if (t == DType::f32) {
    std::normal_distribution<double> dist(0.0, 1.0);
    return to(float32_draws(n, shape, "randn", [&] { return dist(rng()); }), d);
  }
  std::vector<double> v = detail::host_vector<double>("randn", n);
  {
    std::lock_guard<std::mutex> lock(g_rng_mutex);
    std::normal_distribution<double> dist(0.0, 1.0);
    for (double& x : v) x = dist(rng());
  }
  return upload(v, shape, t, d, "randn");
}

Tensor arange(double start, double stop, double step, DType t, Device d) {
  if (step == 0) detail::fail("[arange] step must be non-zero");
  if (!std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    detail::fail("[arange] start, stop and step must be finite; got arange(", start, ", ", stop, ", ", step, ")");
  const double count = std::ceil((stop - start) / step);
  // 2^53: beyond it start + i * step no longer steps by one element (and no memory holds it anyway).
  if (!(count <= 9007199254740992.0))
    detail::fail("[arange] arange(", start, ", ", stop, ", ", step, ") would have ", count,
                 " elements; at most 2^53 are supported");
  const int64_t n = count > 0 ? int64_t(count) : 0;
  detail::checked_numel("arange", Shape{n}, t);
  empty_for("arange", Shape{n}, t, d);  // the device's OutOfMemory before the host buffer
  std::vector<double> v = detail::host_vector<double>("arange", n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + double(i) * step;
  Tensor host(v, Shape{n});
  return to(t == DType::f64 ? host : host.cast(t), d);
}
Tensor arange(int64_t stop, DType t, Device d) { return arange(0.0, double(stop), 1.0, t, d); }

// ---------------- printing ----------------
std::string summary(const Tensor& t) {
  if (!t.defined()) return "Tensor(undefined)";
  std::string dims;
  const Shape& s = t.shape();
  if (s.size() == 0) dims = "0-dimensional";
  if (s.size() == 1) dims = std::to_string(s[0]) + "-element";
  for (int i = 0; s.size() > 1 && i < s.size(); ++i) {
    if (i) dims += "×";
    dims += std::to_string(s[i]);
  }
  return dims + " Tensor{" + dtype_name(t.dtype()) + ", " + to_string(t.device()) + "}";
}

// Julia's compact display: 6 significant digits, "1.0" for whole floats, "1.0e-5" (Float64) and
// "1.0f-5" (Float32 and narrower) for exponents.
static std::string format_value(double v, DType t) {
  char buf[64];
  if (t == DType::boolean) return v != 0 ? "1" : "0";
  if (!is_floating(t)) {
    std::snprintf(buf, sizeof buf, "%lld", (long long)v);
    return buf;
  }
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  std::snprintf(buf, sizeof buf, "%.6g", v);
  std::string s = buf;
  size_t e = s.find('e');
  std::string mantissa = s.substr(0, e), exponent;
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (e == std::string::npos) return mantissa;
  int ex = std::atoi(s.c_str() + e + 1);
  return mantissa + (t == DType::f64 ? "e" : "f") + std::to_string(ex);
}

// Prints rows × cols values starting at v[offset] as Julia prints a matrix, eliding the middle
// rows/columns beyond 10 × 8.
static void print_matrix(std::ostream& os, const std::vector<double>& v, size_t offset, int64_t rows, int64_t cols,
                         DType dtype) {
  const int64_t max_rows = 10, max_cols = 8;
  auto shown_ids = [](int64_t n, int64_t lim) {  // -1 marks the elision
    std::vector<int64_t> ids;
    if (n <= lim) {
      for (int64_t i = 0; i < n; ++i) ids.push_back(i);
    } else {
      for (int64_t i = 0; i < lim / 2; ++i) ids.push_back(i);
      ids.push_back(-1);
      for (int64_t i = n - lim / 2; i < n; ++i) ids.push_back(i);
    }
    return ids;
  };
  std::vector<int64_t> rids = shown_ids(rows, max_rows), cids = shown_ids(cols, max_cols);
  auto cell = [&](int64_t r, int64_t c) { return format_value(v[offset + size_t(r * cols + c)], dtype); };
  // Julia aligns each column on its decimal point: left part right-aligned, right part left-aligned.
  struct Column { size_t left = 1, right = 0; };
  std::vector<Column> width(cids.size());
  auto split = [](const std::string& text) {
    size_t p = text.find_first_of(".ef");
    return p == std::string::npos ? std::make_pair(text, std::string()) : std::make_pair(text.substr(0, p), text.substr(p));
  };
  for (size_t ci = 0; ci < cids.size(); ++ci)
    for (int64_t r : rids)
      if (r >= 0 && cids[ci] >= 0) {
        auto [l, rt] = split(cell(r, cids[ci]));
        width[ci].left = std::max(width[ci].left, l.size());
        width[ci].right = std::max(width[ci].right, rt.size());
      }
  for (size_t ri = 0; ri < rids.size(); ++ri) {
    int64_t r = rids[ri];
    std::string line = " ";
    for (size_t ci = 0; ci < cids.size(); ++ci) {
      int64_t c = cids[ci];
      if (ci) line += "  ";
      if (c < 0) {
        line += r < 0 ? "⋱" : (ri == 0 ? "…" : " ");
        continue;
      }
      std::string l = "⋮", rt;
      size_t lshown = 1;
      if (r >= 0) {
        std::tie(l, rt) = split(cell(r, c));
        lshown = l.size();
      }
      line += std::string(width[ci].left - lshown, ' ') + l + rt + std::string(width[ci].right - rt.size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line;
    if (ri + 1 < rids.size()) os << "\n";
  }
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  os << summary(t);
  if (!t.defined() || t.numel() == 0) return os;
  os << ":\n";
  std::vector<double> v = t.to_vector<double>();
  const Shape& s = t.shape();
  int n = s.size();
  if (n <= 2) {  // 0-d and 1-d print as one column
    int64_t cols = n == 2 ? s[1] : 1;
    print_matrix(os, v, 0, t.numel() / cols, cols, t.dtype());
    return os;
  }
  // N-d: one matrix per index of the leading axes, labelled like Julia's "[:, :, 1] =" but row-major:
  // "[1, 2, :, :] =" (1-based); beyond 6 slices the middle ones are elided.
  int64_t rows = s[n - 2], cols = s[n - 1], nslices = t.numel() / (rows * cols);
  for (int64_t k = 0; k < nslices; ++k) {
    if (nslices > 6 && k == 3) {
      os << "\n\n⋮";
      k = nslices - 4;
      continue;
    }
    if (k) os << "\n\n";
    std::string label = "[";
    int64_t rest = k;
    std::vector<int64_t> idx(size_t(n - 2));
    for (int i = n - 3; i >= 0; --i) {
      idx[size_t(i)] = rest % s[i];
      rest /= s[i];
    }
    for (int64_t i : idx) label += std::to_string(i + 1) + ", ";
    os << label << ":, :] =\n";
    print_matrix(os, v, size_t(k * rows * cols), rows, cols, t.dtype());
  }
  return os;
}

}  // namespace flux
