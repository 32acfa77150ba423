// Pooling layers: options resolved at construction as Flux's MaxPool/MeanPool, then the pool ops.
#include "flux/nn/pooling.hpp"

#include "src/nn/window_options.hpp"

namespace flux {

namespace {
struct Resolved {
  std::vector<int64_t> window, stride, pad;
};

Resolved resolve(const char* api, const Dims& window, const PoolOptions& options) {
  Resolved r;
  r.window = detail::window_sizes(api, "window sizes", window);
  const int n = int(r.window.size());
  r.stride = options.stride.values.empty() ? r.window : detail::per_axis(api, "stride", options.stride, n, 1);
  r.pad = detail::resolve_layer_padding(api, options.pad, r.window, std::vector<int64_t>(size_t(n), 1));
  return r;
}

// Flux: "MaxPool((3, 3), pad=1, stride=2)": pad when non-zero, stride when not the window.
std::string pool_string(const char* name, const std::vector<int64_t>& window, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& pad) {
  std::string s = std::string(name) + "(" + detail::tuple_string(window);
  if (!detail::all_equal(pad, 0)) s += ", pad=" + detail::maybe_tuple_string(pad);
  if (stride != window) s += ", stride=" + detail::maybe_tuple_string(stride);
  return s + ")";
}

PoolParams params_of(const std::vector<int64_t>& stride, const std::vector<int64_t>& pad) {
  PoolParams p;
  p.stride = Dims(stride);
  p.pad = Padding(pad);
  return p;
}

void check_built(const char* api, const std::vector<int64_t>& v) {
  if (v.empty()) detail::fail("[", api, "] the layer is empty (default-constructed)");
}
}  // namespace

MaxPool::MaxPool(const Dims& w, const PoolOptions& options) {
  Resolved r = resolve("MaxPool", w, options);
  for (size_t i = 0; i < r.window.size(); ++i)
    if (r.pad[2 * i] >= r.window[i] || r.pad[2 * i + 1] >= r.window[i])
      detail::fail("[MaxPool] padding ", detail::tuple_string(r.pad), " (lo, hi per axis) must be smaller than the window ",
                   detail::tuple_string(r.window), " on every side");
  window = std::move(r.window), stride = std::move(r.stride), pad = std::move(r.pad);
}

Tensor MaxPool::operator()(const Tensor& x) const {
  check_built("MaxPool", window);
  detail::check_layer_input("MaxPool", x, int(window.size()), [this] { return layer_string(*this); });
  return maxpool(x, Dims(window), params_of(stride, pad));
}

MeanPool::MeanPool(const Dims& w, const PoolOptions& options) {
  Resolved r = resolve("MeanPool", w, options);
  window = std::move(r.window), stride = std::move(r.stride), pad = std::move(r.pad);
}

Tensor MeanPool::operator()(const Tensor& x) const {
  check_built("MeanPool", window);
  detail::check_layer_input("MeanPool", x, int(window.size()), [this] { return layer_string(*this); });
  return meanpool(x, Dims(window), params_of(stride, pad));
}

AdaptiveMaxPool::AdaptiveMaxPool(const Dims& o) : out(detail::window_sizes("AdaptiveMaxPool", "output sizes", o)) {}

Tensor AdaptiveMaxPool::operator()(const Tensor& x) const {
  check_built("AdaptiveMaxPool", out);
  detail::check_layer_input("AdaptiveMaxPool", x, int(out.size()), [this] { return layer_string(*this); });
  return adaptive_maxpool(x, Dims(out));
}

AdaptiveMeanPool::AdaptiveMeanPool(const Dims& o) : out(detail::window_sizes("AdaptiveMeanPool", "output sizes", o)) {}

Tensor AdaptiveMeanPool::operator()(const Tensor& x) const {
  check_built("AdaptiveMeanPool", out);
  detail::check_layer_input("AdaptiveMeanPool", x, int(out.size()), [this] { return layer_string(*this); });
  return adaptive_meanpool(x, Dims(out));
}

std::string layer_string(const MaxPool& m) { return pool_string("MaxPool", m.window, m.stride, m.pad); }
std::string layer_string(const MeanPool& m) { return pool_string("MeanPool", m.window, m.stride, m.pad); }
std::string layer_string(const GlobalMaxPool&) { return "GlobalMaxPool()"; }
std::string layer_string(const GlobalMeanPool&) { return "GlobalMeanPool()"; }
std::string layer_string(const AdaptiveMaxPool& m) { return "AdaptiveMaxPool(" + detail::tuple_string(m.out) + ")"; }
std::string layer_string(const AdaptiveMeanPool& m) { return "AdaptiveMeanPool(" + detail::tuple_string(m.out) + ")"; }

std::ostream& operator<<(std::ostream& os, const MaxPool& m) { return os << layer_string(m); }
std::ostream& operator<<(std::ostream& os, const MeanPool& m) { return os << layer_string(m); }
std::ostream& operator<<(std::ostream& os, const GlobalMaxPool& m) { return os << layer_string(m); }
std::ostream& operator<<(std::ostream& os, const GlobalMeanPool& m) { return os << layer_string(m); }
std::ostream& operator<<(std::ostream& os, const AdaptiveMaxPool& m) { return os << layer_string(m); }
std::ostream& operator<<(std::ostream& os, const AdaptiveMeanPool& m) { return os << layer_string(m); }

}  // namespace flux
