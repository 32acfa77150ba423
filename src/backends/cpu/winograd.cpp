// Winograd F(2x2, 3x3) forward convolution (chosen per geometry by the kernel-choice seam, kernel_choice.hpp;
// in training only where its transformed weights are small: conv.cpp). Each 2x2 block of output pixels (a
// tile) comes from a 4x4 block of input pixels: with d that input block of one channel and g a 3x3 kernel,
// the tile is A^T [(G g G^T) .* (B^T d B)] A, so a 3x3 conv becomes 16 independent products, one per position
// xi of the 4x4 transformed tile: M[xi] (tiles, O) = V[xi] (tiles, C) U[xi]^T, 16 x C x O multiply-adds a
// tile instead of 36 x C x O (2.25x fewer). Those products run on matmul_own.cpp's panel kernel (U[xi] packed
// into 16-output panels, kept prepared with the weights as the Dense weights are at inference, made for the
// call in training).
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
//   A^T = [1 1 1 0; 0 1 -1 -1]
// The input transform reads a zero-padded channels-last copy of one image (8 channels a vector), the
// output transform writes y (N, O, OH, OW) with the forward's ConvEpilogue (cpu_backend.hpp: scale, shift or
// bias, relu, residual, relu). Images go in chunks of about 128 tiles (so that U is read once per
// chunk, not per image, when an image has few tiles), one chunk per pool thread; with fewer chunks
// than threads (batch 1) the batch's rows of tiles are split over the pool instead, each piece from
// input to output on one thread. Both layout changes (NCHW -> channels-last in, back out) go 8 x 8
// through registers (transpose8): written as scalar copies they were ~40% of the transforms' time.
// oneDNN 2.6 on AVX2 runs these convs as direct convolutions (its Winograd kernel needs AVX-512), and
// ONNX Runtime's MLAS as NCHWc direct convolutions (we found no Winograd kernel in it). The
// transforms' rounding is a few float ulps (F(2x2, 3x3) has coefficients 1 and 1/2 only): tests
// compare with a float64 conv at 2e-5.
#include <algorithm>
#include <memory>
#include <vector>

#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/call_scratch.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/prepared.hpp"

namespace flux::cpu_backend {

namespace {

using WVec = Vec8;  // 8 channels (broadcast_rows.hpp's vector types)
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
/// u: 16 O C floats of room for the unpacked transforms.
void transform_weights(const float* w, int64_t C, int64_t O, float* u, float* to) {
  const size_t per = panel_floats(C, O);
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
  for (int xi = 0; xi < 16; ++xi) panel_pack(u + xi * O * C, C, O, to + xi * per);
}

/// The transformed weights, kept in the weight tensor's cache (prepared.hpp) while its content holds.
std::shared_ptr<const PreparedFloats> transforms(const float* w, backend::PreparedCache* cache, int64_t C, int64_t O) {
  return prepared<PreparedFloats>(cache, prepared_key(PreparedKind::winograd, reinterpret_cast<intptr_t>(w), C, O), [&] {
    auto f = std::make_shared<PreparedFloats>(16 * panel_floats(C, O));
    std::vector<float> u(size_t(16 * O * C));
    transform_weights(w, C, O, u.data(), f->data);
    return f;
  });
}

/// One piece's scratch (see take()): the padded channels-last image, V and M of its tiles, its images'
/// y channels-last.
struct Scratch {
  float *image, *v, *m, *out;
};
enum class Block { image, v, m, out, weights, unpacked };  // unpacked: a training call's U before packing
using Blocks = CallScratch<Block, 6>;

/// Scratch for T tiles from the CPU pool (call_scratch.hpp: it shares the pool's free blocks with the
/// tensors, so a training step's peak memory does not grow by it), the padded image's border zeroed
/// (its interior is written before it is read).
Scratch take(Blocks& blocks, const Plan& p, int64_t T) {
  Scratch s;
  const auto floats = [&](Block b, int64_t n) { return static_cast<float*>(blocks.get(b, size_t(n) * sizeof(float))); };
  s.image = floats(Block::image, p.Hp * p.Wp * p.C);
  s.v = floats(Block::v, 16 * T * p.C);
  s.m = floats(Block::m, 16 * T * p.O);
  s.out = floats(Block::out, 4 * p.tiles * p.O);
  const int64_t row = p.Wp * p.C, top = p.pad_top, bottom = std::min(p.Hp, p.pad_top + p.H);
  std::fill(s.image, s.image + top * row, 0.0f);
  std::fill(s.image + bottom * row, s.image + p.Hp * row, 0.0f);
  const int64_t right = std::min(p.Wp, p.pad_left + p.W);
  for (int64_t r = top; r < bottom; ++r) {
    float* line = s.image + r * row;
    std::fill(line, line + p.pad_left * p.C, 0.0f);
    std::fill(line + right * p.C, line + row, 0.0f);
  }
  return s;
}

/// r[i][j] <- r[j][i] for an 8 x 8 block held in 8 vectors (unpack, 64-bit shuffle, 128-bit swap).
FLUX_CPU_INLINE void transpose8(WVec r[8]) {
  WVec t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int k = 0; k < 2; ++k) {
      u[i + k] = __builtin_shufflevector(t[i + k], t[i + 2 + k], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 + k] = __builtin_shufflevector(t[i + k], t[i + 2 + k], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  // u[0] = rows 0-3 of columns 0, u[2] column 1, u[1] column 2, u[3] column 3 (low halves); u[4..7] rows 4-7.
  const int order[4] = {0, 2, 1, 3};
  for (int k = 0; k < 4; ++k) {
    r[k] = __builtin_shufflevector(u[order[k]], u[4 + order[k]], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(u[order[k]], u[4 + order[k]], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/// V[xi] rows [t0, t0 + tiles) of the chunk (T rows each) from image `x` (C, H, W): the tiles of tile
/// rows [th_lo, th_hi), channels [c_lo, c_hi) only (multiples of 8). Only the image rows those tiles
/// read are copied into `image`, whose padding is zero (take()).
FLUX_CPU_INLINE void input_transform(const float* x, const Plan& p, float* image, float* v, int64_t T, int64_t t0,
                                     int64_t c_lo, int64_t c_hi, int64_t th_lo, int64_t th_hi) {
  const int64_t C = p.C;
  // Channels-last: 8 channels x 8 columns at a time through registers, the last W % 8 columns one by one.
  const int64_t plane = p.H * p.W, W8 = p.W / 8 * 8;
  // Tile row th reads padded rows 2 th .. 2 th + 3.
  const int64_t r_lo = std::max<int64_t>(0, 2 * th_lo - p.pad_top), r_hi = std::min(p.H, 2 * th_hi + 2 - p.pad_top);
  for (int64_t c0 = c_lo; c0 < c_hi; c0 += kLanes)
    for (int64_t r = r_lo; r < r_hi; ++r) {
      const float* from = x + c0 * plane + r * p.W;
      float* to = image + ((r + p.pad_top) * p.Wp + p.pad_left) * C + c0;
      for (int64_t col = 0; col < W8; col += 8) {
        WVec b[8];
        for (int k = 0; k < 8; ++k) b[k] = *reinterpret_cast<const WVec*>(from + k * plane + col);
        transpose8(b);
        for (int k = 0; k < 8; ++k) *reinterpret_cast<WVec*>(to + (col + k) * C) = b[k];
      }
      for (int64_t col = W8; col < p.W; ++col)
        for (int64_t k = 0; k < kLanes; ++k) to[col * C + k] = from[k * plane + col];
    }
  for (int64_t th = th_lo; th < th_hi; ++th)
    for (int64_t tw = 0; tw < p.TW; ++tw) {
      const int64_t t = t0 + (th - th_lo) * p.TW + tw;
      const float* base = image + (2 * th * p.Wp + 2 * tw) * C;
      for (int64_t c0 = c_lo; c0 < c_hi; c0 += kLanes) {
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

/// y of image n (O, OH, OW) from M[xi] rows [t0, t0 + tiles) (tile rows [th_lo, th_hi)) and the
/// epilogue: the tiles' pixels with scale, shift and relu into `out` (2 TH x 2 TW pixels, O
/// channels-last), then their rows of y through 8 x 8 transposes, adding the residual and the relu
/// after it on the way.
FLUX_CPU_INLINE void output_transform(const float* m, const Plan& p, int64_t T, int64_t t0, int64_t n,
                                      const ConvEpilogue& ep, float* out, float* y, int64_t o_lo, int64_t o_hi,
                                      int64_t th_lo, int64_t th_hi) {
  const int64_t O = p.O, plane = p.OH * p.OW, OWp = 2 * p.TW;
  for (int64_t th = th_lo; th < th_hi; ++th)
    for (int64_t tw = 0; tw < p.TW; ++tw) {
      const int64_t t = t0 + (th - th_lo) * p.TW + tw;
      float* pixels = out + (2 * th * OWp + 2 * tw) * O;
      for (int64_t o0 = o_lo; o0 < o_hi; o0 += kLanes) {
        WVec s[2][4];
        for (int j = 0; j < 4; ++j) {  // A^T m, column j
          const WVec m0 = *reinterpret_cast<const WVec*>(m + ((0 + j) * T + t) * O + o0);
          const WVec m1 = *reinterpret_cast<const WVec*>(m + ((4 + j) * T + t) * O + o0);
          const WVec m2 = *reinterpret_cast<const WVec*>(m + ((8 + j) * T + t) * O + o0);
          const WVec m3 = *reinterpret_cast<const WVec*>(m + ((12 + j) * T + t) * O + o0);
          s[0][j] = m0 + m1 + m2, s[1][j] = m1 - m2 - m3;
        }
        WVec scale = WVec{} + 1.0f, shift = WVec{};
        if (ep.scale) scale = *reinterpret_cast<const WVec*>(static_cast<const float*>(ep.scale) + o0);
        if (ep.shift) shift = *reinterpret_cast<const WVec*>(static_cast<const float*>(ep.shift) + o0);
        for (int i = 0; i < 2; ++i) {  // (A^T m) A
          WVec v0 = (s[i][0] + s[i][1] + s[i][2]) * scale + shift;
          WVec v1 = (s[i][1] - s[i][2] - s[i][3]) * scale + shift;
          if (ep.relu) v0 = v0 <= WVec{} ? WVec{} : v0, v1 = v1 <= WVec{} ? WVec{} : v1;  // NaN stays NaN
          *reinterpret_cast<WVec*>(pixels + (i * OWp) * O + o0) = v0;
          *reinterpret_cast<WVec*>(pixels + (i * OWp + 1) * O + o0) = v1;
        }
      }
    }
  const int64_t OW8 = p.OW / 8 * 8;
  for (int64_t o0 = o_lo; o0 < o_hi; o0 += kLanes)
    for (int64_t r = 2 * th_lo; r < std::min(p.OH, 2 * th_hi); ++r) {
      const float* from = out + r * OWp * O + o0;
      const int64_t at = (n * O + o0) * plane + r * p.OW;
      for (int64_t col = 0; col < OW8; col += 8) {
        WVec b[8];
        for (int k = 0; k < 8; ++k) b[k] = *reinterpret_cast<const WVec*>(from + (col + k) * O);
        transpose8(b);
        for (int k = 0; k < 8; ++k) {
          WVec v = b[k];
          if (ep.residual)
            v += *reinterpret_cast<const WVec*>(static_cast<const float*>(ep.residual) + at + k * plane + col);
          if (ep.relu_after) v = v <= WVec{} ? WVec{} : v;
          *reinterpret_cast<WVec*>(y + at + k * plane + col) = v;
        }
      }
      for (int64_t col = OW8; col < p.OW; ++col)
        for (int64_t k = 0; k < kLanes; ++k) {
          float e = from[col * O + k];
          if (ep.residual) e += static_cast<const float*>(ep.residual)[at + k * plane + col];
          if (ep.relu_after) e = e <= 0.0f ? 0.0f : e;
          y[at + k * plane + col] = e;
        }
    }
}

/// Tile rows [r0, r1) of the batch (row r: image r / TH, its tile row r % TH): their input transforms
/// for channels [c_lo, c_hi), V row (r - r0) x TW on. Images [n0, n1) are rows n0 TH .. n1 TH.
FLUX_CPU_INLINE void inputs(const float* x, const Plan* p, int64_t r0, int64_t r1, int64_t c_lo, int64_t c_hi,
                            const Scratch* s) {
  const int64_t T = (r1 - r0) * p->TW;
  for (int64_t r = r0; r < r1;) {
    const int64_t n = r / p->TH, th = r % p->TH, th_hi = std::min(p->TH, th + r1 - r);
    input_transform(x + n * p->C * p->H * p->W, *p, s->image, s->v, T, (r - r0) * p->TW, c_lo, c_hi,
                    th, th_hi);
    r += th_hi - th;
  }
}
/// Tile rows [r0, r1) of the batch: their outputs for channels [o_lo, o_hi).
FLUX_CPU_INLINE void outputs(const Plan* p, int64_t r0, int64_t r1, int64_t o_lo, int64_t o_hi,
                             const ConvEpilogue* ep, float* y, const Scratch* s) {
  const int64_t T = (r1 - r0) * p->TW;
  for (int64_t r = r0; r < r1;) {
    const int64_t n = r / p->TH, th = r % p->TH, th_hi = std::min(p->TH, th + r1 - r);
    output_transform(s->m, *p, T, (r - r0) * p->TW, n, *ep, s->out, y, o_lo, o_hi, th, th_hi);
    r += th_hi - th;
  }
}
// run_inputs / run_outputs: compiled per ISA level, called for the active one (isa.hpp; pointer
// arguments, as FLUX_CPU_VARIANTS passes its arguments by value).
FLUX_CPU_VARIANTS(run_inputs, inputs)
FLUX_CPU_VARIANTS(run_outputs, outputs)

/// The 16 products of tile rows [r0, r1) of the batch, positions [xi0, xi1).
void products(const Plan& p, const float* u, int64_t r0, int64_t r1, int64_t xi0, int64_t xi1, const Scratch& s) {
  const int64_t T = (r1 - r0) * p.TW;
  const size_t per = panel_floats(p.C, p.O);
  for (int64_t xi = xi0; xi < xi1; ++xi)
    panel_product(s.v + xi * T * p.C, T, p.C, u + xi * per, p.O, s.m + xi * T * p.O);
}

}  // namespace

bool winograd_fits(const backend::ConvGeometry& g) {
  if (g.spatial != 2 || g.groups != 1) return false;
  for (int i = 0; i < 2; ++i)
    if (g.kernel[i] != 3 || g.stride[i] != 1 || g.dilation[i] != 1 || g.pad_lo[i] > 2 || g.pad_hi[i] > 2) return false;
  if (g.in_channels % kLanes != 0 || g.out_channels % kLanes != 0 || g.in_channels < 16 || g.out_channels < 16 ||
      g.out[0] <= 0 || g.out[1] <= 0)
    return false;
  // A chunk holds at least one image's V and M (16 x tiles x channels each): at most kMaxChunkBytes.
  const double tiles = double((g.out[0] + 1) / 2) * double((g.out[1] + 1) / 2);
  return 16.0 * tiles * double(std::max(g.in_channels, g.out_channels)) * sizeof(float) <= kMaxChunkBytes;
}

void winograd_forward(const float* x, const float* w, const backend::ConvGeometry& g, const ConvEpilogue& ep,
                      float* y) {
  const Plan p(g);
  Blocks call;  // the caller's blocks: a training forward's transformed weights, the shared scratch
  std::shared_ptr<const PreparedFloats> kept;
  const float* u;
  if (g.weight_cache) {
    kept = transforms(w, g.weight_cache, p.C, p.O);
    u = kept->data;
  } else {  // training: made for this call, in pool memory
    float* made = static_cast<float*>(call.get(Block::weights, 16 * panel_floats(p.C, p.O) * sizeof(float)));
    float* unpacked = static_cast<float*>(call.get(Block::unpacked, size_t(16 * p.O * p.C) * sizeof(float)));
    transform_weights(w, p.C, p.O, unpacked, made);
    u = made;
  }
  const int64_t threads = num_threads();
  const int64_t per_chunk =
      std::clamp<int64_t>((kTilesPerChunk + p.tiles - 1) / p.tiles, 1, (p.N + threads - 1) / threads);
  const int64_t chunks = (p.N + per_chunk - 1) / per_chunk;
  // Tile rows [r0, r1) of the batch on this thread, start to end, on `scratch` (sized for them).
  auto rows = [&](int64_t r0, int64_t r1, const Scratch& scratch) {
    run_inputs(x, &p, r0, r1, int64_t(0), p.C, &scratch);
    products(p, u, r0, r1, 0, 16, scratch);
    run_outputs(&p, r0, r1, int64_t(0), p.O, &ep, y, &scratch);
  };
  if (chunks >= threads) {  // a chunk of whole images per task, each on one thread
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      Blocks blocks;
      const Scratch scratch = take(blocks, p, per_chunk * p.tiles);
      for (int64_t c = c0; c < c1; ++c) rows(c * per_chunk * p.TH, std::min(p.N, (c + 1) * per_chunk) * p.TH, scratch);
    });
    return;
  }
  // Fewer chunks than threads (a small batch): the batch's tile rows split over the pool, each piece
  // start to end on one thread (U read by each thread). Sharing one scratch across the three steps
  // instead (split by channels, positions, output channels) ran slower at 2 threads than at 1.
  if (p.N * p.TH >= threads) {
    parallel_for(p.N * p.TH, 1, [&](int64_t r0, int64_t r1) {
      Blocks blocks;
      rows(r0, r1, take(blocks, p, (r1 - r0) * p.TW));
    });
    return;
  }
  // Fewer tile rows than threads: each step split over the pool, on the caller's scratch.
  const int64_t r1 = p.N * p.TH;
  const Scratch scratch = take(call, p, r1 * p.TW);
  const int64_t c_blocks = p.C / kLanes, o_blocks = p.O / kLanes;
  parallel_for(c_blocks, 1,
               [&](int64_t b0, int64_t b1) { run_inputs(x, &p, 0, r1, b0 * kLanes, b1 * kLanes, &scratch); });
  parallel_for(16, 1, [&](int64_t xi0, int64_t xi1) { products(p, u, 0, r1, xi0, xi1, scratch); });
  parallel_for(o_blocks, 1,
               [&](int64_t b0, int64_t b1) { run_outputs(&p, 0, r1, b0 * kLanes, b1 * kLanes, &ep, y, &scratch); });
}

}  // namespace flux::cpu_backend
