// Fused scaled-dot-product attention on the CPU (backend.hpp's attention_forward/backward), with
// FlashAttention-2's schedule (Dao 2023, "FlashAttention-2", algorithms 1 and 2). B = b0 b1 heads,
// BQ / BK queries / keys per tile:
//   forward, one task per (head, query tile): for each key tile,
//     s = q kᵀ scale (masked: -inf),  m' = max(m, rowmax s),  p = exp(s - m'),
//     l = l e^(m - m') + Σ p,  o = o e^(m - m') + p v;  then out = o / l, lse = m + log l.
//   backward, one task per head: for each key tile, for each query tile that sees it,
//     p = exp(s - lse),  dv += pᵀ dout,  dp = dout vᵀ,  ds = p (dp - D),  D = rowsum(dout out),
//     dq += ds k scale,  dk += dsᵀ q scale.
// A thread holds one (BQ, BK) score tile and its tile accumulators, never a (tq, tk) matrix. The
// tiles' products run on the calling thread (gemm_on_this_thread). bf16 operands on a CPU with
// AVX512-BF16 take the bf16 tile products of bf16_tiles.hpp instead: q, k, v (and dout) are read as
// bf16 (k, v and the backward's row operands repacked per head into vdpbf16ps's pair layout, in
// bf16), p and ds are rounded to bf16 for their products, the sums are Float32. Elsewhere (and for
// f16) bf16/f16 operands are converted to Float32 tile by tile in cache for Float32 products.
// Everywhere scores, softmax and accumulators are Float32 and outputs are rounded once.
// The reference is the composed path (matmul, softmax, matmul) of src/ops/attention.cpp.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/backends/cpu/bf16_tiles.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/vector_math.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace flux::cpu_backend {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kLanes = 16;
// Forward tiles: 64 queries share every key tile they load; 128 keys keep the (64, 128) scores and
// the tiles of k and v (d <= 128) in L2 together.
constexpr int64_t kForwardQ = 64, kForwardK = 128;
// Backward tiles: square, so that dk += dsᵀ q and dq += ds k are both reasonable products.
constexpr int64_t kBackwardQ = 64, kBackwardK = 64;

FLUX_CPU_INLINE float lane_max(const float* __restrict x, int64_t n) {
  float lane[kLanes];
  for (int64_t c = 0; c < kLanes; ++c) lane[c] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t c = 0; c < kLanes; ++c) lane[c] = std::max(lane[c], x[j + c]);
  float m = kNegInf;
  for (int64_t c = 0; c < kLanes; ++c) m = std::max(m, lane[c]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// One key tile of the online softmax: s (rows, n) at stride ld, masked entries -inf. Per row, m (the
// running maximum) and l (the running sum) are updated, s becomes p = exp(s - m'), and alpha gets
// e^(m - m'), the factor the row's accumulator is scaled by (1 where the maximum held).
FLUX_CPU_INLINE void online_softmax_body(float* s, int64_t ld, int64_t rows, int64_t n, float* m, float* l,
                                         float* alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict x = s + r * ld;
    const float mnew = std::max(m[r], lane_max(x, n));
    if (mnew == kNegInf) {  // nothing visible yet: p = 0, the accumulator stays 0
      for (int64_t j = 0; j < n; ++j) x[j] = 0;
      alpha[r] = 1;
      continue;
    }
    // nothing accumulated yet (m = -inf): o and l are 0, no rescale
    alpha[r] = m[r] == mnew || m[r] == kNegInf ? 1.0f : vmath::exp(m[r] - mnew);
    float lane[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int64_t c = 0; c < kLanes; ++c) {
        x[j + c] = vmath::exp(x[j + c] - mnew);
        lane[c] += x[j + c];
      }
    float total = 0;
    for (; j < n; ++j) total += (x[j] = vmath::exp(x[j] - mnew));
    for (int64_t c = 0; c < kLanes; ++c) total += lane[c];
    l[r] = l[r] * alpha[r] + total;
    m[r] = mnew;
  }
}
FLUX_CPU_VARIANTS(online_softmax, online_softmax_body)

// online_softmax_body for the bf16 tile products: p is written rounded to bf16 (to nearest even) into
// pb (row stride ldp; an odd n gets a 0 after the row's end, the pair the product reads), not into s;
// l sums the unrounded p. Scores are <= the row maximum, so exp needs no overflow clamp.
FLUX_CPU_INLINE void online_softmax_bf16_body(const float* s, int64_t ld, int64_t rows, int64_t n, float* m, float* l,
                                              float* alpha, uint16_t* pb, int64_t ldp) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = s + r * ld;
    uint16_t* __restrict p = pb + r * ldp;
    if (n % 2) p[n] = 0;
    const float mnew = std::max(m[r], lane_max(x, n));
    if (mnew == kNegInf) {
      for (int64_t j = 0; j < n; ++j) p[j] = 0;
      alpha[r] = 1;
      continue;
    }
    alpha[r] = m[r] == mnew || m[r] == kNegInf ? 1.0f : vmath::exp(m[r] - mnew);
    float lane[kLanes] = {};
    int64_t j = 0;
    auto round = [](float e) {  // e in [0, 1] or NaN (a NaN score): the quiet NaN's bits round to a NaN
      uint32_t u;
      std::memcpy(&u, &e, sizeof u);
      return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    };
    for (; j + kLanes <= n; j += kLanes)
      for (int64_t c = 0; c < kLanes; ++c) {
        const float e = vmath::exp_f32<true, false>(x[j + c] - mnew);
        lane[c] += e;
        p[j + c] = round(e);
      }
    float total = 0;
    for (; j < n; ++j) {
      const float e = vmath::exp_f32<true, false>(x[j] - mnew);
      total += e;
      p[j] = round(e);
    }
    for (int64_t c = 0; c < kLanes; ++c) total += lane[c];
    l[r] = l[r] * alpha[r] + total;
    m[r] = mnew;
  }
}
FLUX_CPU_VARIANTS(online_softmax_bf16, online_softmax_bf16_body)

#if defined(__x86_64__) && defined(__GNUC__)
#define FLUX_ATTENTION_AVX512_BF16 1
#define FLUX_TARGET_ATTENTION_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define FLUX_TARGET_ATTENTION_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
// GCC 12's AVX-512 headers' "undefined" vectors (__m512 __Y = __Y) trip -Wmaybe-uninitialized: a false
// positive (as half_cast.cpp).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// e^x for x <= 0 or NaN, 16 lanes: exp_f32's reduction and polynomial (vector_math.hpp), 2^n by
// vscalefps; 0 below -104 as exp_f32.
FLUX_TARGET_ATTENTION_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // a NaN x stays NaN (max_ps returns x)
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 q = _mm512_set1_ps(1.9875691500e-4f);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.3981999507e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.3334519073e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.1665795894e-2f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.6666665459e-1f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.0000001201e-1f));
  q = _mm512_fmadd_ps(_mm512_mul_ps(q, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512 y = _mm512_scalef_ps(q, n);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_NLT_UQ), y);
}

// online_softmax_bf16_body in AVX-512 (GCC does not vectorise lane_max's selects): the bf16 tile path
// with the AVX512-BF16 kernel, so p is rounded by vcvtneps2bf16.
FLUX_TARGET_ATTENTION_BF16 void online_softmax_bf16_avx512_bf16(const float* s, int64_t ld, int64_t rows, int64_t n,
                                                                float* m, float* l, float* alpha, uint16_t* pb,
                                                                int64_t ldp) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = s + r * ld;
    uint16_t* p = pb + r * ldp;
    if (n % 2) p[n] = 0;
    __m512 vmax = neg_inf;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1u);
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, mk, x + j));
    }
    const float mnew = std::max(m[r], _mm512_reduce_max_ps(vmax));
    if (mnew == kNegInf) {
      for (int64_t j = 0; j < n; ++j) p[j] = 0;
      alpha[r] = 1;
      continue;
    }
    alpha[r] = m[r] == mnew || m[r] == kNegInf ? 1.0f : vmath::exp(m[r] - mnew);
    const __m512 vm = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1u);
      const __m512 e = _mm512_maskz_mov_ps(mk, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), vm)));
      sum = _mm512_add_ps(sum, e);
      _mm256_mask_storeu_epi16(p + j, mk, (__m256i)_mm512_cvtneps_pbh(e));
    }
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
    m[r] = mnew;
  }
}

// online_softmax_body in AVX-512 for the Float32 tiles on an AVX-512 CPU: p = exp(s - m') in place.
FLUX_TARGET_ATTENTION_AVX512 void online_softmax_f32_avx512(float* s, int64_t ld, int64_t rows, int64_t n, float* m,
                                                           float* l, float* alpha) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    __m512 vmax = neg_inf;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1u);
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, mk, x + j));
    }
    const float mnew = std::max(m[r], _mm512_reduce_max_ps(vmax));
    if (mnew == kNegInf) {
      for (int64_t j = 0; j < n; ++j) x[j] = 0;
      alpha[r] = 1;
      continue;
    }
    alpha[r] = m[r] == mnew || m[r] == kNegInf ? 1.0f : vmath::exp(m[r] - mnew);
    const __m512 vm = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1u);
      const __m512 e = _mm512_maskz_mov_ps(mk, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), vm)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(x + j, mk, e);
    }
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
    m[r] = mnew;
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define FLUX_ATTENTION_AVX512_BF16 0
#endif

// The backward's probabilities: s (rows, n) -> p = exp(s - lse) (a row without visible keys, lse = -inf: 0).
FLUX_CPU_INLINE void probabilities_body(float* s, int64_t ld, int64_t rows, int64_t n, const float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict x = s + r * ld;
    const float base = lse[r];
    if (base == kNegInf) {
      for (int64_t j = 0; j < n; ++j) x[j] = 0;
      continue;
    }
    for (int64_t j = 0; j < n; ++j) x[j] = vmath::exp(x[j] - base);
  }
}
FLUX_CPU_VARIANTS(probabilities, probabilities_body)

// ds = p (dp - D) in place of dp; D (rows,) = rowsum(dout out).
FLUX_CPU_INLINE void score_gradient_body(const float* p, float* dp, int64_t ld, int64_t rows, int64_t n, const float* dsum) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict pr = p + r * ld;
    float* __restrict g = dp + r * ld;
    const float dr = dsum[r];
    for (int64_t j = 0; j < n; ++j) g[j] = pr[j] * (g[j] - dr);
  }
}
FLUX_CPU_VARIANTS(score_gradient, score_gradient_body)

// Rows [i0, i0 + rows) against keys [j0, j0 + n) of one head: -inf where the mask (head-offset,
// null: none) hides a key or, causal, where j > i + (tk - tq).
void mask_tile(float* s, int64_t ld, int64_t i0, int64_t rows, int64_t j0, int64_t n, const bool* mask,
               const backend::Attention& a) {
  const int64_t shift = a.tk - a.tq;
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    const int64_t i = i0 + r;
    if (a.causal)
      for (int64_t j = std::max(j0, i + shift + 1); j < j0 + n; ++j) x[j - j0] = kNegInf;
    if (mask) {
      const bool* row = mask + i * a.mask_stride[2] + j0 * a.mask_stride[3];
      for (int64_t c = 0; c < n; ++c)
        if (!row[c * a.mask_stride[3]]) x[c] = kNegInf;
    }
  }
}

// Whether a tile of rows [i0, i0 + rows) and keys [j0, j0 + n) needs mask_tile.
bool tile_masked(int64_t i0, int64_t j0, int64_t n, bool has_mask, const backend::Attention& a) {
  return has_mask || (a.causal && j0 + n - 1 > i0 + (a.tk - a.tq));
}

// `rows` rows of `cols` elements of dtype t at element offset `offset` and row stride ld, as Float32:
// the array itself for f32 (ld_out = ld), else converted into `scratch` (ld_out = cols).
const float* rows_as_float(DType t, const void* base, int64_t offset, int64_t rows, int64_t cols, int64_t ld,
                           float* scratch, int64_t& ld_out) {
  if (t == DType::f32) {
    ld_out = ld;
    return static_cast<const float*>(base) + offset;
  }
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  for (int64_t r = 0; r < rows; ++r) half_storage_to_float(t, src + r * ld, scratch + r * cols, cols);
  ld_out = cols;
  return scratch;
}

// dst (contiguous, dtype t) at element offset `offset` = n Float32 values.
// `rows` rows of n Float32 (src, dense) into base + offset, rows `stride` apart, in t.
void store_rows(DType t, void* base, int64_t offset, int64_t stride, const float* src, int64_t rows, int64_t n) {
  if (t == DType::f32)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<float*>(base) + offset + r * stride, src + r * n, size_t(n) * sizeof(float));
  else
    float_rows_to_half_storage(t, src, n, static_cast<uint16_t*>(base) + offset, stride, rows, n);
}

int64_t head_offset(const int64_t* stride, int64_t b0, int64_t b1) { return b0 * stride[0] + b1 * stride[1]; }

const bool* head_mask(const bool* mask, const backend::Attention& a, int64_t b0, int64_t b1) {
  return mask ? mask + b0 * a.mask_stride[0] + b1 * a.mask_stride[1] : nullptr;
}

// The last key (exclusive) any of rows [i0, i0 + rows) may see.
int64_t key_end(int64_t i0, int64_t rows, const backend::Attention& a) {
  return a.causal ? std::clamp<int64_t>(i0 + rows + (a.tk - a.tq), 0, a.tk) : a.tk;
}

void forward_tasks(DType t, const void* q, const void* k, const void* v, const bool* mask, void* out, float* lse,
                   const backend::Attention& a, int64_t w0, int64_t w1) {
  const int64_t tiles = (a.tq + kForwardQ - 1) / kForwardQ, d = a.d, dv = a.dv;
  const bool half = t != DType::f32;
  [[maybe_unused]] const bool avx512 = active_isa() == Isa::avx512;
  std::vector<float> s(size_t(kForwardQ * kForwardK)), o(size_t(kForwardQ * dv)), m(kForwardQ), l(kForwardQ),
      alpha(kForwardQ);
  std::vector<float> qh(half ? size_t(kForwardQ * d) : 0), kh(half ? size_t(kForwardK * d) : 0),
      vh(half ? size_t(kForwardK * dv) : 0);
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t b = w / tiles, i0 = (w % tiles) * kForwardQ, rows = std::min(kForwardQ, a.tq - i0);
    const int64_t b0 = b / a.b1, b1 = b % a.b1;
    const bool* hm = head_mask(mask, a, b0, b1);
    int64_t ldq, ldk, ldv;
    const float* qt = rows_as_float(t, q, head_offset(a.q_stride, b0, b1) + i0 * a.q_stride[2], rows, d, a.q_stride[2],
                                    qh.data(), ldq);
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(o.begin(), o.end(), 0.0f);
    const int64_t end = key_end(i0, rows, a);
    for (int64_t j0 = 0; j0 < end; j0 += kForwardK) {
      const int64_t n = std::min(kForwardK, end - j0);
      const float* kt = rows_as_float(t, k, head_offset(a.k_stride, b0, b1) + j0 * a.k_stride[2], n, d, a.k_stride[2],
                                      kh.data(), ldk);
      gemm_on_this_thread(false, true, rows, n, d, float(a.scale), qt, ldq, kt, ldk, 0.0f, s.data(), kForwardK);
      if (tile_masked(i0, j0, n, hm != nullptr, a)) mask_tile(s.data(), kForwardK, i0, rows, j0, n, hm, a);
#if FLUX_ATTENTION_AVX512_BF16
      if (avx512)
        online_softmax_f32_avx512(s.data(), kForwardK, rows, n, m.data(), l.data(), alpha.data());
      else
#endif
        online_softmax(s.data(), kForwardK, rows, n, m.data(), l.data(), alpha.data());
      for (int64_t r = 0; r < rows; ++r)
        if (alpha[size_t(r)] != 1.0f)
          for (int64_t c = 0; c < dv; ++c) o[size_t(r * dv + c)] *= alpha[size_t(r)];
      const float* vt = rows_as_float(t, v, head_offset(a.v_stride, b0, b1) + j0 * a.v_stride[2], n, dv, a.v_stride[2],
                                      vh.data(), ldv);
      gemm_on_this_thread(false, false, rows, dv, n, 1.0f, s.data(), kForwardK, vt, ldv, 1.0f, o.data(), dv);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = o.data() + r * dv;
      const float inv = 1.0f / l[size_t(r)];  // l = 0 (no visible key): 0 * inf = NaN, as the composition
      for (int64_t c = 0; c < dv; ++c) orow[c] *= inv;
      lse[b * a.tq + i0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
    }
    store_rows(t, out, head_offset(a.o_stride, b0, b1) + i0 * a.o_stride[2], a.o_stride[2], o.data(), rows, dv);
  }
}

void backward_heads(DType t, const void* q, const void* k, const void* v, const bool* mask, const void* out,
                    const void* dout, const float* lse, void* dq, void* dk, void* dv_out, const backend::Attention& a,
                    int64_t h0, int64_t h1) {
  const int64_t d = a.d, dv = a.dv, tq = a.tq, tk = a.tk;
  const bool half = t != DType::f32;
  std::vector<float> s(size_t(kBackwardQ * kBackwardK)), dp(size_t(kBackwardQ * kBackwardK)), dsum(static_cast<size_t>(tq));
  // Half: the head's operands in Float32 once (every tile is read tq / BQ or tk / BK times) and its
  // gradients accumulated in Float32; f32 reads the arrays in place and accumulates into dq, dk, dv.
  std::vector<float> qh, kh, vh, doh, dqh, dkh, dvh, row;
  if (half) {
    qh.resize(size_t(tq * d)), kh.resize(size_t(tk * d)), vh.resize(size_t(tk * dv)), doh.resize(size_t(tq * dv));
    dqh.resize(size_t(tq * d)), dkh.resize(size_t(tk * d)), dvh.resize(size_t(tk * dv)), row.resize(size_t(dv));
  }
  for (int64_t b = h0; b < h1; ++b) {
    const int64_t b0 = b / a.b1, b1 = b % a.b1;
    const bool* hm = head_mask(mask, a, b0, b1);
    int64_t ldq, ldk, ldv, ldo;
    const float* qa = rows_as_float(t, q, head_offset(a.q_stride, b0, b1), tq, d, a.q_stride[2], qh.data(), ldq);
    const float* ka = rows_as_float(t, k, head_offset(a.k_stride, b0, b1), tk, d, a.k_stride[2], kh.data(), ldk);
    const float* va = rows_as_float(t, v, head_offset(a.v_stride, b0, b1), tk, dv, a.v_stride[2], vh.data(), ldv);
    const int64_t ooff = head_offset(a.o_stride, b0, b1);
    const float* doa = rows_as_float(t, dout, ooff, tq, dv, a.o_stride[2], doh.data(), ldo);
    // Accumulators: f32 writes into dq, dk, dv (at q's, k's, v's strides), half into Float32 scratch.
    const int64_t qoff = head_offset(a.q_stride, b0, b1), koff = head_offset(a.k_stride, b0, b1),
                  voff = head_offset(a.v_stride, b0, b1);
    const int64_t lddq = half ? d : a.q_stride[2], lddk = half ? d : a.k_stride[2], lddv = half ? dv : a.v_stride[2];
    float* dqa = half ? dqh.data() : static_cast<float*>(dq) + qoff;
    float* dka = half ? dkh.data() : static_cast<float*>(dk) + koff;
    float* dva = half ? dvh.data() : static_cast<float*>(dv_out) + voff;
    for (int64_t i = 0; i < tq; ++i) std::fill(dqa + i * lddq, dqa + i * lddq + d, 0.0f);
    for (int64_t j = 0; j < tk; ++j) std::fill(dka + j * lddk, dka + j * lddk + d, 0.0f);
    for (int64_t j = 0; j < tk; ++j) std::fill(dva + j * lddv, dva + j * lddv + dv, 0.0f);
    const float* lh = lse + b * tq;
    for (int64_t i = 0; i < tq; ++i) {  // D = rowsum(dout out)
      const float* orow;
      if (half) {
        half_storage_to_float(t, static_cast<const uint16_t*>(out) + ooff + i * a.o_stride[2], row.data(), dv);
        orow = row.data();
      } else {
        orow = static_cast<const float*>(out) + ooff + i * a.o_stride[2];
      }
      double acc = 0;
      for (int64_t c = 0; c < dv; ++c) acc += double(doa[i * ldo + c]) * double(orow[c]);
      dsum[size_t(i)] = float(acc);
    }
    const int64_t shift = tk - tq;
    for (int64_t j0 = 0; j0 < tk; j0 += kBackwardK) {
      const int64_t n = std::min(kBackwardK, tk - j0);
      // Causal: query i sees key j0 once i + shift >= j0.
      const int64_t first = a.causal ? std::max<int64_t>(0, j0 - shift) / kBackwardQ * kBackwardQ : 0;
      const float* kt = ka + j0 * ldk;
      const float* vt = va + j0 * ldv;
      for (int64_t i0 = first; i0 < tq; i0 += kBackwardQ) {
        const int64_t rows = std::min(kBackwardQ, tq - i0);
        const float* qt = qa + i0 * ldq;
        const float* dot = doa + i0 * ldo;
        gemm_on_this_thread(false, true, rows, n, d, float(a.scale), qt, ldq, kt, ldk, 0.0f, s.data(), kBackwardK);
        if (tile_masked(i0, j0, n, hm != nullptr, a)) mask_tile(s.data(), kBackwardK, i0, rows, j0, n, hm, a);
        probabilities(s.data(), kBackwardK, rows, n, lh + i0);
        gemm_on_this_thread(true, false, n, dv, rows, 1.0f, s.data(), kBackwardK, dot, ldo, 1.0f, dva + j0 * lddv, lddv);
        gemm_on_this_thread(false, true, rows, n, dv, 1.0f, dot, ldo, vt, ldv, 0.0f, dp.data(), kBackwardK);
        score_gradient(s.data(), dp.data(), kBackwardK, rows, n, dsum.data() + i0);
        gemm_on_this_thread(false, false, rows, d, n, float(a.scale), dp.data(), kBackwardK, kt, ldk, 1.0f,
                            dqa + i0 * lddq, lddq);
        gemm_on_this_thread(true, false, n, d, rows, float(a.scale), dp.data(), kBackwardK, qt, ldq, 1.0f,
                            dka + j0 * lddk, lddk);
      }
    }
    if (half) {
      store_rows(t, dq, qoff, a.q_stride[2], dqa, tq, d);
      store_rows(t, dk, koff, a.k_stride[2], dka, tk, d);
      store_rows(t, dv_out, voff, a.v_stride[2], dva, tk, dv);
    }
  }
}

// ---- bf16 operands with bf16 tile products (bf16_tiles.hpp); `fast`: the AVX512-BF16 kernel ----

void forward_tasks_bf16(bool fast, const uint16_t* q, const uint16_t* k, const uint16_t* v, const bool* mask,
                        uint16_t* out, float* lse, const backend::Attention& a, int64_t w0, int64_t w1) {
  const int64_t tiles = (a.tq + kForwardQ - 1) / kForwardQ, d = a.d, dv = a.dv, tk = a.tk;
  std::vector<float> s(size_t(kForwardQ * kForwardK)), o(size_t(kForwardQ * dv)), m(kForwardQ), l(kForwardQ),
      alpha(kForwardQ);
  // The head's kᵀ (B of s = q kᵀ) and v (B of o += p v) in pair layout, packed once per head this
  // thread meets (its tasks are consecutive query tiles); p rounded to bf16 rows.
  std::vector<uint16_t> kt(size_t((d + 1) / 2 * 2 * tk)), vp(size_t((tk + 1) / 2 * 2 * dv)),
      pb(size_t(kForwardQ * kForwardK));
  int64_t packed = -1;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t b = w / tiles, i0 = (w % tiles) * kForwardQ, rows = std::min(kForwardQ, a.tq - i0);
    const int64_t b0 = b / a.b1, b1 = b % a.b1;
    const bool* hm = head_mask(mask, a, b0, b1);
    if (b != packed) {
      pack_transposed_pairs(fast, k + head_offset(a.k_stride, b0, b1), a.k_stride[2], tk, d, kt.data(), tk);
      pack_row_pairs(fast, v + head_offset(a.v_stride, b0, b1), a.v_stride[2], tk, dv, vp.data(), dv);
      packed = b;
    }
    const uint16_t* qt = q + head_offset(a.q_stride, b0, b1) + i0 * a.q_stride[2];
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(o.begin(), o.end(), 0.0f);
    const int64_t end = key_end(i0, rows, a);
    for (int64_t j0 = 0; j0 < end; j0 += kForwardK) {
      const int64_t n = std::min(kForwardK, end - j0);
      bf16_tile_product(fast, rows, n, d, float(a.scale), qt, a.q_stride[2], 2, kt.data() + 2 * j0, tk, s.data(),
                        kForwardK, false);
      if (tile_masked(i0, j0, n, hm != nullptr, a)) mask_tile(s.data(), kForwardK, i0, rows, j0, n, hm, a);
#if FLUX_ATTENTION_AVX512_BF16
      if (fast)
        online_softmax_bf16_avx512_bf16(s.data(), kForwardK, rows, n, m.data(), l.data(), alpha.data(), pb.data(),
                                        kForwardK);
      else
#endif
        online_softmax_bf16(static_cast<const float*>(s.data()), kForwardK, rows, n, m.data(), l.data(), alpha.data(),
                            pb.data(), kForwardK);
      for (int64_t r = 0; r < rows; ++r)
        if (alpha[size_t(r)] != 1.0f)
          for (int64_t c = 0; c < dv; ++c) o[size_t(r * dv + c)] *= alpha[size_t(r)];
      bf16_tile_product(fast, rows, dv, n, 1.0f, pb.data(), kForwardK, 2, vp.data() + j0 * dv, dv, o.data(), dv, true);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = o.data() + r * dv;
      const float inv = 1.0f / l[size_t(r)];  // l = 0 (no visible key): 0 * inf = NaN, as the composition
      for (int64_t c = 0; c < dv; ++c) orow[c] *= inv;
      lse[b * a.tq + i0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
    }
    store_rows(DType::bf16, out, head_offset(a.o_stride, b0, b1) + i0 * a.o_stride[2], a.o_stride[2], o.data(), rows, dv);
  }
}

void backward_heads_bf16(bool fast, const uint16_t* q, const uint16_t* k, const uint16_t* v, const bool* mask,
                         const uint16_t* out, const uint16_t* dout, const float* lse, uint16_t* dq, uint16_t* dk,
                         uint16_t* dv_out, const backend::Attention& a, int64_t h0, int64_t h1) {
  const int64_t d = a.d, dv = a.dv, tq = a.tq, tk = a.tk;
  constexpr int64_t BQ = kBackwardQ, BK = kBackwardK;
  std::vector<float> s(size_t(BQ * BK)), dp(size_t(BQ * BK)), dsum(static_cast<size_t>(tq)),
      ro(static_cast<size_t>(dv)), rd(static_cast<size_t>(dv));
  // Per head, in pair layout (bf16): kᵀ and vᵀ (B of s = q kᵀ and dp = dout vᵀ), k, q and dout by
  // pairs of rows (B of dq += ds k, dk += dsᵀ q, dv += pᵀ dout). Per tile: p or ds as bf16 rows (A of
  // dq += ds k) and by pairs of rows (A of the transposed products). Gradients accumulate in Float32.
  std::vector<uint16_t> kt(size_t((d + 1) / 2 * 2 * tk)), vt(size_t((dv + 1) / 2 * 2 * tk)),
      kp(size_t((tk + 1) / 2 * 2 * d)), qp(size_t((tq + 1) / 2 * 2 * d)), dop(size_t((tq + 1) / 2 * 2 * dv)),
      pn(size_t(BQ * BK)), pi(size_t(BQ * BK));
  std::vector<float> dqh(size_t(tq * d)), dkh(size_t(tk * d)), dvh(size_t(tk * dv));
  for (int64_t b = h0; b < h1; ++b) {
    const int64_t b0 = b / a.b1, b1 = b % a.b1;
    const bool* hm = head_mask(mask, a, b0, b1);
    const int64_t qoff = head_offset(a.q_stride, b0, b1), koff = head_offset(a.k_stride, b0, b1),
                  voff = head_offset(a.v_stride, b0, b1), ooff = head_offset(a.o_stride, b0, b1);
    const int64_t qs = a.q_stride[2], ks = a.k_stride[2], vs = a.v_stride[2], os = a.o_stride[2];
    pack_transposed_pairs(fast, k + koff, ks, tk, d, kt.data(), tk);
    pack_transposed_pairs(fast, v + voff, vs, tk, dv, vt.data(), tk);
    pack_row_pairs(fast, k + koff, ks, tk, d, kp.data(), d);
    pack_row_pairs(fast, q + qoff, qs, tq, d, qp.data(), d);
    pack_row_pairs(fast, dout + ooff, os, tq, dv, dop.data(), dv);
    std::fill(dqh.begin(), dqh.end(), 0.0f);
    std::fill(dkh.begin(), dkh.end(), 0.0f);
    std::fill(dvh.begin(), dvh.end(), 0.0f);
    const float* lh = lse + b * tq;
    for (int64_t i = 0; i < tq; ++i) {  // D = rowsum(dout out), a row at a time in Float32
      half_storage_to_float(DType::bf16, out + ooff + i * os, ro.data(), dv);
      half_storage_to_float(DType::bf16, dout + ooff + i * os, rd.data(), dv);
      double acc = 0;
      for (int64_t c = 0; c < dv; ++c) acc += double(rd[size_t(c)]) * double(ro[size_t(c)]);
      dsum[size_t(i)] = float(acc);
    }
    const int64_t shift = tk - tq;
    for (int64_t j0 = 0; j0 < tk; j0 += BK) {
      const int64_t n = std::min(BK, tk - j0);
      const int64_t first = a.causal ? std::max<int64_t>(0, j0 - shift) / BQ * BQ : 0;
      for (int64_t i0 = first; i0 < tq; i0 += BQ) {
        const int64_t rows = std::min(BQ, tq - i0);
        bf16_tile_product(fast, rows, n, d, float(a.scale), q + qoff + i0 * qs, qs, 2, kt.data() + 2 * j0, tk,
                          s.data(), BK, false);
        if (tile_masked(i0, j0, n, hm != nullptr, a)) mask_tile(s.data(), BK, i0, rows, j0, n, hm, a);
        probabilities(s.data(), BK, rows, n, lh + i0);
        float_rows_to_bf16_pairs(fast, s.data(), BK, rows, n, pi.data(), BK, nullptr, 0);
        bf16_tile_product(fast, n, dv, rows, 1.0f, pi.data(), 2, 2 * BK, dop.data() + i0 * dv, dv,
                          dvh.data() + j0 * dv, dv, true);
        bf16_tile_product(fast, rows, n, dv, 1.0f, dout + ooff + i0 * os, os, 2, vt.data() + 2 * j0, tk, dp.data(),
                          BK, false);
        score_gradient(s.data(), dp.data(), BK, rows, n, dsum.data() + i0);
        float_rows_to_bf16_pairs(fast, dp.data(), BK, rows, n, pi.data(), BK, pn.data(), BK);
        bf16_tile_product(fast, rows, d, n, float(a.scale), pn.data(), BK, 2, kp.data() + j0 * d, d,
                          dqh.data() + i0 * d, d, true);
        bf16_tile_product(fast, n, d, rows, float(a.scale), pi.data(), 2, 2 * BK, qp.data() + i0 * d, d,
                          dkh.data() + j0 * d, d, true);
      }
    }
    store_rows(DType::bf16, dq, qoff, qs, dqh.data(), tq, d);
    store_rows(DType::bf16, dk, koff, ks, dkh.data(), tk, d);
    store_rows(DType::bf16, dv_out, voff, vs, dvh.data(), tk, dv);
  }
}

// Tests: 0 = the bf16 tile products where the CPU has AVX512-BF16 (else Float32 tiles), 1 = the bf16
// tile products with the portable reference kernel, 2 = Float32 tiles always.
std::atomic<int> g_tile_mode{0};

enum class Tiles { f32, bf16_fast, bf16_reference };
Tiles tiles_for(DType t) {
  if (t != DType::bf16) return Tiles::f32;
  switch (g_tile_mode.load(std::memory_order_relaxed)) {
    case 1: return Tiles::bf16_reference;
    case 2: return Tiles::f32;
    default: return bf16_tile_kernel_available() ? Tiles::bf16_fast : Tiles::f32;
  }
}

bool supported(DType t, const backend::Attention& a) {
  return (t == DType::f32 || t == DType::bf16 || t == DType::f16) && a.b0 > 0 && a.b1 > 0 && a.tq > 0 && a.tk > 0 &&
         a.d > 0 && a.dv > 0;
}
}  // namespace

bool attention_forward(DType t, const void* q, const void* k, const void* v, const bool* mask, void* out, float* lse,
                       const backend::Attention& a) {
  if (!supported(t, a)) return false;
  const int64_t tasks = a.b0 * a.b1 * ((a.tq + kForwardQ - 1) / kForwardQ);
  if (const Tiles path = tiles_for(t); path != Tiles::f32) {
    const bool fast = path == Tiles::bf16_fast;
    parallel_for(tasks, 1, [&](int64_t w0, int64_t w1) {
      forward_tasks_bf16(fast, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                         static_cast<const uint16_t*>(v), mask, static_cast<uint16_t*>(out), lse, a, w0, w1);
    });
    return true;
  }
  parallel_for(tasks, 1, [&](int64_t w0, int64_t w1) { forward_tasks(t, q, k, v, mask, out, lse, a, w0, w1); });
  return true;
}

bool attention_backward(DType t, const void* q, const void* k, const void* v, const bool* mask, const void* out,
                        const void* dout, const float* lse, void* dq, void* dk, void* dv, const backend::Attention& a) {
  if (!supported(t, a)) return false;
  if (const Tiles path = tiles_for(t); path != Tiles::f32) {
    const bool fast = path == Tiles::bf16_fast;
    parallel_for(a.b0 * a.b1, 1, [&](int64_t h0, int64_t h1) {
      backward_heads_bf16(fast, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                          static_cast<const uint16_t*>(v), mask, static_cast<const uint16_t*>(out),
                          static_cast<const uint16_t*>(dout), lse, static_cast<uint16_t*>(dq),
                          static_cast<uint16_t*>(dk), static_cast<uint16_t*>(dv), a, h0, h1);
    });
    return true;
  }
  parallel_for(a.b0 * a.b1, 1, [&](int64_t h0, int64_t h1) {
    backward_heads(t, q, k, v, mask, out, dout, lse, dq, dk, dv, a, h0, h1);
  });
  return true;
}

}  // namespace flux::cpu_backend

namespace flux::detail {
/// Tests (test_fused_attention.cpp): which tile products the CPU's bf16 attention uses (0 auto, 1 the
/// portable bf16 reference, 2 Float32 tiles); returns the previous mode.
int cpu_attention_tile_mode(int mode) { return cpu_backend::g_tile_mode.exchange(mode); }
}  // namespace flux::detail
