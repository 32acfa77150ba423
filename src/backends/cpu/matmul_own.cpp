// Dense inference on panels of flux's own (linear_forward's other kernel beside oneDNN; also
// Winograd's tile products, winograd.cpp). w (out, in) is packed once per content into panels of 16
// outputs, each (in, 16): the 16 weights of one input for 16 outputs side by side, kept in the
// weight tensor's cache (prepared.hpp). A kernel call holds R rows of y by 16 columns in registers and
// runs once over the whole of `in` (no blocking of in: the MNIST shapes measured best unblocked), each
// x value broadcast against the panel's vectors, then adds the bias, applies relu and stores
// (broadcast_rows.hpp, the kernel of conv_own.cpp's few-pixel forwards too). x is read in place, its R
// rows `in` apart. matmul.cpp's gemm_loops is the reference; figures:
// bench/results/2026-12-05-cpu-backend-comment-measurements.md.
#include <algorithm>
#include <memory>

#include "src/backends/cpu/broadcast_rows.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/matmul_kernels.hpp"
#include "src/backends/cpu/prepared.hpp"

namespace flux::cpu_backend {

namespace {
constexpr int64_t kPanel = 16;

/// Rows [r0, r0 + rows) of y's columns [c, c + cols) from one panel; a partial panel (cols < 16) through `tile`.
template <class Vec, int R, int V>
FLUX_CPU_INLINE void panel_tile(const float* x, int64_t in, const float* panel, const float* bias, bool relu, int64_t r0,
                                int64_t rows, int64_t cols, float* y, int64_t out, int64_t c, float* tile) {
  if (cols == kPanel) {
    broadcast_block<Vec, R, V>(rows, x + r0 * in, in, panel, in, bias, relu, y + r0 * out + c, out);
    return;
  }
  broadcast_block<Vec, R, V>(rows, x + r0 * in, in, panel, in, bias, relu, tile, kPanel);
  for (int64_t r = 0; r < rows; ++r) std::copy(tile + r * kPanel, tile + r * kPanel + cols, y + (r0 + r) * out + c);
}

/// Columns [lo, hi) of y (n, out) (lo a multiple of 16) from the panels of the whole w. Rows go in
/// blocks of R; a remainder shares the last two blocks evenly (128 rows, R 6: 20 x 6 + 4 + 4, not 21 x 6
/// + 2: a 2-row block has 4 accumulator chains, too few to hide the FMA latency). A last partial panel
/// is computed into a tile and its valid columns copied out; its bias is read from a padded copy.
template <class Vec, int R, int V>
FLUX_CPU_INLINE void panel_columns(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi,
                                   int64_t out, const float* bias, bool relu, float* y) {
  static_assert(V * sizeof(Vec) == kPanel * sizeof(float), "a block row is one panel row");
  for (int64_t c = lo; c < hi; c += kPanel) {
    const float* panel = panels + c * in;  // panel c / 16
    const int64_t cols = std::min(kPanel, out - c);
    float bias16[kPanel] = {};
    float tile[R * kPanel];
    const float* b = bias ? bias + c : nullptr;
    if (bias && cols < kPanel) {
      std::copy(bias + c, bias + c + cols, bias16);
      b = bias16;
    }
    // One call site (each inlines every block size) and no lambda: a lambda does not inherit this
    // function's target, and its kernel was baseline code (bench/results/2026-12-06-notes-from-comments.md).
    for (int64_t r0 = 0; r0 < n;) {
      const int64_t left = n - r0, rows = left >= 2 * R ? R : left > R ? (left + 1) / 2 : left;
      panel_tile<Vec, R, V>(x, in, panel, b, relu, r0, rows, cols, y, out, c, tile);
      r0 += rows;
    }
  }
}

FLUX_CPU_TARGET_AVX512 void panel_columns_avx512(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo,
                                                 int64_t hi, int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec16, 12, 1>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
FLUX_CPU_TARGET_AVX2 void panel_columns_avx2(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo,
                                             int64_t hi, int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec8, 6, 2>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
void panel_columns_baseline(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi,
                            int64_t out, const float* bias, bool relu, float* y) {
  panel_columns<Vec4, 3, 4>(x, n, in, panels, lo, hi, out, bias, relu, y);
}
void panel_piece(const float* x, int64_t n, int64_t in, const float* panels, int64_t lo, int64_t hi, int64_t out,
                 const float* bias, bool relu, float* y) {
  switch (active_isa()) {
    case Isa::avx512: return panel_columns_avx512(x, n, in, panels, lo, hi, out, bias, relu, y);
    case Isa::avx2: return panel_columns_avx2(x, n, in, panels, lo, hi, out, bias, relu, y);
    default: return panel_columns_baseline(x, n, in, panels, lo, hi, out, bias, relu, y);
  }
}

}  // namespace

size_t panel_floats(int64_t in, int64_t out) { return size_t((out + kPanel - 1) / kPanel * kPanel) * size_t(in); }
/// to[(p * in + i) * 16 + j] = w[p * 16 + j][i] for the ceil(out / 16) panels p, 0 past out.
void panel_pack(const float* w, int64_t in, int64_t out, float* to) {
  for (int64_t p = 0; p * kPanel < out; ++p) {
    const int64_t cols = std::min(kPanel, out - p * kPanel);
    float* panel = to + p * in * kPanel;
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = 0; j < cols; ++j) panel[i * kPanel + j] = w[(p * kPanel + j) * in + i];
      for (int64_t j = cols; j < kPanel; ++j) panel[i * kPanel + j] = 0.f;
    }
  }
}
void panel_product(const float* x, int64_t n, int64_t in, const float* panels, int64_t out, float* y) {
  panel_piece(x, n, in, panels, 0, out, out, nullptr, false, y);
}

void linear_panels(const float* x, const float* w, backend::PreparedCache* cache, const float* bias, float* y,
                   int64_t n, int64_t in, int64_t out, bool relu, const Pieces& cut) {
  const auto key = prepared_key(PreparedKind::panels, reinterpret_cast<intptr_t>(w), in, out);
  auto panels = prepared<PreparedFloats>(cache, key, [&] {
    auto f = std::make_shared<PreparedFloats>(panel_floats(in, out));
    panel_pack(w, in, out, f->data);
    return f;
  });
  each_piece(cut.parts, [&](int64_t p) {
    if (cut.lo(p) < cut.hi(p)) panel_piece(x, n, in, panels->data, cut.lo(p), cut.hi(p), out, bias, relu, y);
  });
}

}  // namespace flux::cpu_backend
