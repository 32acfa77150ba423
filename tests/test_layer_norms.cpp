// LayerNorm, GroupNorm and InstanceNorm on every device against float64 host loops (forward and the
// gradients of sum(y * r)), finite differences in float64 for the layernorm/groupnorm ops, Flux
// printing and defaults, PyTorch state names, and bad input.
#include <gmock/gmock.h>

#include "library_kernels.hpp"
#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;

namespace {
class NormDevices : public ::testing::TestWithParam<Device> {};

// Normalises each of `rows` rows of `cols` consecutive values of x (float64); weight/bias per
// column index `col_of(row, j)` when given.
std::vector<double> normalise_ref(const std::vector<double>& x, int64_t rows, int64_t cols, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < cols; ++j) m += x[size_t(r * cols + j)];
    m /= double(cols);
    for (int64_t j = 0; j < cols; ++j) v += (x[size_t(r * cols + j)] - m) * (x[size_t(r * cols + j)] - m);
    v /= double(cols);
    for (int64_t j = 0; j < cols; ++j) y[size_t(r * cols + j)] = (x[size_t(r * cols + j)] - m) / std::sqrt(v + eps);
  }
  return y;
}

Tensor randomised(const Tensor& t, uint64_t seed) { return t.defined() ? uniform_tensor(t.shape(), seed, 0.5, 1.5).cast(t.dtype()) : t; }
}  // namespace

TEST(LayerNorms, ConstructionDefaultsAndPrinting) {
  LayerNorm ln(32);
  EXPECT_EQ(ln.weight.shape(), (Shape{32}));
  EXPECT_EQ(ln.weight.to_vector<double>(), std::vector<double>(32, 1.0));
  EXPECT_EQ(ln.bias.to_vector<double>(), std::vector<double>(32, 0.0));
  EXPECT_EQ(ln.eps, 1e-5);  // PyTorch's and Flux's
  EXPECT_EQ(to_text(ln), "LayerNorm(32)       # 64 parameters");
  EXPECT_EQ(layer_string(LayerNorm(8, relu, {.affine = false})), "LayerNorm(8, relu, affine=false)");
  EXPECT_EQ(to_text(LayerNorm(8, {.affine = false})), "LayerNorm(8, affine=false)");
  GroupNorm gn(32, 4);
  EXPECT_EQ(to_text(gn), "GroupNorm(32, 4)    # 64 parameters");
  EXPECT_EQ(layer_string(GroupNorm(6, 3, relu, {.affine = false})), "GroupNorm(6, 3, relu, affine=false)");
  InstanceNorm in(16);
  EXPECT_FALSE(in.weight.defined());  // Flux's and PyTorch's default: affine = false
  EXPECT_EQ(to_text(in), "InstanceNorm(16)");
  EXPECT_EQ(to_text(InstanceNorm(16, {.affine = true})), "InstanceNorm(16, affine=true)  # 32 parameters");
  auto c = Chain(Dense(4, 8), LayerNorm(8), GroupNorm(8, 2));
  auto st = state(c);
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[2].first, "layers.1.weight");  // PyTorch's nn.LayerNorm / nn.GroupNorm names
  EXPECT_EQ(st[5].first, "layers.2.bias");
  EXPECT_EQ(repr(c), "Chain(Dense(4 => 8), LayerNorm(8), GroupNorm(8, 2))  # 72 parameters");
  EXPECT_EQ(LayerNorm(4, {.dtype = DType::f64}).weight.dtype(), DType::f64);
}

TEST_P(NormDevices, LayerNormMatchesFloat64Reference) {
  Device d = GetParam();
  for (bool affine : {true, false}) {
    for (Shape shape : {Shape{4, 6}, Shape{2, 3, 6}, Shape{6}}) {
      SCOPED_TRACE(to_string(shape) + (affine ? " affine" : ""));
      LayerNorm ln(6, {.affine = affine});
      ln.weight = randomised(ln.weight, 11);
      ln.bias = randomised(ln.bias, 12);
      Tensor x = uniform_tensor(shape, 3, -3, 5);
      Tensor r = uniform_tensor(shape, 4);
      int64_t rows = shape.numel() / 6;
      std::vector<double> xs = x.to_vector<double>(), rs = r.to_vector<double>();
      std::vector<double> xhat = normalise_ref(xs, rows, 6, 1e-5), want = xhat;
      std::vector<double> w = affine ? ln.weight.to_vector<double>() : std::vector<double>(6, 1.0);
      std::vector<double> b = affine ? ln.bias.to_vector<double>() : std::vector<double>(6, 0.0);
      for (size_t i = 0; i < want.size(); ++i) want[i] = xhat[i] * w[i % 6] + b[i % 6];
      LayerNorm m = ln | d;
      Tensor xd = to(x.f32(), d), rd = to(r.f32(), d);
      EXPECT_LT(max_rel_error(m(xd), want), 2e-5);
      // gradients of sum(y * r) in float64 on the CPU are the reference for the device's float32 ones
      auto [g64, gx64] = gradient([&](const LayerNorm& l, const Tensor& v) { return sum(l(v) * r); }, to_f64_cpu(ln), x);
      auto [g, gx] = gradient([&](const LayerNorm& l, const Tensor& v) { return sum(l(v) * rd); }, m, xd);
      EXPECT_LT(max_rel_error(gx, gx64.to_vector<double>()), 1e-4);
      if (affine) {
        // dbias = Σ r, dweight = Σ r x̂ over the rows
        std::vector<double> db(6, 0.0), dw(6, 0.0);
        for (size_t i = 0; i < rs.size(); ++i) db[i % 6] += rs[i], dw[i % 6] += rs[i] * xhat[i];
        EXPECT_LT(max_rel_error(g.bias, db), 1e-5);
        EXPECT_LT(max_rel_error(g.weight, dw), 1e-4);
        EXPECT_LT(max_rel_error(g64.weight, dw), 1e-12);
      }
    }
  }
}

TEST_P(NormDevices, GroupAndInstanceNormMatchFloat64Reference) {
  Device d = GetParam();
  for (Shape shape : {Shape{2, 6, 3, 2}, Shape{3, 6, 5}, Shape{4, 6}}) {
    for (int64_t groups : {1, 2, 3, 6}) {
      SCOPED_TRACE(to_string(shape) + " groups " + std::to_string(groups));
      GroupNorm gn(6, groups);
      gn.weight = randomised(gn.weight, 21);
      gn.bias = randomised(gn.bias, 22);
      Tensor x = uniform_tensor(shape, 5, -2, 4);
      int64_t n = shape[0], s = shape.numel() / (n * 6);
      std::vector<double> xhat = normalise_ref(x.to_vector<double>(), n * groups, 6 / groups * s, 1e-5), want = xhat;
      std::vector<double> w = gn.weight.to_vector<double>(), b = gn.bias.to_vector<double>();
      for (size_t i = 0; i < want.size(); ++i) {
        size_t ch = (i / size_t(s)) % 6;
        want[i] = xhat[i] * w[ch] + b[ch];
      }
      GroupNorm m = gn | d;
      Tensor xd = to(x.f32(), d);
      EXPECT_LT(max_rel_error(m(xd), want), 2e-5);
      Tensor r = uniform_tensor(shape, 6);
      auto [g64, gx64] = gradient([&](const GroupNorm& l, const Tensor& v) { return sum(l(v) * r); }, to_f64_cpu(gn), x);
      auto [g, gx] = gradient([&](const GroupNorm& l, const Tensor& v) { return sum(l(v) * to(r.f32(), d)); }, m, xd);
      // float32 dx is ill-conditioned for groups of 2 values ((4, 6) with 3 groups): 1.5e-4 measured
      EXPECT_LT(max_rel_error(gx, gx64.to_vector<double>()), 5e-4);
      EXPECT_LT(max_rel_error(g.weight, g64.weight.to_vector<double>()), 1e-4);
      EXPECT_LT(max_rel_error(g.bias, g64.bias.to_vector<double>()), 1e-5);
    }
    if (shape.size() > 2) {  // InstanceNorm = GroupNorm with one channel per group, no affine
      Tensor x = uniform_tensor(shape, 8, -2, 4);
      int64_t s = shape.numel() / (shape[0] * 6);
      std::vector<double> want = normalise_ref(x.to_vector<double>(), shape[0] * 6, s, 1e-5);
      EXPECT_LT(max_rel_error((InstanceNorm(6) | d)(to(x.f32(), d)), want), 2e-5);
    }
  }
}

// The backends' fused row-normalisation kernels (rownorm_forward/backward) against the portable composed
// ops and a float64 host loop, on every device, float32 and float64: values and the gradients of
// sum(y * r) for x, weight and bias. Shapes cover one row, many rows (70 000 rows of 3: more than
// OpenCL's 65 536 work-groups per launch and several CPU row blocks), rows longer than a work-group
// (300 > 256), weight only, bias only and neither, and groupnorm's rows.
TEST_P(NormDevices, FusedRowKernelsMatchPortablePathAndFloat64) {
  Device d = GetParam();
  struct Case {
    Shape shape;
    bool weight, bias;
  };
  for (Case c : {Case{{1, 7}, true, true}, Case{{70000, 3}, true, true}, Case{{5, 300}, true, false},
                 Case{{4, 2, 33}, false, true}, Case{{9, 16}, false, false}}) {
    for (DType t : {DType::f64, DType::f32}) {
      SCOPED_TRACE(to_string(c.shape) + " " + dtype_name(t) + (c.weight ? " weight" : "") + (c.bias ? " bias" : ""));
      const int64_t dim = c.shape[c.shape.size() - 1], rows = c.shape.numel() / dim;
      // inputs rounded to float32 first, so the float32 run starts from the reference's numbers
      auto f32_exact = [](const Tensor& v) { return v.f32().cast(DType::f64); };
      Tensor x = f32_exact(uniform_tensor(c.shape, 31, -3, 5)), r = f32_exact(uniform_tensor(c.shape, 32));
      Tensor w = c.weight ? f32_exact(uniform_tensor(Shape{dim}, 33, 0.5, 1.5)) : Tensor();
      Tensor b = c.bias ? f32_exact(uniform_tensor(Shape{dim}, 34)) : Tensor();
      // float64 host reference: y, dx, dw, db
      std::vector<double> xs = x.to_vector<double>(), rs = r.to_vector<double>();
      std::vector<double> xhat = normalise_ref(xs, rows, dim, 1e-5), y(xs.size()), dx(xs.size());
      std::vector<double> ws = c.weight ? w.to_vector<double>() : std::vector<double>(size_t(dim), 1.0);
      std::vector<double> bs = c.bias ? b.to_vector<double>() : std::vector<double>(size_t(dim), 0.0);
      std::vector<double> dw(size_t(dim), 0.0), db(size_t(dim), 0.0);
      for (int64_t i = 0; i < rows; ++i) {
        double m = 0, v = 0, sg = 0, sgx = 0;
        for (int64_t j = 0; j < dim; ++j) m += xs[size_t(i * dim + j)];
        m /= double(dim);
        for (int64_t j = 0; j < dim; ++j) v += (xs[size_t(i * dim + j)] - m) * (xs[size_t(i * dim + j)] - m);
        const double inv = 1.0 / std::sqrt(v / double(dim) + 1e-5);
        for (int64_t j = 0; j < dim; ++j) {
          size_t k = size_t(i * dim + j);
          y[k] = xhat[k] * ws[size_t(j)] + bs[size_t(j)];
          sg += rs[k] * ws[size_t(j)], sgx += rs[k] * ws[size_t(j)] * xhat[k];
          dw[size_t(j)] += rs[k] * xhat[k], db[size_t(j)] += rs[k];
        }
        for (int64_t j = 0; j < dim; ++j) {
          size_t k = size_t(i * dim + j);
          dx[k] = inv * (rs[k] * ws[size_t(j)] - sg / double(dim) - xhat[k] * sgx / double(dim));
        }
      }
      auto run = [&](bool fused) {
        LibraryKernels mode(fused);
        Tensor xd = to(x.cast(t), d), rd = to(r.cast(t), d);
        Tensor wd = c.weight ? to(w.cast(t), d) : Tensor(), bd = c.bias ? to(b.cast(t), d) : Tensor();
        autodiff::Tape tape;
        Tensor xl = tape.leaf(xd), wl = c.weight ? tape.leaf(wd) : Tensor(), bl = c.bias ? tape.leaf(bd) : Tensor();
        Tensor out = layernorm(xl, wl, bl, 1e-5);
        tape.backward(sum(out * rd));
        return std::vector<Tensor>{out, tape.grad(xl), c.weight ? tape.grad(wl) : Tensor(), c.bias ? tape.grad(bl) : Tensor()};
      };
      std::vector<Tensor> fused = run(true), portable = run(false);
      // float64: both paths equal the host loop to rounding. float32: the fused kernels accumulate in
      // float64 (<= 2e-4 worst case over 70 000 rows of 3 values, whose dx is ill-conditioned); the
      // portable path runs in float32 throughout (3.3e-4 measured there), hence its looser bound.
      for (const std::vector<Tensor>* got : {&fused, &portable}) {
        SCOPED_TRACE(got == &fused ? "fused" : "portable");
        const double tol = t == DType::f64 ? 1e-11 : got == &fused ? 2e-4 : 1e-3;
        EXPECT_LT(max_rel_error((*got)[0], y), tol);
        EXPECT_LT(max_rel_error((*got)[1], dx), tol);
        if (c.weight) {
          EXPECT_LT(max_rel_error((*got)[2], dw), tol * 10);  // sums over up to 70 000 rows
        }
        if (c.bias) {
          EXPECT_LT(max_rel_error((*got)[3], db), tol * 10);
        }
      }
    }
  }
  // groupnorm's rows go through the same kernels: fused == portable (float64)
  Tensor x = uniform_tensor(Shape{3, 6, 4, 5}, 41), gw = uniform_tensor(Shape{6}, 42), gb = uniform_tensor(Shape{6}, 43);
  auto group = [&](bool fused) {
    LibraryKernels mode(fused);
    return groupnorm(to(x, d), 3, to(gw, d), to(gb, d)).to_vector<double>();
  };
  EXPECT_LT(max_rel_error(to(Tensor(group(true), x.shape()), Device()), group(false)), 1e-12);
}

FLUX_DEVICE_SUITE(NormDevices);

TEST(LayerNorms, FiniteDifferenceGradientsFloat64) {
  using V = const std::vector<Tensor>&;
  expect_finite_difference_gradient([](V v) { return layernorm(v[0], v[1], v[2]); },
                                    {uniform_tensor(Shape{3, 5}, 1), uniform_tensor(Shape{5}, 2), uniform_tensor(Shape{5}, 3)});
  expect_finite_difference_gradient([](V v) { return layernorm(v[0], Tensor(), Tensor(), 1e-3); },
                                    {uniform_tensor(Shape{2, 2, 4}, 4)});
  expect_finite_difference_gradient([](V v) { return groupnorm(v[0], 2, v[1], v[2]); },
                                    {uniform_tensor(Shape{2, 4, 3}, 5), uniform_tensor(Shape{4}, 6), uniform_tensor(Shape{4}, 7)});
  expect_finite_difference_gradient([](V v) { return groupnorm(v[0], 3, Tensor(), Tensor()); },
                                    {uniform_tensor(Shape{2, 3, 2, 2}, 8)});
  // a layer with an activation on top, through withgradient of the layer's own type
  expect_finite_difference_gradient([](V v) { LayerNorm l(4, flux::tanh); l.weight = v[1]; l.bias = v[2]; return l(v[0]); },
                                    {uniform_tensor(Shape{3, 4}, 9), uniform_tensor(Shape{4}, 10), uniform_tensor(Shape{4}, 11)});
}

TEST(LayerNorms, BadInputNamesTheProblem) {
  EXPECT_THAT(error_of([] { LayerNorm(4)(zeros(Shape{2, 5})); }),
              HasSubstr("[LayerNorm] expected input with last dimension 4 (LayerNorm(4)); got shape (2, 5)"));
  EXPECT_THAT(error_of([] { LayerNorm(4)(zeros(Shape{2, 4}, DType::i32)); }),
              HasSubstr("[LayerNorm] needs a floating-point input"));
  EXPECT_THAT(error_of([] { GroupNorm(6, 4); }),
              HasSubstr("[GroupNorm] the number of groups (4) must be positive and divide the channels (6); got GroupNorm(6, 4)"));
  EXPECT_THAT(error_of([] { GroupNorm(6, 3)(zeros(Shape{2, 4, 3})); }),
              HasSubstr("[GroupNorm] input has 4 channels, layer expects 6 (GroupNorm(6, 3)); got shape (2, 4, 3)"));
  EXPECT_THAT(error_of([] { InstanceNorm(3)(zeros(Shape{2, 3})); }),
              HasSubstr("[InstanceNorm] expects input (N, C, spatial...) with at least 3 dimensions"));
  EXPECT_THAT(error_of([] { layernorm(zeros(Shape{2, 3}), ones(Shape{4}), Tensor()); }),
              HasSubstr("[layernorm] weight and bias must have shape (3,) (the last axis of input (2, 3)); got (4,)"));
  EXPECT_THAT(error_of([] { groupnorm(zeros(Shape{2, 6}), 4, Tensor(), Tensor()); }),
              HasSubstr("[groupnorm] groups (4) must be positive and divide the channels (6) of input (2, 6)"));
  EXPECT_THAT(error_of([] { LayerNorm(4, {.eps = 0}); }), HasSubstr("[LayerNorm] eps must be positive; got 0"));
  for (Device d : test_devices()) {
    if (d == Device()) continue;
    LayerNorm m = LayerNorm(3) | d;
    EXPECT_THAT(error_of([&] { m(zeros(Shape{2, 3})); }),
                HasSubstr("[LayerNorm] input on CPU but the layer's state on " + to_string(d)));
  }
  std::string path = ::testing::TempDir() + "/layernorm_state.safetensors";
  save(path, LayerNorm(4));
  LayerNorm other(5);
  EXPECT_THAT(error_of([&] { load(path, other); }), HasSubstr("weight"));
}
