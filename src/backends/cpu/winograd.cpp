// Winograd F(2x2, 3x3) forward convolution for inference (conv.cpp chooses it per geometry against
// oneDNN by timing the first call). Each 2x2 block of output pixels (a tile) comes from a 4x4 block of
// input pixels: with d that input block of one channel and g a 3x3 kernel, the tile is
// A^T [(G g G^T) .* (B^T d B)] A, so a 3x3 conv becomes 16 independent products, one per position
// xi of the 4x4 transformed tile: M[xi] (tiles, O) = V[xi] (tiles, C) U[xi]^T, 16 x C x O
// multiply-adds a tile instead of 36 x C x O (2.25x fewer). Those products run on matmul.cpp's panel
// kernel (U[xi] packed into 16-output panels, kept per weight content stamp as the Dense weights are).
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
//   A^T = [1 1 1 0; 0 1 -1 -1]
// The input transform reads a zero-padded channels-last copy of one image (8 channels a vector), the
// output transform writes y (N, O, OH, OW) with the epilogue of conv.cpp's forwards (scale, shift or
// bias, relu, residual, relu). Images go in chunks of about 128 tiles (so that U is read once per
// chunk, not per image, when an image has few tiles), one chunk per pool thread.
// ONNX Runtime (MLAS) and oneDNN 2.6 on AVX2 run these convs directly (oneDNN's Winograd kernel is
// AVX-512 only and was removed in 3.x); the transforms' rounding is a few float ulps (F(2x2, 3x3) has
// coefficients 1 and 1/2 only).
#include <algorithm>
#include <deque>
#include <mutex>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu {

namespace {

using WVec = float __attribute__((vector_size(32), aligned(4)));  // 8 channels
constexpr int64_t kLanes = 8;
constexpr int64_t kTilesPerChunk = 128;
constexpr double kMaxChunkBytes = 64.0 * (1 << 20);  // one image's V or M: 224x224 ResNet stages take ~3 MB

struct Plan {
  int64_t N, C, O, H, W, OH, OW, pad_top, pad_left, TH, TW, tiles;  // tiles per image
  int64_t Hp, Wp;  // the padded channels-last image
  explicit Plan(const backend::ConvGeometry& g)
      : N(g.batch), C(g.in_channels), O(g.out_channels), H(g.in[0]), W(g.in[1]), OH(g.out[0]), OW(g.out[1]),
        pad_top(g.pad_lo[0]), pad_left(g.pad_lo[1]), TH((OH + 1) / 2), TW((OW + 1) / 2), tiles(TH * TW),
        Hp(2 * TH + 2), Wp(2 * TW + 2) {}
};

/// U[xi] (O, C) = (G g G^T)[xi] for every (o, c), each packed into panels: to + xi * panel_floats(C, O).
void transform_weights(const float* w, int64_t C, int64_t O, float* to) {
  const size_t per = panel_floats(C, O);
  std::vector<float> u(size_t(16 * O * C));
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c) {
      const float* k = w + (o * C + c) * 9;
      float t[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        t[0][j] = k[j];
        t[1][j] = 0.5f * (k[j] + k[3 + j] + k[6 + j]);
        t[2][j] = 0.5f * (k[j] - k[3 + j] + k[6 + j]);
        t[3][j] = k[6 + j];
      }
      for (int i = 0; i < 4; ++i) {  // (G g) G^T
        const float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]), 0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
        for (int j = 0; j < 4; ++j) u[size_t(((i * 4 + j) * O + o) * C + c)] = r[j];
      }
    }
  for (int xi = 0; xi < 16; ++xi) panel_pack(u.data() + xi * O * C, C, O, to + xi * per);
}

/// Transformed weights kept per weight buffer while its content stamp holds (up to 32 sets and 512 MB,
/// least recently used refilled), as matmul.cpp's panels. Called under conv.cpp's mutex.
class KeptTransforms {
 public:
  const float* get(const float* w, uint64_t stamp, int64_t C, int64_t O) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_;
    const size_t size = 16 * panel_floats(C, O);
    Set* slot = nullptr;
    for (Set& s : sets_)
      if (s.from == w) slot = &s;
    if (!slot || slot->stamp != stamp || slot->C != C || slot->O != O) {
      if (!slot && sets_.size() < kMax && bytes_ + size * sizeof(float) <= kMaxBytes) slot = &sets_.emplace_back();
      if (!slot && !sets_.empty())
        slot = &*std::min_element(sets_.begin(), sets_.end(), [](const Set& a, const Set& b) { return a.used < b.used; });
      if (!slot) slot = &sets_.emplace_back();
      bytes_ -= slot->data.size() * sizeof(float);
      slot->data.assign(size, 0.f);
      slot->data.shrink_to_fit();
      bytes_ += size * sizeof(float);
      transform_weights(w, C, O, slot->data.data());
      slot->from = w, slot->stamp = stamp, slot->C = C, slot->O = O;
    }
    slot->used = calls_;
    return slot->data.data();
  }

 private:
  static constexpr size_t kMax = 32;
  static constexpr size_t kMaxBytes = size_t(512) << 20;
  struct Set {
    const float* from = nullptr;
    uint64_t stamp = 0;
    int64_t C = 0, O = 0;
    std::vector<float> data;
    uint64_t used = 0;
  };
  std::mutex mutex_;
  std::deque<Set> sets_;
  uint64_t calls_ = 0;
  size_t bytes_ = 0;
};

KeptTransforms& kept_transforms() {
  static KeptTransforms* k = new KeptTransforms();  // never destroyed, as the backend
  return *k;
}

struct Scratch {
  std::vector<float> image, v, m;  // padded channels-last image; V and M of one chunk
};

/// V[xi] rows [t0, t0 + tiles) of the chunk (T rows each) from image `x` (C, H, W).
FLUX_CPU_INLINE void input_transform(const float* x, const Plan& p, float* image, float* v, int64_t T, int64_t t0) {
  const int64_t C = p.C;
  std::fill(image, image + p.Hp * p.Wp * C, 0.0f);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < p.H; ++r) {
      const float* from = x + (c * p.H + r) * p.W;
      float* to = image + ((r + p.pad_top) * p.Wp + p.pad_left) * C + c;
      for (int64_t col = 0; col < p.W; ++col) to[col * C] = from[col];
    }
  for (int64_t th = 0; th < p.TH; ++th)
    for (int64_t tw = 0; tw < p.TW; ++tw) {
      const int64_t t = t0 + th * p.TW + tw;
      const float* base = image + (2 * th * p.Wp + 2 * tw) * C;
      for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
        WVec a[4][4];
        for (int j = 0; j < 4; ++j) {  // B^T d, column j
          const WVec d0 = *reinterpret_cast<const WVec*>(base + (0 * p.Wp + j) * C + c0);
          const WVec d1 = *reinterpret_cast<const WVec*>(base + (1 * p.Wp + j) * C + c0);
          const WVec d2 = *reinterpret_cast<const WVec*>(base + (2 * p.Wp + j) * C + c0);
          const WVec d3 = *reinterpret_cast<const WVec*>(base + (3 * p.Wp + j) * C + c0);
          a[0][j] = d0 - d2, a[1][j] = d1 + d2, a[2][j] = d2 - d1, a[3][j] = d1 - d3;
        }
        for (int i = 0; i < 4; ++i) {  // (B^T d) B, row i
          float* row = v + ((i * 4) * T + t) * C + c0;
          const int64_t xi_stride = T * C;
          *reinterpret_cast<WVec*>(row) = a[i][0] - a[i][2];
          *reinterpret_cast<WVec*>(row + xi_stride) = a[i][1] + a[i][2];
          *reinterpret_cast<WVec*>(row + 2 * xi_stride) = a[i][2] - a[i][1];
          *reinterpret_cast<WVec*>(row + 3 * xi_stride) = a[i][1] - a[i][3];
        }
      }
    }
}

/// y of image n (O, OH, OW) from M[xi] rows [t0, t0 + tiles) and the epilogue.
FLUX_CPU_INLINE void output_transform(const float* m, const Plan& p, int64_t T, int64_t t0, int64_t n,
                                      const WinogradEpilogue& ep, float* y) {
  const int64_t O = p.O, plane = p.OH * p.OW;
  for (int64_t th = 0; th < p.TH; ++th)
    for (int64_t tw = 0; tw < p.TW; ++tw) {
      const int64_t t = t0 + th * p.TW + tw;
      const int64_t rows = std::min<int64_t>(2, p.OH - 2 * th), cols = std::min<int64_t>(2, p.OW - 2 * tw);
      for (int64_t o0 = 0; o0 < O; o0 += kLanes) {
        WVec s[2][4];
        for (int j = 0; j < 4; ++j) {  // A^T m, column j
          const WVec m0 = *reinterpret_cast<const WVec*>(m + ((0 + j) * T + t) * O + o0);
          const WVec m1 = *reinterpret_cast<const WVec*>(m + ((4 + j) * T + t) * O + o0);
          const WVec m2 = *reinterpret_cast<const WVec*>(m + ((8 + j) * T + t) * O + o0);
          const WVec m3 = *reinterpret_cast<const WVec*>(m + ((12 + j) * T + t) * O + o0);
          s[0][j] = m0 + m1 + m2, s[1][j] = m1 - m2 - m3;
        }
        WVec out[2][2];
        for (int i = 0; i < 2; ++i) {  // (A^T m) A
          out[i][0] = s[i][0] + s[i][1] + s[i][2];
          out[i][1] = s[i][1] - s[i][2] - s[i][3];
        }
        WVec scale = WVec{} + 1.0f, shift = WVec{};
        if (ep.scale) scale = *reinterpret_cast<const WVec*>(ep.scale + o0);
        if (ep.shift) shift = *reinterpret_cast<const WVec*>(ep.shift + o0);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            WVec v = out[i][j] * scale + shift;
            if (ep.relu) v = v > WVec{} ? v : WVec{};
            const int64_t at = ((n * O + o0) * p.OH + 2 * th + i) * p.OW + 2 * tw + j;
            for (int64_t k = 0; k < kLanes; ++k) {
              float e = v[k];
              if (ep.residual) e += ep.residual[at + k * plane];
              if (ep.relu_after) e = e > 0.0f ? e : 0.0f;
              y[at + k * plane] = e;
            }
          }
      }
    }
}

/// Images [n0, n1) on this thread.
FLUX_CPU_INLINE void chunk(const float* x, const Plan& p, const float* u, int64_t n0, int64_t n1,
                           const WinogradEpilogue& ep, float* y, Scratch& s) {
  const int64_t T = (n1 - n0) * p.tiles;
  s.image.resize(size_t(p.Hp * p.Wp * p.C));
  s.v.resize(size_t(16 * T * p.C));
  s.m.resize(size_t(16 * T * p.O));
  for (int64_t n = n0; n < n1; ++n)
    input_transform(x + n * p.C * p.H * p.W, p, s.image.data(), s.v.data(), T, (n - n0) * p.tiles);
  const size_t per = panel_floats(p.C, p.O);
  for (int xi = 0; xi < 16; ++xi)
    panel_product(s.v.data() + xi * T * p.C, T, p.C, u + xi * per, p.O, s.m.data() + xi * T * p.O);
  for (int64_t n = n0; n < n1; ++n) output_transform(s.m.data(), p, T, (n - n0) * p.tiles, n, ep, y);
}

FLUX_CPU_TARGET_AVX512 void chunk_avx512(const float* x, const Plan& p, const float* u, int64_t n0, int64_t n1,
                                         const WinogradEpilogue& ep, float* y, Scratch& s) {
  chunk(x, p, u, n0, n1, ep, y, s);
}
FLUX_CPU_TARGET_AVX2 void chunk_avx2(const float* x, const Plan& p, const float* u, int64_t n0, int64_t n1,
                                     const WinogradEpilogue& ep, float* y, Scratch& s) {
  chunk(x, p, u, n0, n1, ep, y, s);
}
void chunk_baseline(const float* x, const Plan& p, const float* u, int64_t n0, int64_t n1, const WinogradEpilogue& ep,
                    float* y, Scratch& s) {
  chunk(x, p, u, n0, n1, ep, y, s);
}

}  // namespace

bool winograd_fits(const backend::ConvGeometry& g) {
  if (g.spatial != 2 || g.groups != 1 || g.weight_stamp == 0) return false;
  for (int i = 0; i < 2; ++i)
    if (g.kernel[i] != 3 || g.stride[i] != 1 || g.dilation[i] != 1 || g.pad_lo[i] > 2 || g.pad_hi[i] > 2) return false;
  if (g.in_channels % kLanes != 0 || g.out_channels % kLanes != 0 || g.in_channels < 16 || g.out_channels < 16 ||
      g.out[0] <= 0 || g.out[1] <= 0)
    return false;
  // A chunk holds at least one image's V and M (16 x tiles x channels each): at most kMaxChunkBytes.
  const double tiles = double((g.out[0] + 1) / 2) * double((g.out[1] + 1) / 2);
  return 16.0 * tiles * double(std::max(g.in_channels, g.out_channels)) * sizeof(float) <= kMaxChunkBytes;
}

void winograd_forward(const float* x, const float* w, const backend::ConvGeometry& g, const WinogradEpilogue& ep,
                      float* y) {
  const Plan p(g);
  const float* u = kept_transforms().get(w, g.weight_stamp, p.C, p.O);
  const int64_t threads = num_threads();
  const int64_t per_chunk =
      std::clamp<int64_t>((kTilesPerChunk + p.tiles - 1) / p.tiles, 1, (p.N + threads - 1) / threads);
  const int64_t chunks = (p.N + per_chunk - 1) / per_chunk;
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    thread_local Scratch scratch;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * per_chunk, n1 = std::min(p.N, n0 + per_chunk);
      switch (active_isa()) {
        case Isa::avx512: chunk_avx512(x, p, u, n0, n1, ep, y, scratch); break;
        case Isa::avx2: chunk_avx2(x, p, u, n0, n1, ep, y, scratch); break;
        default: chunk_baseline(x, p, u, n0, n1, ep, y, scratch); break;
      }
    }
  });
}

}  // namespace flux::cpu
