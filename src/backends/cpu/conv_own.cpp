// flux's own convolution kernel (no oneDNN needed): forwards with at most kFewPixels output pixels
// over the batch (ResNet-18's last stage at batch 1: 4x4 pixels at 112x112). Such a forward is bound
// by the pass over its weights (9.4 MB for 512 -> 512 3x3) and the FMAs on them; oneDNN's blocked
// kernels reorder and reread the weights and its gemm kernel gathers its columns with a scalar loop.
// Here the columns (C k, N P) are gathered once, zero-padded to whole vectors of the active ISA, and
// each pool thread runs its rows of W through few_pixel_rows (broadcast_rows.hpp): R rows of the
// product held in registers (R x V vectors), one pass over those rows of W, each weight broadcast
// against the V vectors of its column row; then scale and shift (or bias), relu, residual and relu in
// one pass into y. Measurements: bench/results/2026-12-05-code-comment-measurements.md.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

namespace {
constexpr int64_t kFewPixels = 32;

}  // namespace

bool few_pixel_fits(const backend::ConvGeometry& g) {
  if (g.groups != 1 || g.spatial < 1 || g.spatial > 3) return false;
  int64_t per_pixel = g.in_channels, out_pixels = g.batch, padded_image = 1;
  for (int i = 0; i < g.spatial; ++i) {
    per_pixel *= g.kernel[i], out_pixels *= g.out[i];
    padded_image *= g.in[i] + g.pad_lo[i] + g.pad_hi[i];
  }
  // few_pixel_columns' offsets into one (padded) image are 32-bit.
  return per_pixel >= 64 && out_pixels <= kFewPixels && padded_image < (int64_t(1) << 31);
}

// Rows a kernel call holds for V vectors a row: as many as the ISA's vector registers allow beside
// the V column vectors (32 zmm; 16 ymm / xmm), measured best at 8 (AVX-512, V = 1, 2) and 6 (AVX2, V = 2).
constexpr int few_pixel_block(int lanes, int v) {
  if (lanes == 16) return 8;
  if (lanes == 8) return v == 1 ? 8 : v == 2 ? 6 : v == 3 ? 4 : 3;
  return v <= 2 ? 6 : v <= 4 ? 3 : 1;
}

namespace {

/// c (rows, V L) = w (rows, k) col (k, V L): blocks of R rows of w (k apart) through broadcast_rows.hpp.
template <class Vec, int V> FLUX_CPU_INLINE void few_pixel_rows(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  constexpr int L = int(sizeof(Vec) / sizeof(float)), R = few_pixel_block(L, V);
  for (int64_t r = 0; r < rows; r += R)
    broadcast_block<Vec, R, V>(std::min<int64_t>(R, rows - r), w + r * k, k, col, k, nullptr, false, c + r * V * L, V * L);
}
template <int V> FLUX_CPU_TARGET_AVX512 void few_pixel_avx512(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec16, V>(w, k, rows, col, c);
}
template <int V> FLUX_CPU_TARGET_AVX2 void few_pixel_avx2(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec8, V>(w, k, rows, col, c);
}
template <int V> void few_pixel_baseline(const float* w, int64_t k, int64_t rows, const float* col, float* c) {
  few_pixel_rows<Vec4, V>(w, k, rows, col, c);
}

/// The vector width (floats) of the active ISA's few-pixel kernel.
int64_t few_pixel_lanes() {
  Isa isa = active_isa();
  return isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 4;
}

/// c (rows, ldc) = w (rows, k) col (k, ldc), ldc = few_pixel_lanes() x V, V <= kFewPixels / lanes.
void few_pixel_gemm(const float* w, int64_t k, int64_t rows, const float* col, int64_t ldc, float* c) {
  const int64_t v = ldc / few_pixel_lanes();
  switch (active_isa()) {
    case Isa::avx512:
      if (v == 1) return few_pixel_avx512<1>(w, k, rows, col, c);
      return few_pixel_avx512<2>(w, k, rows, col, c);
    case Isa::avx2:
      switch (v) {
        case 1: return few_pixel_avx2<1>(w, k, rows, col, c);
        case 2: return few_pixel_avx2<2>(w, k, rows, col, c);
        case 3: return few_pixel_avx2<3>(w, k, rows, col, c);
        default: return few_pixel_avx2<4>(w, k, rows, col, c);
      }
    default:
      switch (v) {
        case 1: return few_pixel_baseline<1>(w, k, rows, col, c);
        case 2: return few_pixel_baseline<2>(w, k, rows, col, c);
        case 3: return few_pixel_baseline<3>(w, k, rows, col, c);
        case 4: return few_pixel_baseline<4>(w, k, rows, col, c);
        case 5: return few_pixel_baseline<5>(w, k, rows, col, c);
        case 6: return few_pixel_baseline<6>(w, k, rows, col, c);
        case 7: return few_pixel_baseline<7>(w, k, rows, col, c);
        default: return few_pixel_baseline<8>(w, k, rows, col, c);
      }
  }
}

/// out[t ldc + p] = image[idx[t P + p]] for taps t < taps, pixels p < P: scalar loads (GCC does not
/// vectorise it; small beside the kernel after it).
void gather_taps(const float* __restrict image, const int32_t* __restrict idx, int64_t taps, int64_t P,
                 float* __restrict out, int64_t ldc) {
  for (int64_t t = 0; t < taps; ++t, out += ldc, idx += P)
    for (int64_t p = 0; p < P; ++p) out[p] = image[idx[p]];
}

/// The columns of x (N, C, in...) for (g): col row (c, k...) holds, at n P + p, the input under
/// kernel tap k of output pixel p of sample n (0 in the padding); columns N P .. ldc are 0. Each image
/// (copied first into a zero-bordered buffer when the conv pads) is read through one table of
/// offsets, tap by pixel, shared by every channel (faster than a bounds check per element or loops
/// per output row; figures in bench/results/2026-12-05-cpu-backend-comment-measurements.md).
void few_pixel_columns(const float* x, float* col, int64_t ldc, const backend::ConvGeometry& g) {
  // Axes padded with unit axes in front.
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], lo[3], size[3];
  for (int i = 0; i < 3; ++i) {
    const int from = i - (3 - g.spatial);
    const bool used = from >= 0;
    in[i] = used ? g.in[from] : 1, out[i] = used ? g.out[from] : 1, kernel[i] = used ? g.kernel[from] : 1;
    stride[i] = used ? g.stride[from] : 1, dilation[i] = used ? g.dilation[from] : 1;
    lo[i] = used ? g.pad_lo[from] : 0;
    size[i] = in[i] + lo[i] + (used ? g.pad_hi[from] : 0);  // the padded image
  }
  const bool padded = size[0] != in[0] || size[1] != in[1] || size[2] != in[2];
  const int64_t I = in[0] * in[1] * in[2], S = size[0] * size[1] * size[2];
  const int64_t P = out[0] * out[1] * out[2], K = kernel[0] * kernel[1] * kernel[2], NP = g.batch * P;
  // idx[t P + p]: the offset in the (padded) image of tap t of output pixel p. Offsets are < S <= 2^31
  // for any image a few-pixel conv reads (checked: else the caller's oneDNN path runs).
  std::vector<int32_t> idx(size_t(K * P));
  int32_t* at = idx.data();
  for (int64_t k0 = 0; k0 < kernel[0]; ++k0)
    for (int64_t k1 = 0; k1 < kernel[1]; ++k1)
      for (int64_t k2 = 0; k2 < kernel[2]; ++k2)
        for (int64_t o0 = 0; o0 < out[0]; ++o0)
          for (int64_t o1 = 0; o1 < out[1]; ++o1)
            for (int64_t o2 = 0; o2 < out[2]; ++o2)
              *at++ = int32_t(((o0 * stride[0] + k0 * dilation[0]) * size[1] + o1 * stride[1] + k1 * dilation[1]) * size[2] +
                              o2 * stride[2] + k2 * dilation[2]);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, K * NP + (padded ? S : 0)));
  parallel_for(g.in_channels, grain, [&](int64_t c0, int64_t c1) {
    std::vector<float> buffer(padded ? size_t(S) : 0, 0.0f);  // the border stays 0
    for (int64_t c = c0; c < c1; ++c) {
      float* rows = col + c * K * ldc;
      for (int64_t n = 0; n < g.batch; ++n) {
        const float* image = x + (n * g.in_channels + c) * I;
        if (padded) {
          for (int64_t i0 = 0; i0 < in[0]; ++i0)
            for (int64_t i1 = 0; i1 < in[1]; ++i1)
              std::copy_n(image + (i0 * in[1] + i1) * in[2], in[2],
                          buffer.data() + ((i0 + lo[0]) * size[1] + i1 + lo[1]) * size[2] + lo[2]);
          image = buffer.data();
        }
        gather_taps(image, idx.data(), K, P, rows + n * P, ldc);
      }
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = NP; j < ldc; ++j) rows[k * ldc + j] = 0.0f;
    }
  });
}

}  // namespace

void few_pixel_forward(const float* x, const float* w, const backend::ConvGeometry& g, const ConvEpilogue& ep,
                       float* y) {
  int64_t P = 1, K = g.in_channels;
  for (int i = 0; i < g.spatial; ++i) P *= g.out[i], K *= g.kernel[i];
  const int64_t O = g.out_channels, NP = g.batch * P, lanes = few_pixel_lanes();
  const int64_t ldc = (NP + lanes - 1) / lanes * lanes;
  // The calling thread's buffers, grown to its largest call and kept (no page faults per call).
  thread_local std::vector<float> col_buffer, out_buffer;
  if (col_buffer.size() < size_t(K * ldc)) col_buffer.resize(size_t(K * ldc));
  if (out_buffer.size() < size_t(O * ldc)) out_buffer.resize(size_t(O * ldc));
  float* col = col_buffer.data();
  float* prod = out_buffer.data();
  few_pixel_columns(x, col, ldc, g);
  const auto* scale = static_cast<const float*>(ep.scale);
  const auto* shift = static_cast<const float*>(ep.shift);
  const auto* r = static_cast<const float*>(ep.residual);
  const bool relu = ep.relu, relu_after = ep.relu_after;
  // Rows of W split over the pool in blocks of 16 (a multiple of every kernel's R but AVX2's 6).
  const int64_t blocks = (O + 15) / 16;
  const int64_t chunks = std::min<int64_t>({num_threads(), blocks, std::max<int64_t>(1, (2 * O * K * NP) >> 21)});
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t o0 = std::min(O, blocks * c / chunks * 16), o1 = std::min(O, blocks * (c + 1) / chunks * 16);
      few_pixel_gemm(w + o0 * K, K, o1 - o0, col, ldc, prod + o0 * ldc);
      for (int64_t o = o0; o < o1; ++o) {
        const float a = scale ? scale[o] : 1.0f, b = shift ? shift[o] : 0.0f;
        for (int64_t n = 0; n < g.batch; ++n) {
          const float* from = prod + o * ldc + n * P;
          float* to = y + (n * O + o) * P;
          const float* add = r ? r + (n * O + o) * P : nullptr;
          for (int64_t p = 0; p < P; ++p) {
            float v = from[p] * a + b;
            if (relu) v = v <= 0.0f ? 0.0f : v;  // NaN stays NaN
            if (add) v += add[p];
            if (relu_after) v = v <= 0.0f ? 0.0f : v;
            to[p] = v;
          }
        }
      }
    }
  });
}

}  // namespace flux::cpu_backend
