// conv and conv_transpose: every device and dtype against float64 direct loops written here, the
// adjoint identity between the two, float64 finite-difference gradients, the oneDNN fast path
// against the portable im2col + GEMM path on the CPU, and the error messages.
#include <cmath>
#include <functional>
#include <random>

#include <gmock/gmock.h>

#include "library_kernels.hpp"
#include "src/environment.hpp"
#include "src/ops/ops_internal.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::LibraryKernels;
using flux::testing::max_rel_error;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

namespace {

struct Spec {
  std::string name;
  int64_t batch, in_channels, out_channels;
  std::vector<int64_t> in, kernel;
  Dims stride = 1;
  Padding pad = 0;
  Dims dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  Dims output_padding = 0;  // conv_transpose only
};

std::vector<Spec> specs() {
  return {
      {"conv1d", 2, 3, 4, {9}, {3}, 1, 1},
      {"conv2d_plain", 1, 2, 3, {6, 7}, {3, 3}},
      {"conv2d_stride2", 3, 2, 4, {7, 8}, {3, 2}, 2, 1, 1, 1, true, 1},
      {"conv2d_stride_per_axis", 2, 2, 2, {7, 6}, {2, 3}, {2, 1}, {1, 0}},
      {"conv2d_asymmetric_pad", 2, 3, 2, {5, 6}, {3, 3}, 1, {1, 0, 2, 1}},
      {"conv2d_samepad_odd", 1, 2, 3, {7, 7}, {3, 3}, 2, SamePad()},
      {"conv2d_samepad_even", 2, 1, 2, {6, 8}, {4, 3}, 1, SamePad()},
      {"conv2d_dilation2", 1, 2, 2, {9, 8}, {3, 3}, 1, 2, 2},
      {"conv2d_groups2", 2, 4, 6, {5, 5}, {3, 3}, 1, 1, 1, 2},
      {"conv2d_depthwise", 2, 3, 6, {6, 5}, {3, 3}, 1, 1, 1, 3},
      {"conv2d_nobias_batch3", 3, 2, 3, {5, 6}, {2, 2}, 1, 0, 1, 1, false},
      {"conv3d", 2, 2, 3, {4, 5, 4}, {2, 3, 2}, {1, 2, 1}, 1, 1, 1, false, {0, 1, 0}},
      {"conv1d_stride2_dilation2_groups2", 1, 4, 2, {11}, {3}, 2, 2, 2, 2, true, 1},
  };
}

// ---- the float64 reference: direct loops over three spatial axes (unused ones of size 1) ----

struct Geo {
  int n = 0;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1};
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0}, out[3] = {1, 1, 1};
};

std::vector<int64_t> per_axis(const std::vector<int64_t>& v, int n) {
  return v.size() == 1 ? std::vector<int64_t>(size_t(n), v[0]) : v;
}

Geo geometry(const Spec& c, bool transpose) {
  Geo g;
  g.n = int(c.in.size());
  auto s = per_axis(c.stride.values, g.n), d = per_axis(c.dilation.values, g.n);
  auto extra = per_axis(c.output_padding.values, g.n);
  for (int i = 0; i < g.n; ++i) {
    g.in[i] = c.in[size_t(i)], g.k[i] = c.kernel[size_t(i)], g.s[i] = s[size_t(i)], g.d[i] = d[size_t(i)];
    int64_t eff = g.d[i] * (g.k[i] - 1) + 1;
    const auto& p = c.pad.values;
    if (c.pad.same && !transpose) {  // Flux: total d (k - 1), the odd pixel on the low side
      int64_t total = eff - 1;
      g.lo[i] = total - total / 2, g.hi[i] = total / 2;
    } else if (c.pad.same) {  // Flux: a conv's SamePad with kernel k - stride + 1, out = in * stride
      int64_t total = std::max<int64_t>(0, g.d[i] * (g.k[i] - g.s[i]));
      g.lo[i] = total - total / 2, g.hi[i] = total / 2;
    } else if (p.size() == 1) {
      g.lo[i] = g.hi[i] = p[0];
    } else if (int(p.size()) == g.n) {
      g.lo[i] = g.hi[i] = p[size_t(i)];
    } else {
      g.lo[i] = p[size_t(2 * i)], g.hi[i] = p[size_t(2 * i + 1)];
    }
    g.out[i] = transpose ? (g.in[i] - 1) * g.s[i] - g.lo[i] - g.hi[i] + eff + extra[size_t(i)]
                         : (g.in[i] + g.lo[i] + g.hi[i] - eff) / g.s[i] + 1;
  }
  return g;
}

int64_t prod3(const int64_t* v) { return v[0] * v[1] * v[2]; }

Shape make_shape(int64_t a, int64_t b, const int64_t* sizes, int n) {
  Shape s{a, b};
  for (int i = 0; i < n; ++i) s.push_back(sizes[i]);
  return s;
}

Shape x_shape(const Spec& c) {
  Geo g = geometry(c, false);
  return make_shape(c.batch, c.in_channels, g.in, g.n);
}
/// conv: (O, C / G, k...); conv_transpose: (C, O / G, k...).
Shape w_shape(const Spec& c, bool transpose) {
  Geo g = geometry(c, false);
  return transpose ? make_shape(c.in_channels, c.out_channels / c.groups, g.k, g.n)
                   : make_shape(c.out_channels, c.in_channels / c.groups, g.k, g.n);
}

// y[n, o, p] = b[o] + sum_{c, k} x[n, g C/G + c, p s - lo + k d] w[o, c, k], g = o / (O / G).
std::vector<double> conv_reference(const Spec& c, const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b) {
  Geo g = geometry(c, false);
  int64_t cg = c.in_channels / c.groups, og = c.out_channels / c.groups, I = prod3(g.in), K = prod3(g.k);
  std::vector<double> y(size_t(c.batch * c.out_channels * prod3(g.out)));
  size_t at = 0;
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t o = 0; o < c.out_channels; ++o)
      for (int64_t p0 = 0; p0 < g.out[0]; ++p0)
        for (int64_t p1 = 0; p1 < g.out[1]; ++p1)
          for (int64_t p2 = 0; p2 < g.out[2]; ++p2) {
            double acc = b.empty() ? 0.0 : b[size_t(o)];
            int64_t group = o / og;
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
                for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
                    int64_t i0 = p0 * g.s[0] - g.lo[0] + k0 * g.d[0];
                    int64_t i1 = p1 * g.s[1] - g.lo[1] + k1 * g.d[1];
                    int64_t i2 = p2 * g.s[2] - g.lo[2] + k2 * g.d[2];
                    if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1] || i2 < 0 || i2 >= g.in[2]) continue;
                    int64_t xc = group * cg + ci;
                    acc += x[size_t((n * c.in_channels + xc) * I + (i0 * g.in[1] + i1) * g.in[2] + i2)] *
                           w[size_t((o * cg + ci) * K + (k0 * g.k[1] + k1) * g.k[2] + k2)];
                  }
            y[at++] = acc;
          }
  return y;
}

// y[n, g O/G + o, i s - lo + k d] += x[n, c, i] w[c, o, k] for c in group g, plus b.
std::vector<double> conv_transpose_reference(const Spec& c, const std::vector<double>& x, const std::vector<double>& w,
                                             const std::vector<double>& b) {
  Geo g = geometry(c, true);
  int64_t cg = c.in_channels / c.groups, og = c.out_channels / c.groups, I = prod3(g.in), K = prod3(g.k);
  int64_t P = prod3(g.out);
  std::vector<double> y(size_t(c.batch * c.out_channels * P));
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t o = 0; o < c.out_channels; ++o)
      for (int64_t p = 0; p < P; ++p) y[size_t((n * c.out_channels + o) * P + p)] = b.empty() ? 0.0 : b[size_t(o)];
  for (int64_t n = 0; n < c.batch; ++n)
    for (int64_t ci = 0; ci < c.in_channels; ++ci)
      for (int64_t o = 0; o < og; ++o)
        for (int64_t a0 = 0; a0 < g.in[0]; ++a0)
          for (int64_t a1 = 0; a1 < g.in[1]; ++a1)
            for (int64_t a2 = 0; a2 < g.in[2]; ++a2)
              for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
                for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
                    int64_t j0 = a0 * g.s[0] - g.lo[0] + k0 * g.d[0];
                    int64_t j1 = a1 * g.s[1] - g.lo[1] + k1 * g.d[1];
                    int64_t j2 = a2 * g.s[2] - g.lo[2] + k2 * g.d[2];
                    if (j0 < 0 || j0 >= g.out[0] || j1 < 0 || j1 >= g.out[1] || j2 < 0 || j2 >= g.out[2]) continue;
                    int64_t yo = (ci / cg) * og + o;
                    y[size_t((n * c.out_channels + yo) * P + (j0 * g.out[1] + j1) * g.out[2] + j2)] +=
                        x[size_t((n * c.in_channels + ci) * I + (a0 * g.in[1] + a1) * g.in[2] + a2)] *
                        w[size_t((ci * og + o) * K + (k0 * g.k[1] + k1) * g.k[2] + k2)];
                  }
  return y;
}

std::vector<double> uniform(int64_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

/// Host data of one case: x, w, b (empty without bias).
struct Data {
  std::vector<double> x, w, b;
  Shape xs, ws;
};

Data data_for(const Spec& c, bool transpose) {
  Data d;
  d.xs = x_shape(c), d.ws = w_shape(c, transpose);
  uint64_t seed = std::hash<std::string>{}(c.name) + transpose;
  d.x = uniform(d.xs.numel(), seed);
  d.w = uniform(d.ws.numel(), seed + 1);
  if (c.bias) d.b = uniform(c.out_channels, seed + 2);
  return d;
}

ConvParams conv_params(const Spec& c) { return {c.stride, c.pad, c.dilation, c.groups}; }
ConvTransposeParams transpose_params(const Spec& c) {
  return {c.stride, c.pad, c.dilation, c.groups, c.output_padding};
}

Tensor on(const std::vector<double>& v, const Shape& s, DType t, const Device& d) {
  return to(Tensor(v, s).cast(t), d);
}

/// The op of a case on (x, w[, b]) tensors.
Tensor apply(const Spec& c, bool transpose, const std::vector<Tensor>& v) {
  Tensor b = v.size() > 2 ? v[2] : Tensor();
  return transpose ? conv_transpose(v[0], v[1], b, transpose_params(c)) : conv(v[0], v[1], b, conv_params(c));
}

std::vector<Tensor> inputs(const Data& d, DType t, const Device& dev) {
  std::vector<Tensor> v{on(d.x, d.xs, t, dev), on(d.w, d.ws, t, dev)};
  if (!d.b.empty()) v.push_back(on(d.b, Shape{int64_t(d.b.size())}, t, dev));
  return v;
}

/// L = sum(f(inputs) .* R) for a fixed random R, so every entry of the Jacobian counts.
Tensor objective(const Spec& c, bool transpose, const std::vector<Tensor>& v, const std::vector<double>& r) {
  Tensor y = apply(c, transpose, v);
  return sum(y * on(r, y.shape(), y.dtype(), y.device()));
}

std::vector<double> weights_for(const Spec& c, bool transpose) {
  Data d = data_for(c, transpose);
  Tensor y = apply(c, transpose, inputs(d, DType::f64, Device()));
  return uniform(y.numel(), 7, 0.5, 1.5);
}

std::vector<Tensor> grads(const Spec& c, bool transpose, DType t, const Device& dev) {
  Data d = data_for(c, transpose);
  auto r = weights_for(c, transpose);
  return gradient([&](const std::vector<Tensor>& v) { return objective(c, transpose, v, r); }, inputs(d, t, dev));
}

class ConvDevice : public ::testing::TestWithParam<Device> {};

TEST_P(ConvDevice, ConvMatchesDirectLoops) {
  for (const Spec& c : specs())
    for (DType t : {DType::f32, DType::f64}) {
      SCOPED_TRACE(c.name + " " + dtype_name(t));
      Data d = data_for(c, false);
      Tensor y = apply(c, false, inputs(d, t, GetParam()));
      Geo g = geometry(c, false);
      ASSERT_EQ(y.shape(), make_shape(c.batch, c.out_channels, g.out, g.n));
      ASSERT_EQ(y.dtype(), t);
      ASSERT_EQ(y.device(), GetParam());
      EXPECT_LT(max_rel_error(y, conv_reference(c, d.x, d.w, d.b)), t == DType::f32 ? 2e-6 : 1e-13);
    }
}

TEST_P(ConvDevice, ConvTransposeMatchesDirectLoops) {
  for (const Spec& c : specs())
    for (DType t : {DType::f32, DType::f64}) {
      SCOPED_TRACE(c.name + " " + dtype_name(t));
      Data d = data_for(c, true);
      Tensor y = apply(c, true, inputs(d, t, GetParam()));
      Geo g = geometry(c, true);
      ASSERT_EQ(y.shape(), make_shape(c.batch, c.out_channels, g.out, g.n));
      ASSERT_EQ(y.dtype(), t);
      EXPECT_LT(max_rel_error(y, conv_transpose_reference(c, d.x, d.w, d.b)), t == DType::f32 ? 2e-6 : 1e-13);
    }
}

// <conv(x, w), y> == <x, conv_transpose(y, w)> with the same stride, padding (as lo/hi pairs),
// dilation and groups, and output_padding restoring x's size.
TEST_P(ConvDevice, ConvTransposeIsTheAdjointOfConv) {
  for (const Spec& c : specs()) {
    SCOPED_TRACE(c.name);
    Geo g = geometry(c, false);
    std::vector<int64_t> pads, extra;
    for (int i = 0; i < g.n; ++i) {
      pads.push_back(g.lo[i]), pads.push_back(g.hi[i]);
      extra.push_back((g.in[i] + g.lo[i] + g.hi[i] - (g.d[i] * (g.k[i] - 1) + 1)) % g.s[i]);
    }
    Data d = data_for(c, false);
    Tensor x = on(d.x, d.xs, DType::f64, GetParam()), w = on(d.w, d.ws, DType::f64, GetParam());
    Tensor y = conv(x, w, Tensor(), conv_params(c));
    Tensor u = on(uniform(y.numel(), 3), y.shape(), DType::f64, GetParam());
    Tensor xt = conv_transpose(u, w, Tensor(), {c.stride, Padding(pads), c.dilation, c.groups, Dims(extra)});
    ASSERT_EQ(xt.shape(), x.shape());
    double left = sum(y * u).item<double>(), right = sum(x * xt).item<double>();
    EXPECT_NEAR(left, right, 1e-12 * (1 + std::abs(left)));
  }
}

// Gradients on every device in float32 (and float64) against the float64 CPU gradients, which the
// finite-difference tests below check.
TEST_P(ConvDevice, GradientsMatchFloat64Cpu) {
  for (bool transpose : {false, true})
    for (const Spec& c : specs()) {
      auto want = grads(c, transpose, DType::f64, Device());
      for (DType t : {DType::f32, DType::f64}) {
        SCOPED_TRACE(c.name + (transpose ? " transpose " : " ") + dtype_name(t));
        auto got = grads(c, transpose, t, GetParam());
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].shape(), want[i].shape()) << "input " << i;
          EXPECT_EQ(got[i].device(), GetParam());
          EXPECT_LT(max_rel_error(got[i], want[i].to_vector<double>()), t == DType::f32 ? 1e-5 : 1e-12)
              << "input " << i;
        }
      }
    }
}

FLUX_DEVICE_SUITE(ConvDevice);

// ---- float64 central finite differences (CPU), x, w and bias ----

void check_finite_differences(const Spec& c, bool transpose) {
  SCOPED_TRACE(c.name + (transpose ? " transpose" : ""));
  Data d = data_for(c, transpose);
  auto r = weights_for(c, transpose);
  auto analytic = grads(c, transpose, DType::f64, Device());
  std::vector<std::vector<double>*> host{&d.x, &d.w};
  std::vector<Shape> shapes{d.xs, d.ws};
  if (!d.b.empty()) host.push_back(&d.b), shapes.push_back(Shape{int64_t(d.b.size())});
  ASSERT_EQ(analytic.size(), host.size());
  auto value = [&] {
    std::vector<Tensor> v;
    for (size_t i = 0; i < host.size(); ++i) v.emplace_back(*host[i], shapes[i]);
    return objective(c, transpose, v, r).item<double>();
  };
  // The objective is linear in each input, so a large step has no truncation error and less rounding.
  const double h = 1e-3;
  for (size_t i = 0; i < host.size(); ++i) {
    std::vector<double> g = analytic[i].to_vector<double>();
    ASSERT_EQ(g.size(), host[i]->size());
    for (size_t k = 0; k < g.size(); ++k) {
      double keep = (*host[i])[k];
      (*host[i])[k] = keep + h;
      double plus = value();
      (*host[i])[k] = keep - h;
      double minus = value();
      (*host[i])[k] = keep;
      double numeric = (plus - minus) / (2 * h);
      EXPECT_NEAR(g[k], numeric, 1e-9 * (1 + std::abs(numeric))) << "input " << i << " element " << k;
    }
  }
}

TEST(ConvGradients, FiniteDifferences) {
  for (const Spec& c : specs())
    if (c.name != "conv3d") check_finite_differences(c, false);
}

TEST(ConvGradients, FiniteDifferencesTranspose) {
  for (const Spec& c : specs())
    if (c.name != "conv3d") check_finite_differences(c, true);
}

TEST(ConvGradients, FiniteDifferences3d) {
  for (const Spec& c : specs())
    if (c.name == "conv3d") check_finite_differences(c, false), check_finite_differences(c, true);
}

// Gradients with respect to one input at a time (the others not recorded) equal those of the full call.
TEST(ConvGradients, SingleInputsMatchTheFullGradient) {
  for (bool transpose : {false, true}) {
    Spec c = specs()[2];
    SCOPED_TRACE(transpose ? "transpose" : "conv");
    Data d = data_for(c, transpose);
    Tensor x(d.x, d.xs), w(d.w, d.ws), b(d.b, Shape{c.out_channels});
    auto f = [&](const Tensor& xv, const Tensor& wv, const Tensor& bv) { return sum(square(apply(c, transpose, {xv, wv, bv}))); };
    auto full = gradient([&](const std::vector<Tensor>& v) { return f(v[0], v[1], v[2]); }, std::vector<Tensor>{x, w, b});
    Tensor gx = gradient([&](const Tensor& v) { return f(v, w, b); }, x);
    Tensor gw = gradient([&](const Tensor& v) { return f(x, v, b); }, w);
    Tensor gb = gradient([&](const Tensor& v) { return f(x, w, v); }, b);
    EXPECT_LT(max_rel_error(gx, full[0].to_vector<double>()), 1e-14);
    EXPECT_LT(max_rel_error(gw, full[1].to_vector<double>()), 1e-14);
    EXPECT_LT(max_rel_error(gb, full[2].to_vector<double>()), 1e-14);
  }
}

// ---- oneDNN (float32 fast path) against the portable im2col + GEMM path ----

/// max |a - b| / max |b|: float32 sums in another order differ by rounding relative to the
/// largest entry, not to each (a weight gradient here sums 1024 products).
double normwise_error(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.size() != y.size()) return 1e300;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  return diff / scale;
}

// The op's SamePad and the Conv layer's resolved padding are the same (Flux's calc_padding): with an
// even kernel the odd pixel goes to the low side, so the op equals explicit (lo, hi) padding.
TEST(ConvSamePad, OpEqualsFluxExplicitPadding) {
  Tensor x = rand({1, 2, 7, 8}).f64(), w = rand({3, 2, 2, 4}).f64();
  Tensor same = conv(x, w, Tensor(), {.pad = SamePad()});
  Tensor explicit_pad = conv(x, w, Tensor(), {.pad = {1, 0, 2, 1}});
  ASSERT_EQ(same.shape(), (Shape{1, 3, 7, 8}));
  EXPECT_EQ(same.to_vector<double>(), explicit_pad.to_vector<double>());
  EXPECT_NE(same.to_vector<double>(), conv(x, w, Tensor(), {.pad = {0, 1, 1, 2}}).to_vector<double>());
  // stride 2 keeps out = ceil(in / stride)
  EXPECT_EQ(conv(x, w, Tensor(), {.stride = 2, .pad = SamePad()}).shape(), (Shape{1, 3, 4, 4}));
  // ConvTranspose: a conv's SamePad with kernel k - stride + 1 (k = 3, s = 2: one pixel, low side)
  Tensor wt = rand({2, 3, 3, 3}).f64();
  EXPECT_EQ(conv_transpose(x, wt, Tensor(), {.stride = 2, .pad = SamePad()}).to_vector<double>(),
            conv_transpose(x, wt, Tensor(), {.stride = 2, .pad = {1, 0, 1, 0}}).to_vector<double>());
  EXPECT_EQ(conv_transpose(x, wt, Tensor(), {.stride = 2, .pad = SamePad()}).shape(), (Shape{1, 3, 14, 16}));
}

TEST(ConvLibrary, OneDnnMatchesPortablePath) {
  for (bool transpose : {false, true})
    for (const Spec& c : specs()) {
      SCOPED_TRACE(c.name + (transpose ? " transpose" : ""));
      Data d = data_for(c, transpose);
      auto run = [&](bool library) {
        LibraryKernels mode(library);
        std::vector<Tensor> out{apply(c, transpose, inputs(d, DType::f32, Device()))};
        for (Tensor& g : grads(c, transpose, DType::f32, Device())) out.push_back(g);
        return out;
      };
      auto fast = run(true), portable = run(false);
      ASSERT_EQ(fast.size(), portable.size());
      for (size_t i = 0; i < fast.size(); ++i) {
        ASSERT_EQ(fast[i].shape(), portable[i].shape()) << "output " << i;
        EXPECT_LT(normwise_error(fast[i], portable[i]), 1e-5) << "output " << i;
      }
    }
}

// A LeNet-sized case (batch 16): large enough for oneDNN's vectorised kernels.
TEST(ConvLibrary, OneDnnMatchesPortablePathLeNet) {
  Spec c{"lenet2", 16, 6, 16, {12, 12}, {5, 5}};
  Data d = data_for(c, false);
  auto run = [&](bool library) {
    LibraryKernels mode(library);
    std::vector<Tensor> out{apply(c, false, inputs(d, DType::f32, Device()))};
    for (Tensor& g : grads(c, false, DType::f32, Device())) out.push_back(g);
    return out;
  };
  auto fast = run(true), portable = run(false);
  auto want = grads(c, false, DType::f64, Device());
  for (size_t i = 0; i < fast.size(); ++i)
    EXPECT_LT(normwise_error(fast[i], portable[i]), 1e-5) << "output " << i;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LT(normwise_error(fast[i + 1], want[i]), 1e-5) << "gradient " << i;
}

TEST(ConvLibrary, SwitchDefaultsOn) {
  // FLUX_LIBRARY_KERNELS=0 in the environment turns it off for a whole run.
  const bool env = flux::environment::flag("FLUX_LIBRARY_KERNELS");
  EXPECT_EQ(detail::library_kernels(), env);
  {
    LibraryKernels off(false);
    EXPECT_FALSE(detail::library_kernels());
  }
  EXPECT_EQ(detail::library_kernels(), env);
}

// ---- errors ----

#define EXPECT_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ThrowsMessage<Error>(StrEq(text)))

TEST(ConvErrors, Messages) {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({6, 1, 5, 5});
  EXPECT_ERROR(conv(x, w), "[conv] input has 3 channels, weight expects 1 (weight (6, 1, 5, 5))");
  EXPECT_ERROR(conv(zeros({2, 4, 8, 8}), zeros({6, 1, 3, 3}), Tensor(), {.groups = 2}),
               "[conv] input has 4 channels, weight expects 2 (weight (6, 1, 3, 3), groups 2)");
  EXPECT_ERROR(conv(x, zeros({6, 1, 3, 3}), Tensor(), {.groups = 2}),
               "[conv] input channels 3 are not divisible by groups 2");
  EXPECT_ERROR(conv(zeros({1, 4, 8, 8}), zeros({5, 2, 3, 3}), Tensor(), {.groups = 2}),
               "[conv] weight's 5 output channels are not divisible by groups 2 (weight (5, 2, 3, 3))");
  EXPECT_ERROR(conv(x, zeros({6, 3, 3, 3}), Tensor(), {.groups = 0}), "[conv] groups must be >= 1; got 0");
  EXPECT_ERROR(conv(x, zeros({6, 3, 5, 5}), zeros({5})),
               "[conv] bias must have shape (6,) for 6 output channels; got (5,)");
  EXPECT_ERROR(conv(x, zeros({6, 3, 5, 5}), zeros({6}, DType::f64)),
               "[conv] input is Float32 but bias is Float64; cast one (e.g. .f32())");
  EXPECT_ERROR(conv(zeros({3, 8, 8}), zeros({6, 3, 5, 5})),
               "[conv] expected a 4-dimensional (N, C, H, W) input for 2 spatial axes; got 3×8×8 Tensor{Float32, CPU} "
               "of shape (3, 8, 8)");
  EXPECT_ERROR(conv(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5})),
               "[conv] kernel (5, 5) ((5, 5) with dilation) is larger than the padded input (4, 4) (input (4, 4))");
  EXPECT_ERROR(conv(zeros({1, 1, 6, 6}), zeros({1, 1, 3, 3}), Tensor(), {.dilation = 3}),
               "[conv] kernel (3, 3) ((7, 7) with dilation) is larger than the padded input (6, 6) (input (6, 6))");
  EXPECT_ERROR(conv(x, zeros({6, 3, 5, 5}, DType::f64)),
               "[conv] input is Float32 but weight is Float64; cast one (e.g. .f32())");
  EXPECT_ERROR(conv(x, zeros({6, 3})),
               "[conv] weight must be (C_out, C_in / groups, kernel...) with 1 to 3 spatial axes; got shape (6, 3)");
  EXPECT_ERROR(conv(x, zeros({6, 3, 3, 3}), Tensor(), {.stride = {1, 2, 3}}),
               "[conv] stride needs 1 or 2 values for 2 spatial axes; got 3");
  EXPECT_ERROR(conv(x.cast(DType::i32), zeros({6, 3, 3, 3})),
               "[conv] supports Float32, Float64, Float16 and BFloat16 inputs; got Int32 (cast with .f32())");
  // conv_transpose: w (C_in, C_out / groups, k...)
  EXPECT_ERROR(conv_transpose(x, zeros({4, 2, 3, 3})),
               "[conv_transpose] input has 3 channels, weight expects 4 (weight (4, 2, 3, 3))");
  EXPECT_ERROR(conv_transpose(x, zeros({3, 2, 3, 3}), zeros({3})),
               "[conv_transpose] bias must have shape (2,) for 2 output channels; got (3,)");
  EXPECT_ERROR(conv_transpose(x, zeros({3, 2, 3, 3}), Tensor(), {.stride = 2, .output_padding = 2}),
               "[conv_transpose] output_padding (2, 2) must be smaller than the stride (2, 2) or the dilation (1, 1)");
  EXPECT_ERROR(conv_transpose(zeros({1, 1, 1, 1}), zeros({1, 1, 1, 1}), Tensor(), {.pad = 1}),
               "[conv_transpose] output size (-1, -1) is not positive (input (1, 1), kernel (1, 1), padding lo (1, 1) "
               "hi (1, 1))");
}

TEST_P(ConvDevice, DevicesMustMatch) {
  if (GetParam() == Device()) GTEST_SKIP() << "needs a second device";
  std::string dev = to_string(GetParam());
  Tensor x = zeros({1, 2, 5, 5}), w = to(zeros({3, 2, 3, 3}), GetParam());
  EXPECT_ERROR(conv(x, w), "[conv] input is on CPU but weight is on " + dev + "; move one with to(x, device)");
  EXPECT_ERROR(conv(to(x, GetParam()), w, zeros({3})),
               "[conv] input is on " + dev + " but bias is on CPU; move one with to(x, device)");
  EXPECT_ERROR(conv_transpose(x, to(zeros({2, 3, 3, 3}), GetParam())),
               "[conv_transpose] input is on CPU but weight is on " + dev + "; move one with to(x, device)");
}

}  // namespace

// ---- conv with a fused relu (what Conv(..., relu) runs): oneDNN's post-op on the CPU, conv then relu
// elsewhere; values and gradients equal relu(conv(...)) on every device ----

struct FusedReluCase {
  Tensor x, w, b, u;
  ConvParams p{.stride = Dims{1, 2}, .pad = 1};
};

FusedReluCase fused_relu_case(DType t, Device d) {
  seed(7);
  FusedReluCase c;
  c.x = to(randn({4, 3, 9, 8}).cast(t), d), c.w = to(randn({5, 3, 3, 3}).cast(t), d);
  c.b = to(randn({5}).cast(t), d), c.u = to(randn({4, 5, 9, 4}).cast(t), d);
  return c;
}

std::vector<Tensor> fused_relu_grads(const FusedReluCase& c, bool fused) {
  auto f = [&](const std::vector<Tensor>& v) {
    Tensor y = fused ? detail::conv_relu(v[0], v[1], v[2], c.p) : relu(conv(v[0], v[1], v[2], c.p));
    return sum(y * c.u);
  };
  std::vector<Tensor> out{fused ? detail::conv_relu(c.x, c.w, c.b, c.p) : relu(conv(c.x, c.w, c.b, c.p))};
  for (Tensor& g : gradient(f, std::vector<Tensor>{c.x, c.w, c.b})) out.push_back(g);
  return out;
}

TEST_P(ConvDevice, FusedReluMatchesConvThenRelu) {
  for (DType t : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    FusedReluCase c = fused_relu_case(t, GetParam());
    auto fused = fused_relu_grads(c, true), plain = fused_relu_grads(c, false);
    auto want = fused_relu_grads(fused_relu_case(DType::f64, Device()), false);  // float64 CPU reference
    for (size_t i = 0; i < fused.size(); ++i) {
      SCOPED_TRACE("output " + std::to_string(i));
      ASSERT_EQ(fused[i].shape(), plain[i].shape());
      EXPECT_EQ(fused[i].device(), GetParam());
      EXPECT_LT(normwise_error(fused[i], plain[i]), t == DType::f32 ? 1e-6 : 1e-14);
      EXPECT_LT(normwise_error(fused[i], want[i]), t == DType::f32 ? 1e-5 : 1e-14);
    }
    EXPECT_EQ(min(fused[0]).item<double>(), 0.0);  // relu ran
  }
}

TEST(ConvGradients, FusedReluFiniteDifferences) {
  FusedReluCase c = fused_relu_case(DType::f64, Device());
  auto analytic = fused_relu_grads(c, true);
  std::vector<Tensor> inputs{c.x, c.w, c.b};
  const double h = 1e-5;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<double> host = inputs[i].to_vector<double>(), g = analytic[i + 1].to_vector<double>();
    auto value = [&](size_t k, double v) {
      std::vector<double> moved = host;
      moved[k] = v;
      std::vector<Tensor> in = inputs;
      in[i] = Tensor(moved, inputs[i].shape());
      return sum(detail::conv_relu(in[0], in[1], in[2], c.p) * c.u).item<double>();
    };
    for (size_t k = 0; k < host.size(); k += 3) {
      double numeric = (value(k, host[k] + h) - value(k, host[k] - h)) / (2 * h);
      EXPECT_NEAR(g[k], numeric, 1e-6 * (1 + std::abs(numeric))) << "input " << i << " element " << k;
    }
  }
}

// On the CPU the fused float32 path is oneDNN's post-op; it equals the portable im2col path + relu.
TEST(ConvLibrary, FusedReluOneDnnMatchesPortablePath) {
  FusedReluCase c = fused_relu_case(DType::f32, Device());
  std::vector<Tensor> fast, portable;
  {
    LibraryKernels on(true);
    fast = fused_relu_grads(c, true);
  }
  {
    LibraryKernels off(false);
    portable = fused_relu_grads(c, true);
  }
  for (size_t i = 0; i < fast.size(); ++i) EXPECT_LT(normwise_error(fast[i], portable[i]), 1e-6) << "output " << i;
}

// One image with many output channels: the CPU forward splits its output channels over the threads
// (chunks of 16); values, with bias and the fused relu, equal the portable path.
TEST(ConvLibrary, OneImageSplitOverOutputChannelsMatchesPortablePath) {
  seed(11);
  for (int64_t out : {64, 72}) {
    SCOPED_TRACE("out channels " + std::to_string(out));
    Tensor x = randn({1, 16, 30, 31}), w = randn({out, 16, 3, 3}), b = randn({out});
    ConvParams p{.pad = 1};
    auto run = [&](bool library) {
      LibraryKernels mode(library);
      return std::vector<Tensor>{conv(x, w, b, p), detail::conv_relu(x, w, b, p), conv(x, w, Tensor(), p)};
    };
    auto fast = run(true), portable = run(false);
    for (size_t i = 0; i < fast.size(); ++i) {
      ASSERT_EQ(fast[i].shape(), (Shape{1, out, 30, 31}));
      EXPECT_LT(normwise_error(fast[i], portable[i]), 1e-5) << "output " << i;
    }
  }
}
