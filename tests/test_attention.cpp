// dot_product_attention on every device against float64 host loops (no mask, Bool masks, causal,
// broadcast batch axes), finite differences in float64, MultiHeadAttention on every device against
// its float64 CPU result, its PyTorch state names, printing, causal behaviour, and bad input.
// (PyTorch's nn.MultiheadAttention itself is the oracle in tests/interop/attention_interop.py.)
#include <limits>

#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;

namespace {
class AttentionDevices : public ::testing::TestWithParam<Device> {};

// out[b, i, :] = Σ_j softmax_j(q[b, i] · k[b, j] * scale | mask) v[b, j, :] for B batches, float64.
std::vector<double> attention_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                                  const std::vector<bool>& mask, int64_t b, int64_t tq, int64_t tk, int64_t d, int64_t dv,
                                  bool mask_per_batch) {
  std::vector<double> out(size_t(b * tq * dv), 0.0);
  double scale = 1.0 / std::sqrt(double(d));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> s(static_cast<size_t>(tk));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[size_t((n * tq + i) * d + c)] * k[size_t((n * tk + j) * d + c)];
        size_t mi = size_t(((mask_per_batch ? n : 0) * tq + i) * tk + j);
        s[size_t(j)] = mask.empty() || mask[mi] ? dot * scale : -std::numeric_limits<double>::infinity();
        mx = std::max(mx, s[size_t(j)]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (int64_t j = 0; j < tk; ++j)
        for (int64_t c = 0; c < dv; ++c) out[size_t((n * tq + i) * dv + c)] += s[size_t(j)] / z * v[size_t((n * tk + j) * dv + c)];
    }
  return out;
}

Tensor bool_tensor(const std::vector<bool>& m, const Shape& s) {
  std::vector<double> v(m.begin(), m.end());
  return Tensor(v, s) > 0.5;
}
}  // namespace

TEST(Attention, CausalMaskIsLowerTriangular) {
  EXPECT_EQ(causal_mask(3, 3).dtype(), DType::boolean);
  EXPECT_EQ(causal_mask(3, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  // Tq < Tk: the last query sees every key (NNlib's make_causal_mask aligned at the end)
  EXPECT_EQ(causal_mask(2, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 1, 1, 1}));
}

TEST_P(AttentionDevices, DotProductAttentionMatchesFloat64Loops) {
  Device d = GetParam();
  const int64_t b = 3, tq = 4, tk = 5, dk = 6, dv = 3;
  Tensor q = uniform_tensor(Shape{b, tq, dk}, 1), k = uniform_tensor(Shape{b, tk, dk}, 2), v = uniform_tensor(Shape{b, tk, dv}, 3);
  std::vector<double> qs = q.to_vector<double>(), ks = k.to_vector<double>(), vs = v.to_vector<double>();
  auto on = [&](const Tensor& t) { return to(t.f32(), d); };
  // no mask
  EXPECT_LT(max_rel_error(dot_product_attention(on(q), on(k), on(v)), attention_ref(qs, ks, vs, {}, b, tq, tk, dk, dv, false)), 1e-5);
  // a (Tq, Tk) mask broadcast over the batch, every row keeping at least one key
  std::vector<bool> m2;
  for (int64_t i = 0; i < tq * tk; ++i) m2.push_back((i * 7 + 3) % 3 != 0 || i % tk == 0);
  Tensor mask2 = to(bool_tensor(m2, Shape{tq, tk}), d);
  EXPECT_LT(max_rel_error(dot_product_attention(on(q), on(k), on(v), mask2), attention_ref(qs, ks, vs, m2, b, tq, tk, dk, dv, false)), 1e-5);
  // a per-batch (B, Tq, Tk) mask
  std::vector<bool> m3;
  for (int64_t i = 0; i < b * tq * tk; ++i) m3.push_back((i * 5 + 1) % 4 != 0 || i % tk == 1);
  Tensor mask3 = to(bool_tensor(m3, Shape{b, tq, tk}), d);
  EXPECT_LT(max_rel_error(dot_product_attention(on(q), on(k), on(v), mask3), attention_ref(qs, ks, vs, m3, b, tq, tk, dk, dv, true)), 1e-5);
  // causal, in float64 on the device where float64 is supported
  std::vector<bool> causal = {};
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) causal.push_back(j <= i + (tk - tq));
  EXPECT_LT(max_rel_error(dot_product_attention(on(q), on(k), on(v), causal_mask(tq, tk, d)),
                          attention_ref(qs, ks, vs, causal, b, tq, tk, dk, dv, false)), 1e-5);
  // large scores stay finite (the softmax subtracts each row's maximum)
  Tensor big = dot_product_attention(on(q * 1000.0), on(k * 1000.0), on(v));
  EXPECT_TRUE(std::isfinite(sum(big).item<double>()));
  // 4-D with broadcast batch axes: (2, 1, Tq, d) against (1, 3, Tk, d)
  Tensor q4 = uniform_tensor(Shape{2, 1, tq, dk}, 4), k4 = uniform_tensor(Shape{1, 3, tk, dk}, 5), v4 = uniform_tensor(Shape{1, 3, tk, dv}, 6);
  Tensor y4 = dot_product_attention(on(q4), on(k4), on(v4));
  EXPECT_EQ(y4.shape(), (Shape{2, 3, tq, dv}));
  EXPECT_LT(max_rel_error(y4, dot_product_attention(q4, k4, v4).to_vector<double>()), 1e-5);
}

TEST_P(AttentionDevices, MultiHeadAttentionMatchesFloat64Cpu) {
  Device d = GetParam();
  seed(3);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    MultiHeadAttention mha(8, {.nheads = 2, .causal = causal});
    mha.in_proj_bias = uniform_tensor(Shape{24}, 7).f32();
    mha.out_proj.bias = uniform_tensor(Shape{8}, 8).f32();
    MultiHeadAttention ref = to_f64_cpu(mha);
    Tensor x = uniform_tensor(Shape{2, 5, 8}, 9), r = uniform_tensor(Shape{2, 5, 8}, 10);
    auto [g64, gx64] = gradient([&](const MultiHeadAttention& m, const Tensor& v) { return sum(m(v) * r); }, ref, x);
    MultiHeadAttention md = mha | d;
    Tensor xd = to(x.f32(), d), rd = to(r.f32(), d);
    Tensor y = md(xd);
    EXPECT_EQ(y.shape(), (Shape{2, 5, 8}));
    EXPECT_LT(max_rel_error(y, ref(x).to_vector<double>()), 1e-5);
    auto [g, gx] = gradient([&](const MultiHeadAttention& m, const Tensor& v) { return sum(m(v) * rd); }, md, xd);
    EXPECT_LT(max_rel_error(gx, gx64.to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(g.in_proj_weight, g64.in_proj_weight.to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(g.out_proj.weight, g64.out_proj.weight.to_vector<double>()), 1e-4);
    // cross-attention (distinct query and key/value tensors) with an (N, Tq, Tk) mask
    Tensor kv = uniform_tensor(Shape{2, 3, 8}, 11);
    Tensor mask = causal_mask(5, 3).reshape(Shape{1, 5, 3});
    mask = concat({mask, mask}, 0);
    Tensor yc = md(xd, to(kv.f32(), d), to(kv.f32(), d), to(mask, d));
    EXPECT_EQ(yc.shape(), (Shape{2, 5, 8}));
    EXPECT_LT(max_rel_error(yc, ref(x, kv, kv, mask).to_vector<double>()), 1e-5);
  }
}

FLUX_DEVICE_SUITE(AttentionDevices);

TEST(Attention, CausalOutputIgnoresTheFuture) {
  seed(4);
  MultiHeadAttention mha(4, {.nheads = 2, .causal = true});
  Tensor x = uniform_tensor(Shape{1, 4, 4}, 12).f32();
  std::vector<double> changed = x.to_vector<double>();
  for (size_t i = 12; i < 16; ++i) changed[i] += 3.0;  // the last step only
  Tensor y1 = mha(x), y2 = mha(Tensor(changed, x.shape()).f32());
  std::vector<double> a = y1.to_vector<double>(), b = y2.to_vector<double>();
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  EXPECT_GT(std::abs(a[12] - b[12]) + std::abs(a[13] - b[13]), 1e-3);
}

TEST(Attention, FiniteDifferenceGradientsFloat64) {
  using V = const std::vector<Tensor>&;
  Tensor mask = causal_mask(3, 4);
  expect_finite_difference_gradient([](V v) { return dot_product_attention(v[0], v[1], v[2]); },
                                    {uniform_tensor(Shape{2, 3, 4}, 1), uniform_tensor(Shape{2, 4, 4}, 2), uniform_tensor(Shape{2, 4, 2}, 3)});
  expect_finite_difference_gradient([&](V v) { return dot_product_attention(v[0], v[1], v[2], mask, 0.7); },
                                    {uniform_tensor(Shape{2, 3, 4}, 4), uniform_tensor(Shape{2, 4, 4}, 5), uniform_tensor(Shape{2, 4, 2}, 6)});
  // the whole layer, differentiated in its input and its two weight matrices
  seed(5);
  MultiHeadAttention base(4, {.nheads = 2, .causal = true, .dtype = DType::f64});
  base.in_proj_bias = uniform_tensor(Shape{12}, 7);
  expect_finite_difference_gradient([&](V v) {
    MultiHeadAttention m = base;
    m.in_proj_weight = v[1];
    m.out_proj.weight = v[2];
    return m(v[0]);
  }, {uniform_tensor(Shape{2, 3, 4}, 8), base.in_proj_weight, base.out_proj.weight});
}

TEST(Attention, StateNamesPrintingAndInitialisation) {
  MultiHeadAttention mha(64, {.nheads = 8});
  auto st = state(mha);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_EQ(st[0].first, "in_proj_weight");  // torch.nn.MultiheadAttention's state_dict names
  EXPECT_EQ(st[1].first, "in_proj_bias");
  EXPECT_EQ(st[2].first, "out_proj.weight");
  EXPECT_EQ(st[3].first, "out_proj.bias");
  EXPECT_EQ(st[0].second.shape(), (Shape{192, 64}));
  EXPECT_EQ(parameter_count(mha), 4 * 64 * 64 + 4 * 64);
  EXPECT_EQ(to_text(mha), "MultiHeadAttention(64; nheads=8, bias=true)  # 16_640 parameters");
  EXPECT_EQ(layer_string(MultiHeadAttention(16, {.nheads = 4, .dropout = 0.1, .causal = true, .bias = false})),
            "MultiHeadAttention(16; nheads=4, dropout_prob=0.1, causal=true)");
  // glorot_uniform per (dim, dim) block: |w| <= sqrt(6 / 128), variance 1/64 ... (U(-l, l): l²/3)
  double l = std::sqrt(6.0 / 128.0);
  EXPECT_LE(max(abs(mha.in_proj_weight)).item<double>(), l);
  EXPECT_NEAR(mean(square(mha.in_proj_weight)).item<double>(), l * l / 3, 0.1 * l * l / 3);
  EXPECT_EQ(max(abs(mha.in_proj_bias)).item<double>(), 0.0);
  // Dropout on the weights only in training: outside gradient() the output is deterministic
  MultiHeadAttention drop(8, {.nheads = 2, .dropout = 0.5});
  Tensor x = uniform_tensor(Shape{1, 3, 8}, 1).f32();
  EXPECT_EQ(drop(x).to_vector<double>(), drop(x).to_vector<double>());
  MultiHeadAttention forced = trainmode(drop);
  EXPECT_NE(forced(x).to_vector<double>(), drop(x).to_vector<double>());
}

TEST(Attention, BadInputNamesTheProblem) {
  EXPECT_THAT(error_of([] { MultiHeadAttention(10, {.nheads = 3}); }),
              HasSubstr("[MultiHeadAttention] nheads (3) must be positive and divide dim (10)"));
  MultiHeadAttention mha(8, {.nheads = 2});
  EXPECT_THAT(error_of([&] { mha(zeros(Shape{2, 5, 6})); }),
              HasSubstr("[MultiHeadAttention] expected batch-first input (N, T, 8) (MultiHeadAttention(8; nheads=2, "
                        "bias=true)); got query (2, 5, 6)"));
  EXPECT_THAT(error_of([&] { mha(zeros(Shape{5, 8})); }), HasSubstr("got query (5, 8)"));
  EXPECT_THAT(error_of([&] { mha(zeros(Shape{2, 5, 8}), causal_mask(4, 4)); }),
              HasSubstr("[MultiHeadAttention] mask must be Bool (true = attend) of shape (Tq, Tk) = (5, 5)"));
  EXPECT_THAT(error_of([&] { mha(zeros(Shape{2, 5, 8}), zeros(Shape{5, 5})); }), HasSubstr("got 5×5 Tensor{Float32, CPU}"));
  EXPECT_THAT(error_of([&] { mha(zeros(Shape{2, 5, 8}), zeros(Shape{2, 3, 8}), zeros(Shape{2, 4, 8})); }),
              HasSubstr("must share N, and key and value their length Tk"));
  EXPECT_THAT(error_of([] { dot_product_attention(zeros(Shape{2, 3, 4}), zeros(Shape{2, 5, 3}), zeros(Shape{2, 5, 2})); }),
              HasSubstr("[dot_product_attention] shapes do not compose: q (2, 3, 4) (..., Tq, d), k (2, 5, 3)"));
  EXPECT_THAT(error_of([] { dot_product_attention(zeros(Shape{2, 3, 4}), zeros(Shape{2, 5, 4}), zeros(Shape{2, 5, 2}), causal_mask(5, 5)); }),
              HasSubstr("[dot_product_attention] mask of shape (5, 5) does not broadcast to the scores (..., Tq, Tk) = (2, 3, 5)"));
  EXPECT_THAT(error_of([] { dot_product_attention(zeros(Shape{3, 4}), zeros(Shape{5, 4}), zeros(Shape{5, 2}), zeros(Shape{3, 5})); }),
              HasSubstr("[dot_product_attention] mask must be Bool (true = attend)"));
  EXPECT_THAT(error_of([] { dot_product_attention(zeros(Shape{3, 4}, DType::i32), zeros(Shape{5, 4}), zeros(Shape{5, 2})); }),
              HasSubstr("[dot_product_attention] q, k and v must be floating-point"));
  for (Device d : test_devices()) {
    if (d == Device()) continue;
    MultiHeadAttention m = mha | d;
    EXPECT_THAT(error_of([&] { m(zeros(Shape{1, 2, 8})); }),
                HasSubstr("[MultiHeadAttention] input on CPU but the layer's weights on " + to_string(d)));
  }
  // A state with another dim does not load (names the tensor).
  std::string path = ::testing::TempDir() + "/mha_state.safetensors";
  save(path, MultiHeadAttention(4, {.nheads = 2}));
  EXPECT_THAT(error_of([&] { load(path, mha); }), HasSubstr("in_proj_weight"));
}
