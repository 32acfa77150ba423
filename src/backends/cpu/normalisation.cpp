// Batch normalisation, fused: the forward reads x twice for the statistics (two-pass, accumulated in
// float64) and once to write y; the backward reads x and dy once for the two sums and once for dx.
// Threads split the channels. x, y, dy, dx are (n, c, s) row-major; per-channel arrays are (c,).
// bf16/f16 activations (backend.hpp: per-channel and per-row arrays then Float32) run the same code on
// rows converted in cache (see "bf16/f16 activations" below); BatchNorm's s == 1 case declines.
// bf16 BatchNorm training on AVX-512 takes batchnorm_bf16.cpp's kernels (widened in registers, same
// bits); the template path below stays the portable path and its reference.
// The portable path (src/ops/normalisation.cpp) composes the same formulas from public ops.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

namespace {

// Row sums with eight independent float64 accumulators (vectorisable; float64 for accuracy).
template <class T> FLUX_CPU_INLINE double row_sum(const T* p, int64_t len) {
  double acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(p[k + j]);
  double total = 0;
  for (; k < len; ++k) total += double(p[k]);
  for (double a : acc) total += a;
  return total;
}
template <class T> FLUX_CPU_INLINE double row_squared_deviations(const T* p, int64_t len, double mu) {
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

// ---- bf16/f16 activations (x, y, dy, dx), Float32 per-channel / per-row arrays ----
// The kernels below are written once for storage S and compute type T. S == T (float, double): the
// arrays are read and written in place. S = uint16_t (Float16/BFloat16 of dtype dt, T = float): each
// row of x (and dy) is converted into a per-thread float32 row as it is read, and y (dx) is computed
// there and converted down as it is written: bitwise the cast up, the float32 kernel and the cast
// down, without full-tensor float32 copies.
struct HalfRows {
  std::vector<float> x, g, out;
};
template <class S> HalfRows* half_rows(int64_t len) {
  if constexpr (std::is_same_v<S, uint16_t>) {
    thread_local HalfRows rows;
    for (auto* v : {&rows.x, &rows.g, &rows.out})
      if (int64_t(v->size()) < len) v->resize(size_t(len));
    return &rows;
  } else {
    return nullptr;
  }
}
// A row of len values of p as T: p itself, or converted into buf.
template <class T, class S> const T* load(DType dt, const S* p, float* buf, int64_t len) {
  if constexpr (std::is_same_v<S, T>) return p;
  else return half_storage_to_float(dt, p, buf, len), buf;
}
// Where a row of p is computed (p itself, or buf), and its store into p (nothing for p itself).
template <class T, class S> auto dest(S* p, float* buf) {
  if constexpr (std::is_same_v<std::remove_const_t<S>, T>) return p;
  else return buf;
}
template <class T, class S> void store(DType dt, const T* q, S* p, int64_t len) {
  if constexpr (!std::is_same_v<S, T>) float_to_half_storage(dt, q, p, len);
}
float* buffer(std::vector<float>* v) { return v ? v->data() : nullptr; }

// Half storage: a channel's n rows of x (and dy) are converted once into per-thread buffers when they
// fit in L2 (kChannelFloats each; ResNet-18's largest BatchNorm at 112² b32 holds 100K); larger ones
// are converted row by row on each of the passes. The arithmetic is the same either way.
constexpr int64_t kChannelFloats = int64_t(1) << 17;

template <class S, class T>
void forward(DType dt, const S* x, const T* weight, const T* bias, S* y, T* mean, T* var, int64_t n, int64_t c,
             int64_t s, double eps) {
  if constexpr (std::is_same_v<S, T>)
    if (s == 1) return forward_rows(x, weight, bias, y, mean, var, n, c, eps);
  const double m = double(n * s);
  const bool whole = !std::is_same_v<S, T> && n * s <= kChannelFloats;
  parallel_for(c, 1, [&](int64_t c0, int64_t c1) {
    HalfRows* rows = half_rows<S>(whole ? n * s : s);
    float* bx = buffer(rows ? &rows->x : nullptr);
    for (int64_t ch = c0; ch < c1; ++ch) {
      if (whole)
        for (int64_t i = 0; i < n; ++i) load<T>(dt, x + (i * c + ch) * s, bx + i * s, s);
      // Row i of the channel as T: in place, from the channel's buffer, or converted into the row buffer now.
      auto row = [&](int64_t i) {
        return whole ? dest<T>(x + (i * c + ch) * s, bx + i * s) : load<T>(dt, x + (i * c + ch) * s, bx, s);
      };
      double total = 0;
      for (int64_t i = 0; i < n; ++i) total += row_sum(row(i), s);
      const double mu = total / m;
      double squares = 0;
      for (int64_t i = 0; i < n; ++i) squares += row_squared_deviations(row(i), s, mu);
      const double v = squares / m;
      const double scale = (weight ? double(weight[ch]) : 1.0) / std::sqrt(v + eps);
      const T a = T(scale), b = T((bias ? double(bias[ch]) : 0.0) - mu * scale);
      for (int64_t i = 0; i < n; ++i) {
        const T* p = row(i);
        T* q = dest<T>(y + (i * c + ch) * s, buffer(rows ? &rows->out : nullptr));
        for (int64_t k = 0; k < s; ++k) q[k] = p[k] * a + b;
        store(dt, q, y + (i * c + ch) * s, s);
      }
      mean[ch] = T(mu);
      var[ch] = T(v);
    }
  });
}

template <class S, class T>
void backward(DType dt, const S* x, const S* dy, const T* weight, const T* mean, const T* var, S* dx, T* dweight,
              T* dbias, int64_t n, int64_t c, int64_t s, double eps) {
  if constexpr (std::is_same_v<S, T>)
    if (s == 1) return backward_rows(x, dy, weight, mean, var, dx, dweight, dbias, n, c, eps);
  const double m = double(n * s);
  const bool whole = !std::is_same_v<S, T> && n * s <= kChannelFloats;
  parallel_for(c, 1, [&](int64_t c0, int64_t c1) {
    HalfRows* rows = half_rows<S>(whole ? n * s : s);
    float *bx = buffer(rows ? &rows->x : nullptr), *bg = buffer(rows ? &rows->g : nullptr);
    for (int64_t ch = c0; ch < c1; ++ch) {
      if (whole)
        for (int64_t i = 0; i < n; ++i) {
          load<T>(dt, x + (i * c + ch) * s, bx + i * s, s);
          load<T>(dt, dy + (i * c + ch) * s, bg + i * s, s);
        }
      auto rows_at = [&](int64_t i, const T*& p, const T*& g) {
        const int64_t at = (i * c + ch) * s;
        p = whole ? dest<T>(x + at, bx + i * s) : load<T>(dt, x + at, bx, s);
        g = whole ? dest<T>(dy + at, bg + i * s) : load<T>(dt, dy + at, bg, s);
      };
      const double mu = double(mean[ch]);
      double sum_dy = 0, sum_dy_xc = 0;
      const T *p = nullptr, *g = nullptr;
      for (int64_t i = 0; i < n; ++i) {
        rows_at(i, p, g);
        row_sums_dy(p, g, s, mu, sum_dy, sum_dy_xc);
      }
      const double inv = 1.0 / std::sqrt(double(var[ch]) + eps);
      const double a = (weight ? double(weight[ch]) : 1.0) * inv;
      const double k_xc = a * inv * inv * sum_dy_xc / m;
      // dx = a dy - k_xc (x - mu) - a sum_dy / m = a dy - k_xc x + (k_xc mu - a sum_dy / m)
      const T ta = T(a), tk = T(k_xc), tb = T(k_xc * mu - a * sum_dy / m);
      for (int64_t i = 0; i < n; ++i) {
        rows_at(i, p, g);
        T* q = dest<T>(dx + (i * c + ch) * s, buffer(rows ? &rows->out : nullptr));
        for (int64_t k = 0; k < s; ++k) q[k] = g[k] * ta - p[k] * tk + tb;
        store(dt, q, dx + (i * c + ch) * s, s);
      }
      if (dweight) dweight[ch] = T(inv * sum_dy_xc);
      if (dbias) dbias[ch] = T(sum_dy);
    }
  });
}

// BatchNorm inference: y = x * scale + shift per channel.
template <class S, class T>
void affine(DType dt, const S* x, const T* scale, const T* shift, S* y, int64_t n, int64_t c, int64_t s) {
  parallel_for(n * c, std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, s)), [&](int64_t r0, int64_t r1) {
    HalfRows* rows = half_rows<S>(s);
    for (int64_t r = r0; r < r1; ++r) {  // row r = (i, ch)
      const int64_t ch = r % c;
      const T a = scale[ch], b = shift ? shift[ch] : T(0);
      const T* p = load<T>(dt, x + r * s, buffer(rows ? &rows->x : nullptr), s);
      T* q = dest<T>(y + r * s, buffer(rows ? &rows->out : nullptr));
      for (int64_t k = 0; k < s; ++k) q[k] = p[k] * a + b;
      store(dt, q, y + r * s, s);
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

// One row: its statistics into mean_i, rstd_i and y. Inlined (with the sums above) into each ISA
// variant of normalise_row_range below, so every level runs the same arithmetic in the same order.
template <class T>
FLUX_CPU_INLINE void normalise_row(const T* __restrict xi, const T* weight, const T* bias, T* __restrict yi, T& mean_i,
                                   T& rstd_i, int64_t d, double eps) {
  const double mu = row_sum(xi, d) / double(d);
  const double inv = 1.0 / std::sqrt(row_squared_deviations(xi, d, mu) / double(d) + eps);
  mean_i = T(mu);
  rstd_i = T(inv);
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

// Float32 rows [r0, r1) of normalise_row compiled per ISA level (isa.hpp).
FLUX_CPU_INLINE void normalise_row_range_body(const float* x, const float* weight, const float* bias, float* y,
                                              float* mean, float* rstd, int64_t r0, int64_t r1, int64_t d, double eps) {
  for (int64_t i = r0; i < r1; ++i) normalise_row(x + i * d, weight, bias, y + i * d, mean[i], rstd[i], d, eps);
}
FLUX_CPU_VARIANTS(normalise_row_range, normalise_row_range_body)

// y_low (Float32 rows only): each block of y's rows also rounded to `low` while it is in cache.
template <class S, class T>
void normalise_rows(DType dt, const S* x, const T* weight, const T* bias, S* y, T* mean, T* rstd, int64_t r, int64_t d,
                    double eps, DType low = DType::f32, uint16_t* y_low = nullptr) {
  for_row_blocks(r, d, [&](int64_t, int64_t r0, int64_t r1) {
    if constexpr (std::is_same_v<S, float>) {
      normalise_row_range(x, weight, bias, y, mean, rstd, r0, r1, d, eps);
      if (y_low) float_rows_to_half_storage(low, y + r0 * d, d, y_low + r0 * d, d, r1 - r0, d);  // on this thread
    } else {
      HalfRows* rows = half_rows<S>(d);
      for (int64_t i = r0; i < r1; ++i) {
        T* yi = dest<T>(y + i * d, buffer(rows ? &rows->out : nullptr));
        const T* xi = load<T>(dt, x + i * d, buffer(rows ? &rows->x : nullptr), d);
        if constexpr (std::is_same_v<T, float>)
          normalise_row_range(xi, weight, bias, yi, mean + i, rstd + i, int64_t(0), int64_t(1), d, eps);
        else
          normalise_row(xi, weight, bias, yi, mean[i], rstd[i], d, eps);
        store(dt, yi, y + i * d, d);
      }
    }
  });
}

// One row's dx, and its terms of the dweight / dbias partial sums pw, pb (null: not wanted). The two
// row sums run in 8 float64 lanes (as row_sums_dy); inlined into each ISA variant of
// normalise_row_backward_range below, so every level sums in the same order.
template <class T>
FLUX_CPU_INLINE void normalise_row_backward(const T* __restrict xi, const T* __restrict gi, const T* weight, T mean_i,
                                            T rstd_i, T* __restrict dxi, double* pw, double* pb, int64_t d) {
  const double mu = double(mean_i), s = double(rstd_i);
  // g = dy weight; the sums Σ g and Σ g x̂
  auto g_at = [&](int64_t j) { return weight ? double(gi[j]) * double(weight[j]) : double(gi[j]); };
  double a[8] = {}, b[8] = {};
  int64_t k = 0;
  if (weight)
    for (; k + 8 <= d; k += 8)
      for (int j = 0; j < 8; ++j) {
        const double g = double(gi[k + j]) * double(weight[k + j]);
        a[j] += g;
        b[j] += g * ((double(xi[k + j]) - mu) * s);
      }
  else
    for (; k + 8 <= d; k += 8)
      for (int j = 0; j < 8; ++j) {
        const double g = double(gi[k + j]);
        a[j] += g;
        b[j] += g * ((double(xi[k + j]) - mu) * s);
      }
  double sum_g = 0, sum_gx = 0;
  for (; k < d; ++k) {
    sum_g += g_at(k);
    sum_gx += g_at(k) * ((double(xi[k]) - mu) * s);
  }
  for (int j = 0; j < 8; ++j) sum_g += a[j], sum_gx += b[j];
  const double mg = sum_g / double(d), mgx = sum_gx / double(d);
  if (weight)
    for (int64_t j = 0; j < d; ++j)
      dxi[j] = T(s * (double(gi[j]) * double(weight[j]) - mg - (double(xi[j]) - mu) * s * mgx));
  else
    for (int64_t j = 0; j < d; ++j) dxi[j] = T(s * (double(gi[j]) - mg - (double(xi[j]) - mu) * s * mgx));
  if (pw)
    for (int64_t j = 0; j < d; ++j) {
      pw[j] += double(gi[j]) * ((double(xi[j]) - mu) * s);
      pb[j] += double(gi[j]);
    }
}

// Float32 rows [r0, r1) of normalise_row_backward compiled per ISA level (isa.hpp).
FLUX_CPU_INLINE void normalise_row_backward_range_body(const float* x, const float* dy, const float* weight,
                                                       const float* mean, const float* rstd, float* dx, double* pw,
                                                       double* pb, int64_t r0, int64_t r1, int64_t d) {
  for (int64_t i = r0; i < r1; ++i)
    normalise_row_backward(x + i * d, dy + i * d, weight, mean[i], rstd[i], dx + i * d, pw, pb, d);
}
FLUX_CPU_VARIANTS(normalise_row_backward_range, normalise_row_backward_range_body)

// The per-block partial parameter gradients ([block][dweight d | dbias d], in double) summed into
// dweight and dbias (either may be null).
template <class T>
void sum_block_partials(const std::vector<double>& partial, int64_t blocks, int64_t d, T* dweight, T* dbias) {
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

template <class S, class T>
void normalise_rows_backward(DType dt, const S* x, const S* dy, const T* weight, const T* mean, const T* rstd, S* dx,
                             T* dweight, T* dbias, int64_t r, int64_t d) {
  const int64_t blocks = (r + rows_per_block(d) - 1) / rows_per_block(d);
  const bool params = dweight || dbias;
  std::vector<double> partial(params ? size_t(blocks) * size_t(2 * d) : 0, 0.0);  // [block][dweight d | dbias d]
  for_row_blocks(r, d, [&](int64_t block, int64_t r0, int64_t r1) {
    double* pw = params ? partial.data() + size_t(block) * size_t(2 * d) : nullptr;
    double* pb = pw ? pw + d : nullptr;
    if constexpr (std::is_same_v<S, float>) {
      normalise_row_backward_range(x, dy, weight, mean, rstd, dx, pw, pb, r0, r1, d);
    } else {
      HalfRows* rows = half_rows<S>(d);
      for (int64_t i = r0; i < r1; ++i) {
        T* dxi = dest<T>(dx + i * d, buffer(rows ? &rows->out : nullptr));
        const T* xi = load<T>(dt, x + i * d, buffer(rows ? &rows->x : nullptr), d);
        const T* gi = load<T>(dt, dy + i * d, buffer(rows ? &rows->g : nullptr), d);
        if constexpr (std::is_same_v<T, float>)
          normalise_row_backward_range(xi, gi, weight, mean + i, rstd + i, dxi, pw, pb, int64_t(0), int64_t(1), d);
        else
          normalise_row_backward(xi, gi, weight, mean[i], rstd[i], dxi, pw, pb, d);
        store(dt, dxi, dx + i * d, d);
      }
    }
  });
  if (params) sum_block_partials(partial, blocks, d, dweight, dbias);
}

template <class T> const T* in(const void* p) { return static_cast<const T*>(p); }
template <class T> T* out(void* p) { return static_cast<T*>(p); }
// f.operator()<S, T>() for dtype t: Float32 and Float64 in place, Float16/BFloat16 storage over float
// (where `half` allows it); false for any other dtype.
template <class F> bool typed(DType t, const F& f, bool half = true) {
  if (t == DType::f32) f.template operator()<float, float>();
  else if ((t == DType::bf16 || t == DType::f16) && half) f.template operator()<uint16_t, float>();
  else if (t == DType::f64) f.template operator()<double, double>();
  else return false;
  return true;
}

}  // namespace

bool batchnorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* var,
                       int64_t n, int64_t c, int64_t s, double eps) {
  if (t == DType::bf16 && s > 1 && batchnorm_bf16_avx512_available()) {
    batchnorm_forward_bf16_avx512(in<uint16_t>(x), in<float>(weight), in<float>(bias), out<uint16_t>(y),
                                  out<float>(mean), out<float>(var), n, c, s, eps);
    return true;
  }
  return typed(t, [&]<class S, class T>() {
    forward<S, T>(t, in<S>(x), in<T>(weight), in<T>(bias), out<S>(y), out<T>(mean), out<T>(var), n, c, s, eps);
  }, s > 1);  // half storage: s == 1 declines
}

bool batchnorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* var,
                        void* dx, void* dweight, void* dbias, int64_t n, int64_t c, int64_t s, double eps) {
  if (t == DType::bf16 && s > 1 && batchnorm_bf16_avx512_available()) {
    batchnorm_backward_bf16_avx512(in<uint16_t>(x), in<uint16_t>(dy), in<float>(weight), in<float>(mean),
                                   in<float>(var), out<uint16_t>(dx), out<float>(dweight), out<float>(dbias), n, c, s,
                                   eps);
    return true;
  }
  return typed(t, [&]<class S, class T>() {
    backward<S, T>(t, in<S>(x), in<S>(dy), in<T>(weight), in<T>(mean), in<T>(var), out<S>(dx), out<T>(dweight),
                   out<T>(dbias), n, c, s, eps);
  }, s > 1);
}

bool channel_affine(DType t, const void* x, const void* scale, const void* shift, void* y, int64_t n, int64_t c,
                    int64_t s) {
  return typed(t, [&]<class S, class T>() { affine<S, T>(t, in<S>(x), in<T>(scale), in<T>(shift), out<S>(y), n, c, s); });
}

bool rownorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* rstd,
                     int64_t r, int64_t d, double eps) {
  return typed(t, [&]<class S, class T>() {
    normalise_rows<S, T>(t, in<S>(x), in<T>(weight), in<T>(bias), out<S>(y), out<T>(mean), out<T>(rstd), r, d, eps);
  });
}

bool rownorm_forward_cast(const void* x, const void* weight, const void* bias, void* y, DType low, void* y_low,
                          void* mean, void* rstd, int64_t r, int64_t d, double eps) {
  if (low != DType::bf16 && low != DType::f16) return false;
  normalise_rows<float, float>(DType::f32, in<float>(x), in<float>(weight), in<float>(bias), out<float>(y),
                               out<float>(mean), out<float>(rstd), r, d, eps, low, static_cast<uint16_t*>(y_low));
  return true;
}

bool rownorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* rstd,
                      void* dx, void* dweight, void* dbias, int64_t r, int64_t d) {
  return typed(t, [&]<class S, class T>() {
    normalise_rows_backward<S, T>(t, in<S>(x), in<S>(dy), in<T>(weight), in<T>(mean), in<T>(rstd), out<S>(dx),
                                  out<T>(dweight), out<T>(dbias), r, d);
  });
}

}  // namespace flux::cpu_backend
