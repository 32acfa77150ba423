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
// tiles' products run on the calling thread (gemm_on_this_thread). bf16/f16 operands are converted to
// Float32 tile by tile in cache; scores, softmax and accumulators are Float32, outputs rounded once.
// The reference is the composed path (matmul, softmax, matmul) of src/ops/attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/vector_math.hpp"

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
    alpha[r] = m[r] == mnew ? 1.0f : vmath::exp(m[r] - mnew);
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
void store(DType t, void* base, int64_t offset, const float* src, int64_t n) {
  if (t == DType::f32)
    std::memcpy(static_cast<float*>(base) + offset, src, size_t(n) * sizeof(float));
  else
    float_to_half_storage(t, src, static_cast<uint16_t*>(base) + offset, n);
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
      store(t, out, head_offset(a.o_stride, b0, b1) + (i0 + r) * a.o_stride[2], orow, dv);
      lse[b * a.tq + i0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
    }
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
      for (int64_t i = 0; i < tq; ++i) store(t, dq, qoff + i * a.q_stride[2], dqa + i * d, d);
      for (int64_t j = 0; j < tk; ++j) store(t, dk, koff + j * a.k_stride[2], dka + j * d, d);
      for (int64_t j = 0; j < tk; ++j) store(t, dv_out, voff + j * a.v_stride[2], dva + j * dv, dv);
    }
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
  parallel_for(tasks, 1, [&](int64_t w0, int64_t w1) { forward_tasks(t, q, k, v, mask, out, lse, a, w0, w1); });
  return true;
}

bool attention_backward(DType t, const void* q, const void* k, const void* v, const bool* mask, const void* out,
                        const void* dout, const float* lse, void* dq, void* dk, void* dv, const backend::Attention& a) {
  if (!supported(t, a)) return false;
  parallel_for(a.b0 * a.b1, 1, [&](int64_t h0, int64_t h1) {
    backward_heads(t, q, k, v, mask, out, dout, lse, dq, dk, dv, a, h0, h1);
  });
  return true;
}

}  // namespace flux::cpu_backend
