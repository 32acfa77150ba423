// The fused attention kernels (Backend::attention_forward/backward; the CPU's src/backends/cpu/
// attention.cpp) against the composed path (matmul, softmax, matmul) in float64: outputs and the
// gradients into q, k and v, read in place from projection-shaped rows (N, T, H * d) as
// MultiHeadAttention passes them, with causal and padding masks, lengths that are not multiples of
// the tiles, T = 1, Float32 and bf16/f16 operands; the functional op on every device (the OpenCL
// backend composes; MultiHeadAttention's device suites are in test_attention*.cpp); storage that grows
// with T, not T².
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "sequence_test_support.hpp"
#include "src/backends/cpu/bf16_tiles.hpp"
#include "src/half_bits.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/storage_stats.hpp"

using namespace flux;
using namespace flux::testing;

namespace flux::detail {
int cpu_force_isa(int level);            // src/backends/cpu/isa.cpp
int cpu_attention_tile_mode(int mode);   // src/backends/cpu/attention.cpp
}  // namespace flux::detail

namespace {
struct Case {
  int64_t n, h, tq, tk, d, dv;
  bool causal;
  int mask;     // 0 none, 1 (Tq, Tk), 2 (N, 1, Tq, Tk) padding, 3 (N, H, Tq, Tk)
  bool packed;  // q, k, v as one (N * T, 3 H d) projection (self-attention), else three tensors
};

std::string name(const Case& c) {
  std::ostringstream os;
  os << "n" << c.n << " h" << c.h << " tq" << c.tq << " tk" << c.tk << " d" << c.d << " dv" << c.dv
     << (c.causal ? " causal" : "") << " mask" << c.mask << (c.packed ? " packed" : "");
  return os.str();
}

// A mask of the case's shape that leaves every query at least one key (key 0, which causal keeps
// visible too when tq == tk; padding masks hide a batch element's last keys).
Tensor make_mask(const Case& c) {
  if (c.mask == 0) return Tensor();
  Shape s = c.mask == 1 ? Shape{c.tq, c.tk} : c.mask == 2 ? Shape{c.n, 1, c.tq, c.tk} : Shape{c.n, c.h, c.tq, c.tk};
  std::vector<double> v(size_t(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t j = int64_t(i) % c.tk, row = int64_t(i) / c.tk, b = row / c.tq;
    if (c.mask == 2) v[i] = j < c.tk - (b % 3) ? 1 : 0;  // padding: b % 3 keys hidden at the end
    else v[i] = j == 0 || (int64_t(i) * 7 + 3) % 5 != 0 ? 1 : 0;
  }
  return Tensor(v, s) > 0.5;
}

// The (N, Tq, H dv) output of attention over the projection rows x (packed) or q, k, v, composed in
// float64 from public ops: heads split by permute, causal_mask and the mask combined.
Tensor composed(const Case& c, const std::vector<Tensor>& in, const Tensor& mask) {
  Tensor q, k, v;
  if (c.packed) {
    Tensor x = in[0].reshape(Shape{c.n, c.tq, 3, c.h, c.d});
    Tensor heads = permute(x, {2, 0, 3, 1, 4});
    q = heads[0], k = heads[1], v = heads[2];
  } else {
    q = permute(in[0].reshape(Shape{c.n, c.tq, c.h, c.d}), {0, 2, 1, 3});
    k = permute(in[1].reshape(Shape{c.n, c.tk, c.h, c.d}), {0, 2, 1, 3});
    v = permute(in[2].reshape(Shape{c.n, c.tk, c.h, c.dv}), {0, 2, 1, 3});
  }
  Tensor m = mask;
  if (c.causal) {
    Tensor cm = causal_mask(c.tq, c.tk);
    m = m.defined() ? minimum(m, cm) : cm;
  }
  Tensor o = dot_product_attention(q, k, v, m);
  return permute(o, {0, 2, 1, 3}).reshape(Shape{c.n * c.tq, c.h * c.dv});
}

// The same through detail::fused_attention, reading the heads in place; undefined when not fused.
Tensor fused(const Case& c, const std::vector<Tensor>& in, const Tensor& mask) {
  backend::Attention a;
  a.b0 = c.n, a.b1 = c.h, a.tq = c.tq, a.tk = c.tk, a.d = c.d, a.dv = c.dv, a.causal = c.causal;
  a.scale = 1.0 / std::sqrt(double(c.d));
  if (mask.defined()) {
    const Shape& s = mask.shape();
    a.mask_stride[0] = s.size() == 4 ? s[1] * c.tq * c.tk : 0;
    a.mask_stride[1] = s.size() == 4 && s[1] == c.h ? c.tq * c.tk : 0;
    a.mask_stride[2] = c.tk, a.mask_stride[3] = 1;
  }
  a.o_stride[0] = c.tq * c.h * c.dv, a.o_stride[1] = c.dv, a.o_stride[2] = c.h * c.dv;
  detail::AttentionView q, k, v;
  if (c.packed) {
    const int64_t w = 3 * c.h * c.d;
    q = {in[0], 0, {c.tq * w, c.d, w}}, k = {in[0], c.h * c.d, {c.tq * w, c.d, w}};
    v = {in[0], 2 * c.h * c.d, {c.tq * w, c.d, w}};
  } else {
    q = {in[0], 0, {c.tq * c.h * c.d, c.d, c.h * c.d}}, k = {in[1], 0, {c.tk * c.h * c.d, c.d, c.h * c.d}};
    v = {in[2], 0, {c.tk * c.h * c.dv, c.dv, c.h * c.dv}};
  }
  return detail::fused_attention(q, k, v, mask, a, Shape{c.n * c.tq, c.h * c.dv});
}

std::vector<Tensor> inputs(const Case& c, uint64_t seed_base) {
  if (c.packed) return {uniform_tensor(Shape{c.n * c.tq, 3 * c.h * c.d}, seed_base, -1.5, 1.5)};
  return {uniform_tensor(Shape{c.n * c.tq, c.h * c.d}, seed_base, -1.5, 1.5),
          uniform_tensor(Shape{c.n * c.tk, c.h * c.d}, seed_base + 1, -1.5, 1.5),
          uniform_tensor(Shape{c.n * c.tk, c.h * c.dv}, seed_base + 2, -1.5, 1.5)};
}

// Output and gradients of sum(out * r) of the fused kernel in dtype t against the float64 composition.
void check_case(const Case& c, DType t, double out_tol, double grad_tol) {
  SCOPED_TRACE(name(c) + " " + dtype_name(t));
  std::vector<Tensor> x64 = inputs(c, uint64_t(c.tq * 31 + c.tk * 7 + c.d));
  Tensor mask = make_mask(c);
  Tensor r = uniform_tensor(Shape{c.n * c.tq, c.h * c.dv}, 99, 0.5, 1.5);
  auto ref = [&](const std::vector<Tensor>& v) { return sum(composed(c, v, mask) * r); };
  std::vector<Tensor> want_grads = gradient(ref, x64);
  std::vector<double> want = composed(c, x64, mask).to_vector<double>();

  std::vector<Tensor> xt;
  for (const Tensor& x : x64) xt.push_back(x.cast(t));
  Tensor out = fused(c, xt, mask);
  ASSERT_TRUE(out.defined()) << "the CPU ran the composition";
  EXPECT_EQ(out.dtype(), t);
  EXPECT_LT(max_rel_error(out, want), out_tol);
  Tensor r32 = r.f32();
  std::vector<Tensor> grads = gradient([&](const std::vector<Tensor>& v) { return sum(fused(c, v, mask).cast(DType::f32) * r32); }, xt);
  ASSERT_EQ(grads.size(), xt.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(grads[i].dtype(), t);
    EXPECT_LT(max_rel_error(grads[i], want_grads[i].to_vector<double>()), grad_tol) << "input " << i;
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 3, 5, 5, 8, 8, false, 0, true},       // small, self-attention layout
      {1, 2, 1, 1, 16, 16, true, 0, true},      // T = 1
      {2, 2, 67, 67, 16, 16, true, 0, true},    // causal, T not a multiple of the tiles
      {1, 2, 130, 130, 32, 32, false, 2, true}, // padding mask over > 2 query tiles and > 1 key tile
      {2, 2, 130, 130, 8, 8, true, 2, false},   // causal and padding together
      {3, 2, 7, 19, 8, 4, false, 1, false},     // cross-attention, Tq < Tk, dv != d, a (Tq, Tk) mask
      {2, 3, 9, 150, 16, 8, true, 3, false},    // causal with Tq < Tk (aligned at the end), per-head mask
      {1, 1, 200, 70, 64, 64, false, 0, false}, // Tq > Tk, d = 64
  };
  return all;
}
}  // namespace

TEST(FusedAttention, FloatMatchesFloat64Composition) {
  for (const Case& c : cases()) check_case(c, DType::f32, 2e-5, 1e-4);
}

TEST(FusedAttention, HalfOperandsMatchFloat64Composition) {
  // bf16/f16 operands (inputs rounded, output and gradients rounded once): scores, softmax and the
  // accumulators in Float32. The bounds are a few units in the last place of each format.
  for (const Case& c : cases()) {
    check_case(c, DType::bf16, 3e-2, 6e-2);
    check_case(c, DType::f16, 4e-3, 1e-2);
  }
}

TEST(FusedAttention, RowsWithoutVisibleKeysAreNaNAsComposed) {
  // causal with Tq > Tk: the first Tq - Tk queries see no key (causal_mask's alignment at the end)
  Case c{1, 1, 5, 3, 4, 4, true, 0, false};
  std::vector<Tensor> x64 = inputs(c, 5), x32;
  for (const Tensor& x : x64) x32.push_back(x.f32());
  std::vector<double> want = composed(c, x64, Tensor()).to_vector<double>();
  std::vector<double> got = fused(c, x32, Tensor()).to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << i;
    if (!std::isnan(want[i])) {
      EXPECT_NEAR(got[i], want[i], 1e-5) << i;
    }
  }
}

class FusedAttentionDevices : public ::testing::TestWithParam<Device> {};

TEST_P(FusedAttentionDevices, FunctionalOpMatchesFloat64Composition) {
  // dot_product_attention with 3-D and 4-D operands, masks broadcast over some batch axes, in Float32
  // on the device (the CPU fuses; OpenCL composes) against the float64 CPU composition.
  const Device dev = GetParam();
  auto on = [&](const Tensor& t) { return to(t.dtype() == DType::boolean ? t : t.f32(), dev); };
  struct Shapes {
    Shape q, k, v, mask;
  };
  const std::vector<Shapes> shapes = {
      {{3, 70, 8}, {3, 90, 8}, {3, 90, 5}, {}},
      {{3, 70, 8}, {3, 90, 8}, {3, 90, 5}, {70, 90}},
      {{2, 3, 33, 16}, {2, 3, 33, 16}, {2, 3, 33, 16}, {2, 1, 1, 33}},  // padding per batch element
      {{2, 3, 33, 16}, {2, 3, 33, 16}, {2, 3, 33, 16}, {3, 33, 33}},    // per head, broadcast over N
      {{2, 2, 3, 20, 8}, {2, 2, 3, 20, 8}, {2, 2, 3, 20, 8}, {2, 2, 1, 20, 20}},
  };
  for (const Shapes& s : shapes) {
    SCOPED_TRACE(to_string(s.q) + " mask " + to_string(s.mask));
    Tensor q = uniform_tensor(s.q, 1, -1, 1), k = uniform_tensor(s.k, 2, -1, 1), v = uniform_tensor(s.v, 3, -1, 1);
    Tensor mask;
    if (!s.mask.empty()) {
      std::vector<double> mv(size_t(s.mask.numel()));
      for (size_t i = 0; i < mv.size(); ++i) mv[i] = (int64_t(i) % s.mask[s.mask.size() - 1]) == 0 || (i * 5 + 2) % 7 != 0;
      mask = Tensor(mv, s.mask) > 0.5;
    }
    std::vector<double> want = dot_product_attention(q, k, v, mask).to_vector<double>();
    auto loss = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      Tensor y = dot_product_attention(a, b, c, mask);
      return sum(y * y);
    };
    auto want_grads = gradient(loss, q, k, v);
    Tensor md = mask.defined() ? on(mask) : Tensor();
    Tensor y = dot_product_attention(on(q), on(k), on(v), md);
    EXPECT_LT(max_rel_error(y, want), 2e-5);
    auto loss_on = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      Tensor o = dot_product_attention(a, b, c, md);
      return sum(o * o);
    };
    auto grads = gradient(loss_on, on(q), on(k), on(v));
    EXPECT_LT(max_rel_error(std::get<0>(grads), std::get<0>(want_grads).to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(std::get<1>(grads), std::get<1>(want_grads).to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(std::get<2>(grads), std::get<2>(want_grads).to_vector<double>()), 1e-4);
  }
}

FLUX_DEVICE_SUITE(FusedAttentionDevices);

TEST(FusedAttention, StorageGrowsWithTNotTSquared) {
  // One forward and backward of causal self-attention through MultiHeadAttention: the peak storage
  // beyond what lives before, fused (default) and composed (library kernels off), at T and 2T.
  seed(7);
  MultiHeadAttention mha(64, {.nheads = 4, .causal = true});
  auto peak = [&](int64_t t, bool fused_kernels) {
    detail::set_library_kernels(fused_kernels);
    Tensor x = uniform_tensor(Shape{2, t, 64}, 8).f32();
    const size_t before = detail::live_storage_bytes();
    detail::reset_peak_storage_bytes();
    auto g = gradient([&](const MultiHeadAttention& m, const Tensor& v) { return sum(m(v)); }, mha, x);
    (void)g;
    detail::set_library_kernels(true);
    return double(detail::peak_storage_bytes() - before);
  };
  const double fused256 = peak(256, true), fused512 = peak(512, true);
  const double composed256 = peak(256, false), composed512 = peak(512, false);
  // The composition holds (N, H, T, T) scores and weights (2 * 4 * 512² floats = 8 MiB each at 512).
  EXPECT_GT(composed512, 3.0 * composed256);
  EXPECT_LT(fused512, 2.3 * fused256);
  EXPECT_LT(fused512 * 4, composed512);
}

TEST(FusedAttention, MultiHeadAttentionFusedMatchesScoresPathAndAutocast) {
  // mha(x) runs fused; mha.forward(x) materialises the scores (composed): the same output. Under
  // bf16 autocast the fused kernel runs on bf16 projections.
  seed(9);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    MultiHeadAttention mha(32, {.nheads = 4, .causal = causal});
    mha.in_proj_bias = uniform_tensor(Shape{96}, 3, -0.5, 0.5).f32();
    MultiHeadAttention ref = to_f64_cpu(mha);
    Tensor x = uniform_tensor(Shape{3, 70, 32}, 10, -1, 1);
    Tensor padding = make_mask({3, 4, 70, 70, 8, 8, false, 2, true}).reshape(Shape{3, 70, 70});
    std::vector<double> want = ref(x, padding).to_vector<double>();
    Tensor x32 = x.f32();
    EXPECT_LT(max_rel_error(mha(x32, padding), want), 2e-5);
    auto [y, scores] = mha.forward(x32, padding);
    EXPECT_TRUE(scores.defined());
    EXPECT_LT(max_rel_error(y, want), 2e-5);
    Tensor low;
    {
      const bool emulating = autocast_emulation();
      set_autocast_emulation(true);  // bf16 also on CPUs without bf16 units
      AutocastScope scope(DType::bf16);
      low = mha(x32, padding);
      set_autocast_emulation(emulating);
    }
    EXPECT_EQ(low.dtype(), DType::bf16);
    EXPECT_LT(max_rel_error(low, want), 5e-2);
  }
}

TEST(FusedAttention, FallsBackWhereItCannotFuse) {
  Case c{1, 2, 9, 9, 8, 8, true, 0, true};
  std::vector<Tensor> x = inputs(c, 3);
  EXPECT_FALSE(fused(c, x, Tensor()).defined());  // Float64: composed
  std::vector<Tensor> x32{x[0].f32()};
  detail::set_library_kernels(false);
  EXPECT_FALSE(fused(c, x32, Tensor()).defined());  // FLUX_LIBRARY_KERNELS=0
  detail::set_library_kernels(true);
  EXPECT_TRUE(fused(c, x32, Tensor()).defined());
}

TEST(FusedAttention, DropoutInTrainingRunsComposed) {
  // Dropout acts on the attention weights, which the fused kernel never holds: in training the layer
  // composes (some weights dropped: the output moves); in test mode it fuses and equals the composition.
  seed(11);
  MultiHeadAttention mha(16, {.nheads = 2, .dropout = 0.5, .causal = true});
  Tensor x = uniform_tensor(Shape{2, 9, 16}, 12, -1, 1).f32();
  mha.active = false;
  Tensor eval = mha(x);
  std::vector<double> composed = mha.forward(x).output.to_vector<double>();
  EXPECT_LT(max_rel_error(eval, composed), 2e-6);
  mha.active = true;
  Tensor train = mha(x);
  EXPECT_TRUE(std::isfinite(sum(train).item<double>()));
  EXPECT_GT(max_rel_error(train, composed), 1e-3);
}

TEST(FusedAttention, Bf16TileProductsMatchFloat64) {
  // bf16_tiles.hpp's products (the portable reference everywhere, the AVX512-BF16 kernel where the CPU
  // has it) against float64 sums of the same bf16 values: plain and pair-packed A, tails of the
  // kernel's 4 x 64 blocks in m and n, odd k, accumulate on and off.
  using cpu_backend::bf16_tile_product;
  const bool have_kernel = cpu_backend::bf16_tile_kernel_available();
  struct Shape3 { int64_t m, n, k; };
  uint64_t seed = 1;
  auto draw = [&]() {  // deterministic values in [-2, 2), rounded to bf16
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return half_bits::bfloat16_from_float(float(double(seed >> 11) / double(1ull << 53) * 4.0 - 2.0));
  };
  for (const Shape3 sh : {Shape3{1, 1, 1}, {3, 17, 5}, {4, 64, 64}, {7, 130, 33}, {64, 128, 64}, {5, 16, 2}, {6, 70, 129}}) {
    for (const bool packed_a : {false, true}) {
      SCOPED_TRACE(std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" + std::to_string(sh.k) + (packed_a ? " packed A" : ""));
      const int64_t lda = sh.k + 3, ldb = sh.n + 5, ldc = sh.n + 2;
      std::vector<uint16_t> a(size_t(sh.m * lda)), bt(size_t(sh.n * (sh.k + 1)));
      for (auto& x : a) x = draw();
      for (auto& x : bt) x = draw();  // Bᵀ: (n, k) rows of stride k + 1
      std::vector<uint16_t> b(size_t((sh.k + 1) / 2 * 2 * ldb)), at(size_t((sh.k + 1) / 2 * 2 * sh.m));
      for (const bool fast : {false, true}) {
        if (fast && !have_kernel) continue;
        cpu_backend::pack_transposed_pairs(fast, bt.data(), sh.k + 1, sh.n, sh.k, b.data(), ldb);
        // A as Aᵀ's rows by pairs (the attention's pᵀ / dsᵀ operand): (k, m) rows -> pairs along k
        std::vector<uint16_t> arows(size_t(sh.k * sh.m));
        for (int64_t i = 0; i < sh.m; ++i)
          for (int64_t kk = 0; kk < sh.k; ++kk) arows[size_t(kk * sh.m + i)] = a[size_t(i * lda + kk)];
        cpu_backend::pack_row_pairs(fast, arows.data(), sh.m, sh.k, sh.m, at.data(), sh.m);
        for (const bool accumulate : {false, true}) {
          std::vector<float> c(size_t(sh.m * ldc), 0.5f);
          if (packed_a)
            bf16_tile_product(fast, sh.m, sh.n, sh.k, 0.75f, at.data(), 2, 2 * sh.m, b.data(), ldb, c.data(), ldc, accumulate);
          else
            bf16_tile_product(fast, sh.m, sh.n, sh.k, 0.75f, a.data(), lda, 2, b.data(), ldb, c.data(), ldc, accumulate);
          for (int64_t i = 0; i < sh.m; ++i)
            for (int64_t j = 0; j < sh.n; ++j) {
              double want = 0, mag = 0;
              for (int64_t kk = 0; kk < sh.k; ++kk) {
                const double t = double(half_bits::bfloat16_to_float(a[size_t(i * lda + kk)])) *
                                 double(half_bits::bfloat16_to_float(bt[size_t(j * (sh.k + 1) + kk)]));
                want += t, mag += std::abs(t);
              }
              want = 0.75 * want + (accumulate ? 0.5 : 0.0);
              ASSERT_NEAR(c[size_t(i * ldc + j)], want, 1e-6 * (1 + mag)) << "fast " << fast << " acc " << accumulate << " at " << i << ", " << j;
            }
          for (int64_t i = 0; i < sh.m; ++i)  // the padding between rows untouched
            for (int64_t j = sh.n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], 0.5f);
        }
      }
    }
  }
}

TEST(FusedAttention, Bf16TilePathsMatchFloat64Composition) {
  // bf16 operands through each tile path: the bf16 tile products with the portable reference kernel
  // (every CPU), the AVX512-BF16 kernel (chosen by default where the CPU has it) and Float32 tiles,
  // which the default takes below AVX-512 (force_isa, as ONEDNN_MAX_CPU_ISA / the bench's --max-isa).
  const bool have_kernel = cpu_backend::bf16_tile_kernel_available();
  for (const int mode : {1, 0, 2}) {
    SCOPED_TRACE("tile mode " + std::to_string(mode) + (have_kernel ? " (CPU has AVX512-BF16)" : ""));
    const int old = detail::cpu_attention_tile_mode(mode);
    for (const Case& c : cases()) check_case(c, DType::bf16, 3e-2, 6e-2);
    detail::cpu_attention_tile_mode(old);
  }
  const int old_isa = detail::cpu_force_isa(1);  // AVX2: no AVX512-BF16 kernel, the default takes Float32 tiles
  EXPECT_FALSE(cpu_backend::bf16_tile_kernel_available());
  for (const Case& c : {cases()[2], cases()[4]}) {
    check_case(c, DType::bf16, 3e-2, 6e-2);
    check_case(c, DType::f32, 2e-5, 1e-4);  // the portable online softmax (AVX-512 has its own)
  }
  detail::cpu_force_isa(old_isa);
  Case c{1, 1, 5, 3, 4, 4, true, 0, false};  // rows without visible keys: NaN, as the composition
  std::vector<Tensor> x64 = inputs(c, 5), xb;
  for (const Tensor& x : x64) xb.push_back(x.cast(DType::bf16));
  for (const int mode : {1, 0}) {
    const int old = detail::cpu_attention_tile_mode(mode);
    std::vector<double> want = composed(c, x64, Tensor()).to_vector<double>();
    std::vector<double> got = fused(c, xb, Tensor()).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << i;
      if (!std::isnan(want[i])) {
        EXPECT_NEAR(got[i], want[i], 2e-2 * (1 + std::abs(want[i]))) << i;
      }
    }
    detail::cpu_attention_tile_mode(old);
  }
}


TEST(FusedAttention, Bf16PairPackingMatchesReference) {
  // float_rows_to_bf16_pairs (the backward's p and ds) and pack_row_pairs: the AVX512-BF16 forms
  // bitwise equal to the portable ones on normal values, odd rows and columns included.
  if (!cpu_backend::bf16_tile_kernel_available()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const int64_t rows : {1, 5, 17, 64})
    for (const int64_t cols : {1, 7, 16, 33, 64, 70}) {
      const int64_t ld = cols + 3, ldb = cols + 2;
      std::vector<float> src(size_t(rows * ld));
      for (size_t i = 0; i < src.size(); ++i) src[i] = float(std::sin(double(i) * 0.7) * 3.0);
      std::vector<uint16_t> pairs[2], natural[2], packed[2];
      for (const int fast : {0, 1}) {
        pairs[fast].assign(size_t((rows + 1) / 2 * 2 * ldb), 7);
        natural[fast].assign(size_t(rows * (cols + 1)), 7);
        packed[fast].assign(size_t((rows + 1) / 2 * 2 * ldb), 7);
        cpu_backend::float_rows_to_bf16_pairs(fast, src.data(), ld, rows, cols, pairs[fast].data(), ldb,
                                              natural[fast].data(), cols + 1);
        cpu_backend::pack_row_pairs(fast, natural[fast].data(), cols + 1, rows, cols, packed[fast].data(), ldb);
      }
      EXPECT_EQ(pairs[0], pairs[1]) << rows << " x " << cols;
      EXPECT_EQ(natural[0], natural[1]) << rows << " x " << cols;
      EXPECT_EQ(packed[0], packed[1]) << rows << " x " << cols;
      EXPECT_EQ(packed[1], pairs[1]) << rows << " x " << cols;
      std::vector<uint16_t> bt[2];  // pack_transposed_pairs: the rows' pairs as columns (k, v in s = q kᵀ)
      for (const int fast : {0, 1}) {
        bt[fast].assign(size_t((cols + 1) / 2 * 2 * (rows + 1)), 7);
        cpu_backend::pack_transposed_pairs(fast, natural[0].data(), cols + 1, rows, cols, bt[fast].data(), rows + 1);
      }
      EXPECT_EQ(bt[0], bt[1]) << rows << " x " << cols;
    }
}
