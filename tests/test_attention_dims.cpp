// MultiHeadAttention with Flux's widths (issue 32): MultiHeadAttention({.in, .k_in, .v_in, .qk, .v,
// .out}, {.nheads, .bias}), Flux's parameter counts, PyTorch's kdim/vdim state names, the attention
// scores (Flux's (y, α)), cross-attention as mha(q, k, v, mask), mha(q, kv) and mha(q, kv, mask);
// outputs against float64 host loops on every device, gradients against finite differences (float64,
// on the CPU and on every device itself) and against the float64 CPU gradient on every device,
// printing as Flux, and bad input.
#include <limits>

#include <gmock/gmock.h>

#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;

namespace {
class AttentionDimsDevices : public ::testing::TestWithParam<Device> {};

/// Flux's count for MultiHeadAttention((q_in, k_in, v_in) => (qk, v) => out; bias): its four Denses.
int64_t flux_parameter_count(int64_t q_in, int64_t k_in, int64_t v_in, int64_t qk, int64_t v, int64_t out, bool bias) {
  return qk * q_in + qk * k_in + v * v_in + out * v + (bias ? qk + qk + v + out : 0);
}

std::vector<double> rows(const Tensor& w, int64_t a, int64_t b) { return slice(w, 0, a, b).to_vector<double>(); }

/// y (N, Tq, out) and α (N, H, Tq, Tk) of `m` in float64 host loops, from its weights.
struct Reference {
  std::vector<double> y, scores;
};
Reference reference(const MultiHeadAttention& m, const Tensor& query, const Tensor& key, const Tensor& value,
                    const std::vector<bool>& mask /* (N, Tq, Tk) or empty */) {
  const MultiHeadAttentionDims d = m.dims();
  std::vector<double> wq, wk, wv, bq(size_t(d.qk), 0.0), bk(size_t(d.qk), 0.0), bv(size_t(d.v), 0.0);
  if (m.in_proj_weight.defined()) {
    wq = rows(m.in_proj_weight, 0, d.qk), wk = rows(m.in_proj_weight, d.qk, 2 * d.qk);
    wv = rows(m.in_proj_weight, 2 * d.qk, 2 * d.qk + d.v);
  } else {
    wq = m.q_proj_weight.to_vector<double>(), wk = m.k_proj_weight.to_vector<double>(), wv = m.v_proj_weight.to_vector<double>();
  }
  if (m.in_proj_bias.defined())
    bq = rows(m.in_proj_bias, 0, d.qk), bk = rows(m.in_proj_bias, d.qk, 2 * d.qk), bv = rows(m.in_proj_bias, 2 * d.qk, 2 * d.qk + d.v);
  std::vector<double> wo = m.out_proj.weight.to_vector<double>();
  std::vector<double> bo = m.out_proj.bias.defined() ? m.out_proj.bias.to_vector<double>() : std::vector<double>(size_t(d.out), 0.0);
  const std::vector<double> xq = query.to_vector<double>(), xk = key.to_vector<double>(), xv = value.to_vector<double>();
  const int64_t n = query.size(0), tq = query.size(1), tk = key.size(1), h = m.nheads, dq = d.qk / h, dv = d.v / h;
  auto project = [](const std::vector<double>& x, int64_t row, int64_t in, const std::vector<double>& w,
                    const std::vector<double>& b, int64_t o) {
    double s = b[size_t(o)];
    for (int64_t c = 0; c < in; ++c) s += x[size_t(row * in + c)] * w[size_t(o * in + c)];
    return s;
  };
  Reference r{std::vector<double>(size_t(n * tq * d.out)), std::vector<double>(size_t(n * h * tq * tk))};
  for (int64_t b = 0; b < n; ++b) {
    std::vector<double> joined(size_t(tq * d.v), 0.0);
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < tq; ++i) {
        std::vector<double> s(static_cast<size_t>(tk));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < tk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < dq; ++c)
            dot += project(xq, b * tq + i, d.in, wq, bq, hh * dq + c) * project(xk, b * tk + j, d.k_in, wk, bk, hh * dq + c);
          bool keep = mask.empty() || mask[size_t((b * tq + i) * tk + j)];
          s[size_t(j)] = keep ? dot / std::sqrt(double(dq)) : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int64_t j = 0; j < tk; ++j) {
          double p = s[size_t(j)] / z;
          r.scores[size_t(((b * h + hh) * tq + i) * tk + j)] = p;
          for (int64_t c = 0; c < dv; ++c)
            joined[size_t(i * d.v + hh * dv + c)] += p * project(xv, b * tk + j, d.v_in, wv, bv, hh * dv + c);
        }
      }
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t o = 0; o < d.out; ++o) r.y[size_t((b * tq + i) * d.out + o)] = project(joined, i, d.v, wo, bo, o);
  }
  return r;
}

/// Non-zero biases, so that every bias is exercised.
void randomise_biases(MultiHeadAttention& m, uint64_t s) {
  if (m.in_proj_bias.defined()) m.in_proj_bias = uniform_tensor(m.in_proj_bias.shape(), s).cast(m.in_proj_bias.dtype());
  if (m.out_proj.bias.defined()) m.out_proj.bias = uniform_tensor(m.out_proj.bias.shape(), s + 1).cast(m.out_proj.bias.dtype());
}

std::vector<bool> bools(const Tensor& m) {
  std::vector<int64_t> v = m.to_vector<int64_t>();
  return std::vector<bool>(v.begin(), v.end());
}
}  // namespace

TEST(AttentionDims, ParameterCountsAreFluxs) {
  // Flux: MultiHeadAttention(64 => (16, 16) => 64; nheads = 4, bias = false), as in the model zoo's GPT.
  MultiHeadAttention gpt({.in = 64, .qk = 16, .v = 16, .out = 64}, {.nheads = 4, .bias = false});
  EXPECT_EQ(parameter_count(gpt), flux_parameter_count(64, 64, 64, 16, 16, 64, false));
  EXPECT_EQ(parameter_count(gpt), 4096);
  struct Case {
    MultiHeadAttentionDims dims;
    int64_t q_in, k_in, v_in, qk, v, out;
  };
  for (const Case& c : {Case{{.in = 8}, 8, 8, 8, 8, 8, 8}, Case{{.in = 8, .qk = 4}, 8, 8, 8, 4, 4, 8},
                        Case{{.in = 8, .qk = 4, .v = 6, .out = 10}, 8, 8, 8, 4, 6, 10},
                        Case{{.in = 8, .k_in = 5}, 8, 5, 5, 8, 8, 8},
                        Case{{.in = 8, .k_in = 5, .v_in = 3, .qk = 6, .v = 4, .out = 7}, 8, 5, 3, 6, 4, 7}})
    for (bool bias : {false, true}) {
      MultiHeadAttention m(c.dims, {.nheads = 2, .bias = bias});
      SCOPED_TRACE(layer_string(m));
      EXPECT_EQ(parameter_count(m), flux_parameter_count(c.q_in, c.k_in, c.v_in, c.qk, c.v, c.out, bias));
      MultiHeadAttentionDims want{c.q_in, c.k_in, c.v_in, c.qk, c.v, c.out};
      EXPECT_EQ(m.dims(), want);
      EXPECT_EQ(m.dim(), c.q_in);
    }
  // The PyTorch form is the square case of the Flux form, tensor for tensor.
  seed(7);
  MultiHeadAttention a(16, {.nheads = 4});
  seed(7);
  MultiHeadAttention b({.in = 16}, {.nheads = 4});
  EXPECT_EQ(a.in_proj_weight.to_vector<float>(), b.in_proj_weight.to_vector<float>());
  EXPECT_EQ(a.out_proj.weight.to_vector<float>(), b.out_proj.weight.to_vector<float>());
}

TEST(AttentionDims, StateNamesArePyTorchs) {
  // Equal input widths: in_proj_weight (2 qk + v, in), as nn.MultiheadAttention (which has qk = v = in).
  MultiHeadAttention same({.in = 8, .qk = 4, .v = 6, .out = 10}, {.nheads = 2});
  auto st = state(same);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_EQ(st[0].first, "in_proj_weight");
  EXPECT_EQ(st[0].second.shape(), (Shape{14, 8}));
  EXPECT_EQ(st[1].first, "in_proj_bias");
  EXPECT_EQ(st[1].second.shape(), (Shape{14}));
  EXPECT_EQ(st[2].first, "out_proj.weight");
  EXPECT_EQ(st[2].second.shape(), (Shape{10, 6}));
  // Different key/value widths: PyTorch's kdim/vdim names.
  MultiHeadAttention kv({.in = 8, .k_in = 5, .v_in = 3}, {.nheads = 2});
  st = state(kv);
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[0].first, "q_proj_weight");
  EXPECT_EQ(st[0].second.shape(), (Shape{8, 8}));
  EXPECT_EQ(st[1].first, "k_proj_weight");
  EXPECT_EQ(st[1].second.shape(), (Shape{8, 5}));
  EXPECT_EQ(st[2].first, "v_proj_weight");
  EXPECT_EQ(st[2].second.shape(), (Shape{8, 3}));
  EXPECT_EQ(st[3].first, "in_proj_bias");
  EXPECT_EQ(st[4].first, "out_proj.weight");
  EXPECT_EQ(st[5].first, "out_proj.bias");
  // glorot_uniform per projection, over its own fan-in and fan-out (as Flux's Denses).
  MultiHeadAttention big({.in = 64, .k_in = 32}, {.nheads = 4});
  double l = std::sqrt(6.0 / (64 + 32));
  EXPECT_LE(max(abs(big.k_proj_weight)).item<double>(), l);
  EXPECT_GT(max(abs(big.k_proj_weight)).item<double>(), 0.9 * l);
}

TEST(AttentionDims, PrintsAsFlux) {
  EXPECT_EQ(layer_string(MultiHeadAttention({.in = 64, .qk = 16, .v = 16, .out = 64}, {.nheads = 4, .bias = false})),
            "MultiHeadAttention(64 => 16 => 64; nheads=4)");
  EXPECT_EQ(layer_string(MultiHeadAttention({.in = 64, .qk = 16, .v = 32, .out = 8}, {.nheads = 4, .bias = false})),
            "MultiHeadAttention(64 => (16, 32) => 8; nheads=4)");
  EXPECT_EQ(layer_string(MultiHeadAttention({.in = 8, .k_in = 5, .v_in = 3, .qk = 6, .v = 4, .out = 7}, {.nheads = 2})),
            "MultiHeadAttention((8, 5, 3) => (6, 4) => 7; nheads=2, bias=true)");
  EXPECT_EQ(to_text(MultiHeadAttention({.in = 64, .qk = 16, .v = 16, .out = 64}, {.nheads = 4, .bias = false})),
            "MultiHeadAttention(64 => 16 => 64; nheads=4)  # 4_096 parameters");
  EXPECT_EQ(layer_string(MultiHeadAttention(16, {.nheads = 4})), "MultiHeadAttention(16; nheads=4, bias=true)");
}

TEST_P(AttentionDimsDevices, MatchesFloat64LoopsWithScores) {
  Device d = GetParam();
  seed(11);
  const int64_t n = 2, tq = 3, tk = 4;
  for (MultiHeadAttentionDims dims : {MultiHeadAttentionDims{.in = 8, .qk = 4, .v = 6, .out = 5},
                                      MultiHeadAttentionDims{.in = 8, .k_in = 5, .v_in = 3, .qk = 6, .v = 4, .out = 7}}) {
    MultiHeadAttention m(dims, {.nheads = 2, .dtype = DType::f64});
    randomise_biases(m, 3);
    SCOPED_TRACE(layer_string(m));
    const MultiHeadAttentionDims full = m.dims();
    Tensor x = uniform_tensor(Shape{n, tq, full.in}, 1);
    Tensor key = uniform_tensor(Shape{n, tk, full.k_in}, 2), value = uniform_tensor(Shape{n, tk, full.v_in}, 3);
    Tensor mask = concat({causal_mask(tq, tk).reshape(Shape{1, tq, tk}), ones(Shape{1, tq, tk}) > 0.5}, 0);  // (N, Tq, Tk)
    MultiHeadAttention md = fmap([&](const Tensor& t) { return to(t.f32(), d); }, m);
    auto on = [&](const Tensor& t) { return to(t.dtype() == DType::boolean ? t : t.f32(), d); };
    // cross-attention with a per-example mask: output and scores
    Reference want = reference(m, x, key, value, bools(mask));
    auto [y, scores] = md.forward(on(x), on(key), on(value), on(mask));
    EXPECT_EQ(y.shape(), (Shape{n, tq, full.out}));
    EXPECT_EQ(scores.shape(), (Shape{n, 2, tq, tk}));
    EXPECT_EQ(y.device(), d);
    EXPECT_LT(max_rel_error(y, want.y), 1e-5);
    EXPECT_LT(max_rel_error(scores, want.scores), 1e-5);
    EXPECT_LT(max_rel_error(md(on(x), on(key), on(value), on(mask)), want.y), 1e-5);
    // masked keys get weight 0 and every row sums to 1
    EXPECT_EQ(to(scores, Device()).to_vector<double>()[size_t(tk - 1)], 0.0);  // query 0 of example 0 cannot see key 3 (causal, Tq < Tk)
    EXPECT_LT(max_rel_error(sum(scores, -1), std::vector<double>(size_t(n * 2 * tq), 1.0)), 1e-5);
    if (full.k_in == full.v_in) {
      // Flux's mha(q, kv) and mha(q, kv, mask): keys and values from one tensor
      Reference kv = reference(m, x, key, key, {});
      EXPECT_LT(max_rel_error(md(on(x), on(key)), kv.y), 1e-5);
      EXPECT_LT(max_rel_error(md.forward(on(x), on(key)).scores, kv.scores), 1e-5);
      Reference kvm = reference(m, x, key, key, bools(mask));
      EXPECT_LT(max_rel_error(md(on(x), on(key), on(mask)), kvm.y), 1e-5);
    }
    if (full.k_in == full.in && full.v_in == full.in) {
      // self-attention through the one stacked projection, causal
      Reference self = reference(m, x, x, x, bools(concat({causal_mask(tq, tq).reshape(Shape{1, tq, tq}),
                                                          causal_mask(tq, tq).reshape(Shape{1, tq, tq})}, 0)));
      MultiHeadAttention causal = md;
      causal.causal = true;
      auto [ys, ss] = causal.forward(on(x));
      EXPECT_LT(max_rel_error(ys, self.y), 1e-5);
      EXPECT_LT(max_rel_error(ss, self.scores), 1e-5);
      EXPECT_LT(max_rel_error(md(on(x), on(causal_mask(tq, tq))), self.y), 1e-5);
    }
  }
}

TEST_P(AttentionDimsDevices, GradientsMatchFloat64Cpu) {
  Device d = GetParam();
  seed(12);
  for (MultiHeadAttentionDims dims : {MultiHeadAttentionDims{.in = 8, .qk = 4, .v = 6, .out = 5},
                                      MultiHeadAttentionDims{.in = 6, .k_in = 5, .v_in = 3, .qk = 4, .v = 6, .out = 3}}) {
    MultiHeadAttention m(dims, {.nheads = 2, .dtype = DType::f64});
    randomise_biases(m, 5);
    SCOPED_TRACE(layer_string(m));
    const MultiHeadAttentionDims full = m.dims();
    Tensor x = uniform_tensor(Shape{2, 4, full.in}, 6), kv = uniform_tensor(Shape{2, 3, full.k_in}, 7);
    Tensor value = uniform_tensor(Shape{2, 3, full.v_in}, 8), r = uniform_tensor(Shape{2, 4, full.out}, 9);
    auto loss = [](const Tensor& rr) {
      return [rr](const MultiHeadAttention& mm, const Tensor& q, const Tensor& k, const Tensor& v) {
        auto [y, scores] = mm.forward(q, k, v);
        return sum(y * rr) + sum(scores * scores);  // through the scores too
      };
    };
    auto [g64, gq64, gk64, gv64] = gradient(loss(r), m, x, kv, value);
    MultiHeadAttention md = fmap([&](const Tensor& t) { return to(t.f32(), d); }, m);
    auto on = [&](const Tensor& t) { return to(t.f32(), d); };
    auto [g, gq, gk, gv] = gradient(loss(on(r)), md, on(x), on(kv), on(value));
    EXPECT_LT(max_rel_error(gq, gq64.to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(gk, gk64.to_vector<double>()), 1e-4);
    EXPECT_LT(max_rel_error(gv, gv64.to_vector<double>()), 1e-4);
    auto leaves = state(g), leaves64 = state(g64);
    ASSERT_EQ(leaves.size(), leaves64.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      EXPECT_EQ(leaves[i].first, leaves64[i].first);
      EXPECT_EQ(leaves[i].second.device(), d);
      EXPECT_LT(max_rel_error(leaves[i].second, leaves64[i].second.to_vector<double>()), 1e-4) << leaves[i].first;
    }
  }
}

// Central differences computed ON the device, in float64 (every test device here has it: the CPU and
// PoCL; a device without Float64 skips), against the device's own gradient: the layer's backward is
// checked on each backend itself, not only against the CPU's.
TEST_P(AttentionDimsDevices, FiniteDifferencesOnTheDevice) {
  Device d = GetParam();
  seed(21);
  MultiHeadAttention host({.in = 4, .k_in = 3, .qk = 4, .v = 2, .out = 3}, {.nheads = 2, .dtype = DType::f64});
  randomise_biases(host, 22);
  auto on = [&](const Tensor& t) { return to(t, d); };
  const Tensor kv = on(uniform_tensor(Shape{2, 5, 3}, 23)), r = on(uniform_tensor(Shape{2, 3, 3}, 24));
  const Tensor mask = on(concat({causal_mask(3, 5).reshape(Shape{1, 3, 5}), causal_mask(3, 5).reshape(Shape{1, 3, 5})}, 0));
  // inputs: the query, then the layer's q/k/v projections, biases and output weight
  std::vector<Tensor> xs{on(uniform_tensor(Shape{2, 3, 4}, 25)), on(host.q_proj_weight), on(host.k_proj_weight),
                         on(host.v_proj_weight), on(host.in_proj_bias), on(host.out_proj.weight)};
  const MultiHeadAttention base = fmap(on, host);
  auto objective = [&](const std::vector<Tensor>& v) {
    MultiHeadAttention m = base;
    m.q_proj_weight = v[1], m.k_proj_weight = v[2], m.v_proj_weight = v[3], m.in_proj_bias = v[4], m.out_proj.weight = v[5];
    auto [y, scores] = m.forward(v[0], kv, mask);  // Flux's mha(q, kv; mask), through y and α
    return sum(y * r) + sum(scores * scores);
  };
  std::vector<Tensor> grads;
  try {
    grads = gradient(objective, xs);
  } catch (const Error& e) {
    if (std::string(e.what()).find("Float64") != std::string::npos) GTEST_SKIP() << to_string(d) << ": " << e.what();
    throw;
  }
  ASSERT_EQ(grads.size(), xs.size());
  const double h = 1e-6;
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(grads[i].device(), d);
    std::vector<double> g = grads[i].to_vector<double>(), base_values = xs[i].to_vector<double>();
    for (size_t k = 0; k < base_values.size(); ++k) {
      auto at = [&](double delta) {
        std::vector<double> moved = base_values;
        moved[k] += delta;
        std::vector<Tensor> v = xs;
        v[i] = on(Tensor(moved, xs[i].shape()));
        return objective(v).item<double>();
      };
      const double numeric = (at(h) - at(-h)) / (2 * h);
      EXPECT_NEAR(g[k], numeric, 1e-6 * (1 + std::abs(numeric))) << "input " << i << " element " << k;
    }
  }
}

FLUX_DEVICE_SUITE(AttentionDimsDevices);

TEST(AttentionDims, FiniteDifferenceGradientsFloat64) {
  using V = const std::vector<Tensor>&;
  // dot_product_attention_scores alone, with a mask
  Tensor mask = causal_mask(3, 4);
  expect_finite_difference_gradient([&](V v) { return dot_product_attention_scores(v[0], v[1], mask); },
                                    {uniform_tensor(Shape{2, 3, 4}, 1), uniform_tensor(Shape{2, 4, 4}, 2)});
  // Stacked weights with qk != v (self-attention's one GEMM, then column slices), in x and every weight.
  seed(13);
  MultiHeadAttention stacked({.in = 4, .qk = 2, .v = 4, .out = 3}, {.nheads = 2, .causal = true, .dtype = DType::f64});
  randomise_biases(stacked, 14);
  expect_finite_difference_gradient([&](V v) {
    MultiHeadAttention m = stacked;
    m.in_proj_weight = v[1], m.in_proj_bias = v[2], m.out_proj.weight = v[3];
    return m(v[0]);
  }, {uniform_tensor(Shape{2, 3, 4}, 15), stacked.in_proj_weight, stacked.in_proj_bias, stacked.out_proj.weight});
  // Separate weights (kdim/vdim) in cross-attention, through the output and the scores.
  MultiHeadAttention separate({.in = 4, .k_in = 3, .v_in = 2, .qk = 4, .v = 2, .out = 3}, {.nheads = 2, .dtype = DType::f64});
  randomise_biases(separate, 16);
  expect_finite_difference_gradient([&](V v) {
    MultiHeadAttention m = separate;
    m.q_proj_weight = v[3], m.k_proj_weight = v[4], m.v_proj_weight = v[5];
    auto [y, scores] = m.forward(v[0], v[1], v[2]);
    return concat({y.reshape(Shape{-1}), scores.reshape(Shape{-1})}, 0);
  }, {uniform_tensor(Shape{2, 3, 4}, 17), uniform_tensor(Shape{2, 5, 3}, 18), uniform_tensor(Shape{2, 5, 2}, 19),
      separate.q_proj_weight, separate.k_proj_weight, separate.v_proj_weight});
}

TEST(AttentionDims, BadInputNamesTheProblem) {
  EXPECT_THAT(error_of([] { MultiHeadAttention({.in = 8, .qk = 6}, {.nheads = 4}); }),
              HasSubstr("[MultiHeadAttention] nheads (4) must be positive and divide qk (6) and v (6)"));
  EXPECT_THAT(error_of([] { MultiHeadAttention({.in = 8, .qk = 8, .v = 6}, {.nheads = 4}); }),
              HasSubstr("divide qk (8) and v (6)"));
  EXPECT_THAT(error_of([] { MultiHeadAttention({.in = 8, .out = -1}, {.nheads = 4}); }),
              HasSubstr("[MultiHeadAttention] every width must be positive (0 takes its default); got (in = 8, k_in = 0, "
                        "v_in = 0, qk = 0, v = 0, out = -1)"));
  EXPECT_THAT(error_of([] { MultiHeadAttention(MultiHeadAttentionDims{}, {.nheads = 4}); }),
              HasSubstr("[MultiHeadAttention] dim must be positive; got 0"));
  MultiHeadAttention m({.in = 8, .k_in = 5, .v_in = 3}, {.nheads = 2});
  Tensor q = zeros(Shape{2, 4, 8}), k = zeros(Shape{2, 3, 5}), v = zeros(Shape{2, 3, 3});
  EXPECT_THAT(error_of([&] { m(q, v, v); }),
              HasSubstr("[MultiHeadAttention] expected batch-first input (N, T, 5) (MultiHeadAttention((8, 5, 3) => (8, 8) => 8; "
                        "nheads=2, bias=true)); got key (2, 3, 3)"));
  EXPECT_THAT(error_of([&] { m(q, k, zeros(Shape{2, 2, 3})); }), HasSubstr("must share N, and key and value their length Tk"));
  EXPECT_THAT(error_of([&] { m(q, k, v, zeros(Shape{4, 3})); }), HasSubstr("mask must be Bool (true = attend)"));
  EXPECT_THAT(error_of([&] { m(q, k, causal_mask(4, 3), causal_mask(4, 3)); }),
              HasSubstr("got a Bool tensor as the values and a mask"));
  EXPECT_THAT(error_of([&] { m(q); }),
              HasSubstr("[MultiHeadAttention] self-attention mha(x) needs the key and value input widths to equal the "
                        "query's; MultiHeadAttention((8, 5, 3) => (8, 8) => 8; nheads=2, bias=true) has in = 8, k_in = 5, "
                        "v_in = 3: call mha(q, k, v) or mha(q, kv)"));
  // The second tensor of mha(x, ·) is keys/values only when floating-point and 3-d; else it is a mask.
  MultiHeadAttention square(8, {.nheads = 2});
  EXPECT_THAT(error_of([&] { square(q, zeros(Shape{2, 4, 4}, DType::i64)); }), HasSubstr("mask must be Bool"));
  EXPECT_THAT(error_of([&] { square(q, zeros(Shape{4, 4})); }), HasSubstr("mask must be Bool"));
  EXPECT_THAT(error_of([&] { square(q, zeros(Shape{2, 4, 4})); }), HasSubstr("got key (2, 4, 4)"));
  EXPECT_THAT(error_of([&] { m(q.cast(DType::i64), k, v); }), HasSubstr("[MultiHeadAttention] needs floating-point query"));
  // mha(q, kv) needs k_in == v_in: here the kv tensor's width cannot be both.
  EXPECT_THAT(error_of([&] { m(q, k); }), HasSubstr("got value (2, 3, 5)"));
  EXPECT_THAT(error_of([] { MultiHeadAttention()(zeros(Shape{1, 2, 3})); }), HasSubstr("the layer is empty"));
  EXPECT_THAT(error_of([] { dot_product_attention_scores(zeros(Shape{2, 3, 4}), zeros(Shape{2, 5, 3})); }),
              HasSubstr("[dot_product_attention_scores] shapes do not compose: q (2, 3, 4) (..., Tq, d), k (2, 5, 3) (..., Tk, d)"));
}
