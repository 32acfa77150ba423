// Mixed precision: model casts (f16/bf16/f32/f64), the ops in Float16/BFloat16, and autocast
// (flux/autocast.hpp): each autocast op against a float64 reference within the low dtype's
// tolerance, gradients through autocast against finite differences of the float64 model, the CPU
// without units warning once and computing in float32, on every device.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "src/autocast.hpp"
#include "src/backends/cpu/pass_count.hpp"
#include "src/storage_stats.hpp"
#include "test_devices.hpp"

namespace flux::detail {
int cpu_force_isa(int level);  // src/backends/cpu/isa.cpp
}

namespace {

using namespace flux;
using flux::testing::max_rel_error;

// Emulation on for the test's scope: the CPU computes in the low dtype even without units, so the
// low-precision numerics are checked on every machine.
struct Emulate {
  Emulate() : saved(autocast_emulation()) { set_autocast_emulation(true); }
  ~Emulate() { set_autocast_emulation(saved); }
  bool saved;
};

// The unit roundoff of each low dtype, and a bound for one rounding of a float32-accumulated result.
double roundoff(DType t) { return t == DType::bf16 ? 0x1p-8 : 0x1p-11; }
double tol(DType t) { return 4 * roundoff(t); }

// A float64 reference from the values autocast actually sees: x rounded to the low dtype.
Tensor rounded64(const Tensor& x, DType low) { return to(x, Device()).cast(low).cast(DType::f64); }

struct Case {
  Device device;
  DType low;
};
void PrintTo(const Case& c, std::ostream* os) { *os << to_string(c.device) << " " << dtype_name(c.low); }
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = to_string(info.param.device) + "_" + dtype_name(info.param.low);
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
}
std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Device& d : flux::testing::test_devices())
    for (DType t : {DType::bf16, DType::f16}) out.push_back({d, t});
  return out;
}

class AutocastOps : public ::testing::TestWithParam<Case> {};

TEST_P(AutocastOps, LowPrecisionListRunsInTheLowDtype) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  Tensor a = to(randn({5, 33}), d), b = to(randn({33, 7}), d);
  Tensor c = autocast(low, [&] { return matmul(a, b); });
  EXPECT_EQ(c.dtype(), low);
  EXPECT_LT(max_rel_error(c, matmul(rounded64(a, low), rounded64(b, low)).to_vector<double>()), tol(low));

  Dense dense = Dense(33, 6, relu) | d;
  Tensor y = autocast(low, [&] { return dense(a); });
  EXPECT_EQ(y.dtype(), low);
  Tensor want = relu(matmul(rounded64(a, low), rounded64(dense.weight, low), false, true) + rounded64(dense.bias, low));
  EXPECT_LT(max_rel_error(y, want.to_vector<double>()), tol(low));

  Tensor x = to(randn({2, 3, 9, 9}), d), w = to(randn({4, 3, 3, 3}), d), bias = to(randn({4}), d);
  Tensor yc = autocast(low, [&] { return conv(x, w, bias, {.stride = 2, .pad = 1}); });
  EXPECT_EQ(yc.dtype(), low);
  Tensor wantc = conv(rounded64(x, low), rounded64(w, low), rounded64(bias, low), {.stride = 2, .pad = 1});
  EXPECT_LT(max_rel_error(yc, wantc.to_vector<double>()), tol(low));

  Tensor wt = to(randn({3, 4, 3, 3}), d);
  Tensor yt = autocast(low, [&] { return conv_transpose(x, wt, Tensor(), {.stride = 2}); });
  EXPECT_EQ(yt.dtype(), low);
  Tensor wantt = conv_transpose(rounded64(x, low), rounded64(wt, low), Tensor(), {.stride = 2});
  EXPECT_LT(max_rel_error(yt, wantt.to_vector<double>()), tol(low));

  Tensor q = to(randn({2, 5, 8}), d), k = to(randn({2, 6, 8}), d), v = to(randn({2, 6, 8}), d);
  Tensor ya = autocast(low, [&] { return dot_product_attention(q, k, v, Tensor(), 0.35, 0.0); });
  EXPECT_EQ(ya.dtype(), low);
  // Scores, softmax and the weighted sum each round once to the low dtype: a few roundoffs.
  Tensor s = to(autocast(low, [&] { return matmul(q, k, false, true); }), Device()).cast(DType::f64) * 0.35;
  Tensor wanta = matmul(softmax(s, -1).cast(low).cast(DType::f64), rounded64(v, low));
  EXPECT_LT(max_rel_error(ya, wanta.to_vector<double>()), 2 * tol(low));
}

TEST_P(AutocastOps, RecurrentLayersRunInTheLowDtype) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  auto lstm = LSTM(6, 8) | d;
  Tensor x = to(randn({3, 4, 6}), d);
  Tensor y = autocast(low, [&] { return lstm(x); });
  EXPECT_EQ(y.dtype(), low);
  // The reference: the same layer in float64 from the rounded weights and input; the state is carried
  // in float32 step to step, each step's input projections rounded once, so a few roundoffs.
  auto ref = f64(fmap([&, low = low](const Tensor& t) { return t.defined() ? to(t, Device()).cast(low) : t; }, lstm));
  Tensor want = ref(rounded64(x, low));
  EXPECT_LT(max_rel_error(y, want.to_vector<double>()), 8 * tol(low));
}

TEST_P(AutocastOps, Float32ListRunsInFloat32) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  Tensor xl = to(randn({4, 10}), d).cast(low);
  Tensor x64 = xl.cast(DType::f64);
  AutocastScope scope(low);
  struct Op {
    const char* name;
    Tensor got, want;
  };
  const Tensor pos = abs(xl) + 0.5;
  const Tensor target = to(Tensor(std::vector<float>(40, 0.1f), Shape{4, 10}), d);
  for (const Op& op : {Op{"softmax", softmax(xl), softmax(x64)}, Op{"logsoftmax", logsoftmax(xl), logsoftmax(x64)},
                       Op{"sum", sum(xl, 1), sum(x64, 1)}, Op{"mean", mean(xl), mean(x64)},
                       Op{"exp", exp(xl), exp(x64)}, Op{"log", log(pos), log(pos.cast(DType::f64))},
                       Op{"mse", mse(xl, target), mse(x64, target.f64())},
                       Op{"logitcrossentropy", logitcrossentropy(xl, target), logitcrossentropy(x64, target.f64())}}) {
    SCOPED_TRACE(op.name);
    EXPECT_EQ(op.got.dtype(), DType::f32);
    EXPECT_LT(max_rel_error(op.got, op.want.to_vector<double>()), 1e-5);
  }
}

TEST_P(AutocastOps, NormalisationStatisticsInFloat32OutputLow) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  Tensor x = to(randn({4, 3, 5, 5}) * 3.0 + 100.0, d).cast(low);  // a large mean: bf16 statistics would fail
  auto bn = BatchNorm(3) | d;
  trainmode(bn);
  Tensor y = autocast(low, [&] { return bn(x); });
  EXPECT_EQ(y.dtype(), low);
  EXPECT_EQ(static_cast<const Tensor&>(bn.running_mean).dtype(), DType::f32);
  Tensor want = batchnorm(x.cast(DType::f64), Tensor(), Tensor(), 1e-5, nullptr, nullptr);
  EXPECT_LT(max_rel_error(y, want.to_vector<double>()), tol(low));
  // The running mean moved towards the batch mean (about 100) in float32.
  EXPECT_GT(mean(static_cast<const Tensor&>(bn.running_mean)).item<double>(), 5.0);

  auto ln = LayerNorm(5) | d;
  Tensor z = autocast(low, [&] { return ln(x); });
  EXPECT_EQ(z.dtype(), low);
  EXPECT_LT(max_rel_error(z, layernorm(x.cast(DType::f64), Tensor(), Tensor()).to_vector<double>()), tol(low));
}

// One-hot targets (n, k): row i has its 1 at column i % k.
Tensor onehot_rows(int64_t n, int64_t k, const Device& d) {
  std::vector<float> v(size_t(n * k), 0.0f);
  for (int64_t i = 0; i < n; ++i) v[size_t(i * k + i % k)] = 1.0f;
  return to(Tensor(v, Shape{n, k}), d);
}

// Bytes of tensor storage a copy of `model` leaves alive at the end of the forward of
// logitcrossentropy(model(x), y) inside withgradient, under autocast to *low or in float32: what the
// tape keeps. A fresh copy each time: the low weight casts of one run are not already there for the next.
template <class M> double tape_bytes(const M& model, const Tensor& x, const Tensor& y, std::optional<DType> low) {
  auto m = deepcopy(model);
  Tensor input = x.contiguous_copy();
  const size_t before = flux::detail::live_storage_bytes();
  size_t after = 0;
  auto loss = [&](auto& mm) {
    Tensor l = logitcrossentropy(mm(input), y);
    after = flux::detail::live_storage_bytes();
    return l;
  };
  if (low) withgradient(loss, m, {.autocast = *low});
  else withgradient(loss, m);
  EXPECT_GT(after, before);
  return double(after) - double(before);
}

// Gradients of logitcrossentropy(model(x), y) through autocast to `low` agree with central differences
// of the float64 model (the float32 master weights' own gradient, in Float32) on a few entries of
// every parameter, within `roundoffs` of the low dtype's roundoff (relative to the largest gradient).
// The float64 model runs in training mode (BatchNorm from batch statistics, as on the tape).
template <class M> void expect_gradients_match_finite_differences(M& model, const Tensor& x, const Tensor& y, DType low,
                                                                  double roundoffs) {
  auto loss = [&](auto& m) { return logitcrossentropy(m(x), y); };
  auto [value, grads] = withgradient(loss, model, {.autocast = low});
  EXPECT_EQ(value.dtype(), DType::f32);
  std::vector<Tensor> g = params(grads), p = params(model);
  ASSERT_EQ(g.size(), p.size());
  for (const Tensor& t : g) EXPECT_EQ(t.dtype(), DType::f32);
  auto m64 = f64(model | Device());
  trainmode(m64);
  Tensor x64 = to(x, Device()).f64(), y64 = to(y, Device()).f64();
  std::vector<Tensor> p64 = params(m64);
  ASSERT_EQ(p64.size(), g.size());
  for (size_t i = 0; i < p64.size(); ++i) {
    std::vector<double> gi = g[i].to_vector<double>();
    double scale = 1e-3;
    for (double v : gi) scale = std::max(scale, std::abs(v));
    for (int64_t e : {int64_t(0), p64[i].numel() / 2, p64[i].numel() - 1}) {
      std::vector<double> vals = p64[i].to_vector<double>();
      const double h = 1e-5, v0 = vals[size_t(e)];
      auto at = [&](double v) {
        vals[size_t(e)] = v;
        copy_(p64[i], Tensor(vals, p64[i].shape()));
        const Tensor l = logitcrossentropy(m64(x64), y64);
        return l.item<double>();
      };
      const double fd = (at(v0 + h) - at(v0 - h)) / (2 * h);
      at(v0);
      SCOPED_TRACE("parameter " + std::to_string(i) + " entry " + std::to_string(e));
      EXPECT_NEAR(gi[size_t(e)], fd, roundoffs * roundoff(low) * scale + 1e-6);
    }
  }
}

TEST_P(AutocastOps, GradientsMatchFiniteDifferences) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  // Fixed draws: relu's kink and a max's ties (rounding makes them) can flip a gradient entry of the
  // low model away from the float64 one's on some draws, both right.
  seed(36);
  auto model = Chain(Conv({3, 3}, 2, 4, relu), MaxPool({2, 2}), flatten, Dense(16, 8, tanh), Dense(8, 3)) | d;
  Tensor x = to(randn({3, 2, 6, 6}), d);
  Tensor y = to(Tensor(std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}, Shape{3, 3}), d);
  expect_gradients_match_finite_differences(model, x, y, low, 16);
}

// A conv's weight and bias gradients reach the Float32 master weights as the kernels accumulate them,
// in Float32, never rounded to the low dtype (the CPU's oneDNN writes them in Float32; other backends
// compute them through Float32): against a float64 reference of the values autocast sees, within
// Float32 accumulation (1e-5 of the terms' magnitudes; one rounding to bf16 errs by up to 2^-9 of the
// value, which these sums of a few hundred terms exceed). Operands are exact in the low dtype.
TEST_P(AutocastOps, ConvWeightGradientsReachTheMasterInFloat32) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(45);
  const int64_t n = 3, c = 5, o = 7, hw = 9;
  Conv layer({3, 3}, c, o, Activation(), {.pad = 1});
  auto representable = [&](const Tensor& t) { return t.cast(low).cast(DType::f32); };
  layer.weight = to(representable(randn({o, c, 3, 3}) * 0.3), d);
  layer.bias = to(representable(randn({o})), d);
  Tensor x = to(representable(randn({n, c, hw, hw})), d), w_out = to(representable(randn({n, o, hw, hw})), d);
  auto [value, grads] = withgradient([&](auto& m) { return sum(m(x) * w_out); }, layer, {.autocast = low});
  ASSERT_EQ(grads.weight.dtype(), DType::f32);
  // dw[o, c, ky, kx] = sum over (n, y, x) of w_out[n, o, y, x] x[n, c, y + ky - 1, x + kx - 1]; db = sum of w_out.
  const std::vector<double> xv = to(x, Device()).cast(DType::f64).to_vector<double>();
  const std::vector<double> gv = to(w_out, Device()).cast(DType::f64).to_vector<double>();
  const std::vector<float> dw = to(grads.weight, Device()).to_vector<float>();
  const std::vector<float> db = to(grads.bias, Device()).cast(DType::f32).to_vector<float>();
  for (int64_t oc = 0; oc < o; ++oc) {
    double bias_sum = 0, bias_mag = 0;
    for (int64_t i = 0; i < n * hw * hw; ++i) {
      const double g = gv[size_t(((i / (hw * hw)) * o + oc) * hw * hw + i % (hw * hw))];
      bias_sum += g, bias_mag += std::fabs(g);
    }
    EXPECT_NEAR(db[size_t(oc)], bias_sum, 1e-5 * bias_mag + 1e-30) << "dbias " << oc;
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t ky = 0; ky < 3; ++ky)
        for (int64_t kx = 0; kx < 3; ++kx) {
          double want = 0, mag = 0;
          for (int64_t b = 0; b < n; ++b)
            for (int64_t y = 0; y < hw; ++y)
              for (int64_t xx = 0; xx < hw; ++xx) {
                const int64_t iy = y + ky - 1, ix = xx + kx - 1;
                if (iy < 0 || ix < 0 || iy >= hw || ix >= hw) continue;
                const double t = gv[size_t(((b * o + oc) * hw + y) * hw + xx)] * xv[size_t(((b * c + ci) * hw + iy) * hw + ix)];
                want += t, mag += std::fabs(t);
              }
          const double got = dw[size_t(((oc * c + ci) * 3 + ky) * 3 + kx)];
          EXPECT_NEAR(got, want, 1e-5 * mag + 1e-30) << "dw " << oc << " " << ci << " " << ky << " " << kx;
        }
  }
}

// Dense (with relu) in training under autocast: the weight's and bias's gradients reach the Float32
// masters, and on the CPU with bf16 kernels they are Float32 sums themselves (the weight's by
// matmul_low_precision_float32), never rounded to the low dtype: against a float64 reference of the values autocast sees, within
// 1e-5 of the terms' magnitudes (one rounding to bf16 errs by up to 2^-9 of the value, which these
// sums of 70 terms exceed). Elsewhere (no such kernel: the product rounded once) within that rounding.
// relu's mask is read from the layer's own output.
TEST_P(AutocastOps, DenseWeightGradientsReachTheMasterInFloat32) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(47);
  const int64_t n = 70, in = 40, out = 24;
  auto representable = [&](const Tensor& t) { return t.cast(low).cast(DType::f32); };
  Dense layer(in, out, relu);
  layer.weight = to(representable(randn({out, in}) * 0.3), d);
  layer.bias = to(representable(randn({out}) * 0.1), d);
  Tensor x = to(representable(randn({n, in})), d), w_out = to(representable(randn({n, out})), d);
  Tensor y;
  auto [value, grads] = withgradient(
      [&](auto& m) {
        y = m(x);
        return sum(y * w_out);
      },
      layer, {.autocast = low});
  ASSERT_EQ(grads.weight.dtype(), DType::f32);
  const bool unrounded = d.is_cpu() && low == DType::bf16 && x.backend().low_precision_support(0, low).units;
  const std::vector<double> xv = to(x, Device()).cast(DType::f64).to_vector<double>();
  const std::vector<double> gv = to(w_out, Device()).cast(DType::f64).to_vector<double>();
  const std::vector<double> yv = to(y, Device()).cast(DType::f64).to_vector<double>();
  const std::vector<float> dw = to(grads.weight, Device()).to_vector<float>();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double want = 0, mag = 0;
      for (int64_t r = 0; r < n; ++r) {
        const size_t ro = size_t(r * out + o);
        const double t = yv[ro] > 0 ? gv[ro] * xv[size_t(r * in + i)] : 0.0;
        want += t, mag += std::fabs(t);
      }
      const double bound = unrounded ? 1e-5 * mag : 2 * roundoff(low) * std::fabs(want) + 1e-5 * mag;
      EXPECT_NEAR(dw[size_t(o * in + i)], want, bound + 1e-30) << "dw " << o << " " << i;
    }
  // The bias's: the row sum of the masked gradient, kept in Float32 where the fused path runs.
  ASSERT_EQ(grads.bias.dtype(), DType::f32);
  const std::vector<float> db = to(grads.bias, Device()).to_vector<float>();
  for (int64_t o = 0; o < out; ++o) {
    double want = 0, mag = 0;
    for (int64_t r = 0; r < n; ++r) {
      const size_t ro = size_t(r * out + o);
      const double t = yv[ro] > 0 ? gv[ro] : 0.0;
      want += t, mag += std::fabs(t);
    }
    const double bound = unrounded ? 1e-5 * mag : 2 * roundoff(low) * std::fabs(want) + 1e-5 * mag;
    EXPECT_NEAR(db[size_t(o)], want, bound + 1e-30) << "db " << o;
  }
}

// Dense with relu in training under autocast: on the CPU with bf16 kernels one GEMM writes y with the
// bias and relu in its epilogue (one kernel call; Dense then relu: two); its value against a
// float64 reference of the values autocast sees (one rounding of a Float32 sum), its gradients
// against finite differences of the float64 model, on (N, T, features) input too.
TEST_P(AutocastOps, DenseReluInTrainingMatchesFloat64AndFiniteDifferences) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(46);
  Dense layer(6, 16, relu), plain(6, 16);
  layer = layer | d;
  plain.weight = layer.weight, plain.bias = layer.bias;
  Tensor x = to(randn({2, 4, 6}), d), c = to(randn({2, 4, 16}), d);
  // The forwards' kernel calls, counted on a second call in the step (the casts of x, w and b are
  // kept from the first): Dense with relu against Dense without it, then relu.
  Tensor out;
  int64_t fused_calls = 0, composed_calls = 0;
  withgradient(
      [&](auto& m) {
        m(x);
        cpu_backend::reset_pass_counts();
        out = m(x);
        fused_calls = cpu_backend::pass_counts().kernels;
        return sum(out * c);
      },
      layer, {.autocast = low});
  withgradient(
      [&](auto& m) {
        m(x);
        cpu_backend::reset_pass_counts();
        Tensor y = relu(m(x));
        composed_calls = cpu_backend::pass_counts().kernels;
        return sum(y * c);
      },
      plain, {.autocast = low});
  ASSERT_EQ(out.dtype(), low);
  ASSERT_EQ(out.shape(), (Shape{2, 4, 16}));
  const Tensor x64 = rounded64(x, low).reshape(Shape{8, 6}), w64 = rounded64(layer.weight, low),
               b64 = rounded64(layer.bias, low);
  const std::vector<double> z = (matmul(x64, w64, false, true) + b64).to_vector<double>();
  const std::vector<double> mag = (matmul(abs(x64), abs(w64), false, true) + abs(b64)).to_vector<double>();
  const std::vector<double> got = to(out, Device()).cast(DType::f64).to_vector<double>();
  for (size_t i = 0; i < z.size(); ++i)
    EXPECT_NEAR(got[i], std::max(z[i], 0.0), 2 * roundoff(low) * std::fabs(z[i]) + 1e-4 * mag[i]) << "element " << i;
  if (d.is_cpu() && low == DType::bf16 && x.backend().low_precision_support(0, low).units) {
    EXPECT_EQ(fused_calls, 1) << "the bias and relu did not run in the GEMM's epilogue";
    EXPECT_EQ(composed_calls, 2);
  }
  auto model = Chain(Dense(6, 16, relu), Dense(16, 3)) | d;
  expect_gradients_match_finite_differences(model, to(randn({5, 6}), d), onehot_rows(5, 3, d), low, 16);
}

// BatchNorm from batch statistics, mean pooling and products and quotients of low activations, whose
// tape keeps the low activations and runs the backward in float32 (no float32 copies are kept). The
// functions are smooth: at a kink (relu near 0, a max's ties, which rounding to the low dtype makes)
// the low model and the float64 one may both be right and still differ.
TEST_P(AutocastOps, BatchNormPoolingAndProductsMatchFiniteDifferences) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(36);
  auto gate = [](const Tensor& h) { return h * sigmoid(h); };          // a product of two tracked low tensors
  auto soft = [](const Tensor& h) { return h / (1.0 + abs(h)); };      // a quotient, a sum with a constant
  // Convs without bias before a BatchNorm (as ResNet's): the bias's true gradient is 0 there, and what
  // rounding leaves of it is no scale for a relative check.
  const ConvOptions no_bias{.bias = false};
  auto model = Chain(Conv({3, 3}, 2, 4, Activation(), no_bias), BatchNorm(4, tanh), MeanPool({2, 2}), gate,
                     Conv({1, 1}, 4, 3, Activation(), no_bias), BatchNorm(3), soft, MeanPool({3, 3}), flatten,
                     Dense(3, 3)) |
               d;
  Tensor x = to(randn({8, 2, 8, 8}), d);
  Tensor y = onehot_rows(8, 3, d);
  // Two BatchNorms divide the low activations' rounding by their batch deviations: a few times the
  // 16 roundoffs of the model above.
  expect_gradients_match_finite_differences(model, x, y, low, 48);
}

// LayerNorm and GroupNorm (their affine included) under autocast: one op each on the low input,
// statistics in Float32, the backward from the low input cast up.
TEST_P(AutocastOps, LayerAndGroupNormMatchFiniteDifferences) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(37);
  const ConvOptions no_bias{.bias = false};
  auto model = Chain(Conv({3, 3}, 2, 4, Activation(), no_bias), GroupNorm(4, 2, tanh), MeanPool({2, 2}), flatten,
                     Dense(36, 8), LayerNorm(8, tanh), Dense(8, 3)) |
               d;
  Tensor x = to(randn({4, 2, 8, 8}), d);
  Tensor y = onehot_rows(4, 3, d);
  expect_gradients_match_finite_differences(model, x, y, low, 48);
}

// What the tape keeps of LayerNorm and GroupNorm under autocast: their low inputs, not Float32 copies.
TEST_P(AutocastOps, NormTapesKeepTheLowInput) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  auto model = Chain(Conv({3, 3}, 3, 16, Activation(), {.pad = 1}), GroupNorm(16, 4), MeanPool({4, 4}), flatten,
                     Dense(16 * 4 * 4, 64), LayerNorm(64), Dense(64, 10)) |
               d;
  Tensor x = to(randn({32, 3, 16, 16}), d);
  Tensor y = to(zeros({32, 10}), d);
  const double f32 = tape_bytes(model, x, y, std::nullopt), half = tape_bytes(model, x, y, low);
  // Float32 keeps at least the conv's output (GroupNorm's input) and GroupNorm's output (its affine's).
  EXPECT_GT(f32, 2.0 * 32 * 16 * 16 * 16 * 4);
  EXPECT_LT(half, 0.6 * f32) << "float32 " << f32 << " bytes, " << dtype_name(low) << " " << half << " bytes";
}

// relu of a tracked low activation: its backward runs in the low dtype (a mask product, exact there):
// the gradient is the incoming one where x > 0 and 0 elsewhere, bit for bit. On the CPU the backward is
// one kernel (g step(x) fused), so relu adds two kernels to the step: its forward and its backward.
TEST_P(AutocastOps, ReluOfLowActivationsBackwardIsTheMask) {
  const auto [d, low] = GetParam();
  Tensor x = to(randn({4, 33}), d).cast(low), c = to(randn({4, 33}), d).cast(low);
  const Tensor dx = gradient([&](const Tensor& t) { return sum((relu(t) * c).cast(DType::f32)); }, x);
  ASSERT_EQ(dx.dtype(), low);
  const std::vector<double> xs = x.to_vector<double>(), cs = c.to_vector<double>(), got = dx.to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(got[i], xs[i] > 0 ? cs[i] : 0.0) << "entry " << i << ", x = " << xs[i];
  Tensor y = relu(x);
  EXPECT_EQ(y.to_vector<double>(), relu(x.cast(DType::f64)).to_vector<double>());
  if (d.is_cpu()) {
    auto kernels = [&](bool with_relu) {
      auto f = [&](const Tensor& t) { return sum(((with_relu ? relu(t) : t) * c).cast(DType::f32)); };
      (void)gradient(f, x);  // warm-up
      cpu_backend::reset_pass_counts();
      (void)gradient(f, x);
      return cpu_backend::pass_counts().kernels;
    };
    EXPECT_EQ(kernels(true) - kernels(false), 2);
  }
}

// A Float32 tensor plus or minus a low one of its shape (a residual connection under autocast): the
// Float32 result of the low operand cast up, bit for bit (float64 sums of two floats with one rounding
// are that); the gradients are g (Float32) and ±g rounded to the low dtype. On the CPU one pass, no
// conversion.
TEST_P(AutocastOps, Float32PlusLowIsTheCastSumInOnePass) {
  const auto [d, low] = GetParam();
  Tensor x = to(randn({3, 5, 37}), d), y = to(randn({3, 5, 37}), d).cast(low), c = to(randn({3, 5, 37}), d);
  const std::vector<double> xs = x.to_vector<double>(), ys = y.to_vector<double>(), cs = c.to_vector<double>();
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE(form == 0 ? "x + y" : form == 1 ? "y + x" : "x - y");
    auto f = [form](const Tensor& a, const Tensor& b) { return form == 0 ? a + b : form == 1 ? b + a : a - b; };
    if (d.is_cpu()) cpu_backend::reset_pass_counts();
    const Tensor z = f(x, y);
    if (d.is_cpu()) {
      EXPECT_EQ(cpu_backend::pass_counts().kernels, 1);
      EXPECT_EQ(cpu_backend::pass_counts().conversions, 0);
    }
    ASSERT_EQ(z.dtype(), DType::f32);
    ASSERT_EQ(z.shape(), x.shape());
    const std::vector<double> got = z.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i)
      ASSERT_EQ(got[i], double(float(form == 2 ? xs[i] - ys[i] : xs[i] + ys[i]))) << "entry " << i;
    const auto [gx, gy] = gradient([&](const Tensor& a, const Tensor& b) { return sum(f(a, b) * c); }, x, y);
    ASSERT_EQ(gx.dtype(), DType::f32);
    ASSERT_EQ(gy.dtype(), low);
    const std::vector<double> gxs = gx.to_vector<double>(), gys = gy.to_vector<double>();
    const std::vector<double> want_gy = (form == 2 ? -c : c).cast(low).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      ASSERT_EQ(gxs[i], cs[i]) << "entry " << i;
      ASSERT_EQ(gys[i], want_gy[i]) << "entry " << i;
    }
  }
  // A broadcast operand is not this case: cast up and added as before.
  Tensor row = to(randn({37}), d).cast(low);
  EXPECT_EQ((x + row).to_vector<double>(), (x + row.cast(DType::f32)).to_vector<double>());
}

// LayerNorm of a Float32 input under autocast: its output stays Float32 (as without autocast, bit for
// bit), and its low cast, written by the same kernel, is the one the next ops read, under any view of
// the output (Dense on (N, T, D), attention's projections on (N T, D) rows): no conversion pass for it.
// Equal to the cast made from the output; a write to the output drops it.
TEST_P(AutocastOps, LayerNormOfFloat32OffersItsLowCast) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  seed(45);
  auto ln = LayerNorm(24) | d;
  Dense dense = Dense(24, 8) | d;
  Tensor x = to(randn({2, 5, 24}) * 2.0 + 1.0, d);
  const std::vector<double> plain = ln(x).to_vector<double>();
  Tensor y, z, z2;
  autocast(low, [&] {
    y = ln(x);
    if (d.is_cpu()) cpu_backend::reset_pass_counts();
    z = dense(y);
    z2 = dense(y.reshape(Shape{10, 24}));
    return z;
  });
  if (d.is_cpu() && low == DType::bf16) {  // the weights' casts (made by the first call), not the activation
    EXPECT_LE(cpu_backend::pass_counts().conversion_bytes, 6 * (dense.weight.numel() + dense.bias.numel()));
  }
  ASSERT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.to_vector<double>(), plain);
  const Tensor cast = detail::cached_raw_cast(y, low);
  EXPECT_EQ(cast.shape(), y.shape());
  EXPECT_EQ(cast.to_vector<double>(), y.cast(low).to_vector<double>());
  EXPECT_EQ(detail::cached_raw_cast(y.reshape(Shape{10, 24}), low).impl()->storage, cast.impl()->storage);
  const Tensor want = matmul(rounded64(y, low).reshape(Shape{10, 24}), rounded64(dense.weight, low), false, true) +
                      rounded64(dense.bias, low);
  EXPECT_LT(max_rel_error(z, want.to_vector<double>()), tol(low));
  EXPECT_EQ(z2.to_vector<double>(), z.reshape(Shape{10, 8}).to_vector<double>());
  copy_(y, to(randn({2, 5, 24}), d));
  EXPECT_EQ(detail::cached_raw_cast(y, low).to_vector<double>(), y.cast(low).to_vector<double>());
  // Training through it: the gradients against central differences of the float64 model.
  auto model = Chain(Dense(6, 24), LayerNorm(24), Dense(24, 3)) | d;
  expect_gradients_match_finite_differences(model, to(randn({5, 6}), d), onehot_rows(5, 3, d), low, 16);
}

// What the tape keeps under autocast: after the forward pass of a conv, BatchNorm, relu, pool, Dense
// network, the storage alive beyond the model and its input (the tape's saved values, the weights'
// low casts and the input's) is under 0.6x of float32's: the saved activations are in the low dtype.
TEST_P(AutocastOps, TapeKeepsActivationsInTheLowDtype) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  auto model = Chain(Conv({3, 3}, 3, 16, Activation(), {.pad = 1}), BatchNorm(16, relu), MaxPool({4, 4}), flatten,
                     Dense(16 * 8 * 8, 10)) |
               d;
  Tensor x = to(randn({8, 3, 32, 32}), d);
  Tensor y = to(zeros({8, 10}), d);
  const double f32 = tape_bytes(model, x, y, std::nullopt), half = tape_bytes(model, x, y, low);
  // Float32 keeps at least BatchNorm's input, relu's output and the pooled output in float32.
  EXPECT_GT(f32, 2.0 * 8 * 16 * 32 * 32 * 4);
  EXPECT_LT(half, 0.6 * f32) << "float32 " << f32 << " bytes, " << dtype_name(low) << " " << half << " bytes";
}

TEST_P(AutocastOps, InferenceFormMatchesTheLowModel) {
  const auto [d, low] = GetParam();
  Emulate emulate;
  auto model = Chain(Dense(12, 16, relu), Dense(16, 4)) | d;
  Tensor x = to(randn({5, 12}), d);
  Tensor y = autocast(low, [&] { return model(x); });
  EXPECT_EQ(y.dtype(), low);
  // Autocast of a float32 model computes what the low model computes on rounded input.
  auto lm = (low == DType::bf16 ? bf16(model) : f16(model));
  Tensor want = lm(x.cast(low));
  EXPECT_EQ(y.to_vector<double>(), want.to_vector<double>());
}

INSTANTIATE_TEST_SUITE_P(Devices, AutocastOps, ::testing::ValuesIn(cases()), case_name);

class ModelCasts : public ::testing::TestWithParam<Device> {};

TEST_P(ModelCasts, EveryFloatingTensorConvertedTiesKept) {
  const Device d = GetParam();
  auto shared = Dense(4, 4, relu);
  auto model = Chain(shared, BatchNorm(4), shared, Embedding(10, 4)) | d;
  for (DType t : {DType::f16, DType::bf16, DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    auto m = t == DType::f16 ? f16(model) : t == DType::bf16 ? bf16(model) : t == DType::f64 ? f64(model) : f32(model);
    fmap([&](const Tensor& x) {
      if (x.defined() && is_floating(x.dtype())) {
        EXPECT_EQ(x.dtype(), t);
      }
      if (x.defined()) {
        EXPECT_EQ(x.device(), d);
      }
      return x;
    }, m);
    // BatchNorm's running statistics (non-trainable) are converted too.
    EXPECT_EQ(static_cast<const Tensor&>(std::get<1>(m.layers).running_var).dtype(), t);
    // The Dense used twice is still one set of tensors.
    EXPECT_EQ(std::get<0>(m.layers).weight.impl()->storage, std::get<2>(m.layers).weight.impl()->storage);
    // Values: a rounding of the float32 ones.
    EXPECT_EQ(std::get<0>(m.layers).weight.to_vector<double>(),
              std::get<0>(model.layers).weight.cast(t).to_vector<double>());
  }
}

TEST_P(ModelCasts, LowModelsRunInTheirDtype) {
  const Device d = GetParam();
  auto model = Chain(Conv({3, 3}, 2, 3, relu), MeanPool({2, 2}), flatten, Dense(12, 5)) | d;
  auto lstm = Chain(GRU(3, 4), Dense(4, 2)) | d;
  Tensor x = to(randn({2, 2, 6, 6}), d), s = to(randn({2, 3, 3}), d);
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    auto m = t == DType::bf16 ? bf16(model) : f16(model);
    Tensor y = m(x.cast(t));
    EXPECT_EQ(y.dtype(), t);
    auto ref = f64(m | Device());
    EXPECT_LT(max_rel_error(y, ref(rounded64(x, t)).to_vector<double>()), 4 * tol(t));
    auto r = t == DType::bf16 ? bf16(lstm) : f16(lstm);
    Tensor z = r(s.cast(t));
    EXPECT_EQ(z.dtype(), t);
    EXPECT_LT(max_rel_error(z, f64(r | Device())(rounded64(s, t)).to_vector<double>()), 8 * tol(t));
    // A Float32 input to the low model is converted (Flux's one-time warning).
    EXPECT_EQ(m(x).dtype(), t);
    // Gradients of a low model have its dtype.
    auto g = gradient([&](auto& mm) { return sum(mm(x.cast(t))); }, m);
    EXPECT_EQ(std::get<3>(g.layers).weight.dtype(), t);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ModelCasts, ::testing::ValuesIn(flux::testing::test_devices()),
                         flux::testing::device_test_name);

// A CPU without units (forced here by capping the ISA below AVX-512, so on every machine) warns once,
// naming what is missing, and computes in Float32: bit for bit the Float32 result.
TEST(Autocast, CpuWithoutUnitsWarnsOnceAndMatchesFloat32) {
  const int old = detail::cpu_force_isa(1);
  set_autocast_emulation(false);
  auto model = Chain(Conv({3, 3}, 1, 2, relu), flatten, Dense(18, 3));
  Tensor x = randn({2, 1, 5, 5});
  auto loss = [&](auto& m) { return sum(m(x)); };
  auto want = withgradient(loss, model);
  detail::reset_autocast_warnings();
  ::testing::internal::CaptureStderr();
  auto got = withgradient(loss, model, {.autocast = DType::bf16});
  auto again = withgradient(loss, model, {.autocast = DType::bf16});
  const std::string err = ::testing::internal::GetCapturedStderr();
  detail::cpu_force_isa(old);
  EXPECT_EQ(got.value.item<double>(), want.value.item<double>());
  EXPECT_EQ(std::get<2>(got.grad.layers).weight.to_vector<double>(), std::get<2>(want.grad.layers).weight.to_vector<double>());
  EXPECT_EQ(again.value.item<double>(), want.value.item<double>());
  // Once per process, naming what is missing.
  size_t count = 0;
  for (size_t at = err.find("BFloat16 autocast on the CPU computes in Float32"); at != std::string::npos;
       at = err.find("BFloat16 autocast on the CPU computes in Float32", at + 1))
    ++count;
  EXPECT_EQ(count, 1u) << err;
  EXPECT_NE(err.find("no bf16 units"), std::string::npos) << err;
}

TEST(Autocast, ScopesNestPerThreadAndRejectOtherDtypes) {
  EXPECT_FALSE(autocast_dtype().has_value());
  {
    AutocastScope a(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    {
      AutocastScope b(DType::f16);
      EXPECT_EQ(autocast_dtype(), DType::f16);
      AutocastScope off(std::nullopt);
      EXPECT_FALSE(autocast_dtype().has_value());
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    std::optional<DType> other = DType::f32;
    std::thread([&] { other = autocast_dtype(); }).join();
    EXPECT_FALSE(other.has_value());
  }
  EXPECT_FALSE(autocast_dtype().has_value());
  try {
    AutocastScope bad(DType::f64);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[autocast] runs in Float16 or BFloat16; got Float64"), std::string::npos);
  }
  auto m = Dense(2, 2);
  EXPECT_THROW(withgradient([&](auto& mm) { return sum(mm(randn({1, 2}))); }, m, {.autocast = DType::i32}), Error);
}

// The cast of a weight is made once per content: reused while the weight is unchanged, made anew
// after any write (an optimiser step, copy_, Tensor::buffer()).
TEST(Autocast, WeightCastsFollowWrites) {
  Emulate emulate;
  Tensor w = randn({4, 4});
  Tensor a = detail::cached_raw_cast(w, DType::bf16), b = detail::cached_raw_cast(w, DType::bf16);
  EXPECT_EQ(a.impl()->storage, b.impl()->storage);
  copy_(w, randn({4, 4}));
  Tensor c = detail::cached_raw_cast(w, DType::bf16);
  EXPECT_NE(c.impl()->storage, a.impl()->storage);
  EXPECT_EQ(c.to_vector<double>(), w.cast(DType::bf16).to_vector<double>());
  (void)w.buffer();
  EXPECT_NE(detail::cached_raw_cast(w, DType::bf16).impl()->storage, c.impl()->storage);
}

// The weights' low casts live for one step: the backward drops each from its weight's cache once the
// ops that used it are done, so they do not stay until the optimiser writes the weights.
TEST(Autocast, WeightCastsDroppedByTheBackward) {
  Emulate emulate;
  auto model = Chain(Dense(256, 256, relu), Dense(256, 8));
  Tensor x = randn({2, 256});
  size_t grad_bytes = 0, low_weight_bytes = 0;
  for (const Tensor& p : params(model)) grad_bytes += p.nbytes(), low_weight_bytes += p.nbytes() / 2;
  const size_t before = flux::detail::live_storage_bytes();
  size_t during = 0;
  auto loss = [&](auto& m) {
    Tensor l = sum(m(x).cast(DType::f32));
    during = flux::detail::live_storage_bytes();
    return l;
  };
  auto [value, grads] = withgradient(loss, model, {.autocast = DType::bf16});
  const size_t after = flux::detail::live_storage_bytes();
  EXPECT_GT(during - before, low_weight_bytes);  // the casts exist in the forward
  // After it: the gradients, the loss and x's own cast (x lives on), not the weights' casts.
  EXPECT_LT(after - before, grad_bytes + low_weight_bytes / 4) << "before " << before << ", after " << after;
}

// Threads calling one model at once, one under autocast and one without (the scope is per thread;
// the weight casts are shared through each weight's cache): each gets its single-caller bits.
TEST(Autocast, ThreadsShareOneModel) {
  Emulate emulate;
  auto model = Chain(Conv({3, 3}, 2, 4, relu), flatten, Dense(4 * 4 * 4, 5));
  testmode(model);
  Tensor x = randn({3, 2, 6, 6});
  const std::vector<double> want_low = autocast(DType::bf16, [&] { return model(x); }).to_vector<double>();
  const std::vector<double> want_f32 = model(x).to_vector<double>();
  std::vector<std::vector<double>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 5; ++k)
        got[size_t(i)] = i % 2 ? model(x).to_vector<double>()
                                : autocast(DType::bf16, [&] { return model(x); }).to_vector<double>();
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[size_t(i)], i % 2 ? want_f32 : want_low) << "thread " << i;
}

// bf16 end to end on the CPU: a training step of conv, BatchNorm with relu, max pooling, a residual
// block, LayerNorm, mean pooling and Dense runs its activations in bf16 from op to op (BatchNorm,
// LayerNorm, pooling, relu and the adds read and write bf16): the step's float32 <-> bf16 conversion
// passes are those of the weights, their gradients and the input, not of the activations.
TEST(Autocast, CpuStepConvertsNoActivations) {
  Emulate emulate;
  seed(41);
  const ConvOptions no_bias{.pad = 1, .bias = false};
  auto block = Chain(Conv({3, 3}, 8, 8, Activation(), no_bias), BatchNorm(8));
  auto model = Chain(Conv({3, 3}, 4, 8, Activation(), no_bias), BatchNorm(8, relu), MaxPool({3, 3}, {.stride = 2, .pad = 1}),
                     SkipConnection(block, plus), LayerNorm(16), MeanPool({2, 2}), flatten, Dense(8 * 8 * 8, 3));
  Tensor x = randn({16, 4, 32, 32});
  Tensor y = onehot_rows(16, 3, Device());
  auto loss = [&](auto& m) { return logitcrossentropy(m(x), y); };
  withgradient(loss, model, {.autocast = DType::bf16});  // warm-up
  cpu_backend::reset_pass_counts();
  auto [value, grads] = withgradient(loss, model, {.autocast = DType::bf16});
  const cpu_backend::PassCounts c = cpu_backend::pass_counts();
  // Allowed: the weights down and their gradients up (twice over for slack), the input down, the logits.
  const int64_t allowed = 6 * (4 * parameter_count(model) + x.numel() + 4096);
  const int64_t one_activation = 6 * 16 * 8 * 32 * 32;  // one pass over the first conv's output
  EXPECT_LT(c.conversion_bytes, allowed) << c.conversions << " conversions";
  EXPECT_LT(c.conversion_bytes, one_activation) << c.conversions << " conversions";
  EXPECT_TRUE(std::isfinite(value.item<double>()));
}
}  // namespace
