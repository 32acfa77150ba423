// CPU pooling kernels: pool_forward / pool_backward over (N, C, spatial...) with 1 to 3 spatial axes,
// float32 and float64 (bf16/f16 storage through per-plane float32 copies in cache), threaded over the
// N * C planes (each plane is one task, so the backward's accumulation into overlapping windows never races).
//
// Shapes: x (N, C, in...), y and dy (N, C, out...), dx (N, C, in...). Spatial axes are normalised to
// three (D, H, W) with leading length-1 axes, so 1-D and 2-D run the same loops.
// Semantics (backend.hpp, NNlib / PyTorch): a window starts at o * stride - pad_lo; max never takes
// padding (a window that is all padding gives -inf; the ops forbid it); mean divides by the full
// window size (count_include_pad = True). Max propagates NaN (as PyTorch) and its backward sends dy to
// the first position in window order (d, then h, then w) that holds y.
//
// Two paths: a reference loop that clips every window to the input, and, for 2-D windows of 2x2 and
// 3x3 with stride 2 (LeNet's MaxPool((2, 2)), ResNet's MaxPool((3, 3), stride 2, pad 1)), a version
// with the window and stride fixed at compile time on the windows that lie inside the input (the
// border cells still take the reference loop). Timings are in the report of the commit that added it.
// On AVX-512 the 3x3 stride-2 max forward's and backward's interiors run 16 windows at a time
// (max3_forward_blocks, max3_backward_blocks: bitwise the scalar loops; bf16 and float32 both reach
// them through the float32 plane kernels).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <limits>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace flux::cpu_backend {

namespace {

using backend::ConvGeometry;
using backend::PoolOp;

// The geometry on three axes (D, H, W), unused leading axes of length 1.
struct Axes {
  int64_t in[3], out[3], k[3], s[3], lo[3];
  int64_t in_plane = 1, out_plane = 1, window = 1;
};

Axes axes_of(const ConvGeometry& g) {
  Axes a;
  int shift = 3 - g.spatial;
  for (int i = 0; i < 3; ++i) {
    int j = i - shift;
    bool used = j >= 0;
    a.in[i] = used ? g.in[j] : 1;
    a.out[i] = used ? g.out[j] : 1;
    a.k[i] = used ? g.kernel[j] : 1;
    a.s[i] = used ? g.stride[j] : 1;
    a.lo[i] = used ? g.pad_lo[j] : 0;
    a.in_plane *= a.in[i];
    a.out_plane *= a.out[i];
    a.window *= a.k[i];
  }
  return a;
}

// [begin, end) of the window of output position o along axis i, clipped to the input.
inline void clip(const Axes& a, int i, int64_t o, int64_t& begin, int64_t& end) {
  int64_t start = o * a.s[i] - a.lo[i];
  begin = std::max<int64_t>(start, 0);
  end = std::min<int64_t>(start + a.k[i], a.in[i]);
}

template <class T>
inline T take_max(T m, T v) {
  return (v > m || v != v) ? v : m;  // NaN wins and stays
}
template <class T>
inline bool holds(T v, T y) {
  return (v == y) | ((v != v) & (y != y));  // bitwise: no branches in the backward's inner loops
}

// ---- the reference: one output cell at a time over its clipped window ----

template <class T, PoolOp op>
T cell_forward(const Axes& a, const T* x, int64_t od, int64_t oh, int64_t ow) {
  int64_t d0, d1, h0, h1, w0, w1;
  clip(a, 0, od, d0, d1), clip(a, 1, oh, h0, h1), clip(a, 2, ow, w0, w1);
  if constexpr (op == PoolOp::max) {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t h = h0; h < h1; ++h) {
        const T* row = x + (d * a.in[1] + h) * a.in[2];
        for (int64_t w = w0; w < w1; ++w) m = take_max(m, row[w]);
      }
    return m;
  } else {
    T sum = 0;
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t h = h0; h < h1; ++h) {
        const T* row = x + (d * a.in[1] + h) * a.in[2];
        for (int64_t w = w0; w < w1; ++w) sum += row[w];
      }
    return sum / T(a.window);
  }
}

template <class T, PoolOp op>
void cell_backward(const Axes& a, const T* x, T y, T dy, T* dx, int64_t od, int64_t oh, int64_t ow) {
  int64_t d0, d1, h0, h1, w0, w1;
  clip(a, 0, od, d0, d1), clip(a, 1, oh, h0, h1), clip(a, 2, ow, w0, w1);
  if constexpr (op == PoolOp::max) {
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t h = h0; h < h1; ++h) {
        int64_t base = (d * a.in[1] + h) * a.in[2];
        for (int64_t w = w0; w < w1; ++w)
          if (holds(x[base + w], y)) {
            dx[base + w] += dy;
            return;
          }
      }
  } else {
    T g = dy / T(a.window);
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t h = h0; h < h1; ++h) {
        T* row = dx + (d * a.in[1] + h) * a.in[2];
        for (int64_t w = w0; w < w1; ++w) row[w] += g;
      }
  }
}

template <class T, PoolOp op>
void reference_forward(const Axes& a, const T* x, T* y) {
  for (int64_t od = 0; od < a.out[0]; ++od)
    for (int64_t oh = 0; oh < a.out[1]; ++oh)
      for (int64_t ow = 0; ow < a.out[2]; ++ow) *y++ = cell_forward<T, op>(a, x, od, oh, ow);
}

template <class T, PoolOp op>
void reference_backward(const Axes& a, const T* x, const T* y, const T* dy, T* dx) {
  for (int64_t od = 0; od < a.out[0]; ++od)
    for (int64_t oh = 0; oh < a.out[1]; ++oh)
      for (int64_t ow = 0; ow < a.out[2]; ++ow, ++y, ++dy) cell_backward<T, op>(a, x, *y, *dy, dx, od, oh, ow);
}

// ---- AVX-512: 16 windows of the 3x3 stride-2 max backward at a time (ResNet's stem pool) ----
// Output columns [ow, ow_end) of one output row (all windows inside the input row), in blocks of 16:
// each window row is loaded as 32 floats and split into the windows' first/second columns (even/odd
// lanes) and third (even lanes shifted by one); the hits are found in window order with a "free"
// mask, as fixed_backward's selects, and dy (or +0) is added to every cell of the window in the
// scalar loop's order: for a column shared by two windows (one's third, the next one's first), the
// left window's first. So the bits equal the scalar loop's, -0 + +0 included. Returns the first
// column not done (the scalar loop takes the rest).
#if defined(__x86_64__) && defined(__GNUC__)
#define FLUX_POOL_AVX512 1
#define FLUX_TARGET_POOL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's intrinsics start from _mm512_undefined_*
#endif
FLUX_TARGET_POOL_AVX512 int64_t max3_backward_blocks(const float* x, const float* y, const float* dy, float* dx,
                                                     int64_t W, int64_t offset, int64_t ow, int64_t ow_end) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i zero = _mm512_setzero_si512();
  // Full blocks of 16 windows, then one masked block for the rest (n < 16 windows: its 2 n + 1 columns
  // loaded and stored masked; lanes past n hit nothing and add nothing).
  for (; ow < ow_end; ow += 16) {
    const int64_t n = std::min<int64_t>(16, ow_end - ow);
    const bool full = n == 16;
    const __mmask16 lanes = full ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const int64_t cols = 2 * n + 1;  // columns the block's windows cover (full: the 33rd read apart)
    const __mmask16 m0 = full ? __mmask16(0xffff) : __mmask16(cols >= 16 ? 0xffff : (1u << cols) - 1);
    const __mmask16 m1 = full ? __mmask16(0xffff) : __mmask16(cols > 16 ? (1u << (cols - 16)) - 1 : 0);
    const int64_t b = offset + ow * 2;  // window ow + j starts at column b + 2 j of its rows
    const __m512 yv = _mm512_maskz_loadu_ps(lanes, y + ow), g = _mm512_maskz_loadu_ps(lanes, dy + ow);
    const __mmask16 y_nan = _mm512_cmp_ps_mask(yv, yv, _CMP_UNORD_Q);
    __mmask16 free = lanes, hit[3][3];
    for (int r = 0; r < 3; ++r) {
      const float* xr = x + b + r * W;
      const __m512 v0 = _mm512_maskz_loadu_ps(m0, xr), v1 = _mm512_maskz_loadu_ps(m1, xr + 16);
      const __m512 first = _mm512_permutex2var_ps(v0, even, v1), second = _mm512_permutex2var_ps(v0, odd, v1);
      const __m512 next = full ? _mm512_set1_ps(xr[32]) : _mm512_setzero_ps();  // lane 15's third column
      const __m512 third =
          _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(next), _mm512_castps_si512(first), 1));
      const __m512 cols3[3] = {first, second, third};
      for (int c = 0; c < 3; ++c) {
        const __mmask16 holds = _mm512_cmp_ps_mask(cols3[c], yv, _CMP_EQ_OQ) |
                                (_mm512_cmp_ps_mask(cols3[c], cols3[c], _CMP_UNORD_Q) & y_nan);
        hit[r][c] = free & holds;
        free &= __mmask16(~hit[r][c]);
      }
    }
    for (int r = 0; r < 3; ++r) {
      float* dr = dx + b + r * W;
      const __m512 d0 = _mm512_maskz_loadu_ps(m0, dr), d1 = _mm512_maskz_loadu_ps(m1, dr + 16);
      __m512 de = _mm512_permutex2var_ps(d0, even, d1), d_odd = _mm512_permutex2var_ps(d0, odd, d1);
      const __m512 c0 = _mm512_maskz_mov_ps(hit[r][0], g), c1 = _mm512_maskz_mov_ps(hit[r][1], g);
      const __m512 c2 = _mm512_maskz_mov_ps(hit[r][2], g);
      // The third columns of windows j - 1 land on the first columns of windows j (lane 0: the previous
      // block's, already added), before those windows' own first columns.
      const __m512 shifted = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(c2), zero, 15));
      de = _mm512_mask_add_ps(de, __mmask16(0xfffe & (uint32_t(lanes) << 1)), de, shifted);
      de = _mm512_mask_add_ps(de, lanes, de, c0);
      d_odd = _mm512_mask_add_ps(d_odd, lanes, d_odd, c1);
      _mm512_mask_storeu_ps(dr, m0, _mm512_permutex2var_ps(de, low, d_odd));
      _mm512_mask_storeu_ps(dr + 16, m1, _mm512_permutex2var_ps(de, high, d_odd));
      if (full) {
        alignas(64) float last[16];
        _mm512_store_ps(last, c2);
        dr[32] += last[15];  // window ow + 15's third column: the next block's first
      }
    }
  }
  return ow;
}
// The forward's windows [ow, ow_end) of one output row, 16 at a time as above: the running maximum in
// window order with take_max's rule (a larger value or a NaN replaces it), so the bits equal the
// scalar loop's (the first of equal values, the last NaN).
FLUX_TARGET_POOL_AVX512 int64_t max3_forward_blocks(const float* x, float* y, int64_t W, int64_t offset, int64_t ow,
                                                    int64_t ow_end) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (; ow < ow_end; ow += 16) {
    const int64_t n = std::min<int64_t>(16, ow_end - ow);
    const bool full = n == 16;
    const __mmask16 lanes = full ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const int64_t cols = 2 * n + 1;
    const __mmask16 m0 = full ? __mmask16(0xffff) : __mmask16(cols >= 16 ? 0xffff : (1u << cols) - 1);
    const __mmask16 m1 = full ? __mmask16(0xffff) : __mmask16(cols > 16 ? (1u << (cols - 16)) - 1 : 0);
    const int64_t b = offset + ow * 2;
    __m512 m = _mm512_setzero_ps();
    for (int r = 0; r < 3; ++r) {
      const float* xr = x + b + r * W;
      const __m512 v0 = _mm512_maskz_loadu_ps(m0, xr), v1 = _mm512_maskz_loadu_ps(m1, xr + 16);
      const __m512 first = _mm512_permutex2var_ps(v0, even, v1), second = _mm512_permutex2var_ps(v0, odd, v1);
      const __m512 next = full ? _mm512_set1_ps(xr[32]) : _mm512_setzero_ps();
      const __m512 third =
          _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(next), _mm512_castps_si512(first), 1));
      const __m512 cols3[3] = {first, second, third};
      for (int c = 0; c < 3; ++c) {
        const __m512 v = cols3[c];
        if (r == 0 && c == 0) {
          m = v;
          continue;
        }
        const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, take, v);
      }
    }
    _mm512_mask_storeu_ps(y + ow, lanes, m);
  }
  return ow;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define FLUX_POOL_AVX512 0
#endif

// ---- 2-D windows K x K with stride S fixed at compile time on the interior ----

// The output columns [first, last) whose windows lie inside the input row.
inline void interior_columns(const Axes& a, int64_t K, int64_t S, int64_t& first, int64_t& last) {
  first = std::min<int64_t>((a.lo[2] + S - 1) / S, a.out[2]);
  last = a.in[2] + a.lo[2] >= K ? std::min<int64_t>((a.in[2] + a.lo[2] - K) / S + 1, a.out[2]) : 0;
  last = std::max(last, first);
}

template <class T, PoolOp op, int K, int S>
void fixed_forward(const Axes& a, const T* x, T* y) {
  const int64_t W = a.in[2], OW = a.out[2];
  [[maybe_unused]] const bool avx512 = active_isa() == Isa::avx512;
  int64_t first, last;
  interior_columns(a, K, S, first, last);
  const T scale = T(1) / T(K * K);
  for (int64_t oh = 0; oh < a.out[1]; ++oh, y += OW) {
    int64_t h0 = oh * S - a.lo[1];
    if (h0 < 0 || h0 + K > a.in[1]) {
      for (int64_t ow = 0; ow < OW; ++ow) y[ow] = cell_forward<T, op>(a, x, 0, oh, ow);
      continue;
    }
    for (int64_t ow = 0; ow < first; ++ow) y[ow] = cell_forward<T, op>(a, x, 0, oh, ow);
    const T* base = x + h0 * W - a.lo[2];
    int64_t ow = first;
#if FLUX_POOL_AVX512
    if constexpr (std::is_same_v<T, float> && op == PoolOp::max && K == 3 && S == 2)
      if (avx512) ow = max3_forward_blocks(x, y, W, h0 * W - a.lo[2], ow, last);
#endif
    for (; ow < last; ++ow) {
      const T* p = base + ow * S;
      if constexpr (op == PoolOp::max) {
        T m = p[0];
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) m = take_max(m, p[r * W + c]);
        y[ow] = m;
      } else {
        T sum = 0;
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) sum += p[r * W + c];
        y[ow] = sum * scale;
      }
    }
    for (int64_t ow = last; ow < OW; ++ow) y[ow] = cell_forward<T, op>(a, x, 0, oh, ow);
  }
}

template <class T, PoolOp op, int K, int S>
void fixed_backward(const Axes& a, const T* x, const T* y, const T* dy, T* dx) {
  const int64_t W = a.in[2], OW = a.out[2];
  [[maybe_unused]] const bool avx512 = active_isa() == Isa::avx512;
  int64_t first, last;
  interior_columns(a, K, S, first, last);
  const T scale = T(1) / T(K * K);
  for (int64_t oh = 0; oh < a.out[1]; ++oh, y += OW, dy += OW) {
    int64_t h0 = oh * S - a.lo[1];
    if (h0 < 0 || h0 + K > a.in[1]) {
      for (int64_t ow = 0; ow < OW; ++ow) cell_backward<T, op>(a, x, y[ow], dy[ow], dx, 0, oh, ow);
      continue;
    }
    for (int64_t ow = 0; ow < first; ++ow) cell_backward<T, op>(a, x, y[ow], dy[ow], dx, 0, oh, ow);
    int64_t offset = h0 * W - a.lo[2];
    int64_t ow = first;
#if FLUX_POOL_AVX512
    if constexpr (std::is_same_v<T, float> && op == PoolOp::max && K == 3 && S == 2)
      if (avx512) ow = max3_backward_blocks(x, y, dy, dx, W, offset, ow, last);
#endif
    for (; ow < last; ++ow) {
      int64_t at = offset + ow * S;
      if constexpr (op == PoolOp::max) {
        // dy goes to the first cell in window order that holds y. Written as selects over the whole
        // window (no data-dependent branch: the cells hit are random, and mispredictions made this
        // loop several times slower than the forward), so the compiler if-converts it.
        using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
        const T yv = y[ow];
        const Bits g = std::bit_cast<Bits>(dy[ow]);
        Bits free = ~Bits(0);  // all ones until the first hit
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) {
            Bits here = free & (Bits(0) - Bits(holds(x[at + r * W + c], yv)));
            free &= ~here;
            dx[at + r * W + c] += std::bit_cast<T>(g & here);  // dy where hit, +0 elsewhere
          }
      } else {
        T g = dy[ow] * scale;
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) dx[at + r * W + c] += g;
      }
    }
    for (int64_t ow = last; ow < OW; ++ow) cell_backward<T, op>(a, x, y[ow], dy[ow], dx, 0, oh, ow);
  }
}

// 0: reference, 2: 2x2 stride 2, 3: 3x3 stride 2 (2-D windows only).
int fixed_case(const Axes& a) {
  if (a.k[0] != 1 || a.in[0] != 1 || a.s[1] != 2 || a.s[2] != 2 || a.k[1] != a.k[2]) return 0;
  return a.k[1] == 2 || a.k[1] == 3 ? int(a.k[1]) : 0;
}

// Planes per task so that small pools run inline (about 32K window reads per task at least).
int64_t grain_of(const Axes& a) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.out_plane * a.window)); }

// One plane (one n, c) of the forward and of the backward.
template <class T, PoolOp op> void forward_plane(const Axes& a, int fixed, const T* xp, T* yp) {
  if (fixed == 2) fixed_forward<T, op, 2, 2>(a, xp, yp);
  else if (fixed == 3) fixed_forward<T, op, 3, 2>(a, xp, yp);
  else reference_forward<T, op>(a, xp, yp);
}
template <class T, PoolOp op>
void backward_plane(const Axes& a, int fixed, const T* xp, const T* yp, const T* dyp, T* dxp) {
  if (fixed == 2) fixed_backward<T, op, 2, 2>(a, xp, yp, dyp, dxp);
  else if (fixed == 3) fixed_backward<T, op, 3, 2>(a, xp, yp, dyp, dxp);
  else reference_backward<T, op>(a, xp, yp, dyp, dxp);
}

// ---- all planes, threaded; bf16/f16 storage (S = uint16_t): each plane converted into per-thread
// float32 planes (in cache), the float32 plane kernel run there, the result converted down: bitwise the
// cast up, the float32 pool and the cast down (a max is exact, a mean rounds once), without the
// full-tensor float32 copies. ----
struct HalfPlanes {
  std::vector<float> x, y, dy, dx;
};
HalfPlanes& half_planes(const Axes& a) {
  thread_local HalfPlanes p;
  for (auto* v : {&p.x, &p.dx})
    if (int64_t(v->size()) < a.in_plane) v->resize(size_t(a.in_plane));
  for (auto* v : {&p.y, &p.dy})
    if (int64_t(v->size()) < a.out_plane) v->resize(size_t(a.out_plane));
  return p;
}

template <class S, PoolOp op> void forward_planes(DType t, const Axes& a, int64_t planes, const S* x, S* y) {
  const int fixed = fixed_case(a);
  parallel_for(planes, grain_of(a), [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<S, uint16_t>) {
      HalfPlanes& f = half_planes(a);
      for (int64_t p = begin; p < end; ++p) {
        half_storage_to_float(t, x + p * a.in_plane, f.x.data(), a.in_plane);
        forward_plane<float, op>(a, fixed, f.x.data(), f.y.data());
        float_to_half_storage(t, f.y.data(), y + p * a.out_plane, a.out_plane);
      }
    } else {
      for (int64_t p = begin; p < end; ++p) forward_plane<S, op>(a, fixed, x + p * a.in_plane, y + p * a.out_plane);
    }
  });
}

template <class S, PoolOp op>
void backward_planes(DType t, const Axes& a, int64_t planes, const S* x, const S* y, const S* dy, S* dx) {
  const int fixed = fixed_case(a);
  parallel_for(planes, grain_of(a), [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<S, uint16_t>) {
      HalfPlanes& f = half_planes(a);
      for (int64_t p = begin; p < end; ++p) {
        if (op == PoolOp::max) half_storage_to_float(t, x + p * a.in_plane, f.x.data(), a.in_plane);
        if (op == PoolOp::max) half_storage_to_float(t, y + p * a.out_plane, f.y.data(), a.out_plane);
        half_storage_to_float(t, dy + p * a.out_plane, f.dy.data(), a.out_plane);
        half_storage_to_float(t, dx + p * a.in_plane, f.dx.data(), a.in_plane);  // dx is accumulated into
        backward_plane<float, op>(a, fixed, f.x.data(), f.y.data(), f.dy.data(), f.dx.data());
        float_to_half_storage(t, f.dx.data(), dx + p * a.in_plane, a.in_plane);
      }
    } else {
      for (int64_t p = begin; p < end; ++p)
        backward_plane<S, op>(a, fixed, x + p * a.in_plane, y + p * a.out_plane, dy + p * a.out_plane, dx + p * a.in_plane);
    }
  });
}

// f.operator()<S>() for the storage type of t: float, double, uint16_t (bf16/f16); fails otherwise.
template <class F> void typed(const char* api, DType t, const F& f) {
  if (t == DType::f32) f.template operator()<float>();
  else if (t == DType::f64) f.template operator()<double>();
  else if (t == DType::bf16 || t == DType::f16) f.template operator()<uint16_t>();
  else detail::fail("[", api, "] CPU kernel supports Float32, Float64, BFloat16 and Float16; got ", dtype_name(t));
}

}  // namespace

void pool_forward(PoolOp op, DType t, const void* x, void* y, const ConvGeometry& g) {
  const Axes a = axes_of(g);
  const int64_t planes = g.batch * g.in_channels;
  typed("pool", t, [&]<class S>() {
    auto xs = static_cast<const S*>(x);
    auto ys = static_cast<S*>(y);
    if (op == PoolOp::max) forward_planes<S, PoolOp::max>(t, a, planes, xs, ys);
    else forward_planes<S, PoolOp::mean>(t, a, planes, xs, ys);
  });
}

void pool_backward(PoolOp op, DType t, const void* x, const void* y, const void* dy, void* dx, const ConvGeometry& g) {
  const Axes a = axes_of(g);
  const int64_t planes = g.batch * g.in_channels;
  typed("pool backward", t, [&]<class S>() {
    auto xs = static_cast<const S*>(x), ys = static_cast<const S*>(y), dys = static_cast<const S*>(dy);
    auto dxs = static_cast<S*>(dx);
    if (op == PoolOp::max) backward_planes<S, PoolOp::max>(t, a, planes, xs, ys, dys, dxs);
    else backward_planes<S, PoolOp::mean>(t, a, planes, xs, ys, dys, dxs);
  });
}

}  // namespace flux::cpu_backend
