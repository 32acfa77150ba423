// Batch normalisation, fused: the forward reads x twice for the statistics (two-pass, accumulated in
// float64) and once to write y; the backward reads x and dy once for the two sums and once for dx.
// Threads split the channels. x, y, dy, dx are (n, c, s) row-major; per-channel arrays are (c,).
// The portable path (src/ops/normalisation.cpp) composes the same formulas from public ops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

namespace {

// Row sums with eight independent float64 accumulators (vectorisable; float64 for accuracy).
template <class T> double row_sum(const T* p, int64_t len) {
  double acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(p[k + j]);
  double total = 0;
  for (; k < len; ++k) total += double(p[k]);
  for (double a : acc) total += a;
  return total;
}
template <class T> double row_squared_deviations(const T* p, int64_t len, double mu) {
  double acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8)
    for (int j = 0; j < 8; ++j) {
      double d = double(p[k + j]) - mu;
      acc[j] += d * d;
    }
  double total = 0;
  for (; k < len; ++k) total += (double(p[k]) - mu) * (double(p[k]) - mu);
  for (double a : acc) total += a;
  return total;
}
// Σ g and Σ g (p - mu) over one row.
template <class T> void row_sums_dy(const T* p, const T* g, int64_t len, double mu, double& sum_g, double& sum_g_xc) {
  double a[8] = {}, b[8] = {};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8)
    for (int j = 0; j < 8; ++j) {
      a[j] += double(g[k + j]);
      b[j] += double(g[k + j]) * (double(p[k + j]) - mu);
    }
  for (; k < len; ++k) {
    sum_g += double(g[k]);
    sum_g_xc += double(g[k]) * (double(p[k]) - mu);
  }
  for (int j = 0; j < 8; ++j) sum_g += a[j], sum_g_xc += b[j];
}

// (n, c) input (s == 1, e.g. after Dense): threads take blocks of channels and walk the rows, so each
// row segment is read contiguously (the per-channel loops below would stride by c).
template <class T>
void forward_rows(const T* x, const T* weight, const T* bias, T* y, T* mean, T* var, int64_t n, int64_t c, double eps) {
  parallel_for(c, 64, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    std::vector<double> mu(static_cast<size_t>(w), 0.0), sq(static_cast<size_t>(w), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j) mu[j] += double(x[i * c + c0 + j]);
    for (int64_t j = 0; j < w; ++j) mu[j] /= double(n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j) {
        double d = double(x[i * c + c0 + j]) - mu[j];
        sq[j] += d * d;
      }
    std::vector<T> a(static_cast<size_t>(w)), b(static_cast<size_t>(w));
    for (int64_t j = 0; j < w; ++j) {
      const int64_t ch = c0 + j;
      const double v = sq[j] / double(n), scale = (weight ? double(weight[ch]) : 1.0) / std::sqrt(v + eps);
      a[j] = T(scale);
      b[j] = T((bias ? double(bias[ch]) : 0.0) - mu[j] * scale);
      mean[ch] = T(mu[j]);
      var[ch] = T(v);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j) y[i * c + c0 + j] = x[i * c + c0 + j] * a[j] + b[j];
  });
}

template <class T>
void backward_rows(const T* x, const T* dy, const T* weight, const T* mean, const T* var, T* dx, T* dweight, T* dbias,
                   int64_t n, int64_t c, double eps) {
  parallel_for(c, 64, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    std::vector<double> sum_dy(static_cast<size_t>(w), 0.0), sum_dy_xc(static_cast<size_t>(w), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const int64_t at = i * c + c0 + j;
        sum_dy[j] += double(dy[at]);
        sum_dy_xc[j] += double(dy[at]) * (double(x[at]) - double(mean[c0 + j]));
      }
    std::vector<T> ta(static_cast<size_t>(w)), tk(static_cast<size_t>(w)), tb(static_cast<size_t>(w));
    for (int64_t j = 0; j < w; ++j) {
      const int64_t ch = c0 + j;
      const double inv = 1.0 / std::sqrt(double(var[ch]) + eps), a = (weight ? double(weight[ch]) : 1.0) * inv;
      const double k_xc = a * inv * inv * sum_dy_xc[j] / double(n);
      ta[j] = T(a);
      tk[j] = T(k_xc);
      tb[j] = T(k_xc * double(mean[ch]) - a * sum_dy[j] / double(n));
      if (dweight) dweight[ch] = T(inv * sum_dy_xc[j]);
      if (dbias) dbias[ch] = T(sum_dy[j]);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const int64_t at = i * c + c0 + j;
        dx[at] = dy[at] * ta[j] - x[at] * tk[j] + tb[j];
      }
  });
}

template <class T>
void forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* var, int64_t n, int64_t c, int64_t s,
             double eps) {
  if (s == 1) return forward_rows(x, weight, bias, y, mean, var, n, c, eps);
  const double m = double(n * s);
  parallel_for(c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      double total = 0;
      for (int64_t i = 0; i < n; ++i) total += row_sum(x + (i * c + ch) * s, s);
      const double mu = total / m;
      double squares = 0;
      for (int64_t i = 0; i < n; ++i) squares += row_squared_deviations(x + (i * c + ch) * s, s, mu);
      const double v = squares / m;
      const double scale = (weight ? double(weight[ch]) : 1.0) / std::sqrt(v + eps);
      const T a = T(scale), b = T((bias ? double(bias[ch]) : 0.0) - mu * scale);
      for (int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * s;
        T* q = y + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) q[k] = p[k] * a + b;
      }
      mean[ch] = T(mu);
      var[ch] = T(v);
    }
  });
}

template <class T>
void backward(const T* x, const T* dy, const T* weight, const T* mean, const T* var, T* dx, T* dweight, T* dbias,
              int64_t n, int64_t c, int64_t s, double eps) {
  if (s == 1) return backward_rows(x, dy, weight, mean, var, dx, dweight, dbias, n, c, eps);
  const double m = double(n * s);
  parallel_for(c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const double mu = double(mean[ch]);
      double sum_dy = 0, sum_dy_xc = 0;
      for (int64_t i = 0; i < n; ++i) row_sums_dy(x + (i * c + ch) * s, dy + (i * c + ch) * s, s, mu, sum_dy, sum_dy_xc);
      const double inv = 1.0 / std::sqrt(double(var[ch]) + eps);
      const double a = (weight ? double(weight[ch]) : 1.0) * inv;
      const double k_xc = a * inv * inv * sum_dy_xc / m;
      // dx = a dy - k_xc (x - mu) - a sum_dy / m = a dy - k_xc x + (k_xc mu - a sum_dy / m)
      const T ta = T(a), tk = T(k_xc), tb = T(k_xc * mu - a * sum_dy / m);
      for (int64_t i = 0; i < n; ++i) {
        const T* p = x + (i * c + ch) * s;
        const T* g = dy + (i * c + ch) * s;
        T* q = dx + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) q[k] = g[k] * ta - p[k] * tk + tb;
      }
      if (dweight) dweight[ch] = T(inv * sum_dy_xc);
      if (dbias) dbias[ch] = T(sum_dy);
    }
  });
}

template <class T>
void affine(const T* x, const T* scale, const T* shift, T* y, int64_t n, int64_t c, int64_t s) {
  parallel_for(n * c, std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, s)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // row r = (i, ch)
      const int64_t ch = r % c;
      const T a = scale[ch], b = shift ? shift[ch] : T(0);
      const T* p = x + r * s;
      T* q = y + r * s;
      for (int64_t k = 0; k < s; ++k) q[k] = p[k] * a + b;
    }
  });
}

// ---- row normalisation (layernorm, groupnorm): rows split across threads, each row read twice for
// its statistics (two-pass, float64) and once to write y; the backward reads x and dy twice per row
// (the two sums, then dx and the dweight/dbias partial sums). dweight/dbias sum over rows: threads
// take blocks of rows with float64 partial sums per block, added in block order: the blocks depend on
// (r, d) only, so the result is the same whatever the thread count.
constexpr int64_t kRowNormElements = 16384;  // elements per block of rows
int64_t rows_per_block(int64_t d) { return std::max<int64_t>(1, kRowNormElements / std::max<int64_t>(1, d)); }
// fn(block, first row, end row) for every block of rows, blocks spread over the threads.
template <class F> void for_row_blocks(int64_t r, int64_t d, const F& fn) {
  const int64_t grain = rows_per_block(d), blocks = (r + grain - 1) / grain;
  parallel_for(blocks, 2, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b, b * grain, std::min(r, (b + 1) * grain));
  });
}

template <class T>
void normalise_rows(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t r, int64_t d,
                    double eps) {
  for_row_blocks(r, d, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const T* xi = x + i * d;
      T* yi = y + i * d;
      const double mu = row_sum(xi, d) / double(d);
      const double inv = 1.0 / std::sqrt(row_squared_deviations(xi, d, mu) / double(d) + eps);
      mean[i] = T(mu);
      rstd[i] = T(inv);
      const T m = T(mu), s = T(inv);
      if (weight && bias)
        for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - m) * s * weight[j] + bias[j];
      else if (weight)
        for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - m) * s * weight[j];
      else if (bias)
        for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - m) * s + bias[j];
      else
        for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - m) * s;
    }
  });
}

template <class T>
void normalise_rows_backward(const T* x, const T* dy, const T* weight, const T* mean, const T* rstd, T* dx,
                             T* dweight, T* dbias, int64_t r, int64_t d) {
  const int64_t blocks = (r + rows_per_block(d) - 1) / rows_per_block(d);
  const bool params = dweight || dbias;
  std::vector<double> partial(params ? size_t(blocks) * size_t(2 * d) : 0, 0.0);  // [block][dweight d | dbias d]
  for_row_blocks(r, d, [&](int64_t block, int64_t r0, int64_t r1) {
    double* pw = params ? partial.data() + size_t(block) * size_t(2 * d) : nullptr;
    double* pb = pw ? pw + d : nullptr;
    for (int64_t i = r0; i < r1; ++i) {
      const T* xi = x + i * d;
      const T* gi = dy + i * d;
      T* dxi = dx + i * d;
      const double mu = double(mean[i]), s = double(rstd[i]);
      double sum_g = 0, sum_gx = 0;  // Σ g, Σ g x̂ with g = dy weight
      for (int64_t j = 0; j < d; ++j) {
        const double g = weight ? double(gi[j]) * double(weight[j]) : double(gi[j]);
        sum_g += g;
        sum_gx += g * (double(xi[j]) - mu) * s;
      }
      const double mg = sum_g / double(d), mgx = sum_gx / double(d);
      for (int64_t j = 0; j < d; ++j) {
        const double xh = (double(xi[j]) - mu) * s;
        const double g = weight ? double(gi[j]) * double(weight[j]) : double(gi[j]);
        dxi[j] = T(s * (g - mg - xh * mgx));
        if (pw) {
          pw[j] += double(gi[j]) * xh;
          pb[j] += double(gi[j]);
        }
      }
    }
  });
  if (!params) return;
  for (int64_t j = 0; j < d; ++j) {
    double w = 0, b = 0;
    for (int64_t k = 0; k < blocks; ++k) {
      w += partial[size_t(k) * size_t(2 * d) + size_t(j)];
      b += partial[size_t(k) * size_t(2 * d) + size_t(d + j)];
    }
    if (dweight) dweight[j] = T(w);
    if (dbias) dbias[j] = T(b);
  }
}

template <class T> const T* in(const void* p) { return static_cast<const T*>(p); }
template <class T> T* out(void* p) { return static_cast<T*>(p); }

}  // namespace

bool batchnorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* var,
                       int64_t n, int64_t c, int64_t s, double eps) {
  if (t == DType::f32) forward(in<float>(x), in<float>(weight), in<float>(bias), out<float>(y), out<float>(mean), out<float>(var), n, c, s, eps);
  else if (t == DType::f64) forward(in<double>(x), in<double>(weight), in<double>(bias), out<double>(y), out<double>(mean), out<double>(var), n, c, s, eps);
  else return false;
  return true;
}

bool batchnorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* var,
                        void* dx, void* dweight, void* dbias, int64_t n, int64_t c, int64_t s, double eps) {
  if (t == DType::f32)
    backward(in<float>(x), in<float>(dy), in<float>(weight), in<float>(mean), in<float>(var), out<float>(dx), out<float>(dweight), out<float>(dbias), n, c, s, eps);
  else if (t == DType::f64)
    backward(in<double>(x), in<double>(dy), in<double>(weight), in<double>(mean), in<double>(var), out<double>(dx), out<double>(dweight), out<double>(dbias), n, c, s, eps);
  else return false;
  return true;
}

bool channel_affine(DType t, const void* x, const void* scale, const void* shift, void* y, int64_t n, int64_t c,
                    int64_t s) {
  if (t == DType::f32) affine(in<float>(x), in<float>(scale), in<float>(shift), out<float>(y), n, c, s);
  else if (t == DType::f64) affine(in<double>(x), in<double>(scale), in<double>(shift), out<double>(y), n, c, s);
  else return false;
  return true;
}

bool rownorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* rstd,
                     int64_t r, int64_t d, double eps) {
  if (t == DType::f32)
    normalise_rows(in<float>(x), in<float>(weight), in<float>(bias), out<float>(y), out<float>(mean), out<float>(rstd),
                   r, d, eps);
  else if (t == DType::f64)
    normalise_rows(in<double>(x), in<double>(weight), in<double>(bias), out<double>(y), out<double>(mean),
                   out<double>(rstd), r, d, eps);
  else
    return false;
  return true;
}

bool rownorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* rstd,
                      void* dx, void* dweight, void* dbias, int64_t r, int64_t d) {
  if (t == DType::f32)
    normalise_rows_backward(in<float>(x), in<float>(dy), in<float>(weight), in<float>(mean), in<float>(rstd),
                            out<float>(dx), out<float>(dweight), out<float>(dbias), r, d);
  else if (t == DType::f64)
    normalise_rows_backward(in<double>(x), in<double>(dy), in<double>(weight), in<double>(mean), in<double>(rstd),
                            out<double>(dx), out<double>(dweight), out<double>(dbias), r, d);
  else
    return false;
  return true;
}

}  // namespace flux::cpu_backend
