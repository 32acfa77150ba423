// Backend-level tests of the window primitives of backend ABI 2 (im2col, col2im, pool_forward,
// pool_backward) and random_uniform, called directly through Tensor::backend() on every device
// (FLUX_DEVICE_SUITE: CPU, OpenCL:0, ...). Each result is compared with a float64 reference written
// here from the formulas in include/flux/backend.hpp (not from any backend's code):
//   im2col   col[n, g, (c, k...), (o...)] = x[n, g * C/g + c, o * stride - pad_lo + k * dilation], 0 outside
//   col2im   its adjoint: checked against the reference scatter and by <im2col(x), c> == <x, col2im(c)>
//   pool     max (padding never wins, first maximum in window order gets the gradient), mean (divides
//            by the full window size, count_include_pad)
//   random   z = splitmix64(seed + (offset + i) * 0x9E3779B97F4A7C15), bit-exact
// Inputs are views at a non-zero byte offset into a larger tensor, sizes are odd, and some cases
// exceed one launch's work-items so the kernels' grid-stride loops run more than once.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "test_devices.hpp"

using namespace flux;
using backend::ConvGeometry;
using backend::PoolOp;

namespace {

// ---- geometry ----

struct Case {
  const char* name;
  int spatial;
  int64_t batch, channels, groups;
  std::vector<int64_t> in, kernel, stride, pad_lo, pad_hi, dilation;
};

ConvGeometry geometry_of(const Case& c) {
  ConvGeometry g;
  g.spatial = c.spatial;
  g.batch = c.batch;
  g.in_channels = c.channels;
  g.out_channels = 2 * c.groups;
  g.groups = c.groups;
  for (int i = 0; i < c.spatial; ++i) {
    g.in[i] = c.in[size_t(i)];
    g.kernel[i] = c.kernel[size_t(i)];
    g.stride[i] = c.stride[size_t(i)];
    g.pad_lo[i] = c.pad_lo[size_t(i)];
    g.pad_hi[i] = c.pad_hi[size_t(i)];
    g.dilation[i] = c.dilation[size_t(i)];
    g.out[i] = (g.in[i] + g.pad_lo[i] + g.pad_hi[i] - g.dilation[i] * (g.kernel[i] - 1) - 1) / g.stride[i] + 1;
  }
  return g;
}

int64_t prod(const int64_t* v, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= v[i];
  return p;
}

// Row-major multi-index of flat index f over sizes[0..n).
void unflatten(int64_t f, const int64_t* sizes, int n, int64_t* idx) {
  for (int i = n - 1; i >= 0; --i) {
    idx[i] = f % sizes[i];
    f /= sizes[i];
  }
}

// The input position (flat within one plane) that window position k of output o reads, or -1 when
// that position is padding.
int64_t source_of(const ConvGeometry& g, int64_t o, int64_t k) {
  int64_t os[3], ks[3];
  unflatten(o, g.out, g.spatial, os);
  unflatten(k, g.kernel, g.spatial, ks);
  int64_t flat = 0;
  for (int i = 0; i < g.spatial; ++i) {
    int64_t p = os[i] * g.stride[i] - g.pad_lo[i] + ks[i] * g.dilation[i];
    if (p < 0 || p >= g.in[i]) return -1;
    flat = flat * g.in[i] + p;
  }
  return flat;
}

// ---- float64 references ----

// Index of col[n, gr, (c, k), o] in the (N, G, C/G * K, P) array, for channel gr * C/G + c.
std::vector<double> reference_im2col(const ConvGeometry& g, const std::vector<double>& x) {
  const int64_t G = g.groups, Cg = g.in_channels / G, K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial);
  const int64_t I = prod(g.in, g.spatial);
  std::vector<double> col(size_t(g.batch * G * Cg * K * P));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gr = 0; gr < G; ++gr)
      for (int64_t c = 0; c < Cg; ++c)
        for (int64_t k = 0; k < K; ++k)
          for (int64_t o = 0; o < P; ++o) {
            int64_t s = source_of(g, o, k);
            int64_t channel = gr * Cg + c;
            col[size_t(((n * G + gr) * Cg * K + c * K + k) * P + o)] =
                s < 0 ? 0.0 : x[size_t((n * g.in_channels + channel) * I + s)];
          }
  return col;
}

// dx + the adjoint of im2col applied to col.
std::vector<double> reference_col2im(const ConvGeometry& g, const std::vector<double>& col, std::vector<double> dx) {
  const int64_t G = g.groups, Cg = g.in_channels / G, K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial);
  const int64_t I = prod(g.in, g.spatial);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gr = 0; gr < G; ++gr)
      for (int64_t c = 0; c < Cg; ++c)
        for (int64_t k = 0; k < K; ++k)
          for (int64_t o = 0; o < P; ++o) {
            int64_t s = source_of(g, o, k);
            if (s < 0) continue;
            dx[size_t((n * g.in_channels + gr * Cg + c) * I + s)] +=
                col[size_t(((n * G + gr) * Cg * K + c * K + k) * P + o)];
          }
  return dx;
}

bool holds(double v, double y) { return v == y || (std::isnan(v) && std::isnan(y)); }

std::vector<double> reference_pool(PoolOp op, const ConvGeometry& g, const std::vector<double>& x) {
  const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial), I = prod(g.in, g.spatial);
  std::vector<double> y(size_t(g.batch * g.in_channels * P));
  for (int64_t p = 0; p < g.batch * g.in_channels; ++p)
    for (int64_t o = 0; o < P; ++o) {
      double m = op == PoolOp::max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        int64_t s = source_of(g, o, k);
        if (s < 0) continue;  // padding never wins and adds 0
        double v = x[size_t(p * I + s)];
        if (op == PoolOp::mean) m += v;
        else if (std::isnan(v) || v > m) m = std::isnan(m) ? m : v;
      }
      y[size_t(p * P + o)] = op == PoolOp::max ? m : m / double(K);
    }
  return y;
}

// dx + the pooling adjoint of dy; max: each window's dy to its first in-bounds position holding y.
std::vector<double> reference_pool_backward(PoolOp op, const ConvGeometry& g, const std::vector<double>& x,
                                            const std::vector<double>& y, const std::vector<double>& dy,
                                            std::vector<double> dx) {
  const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial), I = prod(g.in, g.spatial);
  for (int64_t p = 0; p < g.batch * g.in_channels; ++p)
    for (int64_t o = 0; o < P; ++o) {
      double yv = y[size_t(p * P + o)], d = dy[size_t(p * P + o)];
      for (int64_t k = 0; k < K; ++k) {
        int64_t s = source_of(g, o, k);
        if (s < 0) continue;
        if (op == PoolOp::mean) {
          dx[size_t(p * I + s)] += d / double(K);
        } else if (holds(x[size_t(p * I + s)], yv)) {
          dx[size_t(p * I + s)] += d;
          break;
        }
      }
    }
  return dx;
}

// ---- device data ----

// Values on dev as dtype t, viewed at a non-zero byte offset: rows [1, 1 + shape[0]) of a larger
// tensor whose first row is a sentinel that must stay untouched.
struct Placed {
  Tensor whole, view;
};
Placed place(const std::vector<double>& v, Shape shape, DType t, const Device& dev) {
  int64_t row = shape[0] ? int64_t(v.size()) / shape[0] : 0;
  std::vector<double> all(size_t(row), 1234.5);
  all.insert(all.end(), v.begin(), v.end());
  Shape big = shape;
  big[0] += 1;
  Tensor whole = to(Tensor(all, big).cast(t), dev);
  return {whole, whole.slice(1, shape[0] + 1)};
}

void expect_sentinel_kept(const Placed& p, const std::string& what) {
  std::vector<double> all = p.whole.to_vector<double>();
  int64_t row = p.whole.shape()[0] ? int64_t(all.size()) / p.whole.shape()[0] : 0;
  for (int64_t i = 0; i < row; ++i) {
    ASSERT_EQ(all[size_t(i)], 1234.5) << what << ": the kernel wrote before its output at " << i;
  }
}

std::vector<double> values(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = double(float(dist(gen)));  // exact in float32 too
  return v;
}

// Small integers (many ties within a window), exact in every float dtype.
std::vector<double> tie_values(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<double> v(n);
  for (double& x : v) x = double(int64_t(gen() % 5) - 2);
  return v;
}

void expect_close(DType t, const std::vector<double>& got, const std::vector<double>& want, const std::string& what,
                  double tol32 = 2e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = t == DType::f32 ? tol32 : 1e-13;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i])
          << what << " at " << i << ": got " << got[i] << ", want " << want[i];
      continue;
    }
    double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    ASSERT_LE(err, tol) << what << " at " << i << ": got " << got[i] << ", want " << want[i];
  }
}

Shape activation_shape(const ConvGeometry& g, const int64_t* spatial_sizes) {
  Shape s{g.batch, g.in_channels};
  for (int i = 0; i < g.spatial; ++i) s.push_back(spatial_sizes[i]);
  return s;
}

std::string describe(const Case& c, DType t) { return std::string(c.name) + " " + dtype_name(t); }

// The cases: 1-D, 2-D, 3-D; stride, asymmetric padding, dilation, groups (depthwise included),
// batch > 1; sizes that are not multiples of any work-group size. The last ones launch more rows
// than one grid covers (256 * 1024 work-items), so grid-stride loops wrap.
const std::vector<Case>& conv_cases() {
  static const std::vector<Case> cases = {
      {"1-D", 1, 2, 3, 1, {11}, {3}, {1}, {0}, {0}, {1}},
      {"1-D stride 2, pad (2, 1), dilation 2", 1, 3, 2, 1, {13}, {3}, {2}, {2}, {1}, {2}},
      {"1-D groups 2", 1, 2, 4, 2, {9}, {4}, {1}, {1}, {2}, {1}},
      {"2-D LeNet-like", 2, 3, 1, 1, {12, 12}, {5, 5}, {1, 1}, {0, 0}, {0, 0}, {1, 1}},
      {"2-D stride (2, 3), pad (1, 0, 2, 1)", 2, 2, 3, 1, {9, 11}, {3, 2}, {2, 3}, {1, 2}, {0, 1}, {1, 1}},
      {"2-D dilation (2, 1), pad 2", 2, 1, 2, 1, {7, 8}, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {2, 1}},
      {"2-D groups 3, stride 2", 2, 2, 6, 3, {10, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
      {"2-D depthwise", 2, 3, 5, 5, {6, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}},
      {"2-D kernel larger than stride with large pad", 2, 1, 1, 1, {3, 4}, {3, 3}, {1, 2}, {3, 1}, {2, 3}, {1, 1}},
      {"3-D", 3, 2, 2, 1, {5, 6, 7}, {2, 3, 2}, {1, 2, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 2}},
      {"3-D groups 2, stride 2", 3, 1, 4, 2, {6, 5, 5}, {3, 2, 3}, {2, 2, 2}, {1, 1, 1}, {1, 0, 1}, {1, 1, 1}},
      {"1-D many rows (grid-stride)", 1, 33, 64, 1, {70}, {130}, {13}, {33}, {33}, {1}},
      {"3-D many rows (grid-stride)", 3, 2, 33, 1, {65, 64, 2}, {1, 2, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0},
       {1, 1, 1}},
  };
  return cases;
}

// Pooling windows (no dilation: the pools have none). Includes the shapes the CPU backend runs on
// its fixed-window path (2x2 and 3x3 with stride 2) and their borders.
const std::vector<Case>& pool_cases() {
  static const std::vector<Case> cases = {
      {"1-D window 3", 1, 2, 3, 1, {11}, {3}, {3}, {0}, {0}, {1}},
      {"1-D window 4 stride 2 pad (1, 2)", 1, 3, 2, 1, {13}, {4}, {2}, {1}, {2}, {1}},
      {"2-D 2x2", 2, 3, 4, 1, {12, 13}, {2, 2}, {2, 2}, {0, 0}, {0, 0}, {1, 1}},
      {"2-D 3x3 stride 2 pad 1", 2, 2, 3, 1, {11, 14}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
      {"2-D 3x2 stride (1, 2) pad (2, 0, 1, 1)", 2, 2, 2, 1, {7, 9}, {3, 2}, {1, 2}, {2, 1}, {0, 1}, {1, 1}},
      {"2-D overlapping 4x4 stride 1", 2, 1, 3, 1, {9, 10}, {4, 4}, {1, 1}, {0, 0}, {0, 0}, {1, 1}},
      {"3-D 2x2x2", 3, 2, 2, 1, {6, 5, 7}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}},
      {"3-D 3x2x3 stride (2, 1, 2) pad (1, 0, 1, 1, 1, 0)", 3, 1, 3, 1, {7, 5, 6}, {3, 2, 3}, {2, 1, 2},
       {1, 1, 1}, {0, 1, 0}, {1, 1, 1}},
      {"3-D many rows (grid-stride)", 3, 2, 33, 1, {65, 64, 2}, {1, 2, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0},
       {1, 1, 1}},
  };
  return cases;
}

// True when this backend does not implement the primitive yet (the default body of backend.hpp).
bool not_implemented(const Error& e) { return std::string(e.what()).find("not implemented by the") != std::string::npos; }

class ConvKernels : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
  backend::Backend& be() const { return detail::backend_for(GetParam()); }
};
class PoolKernels : public ConvKernels {};
class RandomKernels : public ConvKernels {};

#define FLUX_SKIP_IF_NOT_IMPLEMENTED(statement)                                          \
  try {                                                                                  \
    statement;                                                                           \
  } catch (const Error& e) {                                                             \
    if (not_implemented(e)) GTEST_SKIP() << to_string(dev()) << ": " << e.what();        \
    throw;                                                                               \
  }

const DType kFloats[] = {DType::f32, DType::f64};

// ---- im2col / col2im ----

TEST_P(ConvKernels, Im2colMatchesTheIndexingFormula) {
  for (const Case& c : conv_cases())
    for (DType t : kFloats) {
      ConvGeometry g = geometry_of(c);
      const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial);
      std::vector<double> x = values(size_t(g.batch * g.in_channels * prod(g.in, g.spatial)), 11);
      Placed xd = place(x, activation_shape(g, g.in), t, dev());
      const int64_t rows = g.in_channels * K;
      // Pre-filled with NaN: every entry, padding included, must be written.
      std::vector<double> nan(size_t(g.batch * rows * P), std::nan(""));
      Placed col = place(nan, Shape{g.batch, rows, P}, t, dev());
      FLUX_SKIP_IF_NOT_IMPLEMENTED(
          be().im2col(dev().index(), t, xd.view.buffer(), col.view.buffer(), g));
      // A pure gather: bit-exact in either dtype.
      expect_close(t, col.view.to_vector<double>(), reference_im2col(g, x), describe(c, t), 0.0);
      expect_sentinel_kept(col, describe(c, t));
    }
}

TEST_P(ConvKernels, Col2imAddsTheAdjointOfIm2col) {
  for (const Case& c : conv_cases())
    for (DType t : kFloats) {
      ConvGeometry g = geometry_of(c);
      const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial), I = prod(g.in, g.spatial);
      std::vector<double> col = values(size_t(g.batch * g.in_channels * K * P), 21);
      std::vector<double> base = values(size_t(g.batch * g.in_channels * I), 22, -4.0, 4.0);
      Placed cd = place(col, Shape{g.batch, g.in_channels * K, P}, t, dev());
      Placed dx = place(base, activation_shape(g, g.in), t, dev());
      FLUX_SKIP_IF_NOT_IMPLEMENTED(be().col2im(dev().index(), t, cd.view.buffer(), dx.view.buffer(), g));
      std::vector<double> got = dx.view.to_vector<double>();
      // Each dx element sums at most K * (overlapping windows) float32 terms.
      expect_close(t, got, reference_col2im(g, col, base), describe(c, t), 1e-5);
      expect_sentinel_kept(dx, describe(c, t));

      // <im2col(x), c> == <x, col2im(c)>, with this device's im2col and col2im.
      std::vector<double> x = values(size_t(g.batch * g.in_channels * I), 23);
      Placed xd = place(x, activation_shape(g, g.in), t, dev());
      Placed xc = place(std::vector<double>(col.size(), 0.0), Shape{g.batch, g.in_channels * K, P}, t, dev());
      Placed back = place(std::vector<double>(base.size(), 0.0), activation_shape(g, g.in), t, dev());
      be().im2col(dev().index(), t, xd.view.buffer(), xc.view.buffer(), g);
      be().col2im(dev().index(), t, cd.view.buffer(), back.view.buffer(), g);
      std::vector<double> ix = xc.view.to_vector<double>(), cb = back.view.to_vector<double>();
      double lhs = 0, rhs = 0, scale = 0;
      for (size_t i = 0; i < ix.size(); ++i) lhs += ix[i] * col[i], scale += std::abs(ix[i] * col[i]);
      for (size_t i = 0; i < x.size(); ++i) rhs += x[i] * cb[i];
      EXPECT_LE(std::abs(lhs - rhs), (t == DType::f32 ? 1e-5 : 1e-12) * std::max(1.0, scale))
          << describe(c, t) << ": <im2col(x), c> = " << lhs << ", <x, col2im(c)> = " << rhs;
    }
}

TEST_P(ConvKernels, RejectsIntegerTensors) {
  ConvGeometry g = geometry_of(conv_cases()[0]);
  Tensor x = zeros(Shape{2, 3, 11}, DType::i32, dev());
  Tensor col = zeros(Shape{2, 9, 9}, DType::i32, dev());
  try {
    be().im2col(dev().index(), DType::i32, x.buffer(), col.buffer(), g);
    FAIL() << "im2col accepted Int32";
  } catch (const Error& e) {
    if (not_implemented(e)) GTEST_SKIP() << e.what();
    EXPECT_EQ(std::string(e.what()),
              std::string("[im2col] ") + be().name() + " kernel supports Float32 and Float64; got Int32");
  }
}

// ---- pooling ----

TEST_P(PoolKernels, ForwardMatchesReferenceWithTiesAndPadding) {
  for (const Case& c : pool_cases())
    for (PoolOp op : {PoolOp::max, PoolOp::mean})
      for (DType t : kFloats) {
        ConvGeometry g = geometry_of(c);
        std::vector<double> x = op == PoolOp::max ? tie_values(size_t(g.batch * g.in_channels * prod(g.in, g.spatial)), 31)
                                                  : values(size_t(g.batch * g.in_channels * prod(g.in, g.spatial)), 32);
        Placed xd = place(x, activation_shape(g, g.in), t, dev());
        std::vector<double> nan(size_t(g.batch * g.in_channels * prod(g.out, g.spatial)), std::nan(""));
        Placed y = place(nan, activation_shape(g, g.out), t, dev());
        std::string what = describe(c, t) + (op == PoolOp::max ? " max" : " mean");
        FLUX_SKIP_IF_NOT_IMPLEMENTED(be().pool_forward(dev().index(), op, t, xd.view.buffer(), y.view.buffer(), g));
        expect_close(t, y.view.to_vector<double>(), reference_pool(op, g, x), what);
        expect_sentinel_kept(y, what);
      }
}

TEST_P(PoolKernels, BackwardSendsGradientToFirstMaximumAndSpreadsMeans) {
  for (const Case& c : pool_cases())
    for (PoolOp op : {PoolOp::max, PoolOp::mean})
      for (DType t : kFloats) {
        ConvGeometry g = geometry_of(c);
        const int64_t nx = g.batch * g.in_channels * prod(g.in, g.spatial);
        const int64_t ny = g.batch * g.in_channels * prod(g.out, g.spatial);
        std::vector<double> x = tie_values(size_t(nx), 41);
        std::vector<double> y = reference_pool(op, g, x);
        if (t == DType::f32)
          for (double& v : y) v = double(float(v));  // y as the forward gives it in float32
        std::vector<double> dy = values(size_t(ny), 42), base = values(size_t(nx), 43, -2.0, 2.0);
        Placed xd = place(x, activation_shape(g, g.in), t, dev()), yd = place(y, activation_shape(g, g.out), t, dev());
        Placed dyd = place(dy, activation_shape(g, g.out), t, dev()), dx = place(base, activation_shape(g, g.in), t, dev());
        std::string what = describe(c, t) + (op == PoolOp::max ? " max" : " mean");
        FLUX_SKIP_IF_NOT_IMPLEMENTED(be().pool_backward(dev().index(), op, t, xd.view.buffer(), yd.view.buffer(),
                                                        dyd.view.buffer(), dx.view.buffer(), g));
        expect_close(t, dx.view.to_vector<double>(), reference_pool_backward(op, g, x, y, dy, base), what, 1e-5);
        expect_sentinel_kept(dx, what);
      }
}

TEST_P(PoolKernels, MaxPropagatesNaNAndRoutesItsGradient) {
  // 1 x 1 x 4 x 4, 2x2 windows with stride 2: the window holding NaN gives NaN and its dy goes to
  // the NaN (the first position holding y); a window of -inf and padding-free ties picks the first.
  Case c{"NaN", 2, 1, 1, 1, {4, 4}, {2, 2}, {2, 2}, {0, 0}, {0, 0}, {1, 1}};
  ConvGeometry g = geometry_of(c);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> x = {1, 5, 2, 2,     //
                           nan, 3, 2, 2,   //
                           -inf, -inf, 0, 7,  //
                           -inf, -inf, 7, 1};
  for (DType t : kFloats) {
    Placed xd = place(x, Shape{1, 1, 4, 4}, t, dev());
    Placed y = place(std::vector<double>(4, 0.0), Shape{1, 1, 2, 2}, t, dev());
    FLUX_SKIP_IF_NOT_IMPLEMENTED(be().pool_forward(dev().index(), PoolOp::max, t, xd.view.buffer(), y.view.buffer(), g));
    std::vector<double> yv = y.view.to_vector<double>();
    EXPECT_TRUE(std::isnan(yv[0])) << dtype_name(t);
    EXPECT_EQ(yv[1], 2.0);
    EXPECT_EQ(yv[2], -inf);
    EXPECT_EQ(yv[3], 7.0);
    Placed dyd = place({1, 10, 100, 1000}, Shape{1, 1, 2, 2}, t, dev());
    Placed dx = place(std::vector<double>(16, 0.0), Shape{1, 1, 4, 4}, t, dev());
    be().pool_backward(dev().index(), PoolOp::max, t, xd.view.buffer(), y.view.buffer(), dyd.view.buffer(),
                       dx.view.buffer(), g);
    std::vector<double> want = {0, 0, 10, 0,  //
                                1, 0, 0, 0,   //
                                100, 0, 0, 1000,  //
                                0, 0, 0, 0};
    EXPECT_EQ(dx.view.to_vector<double>(), want) << dtype_name(t);
  }
}

// ---- random_uniform ----

uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

TEST_P(RandomKernels, UniformIsBitExactAgainstTheFormula) {
  const std::pair<uint64_t, uint64_t> seeds_offsets[] = {
      {0, 0}, {42, 7}, {0xDEADBEEFCAFEF00Dull, (uint64_t(1) << 63) - 5}, {~uint64_t(0), 123456789}};
  for (auto [seed, offset] : seeds_offsets)
    for (DType t : kFloats) {
      const int64_t n = 300007;  // more than one launch grid covers
      Placed dst = place(std::vector<double>(size_t(n), std::nan("")), Shape{n}, t, dev());
      FLUX_SKIP_IF_NOT_IMPLEMENTED(be().random_uniform(dev().index(), t, dst.view.buffer(), n, seed, offset));
      expect_sentinel_kept(dst, "random_uniform");
      bool all_in_range = true;
      int64_t mismatches = 0, first = -1;
      if (t == DType::f32) {
        std::vector<float> got = dst.view.to_vector<float>();
        for (int64_t i = 0; i < n; ++i) {
          uint64_t z = splitmix64(seed + (offset + uint64_t(i)) * 0x9E3779B97F4A7C15ull);
          float want = float(z >> 40) * 0x1p-24f;
          if (std::memcmp(&want, &got[size_t(i)], sizeof want) != 0 && mismatches++ == 0) first = i;
          all_in_range = all_in_range && got[size_t(i)] >= 0.0f && got[size_t(i)] < 1.0f;
        }
      } else {
        std::vector<double> got = dst.view.to_vector<double>();
        for (int64_t i = 0; i < n; ++i) {
          uint64_t z = splitmix64(seed + (offset + uint64_t(i)) * 0x9E3779B97F4A7C15ull);
          double want = double(z >> 11) * 0x1p-53;
          if (std::memcmp(&want, &got[size_t(i)], sizeof want) != 0 && mismatches++ == 0) first = i;
          all_in_range = all_in_range && got[size_t(i)] >= 0.0 && got[size_t(i)] < 1.0;
        }
      }
      EXPECT_EQ(mismatches, 0) << dtype_name(t) << " seed " << seed << " offset " << offset << ": first at " << first;
      EXPECT_TRUE(all_in_range);
    }
}

TEST_P(RandomKernels, ConsecutiveCallsContinueTheStream) {
  // Two calls at offsets 0 and 1000 give the same values as one call of 1777 elements.
  for (DType t : kFloats) {
    Tensor whole = Tensor::empty(Shape{1777}, t, dev()), parts = Tensor::empty(Shape{1777}, t, dev());
    FLUX_SKIP_IF_NOT_IMPLEMENTED(be().random_uniform(dev().index(), t, whole.buffer(), 1777, 99, 0));
    be().random_uniform(dev().index(), t, parts.slice(0, 1000).buffer(), 1000, 99, 0);
    be().random_uniform(dev().index(), t, parts.slice(1000, 1777).buffer(), 777, 99, 1000);
    EXPECT_EQ(whole.to_vector<double>(), parts.to_vector<double>()) << dtype_name(t);
  }
}

FLUX_DEVICE_SUITE(ConvKernels);
FLUX_DEVICE_SUITE(PoolKernels);
FLUX_DEVICE_SUITE(RandomKernels);

}  // namespace
