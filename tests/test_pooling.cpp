// Pooling ops and flatten on every device, in Float32 and Float64, against a float64 reference written
// here from the definitions (NNlib's maxpool / meanpool with count_include_pad, PyTorch's adaptive
// windows start = floor(i in / out), end = ceil((i + 1) in / out)); gradients against the same
// reference (max: the first maximum in window order) and against central finite differences in
// float64; exact error messages.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {

using Ints = std::vector<int64_t>;

// ---- the reference: every output cell lists its window's input positions in window order ----

// A pool written out: the output shape, and for each output cell (row-major over (N, C, out...)) the
// flat input positions of its window in window order (-1 for padding) and the mean's divisor.
struct Reference {
  Ints out_shape;
  std::vector<Ints> windows;
  std::vector<double> divisor;
};

bool next_index(Ints& i, const Ints& dims) {
  for (int j = int(dims.size()) - 1; j >= 0; --j) {
    if (++i[size_t(j)] < dims[size_t(j)]) return true;
    i[size_t(j)] = 0;
  }
  return false;
}

int64_t product(const Ints& v) { return std::accumulate(v.begin(), v.end(), int64_t(1), std::multiplies<>()); }

// Per spatial axis: the half-open [begin, end) window of each output position (begin may be negative
// and end past the input: padding).
using AxisWindows = std::vector<std::pair<int64_t, int64_t>>;

Reference windows_reference(const Ints& x_shape, const std::vector<AxisWindows>& axes, bool divide_by_full) {
  size_t n = axes.size();
  Ints in(x_shape.begin() + 2, x_shape.end()), out(n);
  for (size_t a = 0; a < n; ++a) out[a] = int64_t(axes[a].size());
  Reference r;
  r.out_shape = {x_shape[0], x_shape[1]};
  r.out_shape.insert(r.out_shape.end(), out.begin(), out.end());
  int64_t in_plane = product(in);
  for (int64_t plane = 0; plane < x_shape[0] * x_shape[1]; ++plane) {
    if (product(out) == 0) break;
    Ints o(n, 0);
    do {
      Ints begin(n), len(n);
      for (size_t a = 0; a < n; ++a) {
        begin[a] = axes[a][size_t(o[a])].first;
        len[a] = axes[a][size_t(o[a])].second - begin[a];
      }
      Ints w(n, 0), cell;
      do {
        int64_t flat = 0;
        bool inside = true;
        for (size_t a = 0; a < n; ++a) {
          int64_t p = begin[a] + w[a];
          inside = inside && p >= 0 && p < in[a];
          flat = flat * in[a] + p;
        }
        cell.push_back(inside ? plane * in_plane + flat : -1);
      } while (next_index(w, len));
      int64_t real = std::count_if(cell.begin(), cell.end(), [](int64_t p) { return p >= 0; });
      r.divisor.push_back(divide_by_full ? double(cell.size()) : double(real));
      r.windows.push_back(cell);
    } while (next_index(o, out));
  }
  return r;
}

// maxpool / meanpool with resolved per-axis window, stride and (lo, hi) padding.
Reference pool_reference(const Ints& x_shape, const Ints& k, const Ints& s, const Ints& lo, const Ints& hi) {
  std::vector<AxisWindows> axes;
  for (size_t a = 0; a < k.size(); ++a) {
    int64_t in = x_shape[2 + a], out = (in + lo[a] + hi[a] - k[a]) / s[a] + 1;
    AxisWindows w;
    for (int64_t o = 0; o < out; ++o) w.push_back({o * s[a] - lo[a], o * s[a] - lo[a] + k[a]});
    axes.push_back(w);
  }
  return windows_reference(x_shape, axes, true);
}

// PyTorch's adaptive windows.
Reference adaptive_reference(const Ints& x_shape, const Ints& out) {
  std::vector<AxisWindows> axes;
  for (size_t a = 0; a < out.size(); ++a) {
    int64_t in = x_shape[2 + a];
    AxisWindows w;
    for (int64_t i = 0; i < out[a]; ++i)
      w.push_back({int64_t(std::floor(double(i * in) / double(out[a]))),
                   int64_t(std::ceil(double((i + 1) * in) / double(out[a])))});
    axes.push_back(w);
  }
  return windows_reference(x_shape, axes, false);
}

// The first maximum of a window (padding skipped), as a position; strict > keeps the first.
int64_t first_max(const Ints& cell, const std::vector<double>& x) {
  int64_t best = -1;
  for (int64_t p : cell)
    if (p >= 0 && (best < 0 || x[size_t(p)] > x[size_t(best)])) best = p;
  return best;
}

std::vector<double> reference_forward(const Reference& r, bool is_max, const std::vector<double>& x) {
  std::vector<double> y;
  for (size_t c = 0; c < r.windows.size(); ++c) {
    if (is_max) {
      y.push_back(x[size_t(first_max(r.windows[c], x))]);
    } else {
      double sum = 0;
      for (int64_t p : r.windows[c]) sum += p >= 0 ? x[size_t(p)] : 0.0;
      y.push_back(sum / r.divisor[c]);
    }
  }
  return y;
}

// d/dx of sum(pool(x) .* w).
std::vector<double> reference_backward(const Reference& r, bool is_max, const std::vector<double>& x,
                                       const std::vector<double>& w) {
  std::vector<double> dx(x.size(), 0.0);
  for (size_t c = 0; c < r.windows.size(); ++c) {
    if (is_max) {
      dx[size_t(first_max(r.windows[c], x))] += w[c];
    } else {
      for (int64_t p : r.windows[c])
        if (p >= 0) dx[size_t(p)] += w[c] / r.divisor[c];
    }
  }
  return dx;
}

// ---- inputs ----

std::vector<double> uniform(int64_t n, uint64_t seed, double lo = -2, double hi = 2) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}
// Small integers: many ties inside every window.
std::vector<double> with_ties(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(0, 2);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}
// Distinct values 0.05 apart (a scaled random permutation): no ties for finite differences.
std::vector<double> permutation(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  std::mt19937_64 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  for (double& x : v) x = x * 0.05 - 1.0;
  return v;
}

using PoolFn = std::function<Tensor(const Tensor&)>;

double tolerance(DType t) { return t == DType::f64 ? 1e-12 : 2e-6; }

// Forward and gradient of f on device d in dtype t against the reference.
void check_against_reference(const Device& d, DType t, const Ints& x_shape, const std::vector<double>& values,
                             const Reference& r, bool is_max, const PoolFn& f) {
  SCOPED_TRACE(dtype_name(t));
  Tensor x = to(Tensor(values, Shape(x_shape)).cast(t), d);
  std::vector<double> xv = x.to_vector<double>();  // as the device holds them (f32-rounded)
  Tensor y = f(x);
  ASSERT_EQ(y.shape(), Shape(r.out_shape));
  EXPECT_EQ(y.dtype(), t);
  EXPECT_EQ(y.device(), d);
  EXPECT_LE(flux::testing::max_rel_error(y, reference_forward(r, is_max, xv)), tolerance(t));

  Tensor w = to(Tensor(uniform(product(r.out_shape), 99, 0.5, 1.5), Shape(r.out_shape)).cast(t), d);
  Tensor dx = gradient([&](const Tensor& v) { return sum(f(v) * w); }, x);
  ASSERT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dx.dtype(), t);
  EXPECT_EQ(dx.device(), d);
  EXPECT_LE(flux::testing::max_rel_error(dx, reference_backward(r, is_max, xv, w.to_vector<double>())), tolerance(t));
}

// Central finite differences in float64 on device d for L(x) = sum(f(x) .* w).
void check_finite_differences(const Device& d, const Ints& x_shape, const std::vector<double>& values, const PoolFn& f) {
  Tensor x = to(Tensor(values, Shape(x_shape)), d);
  Shape out = f(x).shape();
  Tensor w = to(Tensor(uniform(out.numel(), 7, 0.5, 1.5), out), d);
  auto loss = [&](const std::vector<double>& v) { return sum(f(to(Tensor(v, Shape(x_shape)), d)) * w).item<double>(); };
  std::vector<double> g = gradient([&](const Tensor& v) { return sum(f(v) * w); }, x).to_vector<double>();
  const double h = 1e-6;
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<double> plus = values, minus = values;
    plus[i] += h;
    minus[i] -= h;
    double numeric = (loss(plus) - loss(minus)) / (2 * h);
    EXPECT_NEAR(g[i], numeric, 1e-7 * (1 + std::abs(numeric))) << "element " << i;
  }
}

// ---- the table of pools ----

struct PoolCase {
  std::string name;
  Ints x;           // (N, C, spatial...)
  Dims window;
  PoolParams params;
  Ints k, s, lo, hi;  // what the options resolve to (written out by hand)
};

std::vector<PoolCase> pool_cases() {
  return {
      {"1d_window3", {2, 3, 9}, 3, {}, {3}, {3}, {0}, {0}},
      {"1d_window3_stride2_pad1", {2, 2, 10}, {3}, {.stride = 2, .pad = 1}, {3}, {2}, {1}, {1}},
      {"2d_2x2_lenet", {2, 3, 8, 8}, {2, 2}, {}, {2, 2}, {2, 2}, {0, 0}, {0, 0}},
      {"2d_2x2_odd_sizes", {1, 2, 7, 9}, {2, 2}, {}, {2, 2}, {2, 2}, {0, 0}, {0, 0}},
      {"2d_2x2_stride2_pad1", {1, 2, 6, 7}, 2, {.stride = 2, .pad = 1}, {2, 2}, {2, 2}, {1, 1}, {1, 1}},
      {"2d_3x3_stride2_pad1_resnet", {2, 3, 12, 12}, {3, 3}, {.stride = 2, .pad = 1}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"2d_3x3_stride2_pad1_odd", {1, 2, 11, 13}, {3, 3}, {.stride = 2, .pad = 1}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"2d_3x3_stride2_nopad", {1, 2, 9, 10}, {3, 3}, {.stride = 2}, {3, 3}, {2, 2}, {0, 0}, {0, 0}},
      {"2d_3x3_stride1_overlapping", {2, 2, 6, 7}, {3, 3}, {.stride = 1}, {3, 3}, {1, 1}, {0, 0}, {0, 0}},
      {"2d_samepad_stride2", {1, 2, 7, 10}, {3, 3}, {.stride = 2, .pad = SamePad()}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"2d_samepad_even_window", {1, 2, 7, 10}, {2, 4}, {.stride = 1, .pad = SamePad()}, {2, 4}, {1, 1}, {1, 2}, {0, 1}},
      {"2d_samepad_default_stride", {1, 2, 7, 10}, {3, 3}, {.pad = SamePad()}, {3, 3}, {3, 3}, {1, 1}, {1, 1}},
      {"2d_asymmetric_padding", {1, 2, 6, 7}, {3, 2}, {.stride = Dims{2, 1}, .pad = {0, 2, 1, 0}}, {3, 2}, {2, 1}, {0, 1}, {2, 0}},
      {"2d_per_axis_padding", {1, 2, 5, 6}, {3, 3}, {.stride = 2, .pad = {1, 0}}, {3, 3}, {2, 2}, {1, 0}, {1, 0}},
      {"2d_non_square", {2, 2, 7, 9}, {2, 3}, {.stride = Dims{1, 2}}, {2, 3}, {1, 2}, {0, 0}, {0, 0}},
      {"2d_stride_larger_than_window", {1, 2, 9, 9}, {2, 2}, {.stride = 3}, {2, 2}, {3, 3}, {0, 0}, {0, 0}},
      {"3d_2x2x2", {1, 2, 4, 6, 5}, {2, 2, 2}, {}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {0, 0, 0}},
      {"3d_3x3x3_stride2_pad1", {1, 2, 5, 6, 7}, 3, {.stride = 2, .pad = 1}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}},
      {"3d_non_cubic", {2, 1, 4, 5, 6}, {1, 2, 3}, {.stride = Dims{1, 2, 2}, .pad = {0, 1, 1}}, {1, 2, 3}, {1, 2, 2}, {0, 1, 1}, {0, 1, 1}},
      // enough planes for the threaded path, through the 2x2 and 3x3 stride-2 loops
      {"2d_2x2_threaded", {4, 16, 24, 24}, {2, 2}, {}, {2, 2}, {2, 2}, {0, 0}, {0, 0}},
      {"2d_3x3_stride2_pad1_threaded", {2, 32, 17, 16}, {3, 3}, {.stride = 2, .pad = 1}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
  };
}

class Pooling : public ::testing::TestWithParam<Device> {};

TEST_P(Pooling, MaxAndMeanPoolMatchReference) {
  Device d = GetParam();
  for (const PoolCase& c : pool_cases()) {
    SCOPED_TRACE(c.name);
    Reference r = pool_reference(c.x, c.k, c.s, c.lo, c.hi);
    std::vector<double> values = uniform(product(c.x), std::hash<std::string>{}(c.name));
    for (DType t : {DType::f32, DType::f64}) {
      check_against_reference(d, t, c.x, values, r, true, [&](const Tensor& x) { return maxpool(x, c.window, c.params); });
      check_against_reference(d, t, c.x, values, r, false, [&](const Tensor& x) { return meanpool(x, c.window, c.params); });
    }
  }
}

TEST_P(Pooling, MaxPoolTiesSendTheGradientToTheFirstMaximum) {
  Device d = GetParam();
  for (const PoolCase& c : pool_cases()) {
    SCOPED_TRACE(c.name);
    Reference r = pool_reference(c.x, c.k, c.s, c.lo, c.hi);
    std::vector<double> values = with_ties(product(c.x), std::hash<std::string>{}(c.name));
    for (DType t : {DType::f32, DType::f64})
      check_against_reference(d, t, c.x, values, r, true, [&](const Tensor& x) { return maxpool(x, c.window, c.params); });
  }
}

TEST_P(Pooling, MaxPoolNeverTakesPadding) {
  Device d = GetParam();
  Tensor x = to(full({1, 1, 3, 3}, -5.0), d);  // all negative: a zero from padding would win
  Tensor y = maxpool(x, {3, 3}, {.stride = 1, .pad = 1});
  EXPECT_EQ(y.shape(), Shape({1, 1, 3, 3}));
  for (float v : y.to_vector<float>()) EXPECT_EQ(v, -5.0f);
  // meanpool counts padding as zeros: the corner window holds 4 of 9 inputs
  Tensor m = meanpool(x, {3, 3}, {.stride = 1, .pad = 1});
  EXPECT_FLOAT_EQ(m.to_vector<float>()[0], -5.0f * 4 / 9);
  EXPECT_FLOAT_EQ(m.to_vector<float>()[4], -5.0f);
}

struct AdaptiveCase {
  std::string name;
  Ints x;
  Dims out;
  Ints out_resolved;
};

std::vector<AdaptiveCase> adaptive_cases() {
  return {
      {"2d_divisible", {2, 3, 8, 8}, {4, 4}, {4, 4}},
      {"2d_divisible_non_square", {1, 2, 8, 6}, {2, 3}, {2, 3}},
      {"2d_to_1x1", {2, 2, 5, 7}, {1, 1}, {1, 1}},
      {"2d_non_divisible", {1, 2, 10, 7}, {3, 4}, {3, 4}},
      {"2d_one_axis_divisible", {2, 2, 9, 7}, {3, 5}, {3, 5}},
      {"2d_output_larger_than_input", {1, 2, 3, 5}, {5, 7}, {5, 7}},
      {"2d_one_value", {1, 2, 9, 9}, 4, {4, 4}},
      {"2d_resnet_7x7", {1, 3, 10, 9}, {7, 7}, {7, 7}},
      {"1d_non_divisible", {2, 3, 10}, {4}, {4}},
      {"1d_divisible", {2, 3, 12}, {4}, {4}},
      {"3d_non_divisible", {1, 2, 5, 6, 7}, {2, 3, 4}, {2, 3, 4}},
      {"3d_divisible", {1, 2, 4, 6, 8}, {2, 3, 2}, {2, 3, 2}},
  };
}

TEST_P(Pooling, AdaptivePoolsUsePyTorchWindows) {
  Device d = GetParam();
  for (const AdaptiveCase& c : adaptive_cases()) {
    SCOPED_TRACE(c.name);
    Reference r = adaptive_reference(c.x, c.out_resolved);
    std::vector<double> values = uniform(product(c.x), std::hash<std::string>{}(c.name));
    std::vector<double> ties = with_ties(product(c.x), std::hash<std::string>{}(c.name) + 1);
    for (DType t : {DType::f32, DType::f64}) {
      check_against_reference(d, t, c.x, values, r, true, [&](const Tensor& x) { return adaptive_maxpool(x, c.out); });
      check_against_reference(d, t, c.x, values, r, false, [&](const Tensor& x) { return adaptive_meanpool(x, c.out); });
      SCOPED_TRACE("ties");
      check_against_reference(d, t, c.x, ties, r, true, [&](const Tensor& x) { return adaptive_maxpool(x, c.out); });
    }
  }
}

TEST_P(Pooling, AdaptiveWindowsOfAKnownCase) {
  // PyTorch: AdaptiveAvgPool1d(3) over [0, 1, 2, 3, 4] uses windows [0, 2), [1, 4), [3, 5).
  Device d = GetParam();
  Tensor x = to(Tensor(std::vector<double>{0, 1, 2, 3, 4}, Shape{1, 1, 5}), d);
  EXPECT_EQ(adaptive_meanpool(x, 3).to_vector<double>(), (std::vector<double>{0.5, 2.0, 3.5}));
  EXPECT_EQ(adaptive_maxpool(x, 3).to_vector<double>(), (std::vector<double>{1, 3, 4}));
}

TEST_P(Pooling, GlobalPoolsGiveOneValuePerChannel) {
  Device d = GetParam();
  for (Ints shape : {Ints{2, 3, 7}, Ints{2, 3, 5, 6}, Ints{1, 4, 3, 4, 5}, Ints{3, 2, 1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    std::vector<AxisWindows> axes;
    for (size_t a = 2; a < shape.size(); ++a) axes.push_back({{0, shape[a]}});
    Reference r = windows_reference(shape, axes, true);
    Ints want = {shape[0], shape[1]};
    want.resize(shape.size(), 1);
    EXPECT_EQ(r.out_shape, want);
    std::vector<double> values = uniform(product(shape), 5);
    std::vector<double> ties = with_ties(product(shape), 6);
    for (DType t : {DType::f32, DType::f64}) {
      check_against_reference(d, t, shape, values, r, true, [](const Tensor& x) { return global_maxpool(x); });
      check_against_reference(d, t, shape, values, r, false, [](const Tensor& x) { return global_meanpool(x); });
      check_against_reference(d, t, shape, ties, r, true, [](const Tensor& x) { return global_maxpool(x); });
    }
  }
}

TEST_P(Pooling, EmptyBatchGivesEmptyOutput) {
  Device d = GetParam();
  Tensor x = to(zeros({0, 3, 4, 4}), d);
  EXPECT_EQ(maxpool(x, {2, 2}).shape(), Shape({0, 3, 2, 2}));
  EXPECT_EQ(meanpool(x, {3, 3}, {.stride = 2, .pad = 1}).shape(), Shape({0, 3, 2, 2}));
  EXPECT_EQ(adaptive_meanpool(x, {3, 3}).shape(), Shape({0, 3, 3, 3}));
  EXPECT_EQ(global_maxpool(x).shape(), Shape({0, 3, 1, 1}));
  Tensor g = gradient([](const Tensor& v) { return sum(maxpool(v, 2)); }, x);
  EXPECT_EQ(g.shape(), x.shape());
}

TEST_P(Pooling, FiniteDifferenceGradientsInFloat64) {
  Device d = GetParam();
  struct Case {
    std::string name;
    Ints x;
    PoolFn f;
  };
  std::vector<Case> cases = {
      {"maxpool_2x2", {1, 2, 4, 4}, [](const Tensor& x) { return maxpool(x, {2, 2}); }},
      {"maxpool_3x3_stride2_pad1", {1, 2, 5, 5}, [](const Tensor& x) { return maxpool(x, {3, 3}, {.stride = 2, .pad = 1}); }},
      {"maxpool_overlapping_1d", {2, 2, 7}, [](const Tensor& x) { return maxpool(x, 3, {.stride = 1}); }},
      {"maxpool_3d", {1, 1, 3, 4, 4}, [](const Tensor& x) { return maxpool(x, 2, {.pad = SamePad()}); }},
      {"meanpool_2x2", {1, 2, 4, 4}, [](const Tensor& x) { return meanpool(x, {2, 2}); }},
      {"meanpool_3x3_stride2_pad1", {1, 2, 5, 5}, [](const Tensor& x) { return meanpool(x, {3, 3}, {.stride = 2, .pad = 1}); }},
      {"meanpool_asymmetric_pad", {1, 1, 4, 5}, [](const Tensor& x) { return meanpool(x, {2, 3}, {.stride = 1, .pad = {1, 0, 0, 2}}); }},
      {"meanpool_3d", {1, 1, 3, 4, 4}, [](const Tensor& x) { return meanpool(x, {2, 2, 2}, {.stride = 1}); }},
      {"adaptive_maxpool_divisible", {1, 2, 4, 6}, [](const Tensor& x) { return adaptive_maxpool(x, {2, 3}); }},
      {"adaptive_maxpool_non_divisible", {1, 2, 5, 7}, [](const Tensor& x) { return adaptive_maxpool(x, {3, 4}); }},
      {"adaptive_meanpool_divisible", {1, 2, 4, 6}, [](const Tensor& x) { return adaptive_meanpool(x, {2, 3}); }},
      {"adaptive_meanpool_non_divisible", {1, 2, 5, 7}, [](const Tensor& x) { return adaptive_meanpool(x, {3, 4}); }},
      {"adaptive_meanpool_3d", {1, 1, 3, 5, 4}, [](const Tensor& x) { return adaptive_meanpool(x, {2, 3, 3}); }},
      {"global_maxpool", {2, 2, 3, 4}, [](const Tensor& x) { return global_maxpool(x); }},
      {"global_meanpool", {2, 2, 3, 4}, [](const Tensor& x) { return global_meanpool(x); }},
      {"flatten_then_square", {2, 3, 2, 2}, [](const Tensor& x) { return square(flatten(x)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    check_finite_differences(d, c.x, permutation(product(c.x), std::hash<std::string>{}(c.name)), c.f);
  }
}

TEST_P(Pooling, FlattenKeepsTheFirstAxis) {
  Device d = GetParam();
  std::vector<double> v = uniform(2 * 3 * 4 * 5, 3);
  Tensor x = to(Tensor(v, Shape{2, 3, 4, 5}), d);
  Tensor y = flatten(x);
  EXPECT_EQ(y.shape(), Shape({2, 60}));
  EXPECT_EQ(y.device(), d);
  EXPECT_EQ(y.to_vector<double>(), v);
  EXPECT_EQ(flatten(to(ones({5}), d)).shape(), Shape({5, 1}));
  EXPECT_EQ(flatten(to(ones({4, 3}), d)).shape(), Shape({4, 3}));
  EXPECT_EQ(flatten(to(ones({0, 3, 2}), d)).shape(), Shape({0, 6}));
  EXPECT_EQ(flatten(to(ones({3, 0, 2}), d)).shape(), Shape({3, 0}));
  Tensor w = to(Tensor(uniform(120, 4), Shape{2, 60}), d);
  Tensor g = gradient([&](const Tensor& t) { return sum(flatten(t) * w); }, x);
  EXPECT_EQ(g.shape(), x.shape());
  EXPECT_EQ(g.to_vector<double>(), w.to_vector<double>());
}

FLUX_DEVICE_SUITE(Pooling);

TEST(PoolingErrors, ExactMessages) {
  Tensor x = ones({1, 1, 3, 3});
  EXPECT_FLUX_ERROR(maxpool(x, {4, 4}), "[maxpool] window (4, 4) is larger than the padded input (3, 3) (input (3, 3))");
  EXPECT_FLUX_ERROR(meanpool(x, {6, 2}, {.pad = 1}),
                    "[meanpool] window (6, 2) is larger than the padded input (5, 5) (input (3, 3))");
  EXPECT_FLUX_ERROR(maxpool(ones({2, 3, 4}), {2, 2}),
                    "[maxpool] expected a 4-dimensional (N, C, H, W) input for 2 spatial axes; got 2×3×4 "
                    "Tensor{Float32, CPU} of shape (2, 3, 4)");
  EXPECT_FLUX_ERROR(meanpool(ones({1, 2, 4, 4}), {2, 2, 2}), "[meanpool] expected a 5-dimensional");
  EXPECT_FLUX_ERROR(maxpool(ones({3, 4}), 2),
                    "[maxpool] expected an (N, C, spatial...) input with 1 to 3 spatial axes; got shape (3, 4)");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 4, 4}), {0, 2}), "[maxpool] window must be >= 1; got (0, 2)");
  EXPECT_FLUX_ERROR(meanpool(ones({1, 1, 4, 4}), {-1, 2}), "[meanpool] window must be >= 1; got (-1, 2)");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 4, 4}), {2, 2}, {.stride = 0}), "[maxpool] stride must be >= 1; got (0, 0)");
  EXPECT_FLUX_ERROR(meanpool(ones({1, 1, 4, 4}), {2, 2}, {.stride = Dims{1, -2}}),
                    "[meanpool] stride must be >= 1; got (1, -2)");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 4, 4}), {2, 2}, {.stride = Dims{1, 2, 3}}),
                    "[maxpool] stride needs 1 or 2 values for 2 spatial axes; got 3");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 2, 2, 2, 2}), {1, 1, 1, 1}),
                    "[maxpool] window needs 1 to 3 values (one per spatial axis); got 4");
  EXPECT_FLUX_ERROR(maxpool(Tensor(std::vector<int64_t>(16, 1), Shape{1, 1, 4, 4}), 2),
                    "[maxpool] supports Float32, Float64, Float16 and BFloat16 inputs; got Int64 (cast with .f32())");
  EXPECT_FLUX_ERROR(meanpool(Tensor(std::vector<int32_t>(16, 1), Shape{1, 1, 4, 4}), 2),
                    "[meanpool] supports Float32, Float64, Float16 and BFloat16 inputs; got Int32");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 4, 4}), {2, 2}, {.pad = 2}),
                    "[maxpool] padding (2, 2, 2, 2) (lo, hi per axis) must be smaller than the window (2, 2) on every "
                    "side: a window of padding alone has no maximum");
  EXPECT_FLUX_ERROR(maxpool(ones({1, 1, 4, 4}), {2, 2}, {.pad = {1, 2, 3}}),
                    "[maxpool] padding needs 1, 2 or 4 values for 2 spatial axes; got 3");
  EXPECT_FLUX_ERROR(meanpool(ones({1, 1, 4, 4}), {2, 2}, {.pad = -1}), "[meanpool] padding must be non-negative");
  EXPECT_FLUX_ERROR(maxpool(Tensor(), 2), "[maxpool] got an undefined");

  EXPECT_FLUX_ERROR(adaptive_maxpool(ones({1, 1, 4, 4}), {0, 2}), "[adaptive_maxpool] output size must be >= 1; got (0, 2)");
  EXPECT_FLUX_ERROR(adaptive_meanpool(ones({2, 3, 4}), {2, 2}),
                    "[adaptive_meanpool] expected a 4-dimensional (N, C, H, W) input for 2 spatial axes");
  EXPECT_FLUX_ERROR(adaptive_meanpool(ones({1, 2, 0, 4}), {2, 2}),
                    "[adaptive_meanpool] cannot pool an empty spatial axis: input shape (1, 2, 0, 4)");
  EXPECT_FLUX_ERROR(adaptive_maxpool(Tensor(std::vector<int64_t>(16, 1), Shape{1, 1, 4, 4}), 2),
                    "[adaptive_maxpool] supports Float32, Float64, Float16 and BFloat16 inputs; got Int64");
  EXPECT_FLUX_ERROR(global_maxpool(ones({3, 4})), "[global_maxpool] expected an (N, C, spatial...) input with 1 to 3 spatial axes");
  EXPECT_FLUX_ERROR(global_meanpool(ones({1, 2, 3, 0})),
                    "[global_meanpool] cannot pool an empty spatial axis: input shape (1, 2, 3, 0)");
  EXPECT_FLUX_ERROR(global_meanpool(Tensor(std::vector<uint8_t>(4, 1), Shape{1, 1, 2, 2})),
                    "[global_meanpool] supports Float32, Float64, Float16 and BFloat16 inputs; got UInt8");

  EXPECT_FLUX_ERROR(flatten(Tensor::scalar(1.0)),
                    "[flatten] needs at least 1 dimension (observations on the first); got a 0-dimensional tensor");
  EXPECT_FLUX_ERROR(flatten(Tensor()), "[flatten] got an undefined");
}

}  // namespace
