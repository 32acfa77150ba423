// Dense and Chain: forward values on every device against a float64 host reference, initialisation,
// and Flux's exact printing.
#include <cmath>
#include <sstream>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;
using ::testing::HasSubstr;

namespace {
template <class T> std::string to_text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// y[n, o] = act(sum_i x[n, i] W[o, i] + b[o]) in float64.
std::vector<double> dense_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                              int64_t n, int64_t in, int64_t out, double (*act)(double)) {
  std::vector<double> y;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y.push_back(act(s));
    }
  return y;
}
double id(double v) { return v; }
double relu_d(double v) { return v > 0 ? v : 0; }
double sigmoid_d(double v) { return 1 / (1 + std::exp(-v)); }
double tanh_d(double v) { return std::tanh(v); }

class Layers : public ::testing::TestWithParam<Device> {};
}  // namespace

TEST_P(Layers, DenseForwardMatchesHost) {
  Device d = GetParam();
  seed(10);
  struct Case {
    Activation act;
    double (*ref)(double);
  };
  for (const Case& c : {Case{Activation(), id}, Case{relu, relu_d}, Case{sigmoid, sigmoid_d}, Case{flux::tanh, tanh_d}}) {
    SCOPED_TRACE(c.act.name());
    Dense layer(5, 3, c.act);
    layer.bias = randn({3});
    Dense dl = layer | d;
    EXPECT_EQ(dl.weight.device(), d);
    Tensor x = randn({7, 5});
    Tensor y = dl(to(x, d));
    EXPECT_EQ(y.shape(), (Shape{7, 3}));
    EXPECT_EQ(y.device(), d);
    auto want = dense_ref(x.to_vector<double>(), layer.weight.to_vector<double>(), layer.bias.to_vector<double>(), 7, 5, 3, c.ref);
    EXPECT_LE(max_rel_error(y, want), 1e-5);
    // a single observation (in,) gives (out,)
    Tensor y1 = dl(to(x[0], d));
    EXPECT_EQ(y1.shape(), (Shape{3}));
    EXPECT_LE(max_rel_error(y1, std::vector<double>(want.begin(), want.begin() + 3)), 1e-5);
  }
  // no bias
  Dense nb = Dense(4, 2, {.bias = false}) | d;
  EXPECT_FALSE(nb.bias.defined());
  Tensor x = randn({3, 4});
  EXPECT_LE(max_rel_error(nb(to(x, d)), dense_ref(x.to_vector<double>(), to(nb.weight, Device()).to_vector<double>(), {}, 3, 4, 2, id)), 1e-5);
  // batch of batches (B, N, in)
  Dense l = Dense(4, 2) | d;
  Tensor xb = randn({2, 3, 4});
  Tensor yb = l(to(xb, d));
  EXPECT_EQ(yb.shape(), (Shape{2, 3, 2}));
  EXPECT_LE(max_rel_error(yb, dense_ref(xb.to_vector<double>(), to(l.weight, Device()).to_vector<double>(),
                                         to(l.bias, Device()).to_vector<double>(), 6, 4, 2, id)), 1e-5);
}

TEST_P(Layers, ChainAppliesLayersInOrder) {
  Device d = GetParam();
  seed(20);
  auto model = Chain(Dense(4, 8, relu), Dense(8, 3), softmax) | d;
  Tensor x = randn({6, 4});
  Tensor y = model(to(x, d));
  EXPECT_EQ(y.shape(), (Shape{6, 3}));
  const Dense& a = model.get<0>();
  const Dense& b = model.get<1>();
  auto h = dense_ref(x.to_vector<double>(), to(a.weight, Device()).to_vector<double>(), to(a.bias, Device()).to_vector<double>(), 6, 4, 8, relu_d);
  auto z = dense_ref(h, to(b.weight, Device()).to_vector<double>(), to(b.bias, Device()).to_vector<double>(), 6, 8, 3, id);
  for (int r = 0; r < 6; ++r) {
    double m = std::max({z[r * 3], z[r * 3 + 1], z[r * 3 + 2]}), s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(z[r * 3 + c] - m);
    for (int c = 0; c < 3; ++c) z[r * 3 + c] = std::exp(z[r * 3 + c] - m) / s;
  }
  EXPECT_LE(max_rel_error(y, z), 1e-5);
  // any callable is a layer; chains nest
  auto scaled = Chain(Chain(Dense(4, 2) | d), [](const Tensor& t) { return t * 2.0; });
  Tensor ys = scaled(to(x, d));
  Tensor inner = scaled.get<0>()(to(x, d));
  EXPECT_LE(max_rel_error(ys, (inner * 2.0).to_vector<double>()), 1e-6);
  EXPECT_EQ(decltype(model)::size(), 3u);
}

// A chain holds one intermediate at a time (as PyTorch's Sequential): each layer's input is released
// once the layer has run, so the memory in use does not grow with the chain's length. Before, every
// intermediate lived until the chain returned: each step below found 4 MB more in use than the last.
TEST_P(Layers, ChainReleasesEachIntermediate) {
  Device d = GetParam();
  std::vector<size_t> used;
  auto step = [&](const Tensor& t) {
    used.push_back(d.memory().used);
    return t + 1.0;
  };
  auto chain = Chain(step, step, step, step, step, step);
  Tensor x = to(full({1 << 20}, 0.5f), d);  // 4 MB
  Tensor y = chain(x);
  ASSERT_EQ(used.size(), 6u);
  const size_t mb4 = size_t(4) << 20;
  // Steps 3..6 see the chain's input, their own input and nothing older.
  for (size_t i = 2; i < used.size(); ++i)
    EXPECT_LE(used[i], used[1]) << "step " << i + 1 << ": " << (used[i] - used[1]) / mb4 << " x 4 MB more in use";
  std::vector<float> v = y.to_vector<float>();
  EXPECT_EQ(v.front(), 6.5f);
  EXPECT_EQ(v.back(), 6.5f);
}

TEST_P(Layers, TrainsOnDevice) {
  Device d = GetParam();
  seed(30);
  // the seeds' loop on a learnable target
  auto model = Chain(Dense(10, 64, relu), Dense(64, 1)) | d;
  Tensor X = rand({256, 10}), W = randn({10, 1});
  Tensor Y = matmul(X, W);
  auto loader = DataLoader<2>({X, Y}, {.batchsize = 64, .shuffle = true});
  auto state = optimisers::setup(optimisers::Adam(1e-2), model);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 30; ++epoch) {
    double total = 0;
    int batches = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] = withgradient([&](const auto& m) { return mse(m(to(x, d)), to(y, d)); }, model);
      optimisers::update(state, model, grads);
      total += loss.item<float>();
      ++batches;
    }
    if (epoch == 0) first = total / batches;
    last = total / batches;
  }
  EXPECT_LT(last, first * 0.05);
  EXPECT_EQ(model.get<0>().weight.device(), d);
}

FLUX_DEVICE_SUITE(Layers);

TEST(Dense, GlorotUniformInitAndSeeding) {
  seed(5);
  Dense a(300, 200);
  seed(5);
  Dense b(300, 200);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
  EXPECT_EQ(a.weight.shape(), (Shape{200, 300}));
  EXPECT_EQ(a.in_features(), 300);
  EXPECT_EQ(a.out_features(), 200);
  EXPECT_EQ(a.bias.to_vector<float>(), std::vector<float>(200, 0.0f));
  double limit = std::sqrt(6.0 / 500), var = 0, lo = 1, hi = -1;
  auto w = a.weight.to_vector<double>();
  for (double v : w) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    var += v * v / double(w.size());
  }
  EXPECT_GE(lo, -limit);
  EXPECT_LE(hi, limit);
  EXPECT_LT(lo, -0.95 * limit);
  EXPECT_GT(hi, 0.95 * limit);
  EXPECT_NEAR(var, limit * limit / 3, 0.05 * limit * limit / 3);  // variance of U(-l, l)
  Dense f64(3, 2, {.dtype = DType::f64});
  EXPECT_EQ(f64.weight.dtype(), DType::f64);
  EXPECT_EQ(f64.bias.dtype(), DType::f64);
  EXPECT_EQ(glorot_uniform(4, 6, DType::f16).dtype(), DType::f16);
}

TEST(Dense, FromArrays) {
  Dense d(Tensor({{1, 2}, {3, 4}, {5, 6}}), Tensor({1, 0, -1}), relu);
  EXPECT_EQ(d.in_features(), 2);
  EXPECT_EQ(d.out_features(), 3);
  EXPECT_EQ(d(Tensor({1, -1})).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(d(Tensor({{1, 1}})).to_vector<float>(), (std::vector<float>{4, 7, 10}));
  Dense nobias(Tensor({{2, 0}, {0, 2}}), Tensor());
  EXPECT_EQ(nobias(Tensor({1, 3})).to_vector<float>(), (std::vector<float>{2, 6}));
}

TEST(Printing, DenseLikeFlux) {
  EXPECT_EQ(to_text(Dense(10, 5, sigmoid)), "Dense(10 => 5, sigmoid)  # 55 parameters");
  EXPECT_EQ(to_text(Dense(10, 5)), "Dense(10 => 5)      # 55 parameters");
  EXPECT_EQ(to_text(Dense(2, 3, relu, {.bias = false})), "Dense(2 => 3, relu; bias=false)  # 6 parameters");
  EXPECT_EQ(to_text(Dense(784, 2048, relu)), "Dense(784 => 2048, relu)  # 1_607_680 parameters");
  EXPECT_EQ(to_text(Dense(3, 3, flux::tanh)), "Dense(3 => 3, tanh)  # 12 parameters");
  EXPECT_EQ(to_text(Dense(3, 3, leakyrelu)), "Dense(3 => 3, leakyrelu)  # 12 parameters");
  EXPECT_EQ(layer_string(Dense(1, 1, gelu)), "Dense(1 => 1, gelu)");
}

TEST(Printing, ChainLikeFlux) {
  EXPECT_EQ(to_text(Chain(Dense(784, 2048, relu), Dense(2048, 10))),
            "Chain(\n"
            "  Dense(784 => 2048, relu),             # 1_607_680 parameters\n"
            "  Dense(2048 => 10),                    # 20_490 parameters\n"
            ")                   # Total: 4 arrays, 1_628_170 parameters, 6.211 MiB.");
  EXPECT_EQ(repr(Chain(Dense(10, 64, relu), Dense(64, 1))), "Chain(Dense(10 => 64, relu), Dense(64 => 1))  # 769 parameters");
  EXPECT_EQ(to_text(Chain(Dense(2, 3, relu), Chain(Dense(3, 3), softmax), Dense(3, 1, {.bias = false}))),
            "Chain(\n"
            "  Dense(2 => 3, relu),                  # 9 parameters\n"
            "  Chain(\n"
            "    Dense(3 => 3),                      # 12 parameters\n"
            "    softmax,\n"
            "  ),\n"
            "  Dense(3 => 1; bias=false),            # 3 parameters\n"
            ")                   # Total: 5 arrays, 24 parameters, 96 bytes.");
  // two arrays or fewer: no total line
  EXPECT_EQ(to_text(Chain(Dense(2, 2), relu)),
            "Chain(\n"
            "  Dense(2 => 2),                        # 6 parameters\n"
            "  relu,\n"
            ")");
}

TEST(Printing, Helpers) {
  EXPECT_EQ(show::underscorise(0), "0");
  EXPECT_EQ(show::underscorise(999), "999");
  EXPECT_EQ(show::underscorise(1000), "1_000");
  EXPECT_EQ(show::underscorise(1628170), "1_628_170");
  EXPECT_EQ(show::underscorise(-1234), "-1_234");
  EXPECT_EQ(show::format_bytes(1), "1 byte");
  EXPECT_EQ(show::format_bytes(96), "96 bytes");
  EXPECT_EQ(show::format_bytes(3076), "3.004 KiB");
  EXPECT_EQ(show::format_bytes(6512680), "6.211 MiB");
  EXPECT_EQ(show::format_bytes(size_t(3) << 30), "3.000 GiB");
}
