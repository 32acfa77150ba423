// The index math of the CUDA/AMDGPU window kernels (src/backends/cuda/window.hpp: im2col, col2im,
// pooling forward, first maximum, backward gather), run here on the host: the kernels are loops over
// exactly these functions, so their arithmetic is checked on machines without a GPU (the kernels
// themselves run in the device suites where a GPU exists: scripts/gpu-check.sh). Each result is
// compared with a float64 reference written from include/flux/backend.hpp's formulas, over a few
// thousand random geometries (1 to 3 spatial axes, stride, asymmetric padding, dilation, groups),
// with ties and NaN in the pooling inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "src/backends/cuda/window.hpp"

namespace {

using flux::backend::ConvGeometry;
using flux::backend::PoolOp;
using flux::cuda_backend::Window3;

int64_t prod(const int64_t* v, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= v[i];
  return p;
}

void unflatten(int64_t f, const int64_t* sizes, int n, int64_t* idx) {
  for (int i = n - 1; i >= 0; --i) {
    idx[i] = f % sizes[i];
    f /= sizes[i];
  }
}

// The in-plane input position that window position k of output o reads, -1 for padding.
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

struct Random {
  std::mt19937_64 rng{20261203};
  int64_t operator()(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
};

// A random valid geometry; pools have groups 1, no dilation and padding below the kernel size.
ConvGeometry random_geometry(Random& r, bool pool) {
  for (;;) {
    ConvGeometry g;
    g.spatial = int(r(1, 3));
    g.batch = r(1, 2);
    g.groups = pool ? 1 : r(1, 3);
    g.in_channels = g.out_channels = g.groups * r(1, 2);
    bool ok = true;
    for (int i = 0; i < g.spatial; ++i) {
      g.in[i] = r(1, 7);
      g.kernel[i] = r(1, 4);
      g.stride[i] = r(1, 3);
      g.dilation[i] = pool ? 1 : r(1, 2);
      g.pad_lo[i] = r(0, pool ? g.kernel[i] - 1 : 2);
      g.pad_hi[i] = r(0, pool ? g.kernel[i] - 1 : 2);
      int64_t span = g.in[i] + g.pad_lo[i] + g.pad_hi[i] - g.dilation[i] * (g.kernel[i] - 1) - 1;
      if (span < 0) ok = false;
      else g.out[i] = span / g.stride[i] + 1;
    }
    if (ok) return g;
  }
}

std::string describe(const ConvGeometry& g) {
  std::string s = std::to_string(g.spatial) + "-D, batch " + std::to_string(g.batch) + ", channels " +
                  std::to_string(g.in_channels) + ", groups " + std::to_string(g.groups);
  for (int i = 0; i < g.spatial; ++i)
    s += "; axis " + std::to_string(i) + ": in " + std::to_string(g.in[i]) + " k " + std::to_string(g.kernel[i]) +
         " s " + std::to_string(g.stride[i]) + " pad " + std::to_string(g.pad_lo[i]) + "/" +
         std::to_string(g.pad_hi[i]) + " dil " + std::to_string(g.dilation[i]) + " out " + std::to_string(g.out[i]);
  return s;
}

bool same(double got, double want) {
  return got == want || (std::isnan(got) && std::isnan(want)) || std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want));
}

TEST(GpuWindowMath, Im2colAndCol2imMatchTheFormulaOnRandomGeometries) {
  Random r;
  for (int trial = 0; trial < 2000; ++trial) {
    const ConvGeometry g = random_geometry(r, false);
    const Window3 a = flux::cuda_backend::window3(g);
    const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial), I = prod(g.in, g.spatial);
    const int64_t rows = g.batch * g.in_channels;  // col (N, G, C/G * K, P) is (N * C, K, P)
    ASSERT_EQ(a.kernel_size, K);
    ASSERT_EQ(a.out_size, P);
    ASSERT_EQ(a.in_size, I);
    std::vector<double> x(size_t(rows * I));
    for (double& v : x) v = double(r(-50, 50));
    std::vector<double> col_ref(size_t(rows * K * P)), col_in(col_ref.size()), dx(x.size()), dx_ref(x.size());
    for (double& v : col_in) v = double(r(-9, 9));
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dx_ref[i] = double(r(-3, 3));
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t o = 0; o < P; ++o) {
          const int64_t s = source_of(g, o, k);
          const size_t c = size_t((row * K + k) * P + o);
          col_ref[c] = s < 0 ? 0.0 : x[size_t(row * I + s)];
          if (s >= 0) dx_ref[size_t(row * I + s)] += col_in[c];
        }
    for (size_t k = 0; k < col_ref.size(); ++k) {
      const double got = flux::cuda_backend::im2col_value(x.data(), a, int64_t(k));
      ASSERT_EQ(got, col_ref[k]) << "im2col element " << k << " of " << describe(g);
    }
    for (size_t j = 0; j < dx.size(); ++j) {
      const double got = flux::cuda_backend::col2im_value(col_in.data(), dx.data(), a, int64_t(j));
      ASSERT_EQ(got, dx_ref[j]) << "col2im element " << j << " of " << describe(g);
    }
  }
}

TEST(GpuWindowMath, PoolingMatchesTheReferenceWithTiesAndNaN) {
  Random r;
  for (int trial = 0; trial < 2000; ++trial) {
    const ConvGeometry g = random_geometry(r, true);
    const Window3 a = flux::cuda_backend::window3(g);
    const int64_t K = prod(g.kernel, g.spatial), P = prod(g.out, g.spatial), I = prod(g.in, g.spatial);
    const int64_t planes = g.batch * g.in_channels;
    std::vector<double> x(size_t(planes * I));
    for (double& v : x) v = double(r(-2, 2));  // many ties
    if (trial % 5 == 0) x[size_t(r(0, int64_t(x.size()) - 1))] = NAN;
    std::vector<double> dy(size_t(planes * P));
    for (double& v : dy) v = double(r(1, 9));
    for (PoolOp op : {PoolOp::max, PoolOp::mean}) {
      const bool is_max = op == PoolOp::max;
      std::vector<double> y_ref(dy.size()), dx_ref(x.size(), 0.5), y(dy.size()), dx(x.size(), 0.5);
      std::vector<int64_t> first_ref(dy.size(), -1), first(dy.size());
      for (int64_t p = 0; p < planes; ++p)
        for (int64_t o = 0; o < P; ++o) {
          double m = -INFINITY, sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t s = source_of(g, o, k);
            if (s < 0) continue;  // padding: never the maximum, zero in the sum
            const double v = x[size_t(p * I + s)];
            sum += v;
            if (!std::isnan(m) && (std::isnan(v) || v > m)) m = v;
          }
          const size_t at = size_t(p * P + o);
          y_ref[at] = is_max ? m : sum / double(K);
          for (int64_t k = 0; k < K && is_max && first_ref[at] < 0; ++k) {
            const int64_t s = source_of(g, o, k);
            if (s >= 0 && (x[size_t(p * I + s)] == m || (std::isnan(m) && std::isnan(x[size_t(p * I + s)]))))
              first_ref[at] = s;
          }
          if (is_max) {
            if (first_ref[at] >= 0) dx_ref[size_t(p * I + first_ref[at])] += dy[at];
          } else {
            for (int64_t k = 0; k < K; ++k)
              if (int64_t s = source_of(g, o, k); s >= 0) dx_ref[size_t(p * I + s)] += dy[at] / double(K);
          }
        }
      for (size_t k = 0; k < y.size(); ++k) {
        y[k] = is_max ? flux::cuda_backend::pool_value<double, PoolOp::max>(x.data(), a, int64_t(k))
                      : flux::cuda_backend::pool_value<double, PoolOp::mean>(x.data(), a, int64_t(k));
        ASSERT_TRUE(same(y[k], y_ref[k])) << (is_max ? "max" : "mean") << " output " << k << ": " << y[k] << " vs "
                                          << y_ref[k] << " in " << describe(g);
        if (is_max) {
          first[k] = flux::cuda_backend::pool_first_max(x.data(), y.data(), a, int64_t(k));
          ASSERT_EQ(first[k], first_ref[k]) << "first maximum of output " << k << " in " << describe(g);
        }
      }
      for (size_t j = 0; j < dx.size(); ++j) {
        const double got = is_max ? flux::cuda_backend::pool_gather<double, PoolOp::max>(dy.data(), first.data(), dx.data(), a, int64_t(j))
                                  : flux::cuda_backend::pool_gather<double, PoolOp::mean>(dy.data(), nullptr, dx.data(), a, int64_t(j));
        ASSERT_TRUE(same(got, dx_ref[j])) << (is_max ? "max" : "mean") << " gradient " << j << ": " << got << " vs "
                                          << dx_ref[j] << " in " << describe(g);
      }
    }
  }
}

TEST(GpuWindowMath, Float32MaxKeepsNaNAndPaddingOnlyWindowsGiveMinusInfinity) {
  // 1-D, in 3, kernel 2, stride 1, pad 1/1: windows [-1, 0], [0, 1], [1, 2], [2, 3].
  ConvGeometry g;
  g.spatial = 1, g.batch = 1, g.in_channels = g.out_channels = 1;
  g.in[0] = 3, g.kernel[0] = 2, g.pad_lo[0] = g.pad_hi[0] = 1, g.out[0] = 4;
  const Window3 a = flux::cuda_backend::window3(g);
  const float x[3] = {-5.f, NAN, -7.f};
  EXPECT_EQ((flux::cuda_backend::pool_value<float, PoolOp::max>(x, a, 0)), -5.f);  // padding is not 0 here
  EXPECT_TRUE(std::isnan(flux::cuda_backend::pool_value<float, PoolOp::max>(x, a, 1)));
  EXPECT_TRUE(std::isnan(flux::cuda_backend::pool_value<float, PoolOp::max>(x, a, 2)));
  EXPECT_EQ((flux::cuda_backend::pool_value<float, PoolOp::max>(x, a, 3)), -7.f);
  EXPECT_EQ((flux::cuda_backend::pool_value<float, PoolOp::mean>(x, a, 0)), -2.5f);  // divides by the full window
  ConvGeometry only_pad = g;  // kernel 1 at pad 1: the first window is all padding
  only_pad.kernel[0] = 1, only_pad.out[0] = 5;
  EXPECT_EQ((flux::cuda_backend::pool_value<float, PoolOp::max>(x, flux::cuda_backend::window3(only_pad), 0)), -INFINITY);
}

}  // namespace
