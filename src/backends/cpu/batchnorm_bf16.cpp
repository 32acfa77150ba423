// BatchNorm's training forward and backward on bf16 activations (s > 1) with AVX-512: x and dy are
// read as bf16 and widened in registers on each pass (no float32 copies of the channel), the sums in
// float64 and y / dx in float32 arithmetic rounded to bf16 once. The arithmetic is that of the
// float32 kernel (normalisation.cpp's forward / backward) step by step: per row eight float64
// accumulators over k mod 8 (one 8-lane register), the tail summed apart and added first, multiplies
// kept apart from the adds (the _round intrinsics are never contracted into FMAs), so the results are
// bitwise the float32 kernel's on the widened values, as the portable forward_half / backward_half
// (the reference, kept in normalisation.cpp) are. Tests: CpuBf16BatchNorm in test_low_precision_cpu.cpp.
#include "src/backends/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLUX_BN_BF16_X86 1
#define FLUX_TARGET_BN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#else
#define FLUX_BN_BF16_X86 0
#endif

namespace flux::cpu_backend {

#if FLUX_BN_BF16_X86
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr int64_t kChunk = 1024;  // floats of y / dx computed before one rounding call (in L1)

inline float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

/// 8 bf16 -> 8 float64 (exact).
FLUX_TARGET_BN_AVX512 inline __m512d load8(const uint16_t* p) {
  const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  return _mm512_cvtps_pd(_mm256_castsi256_ps(w));
}
/// 16 bf16 -> 16 float32 (exact), masked lanes 0.
FLUX_TARGET_BN_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
FLUX_TARGET_BN_AVX512 inline double add_lanes_in_order(double total, __m512d acc) {
  alignas(64) double a[8];
  _mm512_store_pd(a, acc);
  for (double v : a) total += v;
  return total;
}

// normalisation.cpp's row_sum / row_squared_deviations / row_sums_dy on a bf16 row.
FLUX_TARGET_BN_AVX512 double row_sum(const uint16_t* p, int64_t len) {
  __m512d acc = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) acc = _mm512_add_pd(acc, load8(p + k));
  double total = 0;
  for (; k < len; ++k) total += double(widen(p[k]));
  return add_lanes_in_order(total, acc);
}
FLUX_TARGET_BN_AVX512 double row_squared_deviations(const uint16_t* p, int64_t len, double mu) {
  const __m512d vmu = _mm512_set1_pd(mu);
  __m512d acc = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m512d d = _mm512_sub_pd(load8(p + k), vmu);
    acc = _mm512_add_pd(acc, _mm512_mul_round_pd(d, d, kRound));
  }
  double total = 0;
  for (; k < len; ++k) {
    const double d = double(widen(p[k])) - mu;
    total += d * d;
  }
  return add_lanes_in_order(total, acc);
}
FLUX_TARGET_BN_AVX512 void row_sums_dy(const uint16_t* p, const uint16_t* g, int64_t len, double mu, double& sum_g,
                                       double& sum_g_xc) {
  const __m512d vmu = _mm512_set1_pd(mu);
  __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m512d gv = load8(g + k);
    a = _mm512_add_pd(a, gv);
    b = _mm512_add_pd(b, _mm512_mul_round_pd(gv, _mm512_sub_pd(load8(p + k), vmu), kRound));
  }
  for (; k < len; ++k) {
    const double gk = double(widen(g[k]));
    sum_g += gk;
    sum_g_xc += gk * (double(widen(p[k])) - mu);
  }
  alignas(64) double av[8], bv[8];
  _mm512_store_pd(av, a);
  _mm512_store_pd(bv, b);
  for (int j = 0; j < 8; ++j) sum_g += av[j], sum_g_xc += bv[j];
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

/// y[k] = x[k] * a + b (float32: the product rounded, then the sum), rounded to bf16.
FLUX_TARGET_BN_AVX512 void scale_shift_row(const uint16_t* x, float a, float b, uint16_t* y, int64_t len) {
  alignas(64) float q[kChunk];
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t at = 0; at < len; at += kChunk) {
    const int64_t m = std::min(kChunk, len - at);
    for (int64_t k = 0; k < m; k += 16) {
      const __mmask16 mask = tail_mask(m - k);
      const __m512 v = _mm512_add_round_ps(_mm512_mul_round_ps(load16(x + at + k, mask), va, kRound), vb, kRound);
      _mm512_mask_storeu_ps(q + k, mask, v);
    }
    float_to_half_storage(DType::bf16, q, y + at, m);
  }
}

/// dx[k] = dy[k] * ta - x[k] * tk + tb (float32, left to right), rounded to bf16.
FLUX_TARGET_BN_AVX512 void backward_row(const uint16_t* x, const uint16_t* dy, float ta, float tk, float tb,
                                        uint16_t* dx, int64_t len) {
  alignas(64) float q[kChunk];
  const __m512 va = _mm512_set1_ps(ta), vk = _mm512_set1_ps(tk), vb = _mm512_set1_ps(tb);
  for (int64_t at = 0; at < len; at += kChunk) {
    const int64_t m = std::min(kChunk, len - at);
    for (int64_t k = 0; k < m; k += 16) {
      const __mmask16 mask = tail_mask(m - k);
      const __m512 g = _mm512_mul_round_ps(load16(dy + at + k, mask), va, kRound);
      const __m512 p = _mm512_mul_round_ps(load16(x + at + k, mask), vk, kRound);
      const __m512 v = _mm512_add_round_ps(_mm512_sub_round_ps(g, p, kRound), vb, kRound);
      _mm512_mask_storeu_ps(q + k, mask, v);
    }
    float_to_half_storage(DType::bf16, q, dx + at, m);
  }
}

}  // namespace
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool batchnorm_bf16_avx512_available() { return half_cast_path(DType::bf16) >= HalfCastPath::avx512; }

void batchnorm_forward_bf16_avx512(const uint16_t* x, const float* weight, const float* bias, uint16_t* y, float* mean,
                                   float* var, int64_t n, int64_t c, int64_t s, double eps) {
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
      const float a = float(scale), b = float((bias ? double(bias[ch]) : 0.0) - mu * scale);
      for (int64_t i = 0; i < n; ++i) scale_shift_row(x + (i * c + ch) * s, a, b, y + (i * c + ch) * s, s);
      mean[ch] = float(mu);
      var[ch] = float(v);
    }
  });
}

void batchnorm_backward_bf16_avx512(const uint16_t* x, const uint16_t* dy, const float* weight, const float* mean,
                                    const float* var, uint16_t* dx, float* dweight, float* dbias, int64_t n, int64_t c,
                                    int64_t s, double eps) {
  const double m = double(n * s);
  parallel_for(c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const double mu = double(mean[ch]);
      double sum_dy = 0, sum_dy_xc = 0;
      for (int64_t i = 0; i < n; ++i) row_sums_dy(x + (i * c + ch) * s, dy + (i * c + ch) * s, s, mu, sum_dy, sum_dy_xc);
      const double inv = 1.0 / std::sqrt(double(var[ch]) + eps);
      const double a = (weight ? double(weight[ch]) : 1.0) * inv;
      const double k_xc = a * inv * inv * sum_dy_xc / m;
      const float ta = float(a), tk = float(k_xc), tb = float(k_xc * mu - a * sum_dy / m);
      for (int64_t i = 0; i < n; ++i)
        backward_row(x + (i * c + ch) * s, dy + (i * c + ch) * s, ta, tk, tb, dx + (i * c + ch) * s, s);
      if (dweight) dweight[ch] = float(inv * sum_dy_xc);
      if (dbias) dbias[ch] = float(sum_dy);
    }
  });
}

#else  // not x86-64: never available, the portable kernels of normalisation.cpp run

bool batchnorm_bf16_avx512_available() { return false; }
void batchnorm_forward_bf16_avx512(const uint16_t*, const float*, const float*, uint16_t*, float*, float*, int64_t,
                                   int64_t, int64_t, double) {
  detail::fail("[batchnorm] the AVX-512 bf16 kernel is not built for this CPU");
}
void batchnorm_backward_bf16_avx512(const uint16_t*, const uint16_t*, const float*, const float*, const float*,
                                    uint16_t*, float*, float*, int64_t, int64_t, int64_t, double) {
  detail::fail("[batchnorm backward] the AVX-512 bf16 kernel is not built for this CPU");
}

#endif

}  // namespace flux::cpu_backend
