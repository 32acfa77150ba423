// The convolutional layers (Conv, ConvTranspose, pools, flatten), initialisers and containers
// (SkipConnection, Parallel): construction, Flux's exact printing, PyTorch's state names, forward
// values on every device against a float64 reference written here with plain loops, gradients on
// every device against the float64 CPU gradient, central finite differences in float64, and errors.
#include <cmath>
#include <functional>
#include <sstream>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;
using ::testing::HasSubstr;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

#define EXPECT_ERROR_EXACT(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ThrowsMessage<::flux::Error>(StrEq(text)))
#define EXPECT_ERROR_HAS(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {
template <class T> std::string to_text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// ---- float64 references (NCHW, cross-correlation as PyTorch's conv2d / conv_transpose2d) ----

struct Geometry {
  std::vector<int64_t> stride, pad, dilation;  // pad: (lo, hi) per spatial axis
  int64_t groups = 1;
};

// y (N, O, OH, OW) = sum over c in group, (ki, kj) of x[n, c, oh s - lo + ki d, ow s - lo + kj d] w[o, c', ki, kj].
std::vector<double> conv2d_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                               const Shape& ws, const std::vector<double>& b, const Geometry& g, Shape& ys) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3];
  const int64_t OH = (H + g.pad[0] + g.pad[1] - g.dilation[0] * (KH - 1) - 1) / g.stride[0] + 1;
  const int64_t OW = (W + g.pad[2] + g.pad[3] - g.dilation[1] * (KW - 1) - 1) / g.stride[1] + 1;
  const int64_t Og = O / g.groups;
  ys = Shape{N, O, OH, OW};
  std::vector<double> y(size_t(N * O * OH * OW), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b.empty() ? 0.0 : b[size_t(o)];
          const int64_t group = o / Og;
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                int64_t ih = oh * g.stride[0] - g.pad[0] + ki * g.dilation[0];
                int64_t iw = ow * g.stride[1] - g.pad[2] + kj * g.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t c = group * Cg + cg;
                s += x[size_t(((n * C + c) * H + ih) * W + iw)] * w[size_t(((o * Cg + cg) * KH + ki) * KW + kj)];
              }
          y[size_t(((n * O + o) * OH + oh) * OW + ow)] = s;
        }
  return y;
}

// y = conv_transpose2d(x, w): every x[n, c, i, j] w[c, o', ki, kj] lands on y[n, o, i s - lo + ki d, ...].
std::vector<double> conv_transpose2d_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                                         const Shape& ws, const std::vector<double>& b, const Geometry& g,
                                         const std::vector<int64_t>& outpad, Shape& ys) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], Og = ws[1], KH = ws[2], KW = ws[3];
  const int64_t O = Og * g.groups, Cg = C / g.groups;
  const int64_t OH = (H - 1) * g.stride[0] - g.pad[0] - g.pad[1] + g.dilation[0] * (KH - 1) + outpad[0] + 1;
  const int64_t OW = (W - 1) * g.stride[1] - g.pad[2] - g.pad[3] + g.dilation[1] * (KW - 1) + outpad[1] + 1;
  ys = Shape{N, O, OH, OW};
  std::vector<double> y(size_t(N * O * OH * OW), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t p = 0; p < OH * OW; ++p) y[size_t((n * O + o) * OH * OW + p)] = b.empty() ? 0.0 : b[size_t(o)];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < W; ++j)
          for (int64_t oo = 0; oo < Og; ++oo)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                int64_t oh = i * g.stride[0] - g.pad[0] + ki * g.dilation[0];
                int64_t ow = j * g.stride[1] - g.pad[2] + kj * g.dilation[1];
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                int64_t o = (c / Cg) * Og + oo;
                y[size_t(((n * O + o) * OH + oh) * OW + ow)] +=
                    x[size_t(((n * C + c) * H + i) * W + j)] * w[size_t(((c * Og + oo) * KH + ki) * KW + kj)];
              }
  return y;
}

std::vector<double> host(const Tensor& t) { return to(t, Device()).to_vector<double>(); }

// Central differences in float64 of loss(model) with respect to every element of `param` (a tensor
// of the model: writing into its storage changes the model).
template <class M, class F> std::vector<double> numeric_grad(const M& model, Tensor param, F loss, double h = 1e-6) {
  std::vector<double> values = param.to_vector<double>(), out(values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    std::vector<double> v = values;
    v[k] += h;
    copy_(param, Tensor(v, param.shape()));
    double up = loss(model).template item<double>();
    v[k] -= 2 * h;
    copy_(param, Tensor(v, param.shape()));
    double down = loss(model).template item<double>();
    out[k] = (up - down) / (2 * h);
  }
  copy_(param, Tensor(values, param.shape()));
  return out;
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-6) {
  std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size());
  for (size_t k = 0; k < g.size(); ++k) EXPECT_NEAR(g[k], want[k], tol * (1 + std::abs(want[k]))) << "element " << k;
}

// Mean and standard deviation of every value of t.
std::pair<double, double> moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  return {m, std::sqrt(s / double(v.size()))};
}

// WᵀW (transpose_first) or WWᵀ of a row-major (r, c) matrix, in float64.
std::vector<double> gram(const std::vector<double>& w, int64_t r, int64_t c, bool columns) {
  int64_t n = columns ? c : r;
  std::vector<double> g(size_t(n * n), 0.0);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) {
      double s = 0;
      if (columns)
        for (int64_t i = 0; i < r; ++i) s += w[size_t(i * c + a)] * w[size_t(i * c + b)];
      else
        for (int64_t j = 0; j < c; ++j) s += w[size_t(a * c + j)] * w[size_t(b * c + j)];
      g[size_t(a * n + b)] = s;
    }
  return g;
}

double max_identity_error(const std::vector<double>& g, int64_t n, double scale = 1.0) {
  double worst = 0;
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) worst = std::max(worst, std::abs(g[size_t(a * n + b)] - (a == b ? scale : 0.0)));
  return worst;
}

auto lenet() {
  return Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}), Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
               Dense(256, 120, relu), Dense(120, 84, relu), Dense(84, 10));
}

template <class M> auto to_f64(const M& m) {
  return fmap([](const Tensor& t) { return t.f64(); }, m);
}

class ConvLayers : public ::testing::TestWithParam<Device> {};
}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction, parameters, printing (no ops run)

TEST(ConvLayerConstruction, ShapesAndDefaults) {
  Conv c({5, 5}, 1, 6, relu);
  EXPECT_EQ(c.weight.shape(), (Shape{6, 1, 5, 5}));  // PyTorch's nn.Conv2d layout
  EXPECT_EQ(c.bias.shape(), (Shape{6}));
  EXPECT_EQ(c.bias.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(c.in_channels(), 1);
  EXPECT_EQ(c.out_channels(), 6);
  EXPECT_EQ(c.kernel_size(), (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(c.stride, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.pad, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(c.dilation, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(parameter_count(c), 156);
  // DESIGN.md's example compiles and resolves SamePad as Flux (k = 3: one pixel each side)
  Conv d({3, 3}, 16, 32, relu, {.stride = 2, .pad = SamePad(), .dilation = 1, .groups = 1, .bias = true});
  EXPECT_EQ(d.weight.shape(), (Shape{32, 16, 3, 3}));
  EXPECT_EQ(d.stride, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(d.pad, (std::vector<int64_t>{1, 1, 1, 1}));
  // Flux's SamePad with an even kernel puts the odd pixel on the low side; dilation widens it
  EXPECT_EQ(Conv({2, 2}, 3, 7, {.pad = SamePad()}).pad, (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_EQ(Conv({3, 4}, 1, 1, {.pad = SamePad(), .dilation = 2}).pad, (std::vector<int64_t>{2, 2, 3, 3}));
  EXPECT_EQ(Conv({3, 3}, 1, 1, {.pad = {1, 2}}).pad, (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(Conv({3, 3}, 1, 1, {.pad = {0, 1, 2, 3}}).pad, (std::vector<int64_t>{0, 1, 2, 3}));
  // groups, no bias, 1-D and 3-D kernels, other dtypes
  Conv g({3, 3}, 4, 8, {.groups = 2, .bias = false});
  EXPECT_EQ(g.weight.shape(), (Shape{8, 2, 3, 3}));
  EXPECT_FALSE(g.bias.defined());
  EXPECT_EQ(g.in_channels(), 4);
  EXPECT_EQ(Conv({3}, 2, 4).weight.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(Conv({3, 3, 3}, 2, 4).weight.shape(), (Shape{4, 2, 3, 3, 3}));
  Conv c64({3, 3}, 2, 2, {.dtype = DType::f64});
  EXPECT_EQ(c64.weight.dtype(), DType::f64);
  EXPECT_EQ(c64.bias.dtype(), DType::f64);
  // depthwise
  EXPECT_EQ(Conv({3, 3}, 8, 8, {.groups = 8}).weight.shape(), (Shape{8, 1, 3, 3}));
}

TEST(ConvLayerConstruction, FromArrays) {
  Tensor w = randn({6, 2, 3, 3}), b = randn({6});
  Conv c(w, b, relu, {.stride = 2, .pad = 1, .groups = 2});
  EXPECT_TRUE(c.weight.same_storage(w));
  EXPECT_EQ(c.in_channels(), 4);
  EXPECT_EQ(c.out_channels(), 6);
  EXPECT_EQ(c.pad, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(layer_string(c), "Conv((3, 3), 4 => 6, relu, pad=1, stride=2, groups=2)");
  Conv nb(w, Tensor());
  EXPECT_EQ(layer_string(nb), "Conv((3, 3), 2 => 6, bias=false)");
  ConvTranspose t(randn({4, 3, 2, 2}), randn({3}), identity, {.stride = 2});
  EXPECT_EQ(t.in_channels(), 4);
  EXPECT_EQ(t.out_channels(), 3);
  EXPECT_EQ(layer_string(t), "ConvTranspose((2, 2), 4 => 3, stride=2)");
}

TEST(ConvLayerConstruction, ConvTransposeShapes) {
  ConvTranspose t({4, 4}, 32, 16, relu, {.stride = 2, .pad = 1});
  EXPECT_EQ(t.weight.shape(), (Shape{32, 16, 4, 4}));  // PyTorch's nn.ConvTranspose2d layout (in, out / groups, k...)
  EXPECT_EQ(t.bias.shape(), (Shape{16}));
  EXPECT_EQ(t.in_channels(), 32);
  EXPECT_EQ(t.out_channels(), 16);
  EXPECT_EQ(parameter_count(t), 32 * 16 * 16 + 16);
  ConvTranspose g({3, 3}, 4, 6, {.groups = 2});
  EXPECT_EQ(g.weight.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(g.out_channels(), 6);
  // Flux's SamePad for ConvTranspose: a conv's SamePad with kernel k - stride + 1
  EXPECT_EQ(ConvTranspose({4, 4}, 1, 1, {.stride = 2, .pad = SamePad()}).pad, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(ConvTranspose({3, 3}, 1, 1, {.stride = 2, .output_padding = 1}).output_padding,
            (std::vector<int64_t>{1, 1}));
}

TEST(ConvLayerPrinting, ConvLikeFlux) {
  EXPECT_EQ(to_text(Conv({5, 5}, 1, 6, relu)), "Conv((5, 5), 1 => 6, relu)  # 156 parameters");
  EXPECT_EQ(to_text(Conv({3, 3}, 16, 32, relu, {.stride = 2, .pad = SamePad(), .dilation = 1, .groups = 1, .bias = true})),
            "Conv((3, 3), 16 => 32, relu, pad=1, stride=2)  # 4_640 parameters");
  // Flux's own doc examples (src/layers/conv.jl, SamePad)
  EXPECT_EQ(to_text(Conv({2, 2}, 3, 7, {.pad = SamePad()})), "Conv((2, 2), 3 => 7, pad=(1, 0, 1, 0))  # 91 parameters");
  EXPECT_EQ(to_text(Conv({2, 2}, 3, 7)), "Conv((2, 2), 3 => 7)  # 91 parameters");
  EXPECT_EQ(to_text(Conv({5, 5}, 3, 7, {.stride = 2, .pad = SamePad()})),
            "Conv((5, 5), 3 => 7, pad=2, stride=2)  # 532 parameters");
  EXPECT_EQ(to_text(Conv({3}, 2, 4)), "Conv((3,), 2 => 4)  # 28 parameters");
  EXPECT_EQ(to_text(Conv({3, 3}, 4, 8, {.groups = 2})), "Conv((3, 3), 4 => 8, groups=2)  # 152 parameters");
  EXPECT_EQ(to_text(Conv({3, 3}, 1, 2, {.bias = false})), "Conv((3, 3), 1 => 2, bias=false)  # 18 parameters");
  EXPECT_EQ(layer_string(Conv({3, 3}, 4, 8, {.dilation = 2})), "Conv((3, 3), 4 => 8, dilation=2)");
  EXPECT_EQ(layer_string(Conv({3, 3}, 1, 1, {.stride = {2, 1}})), "Conv((3, 3), 1 => 1, stride=(2, 1))");
  EXPECT_EQ(layer_string(Conv({3, 3}, 1, 1, flux::tanh, {.pad = {1, 0}})), "Conv((3, 3), 1 => 1, tanh, pad=(1, 1, 0, 0))");
  EXPECT_EQ(layer_string(Conv({3, 3, 3}, 2, 2, sigmoid)), "Conv((3, 3, 3), 2 => 2, sigmoid)");
  EXPECT_EQ(layer_string(Conv({3, 3}, 4, 8, leakyrelu, {.stride = 2, .pad = 1, .dilation = 2, .groups = 4, .bias = false})),
            "Conv((3, 3), 4 => 8, leakyrelu, pad=1, stride=2, dilation=2, groups=4, bias=false)");
  EXPECT_EQ(to_text(ConvTranspose({4, 4}, 32, 16, relu, {.stride = 2, .pad = 1})),
            "ConvTranspose((4, 4), 32 => 16, relu, pad=1, stride=2)  # 8_208 parameters");
  EXPECT_EQ(to_text(ConvTranspose({3, 3}, 2, 2, {.stride = 2, .output_padding = 1})),
            "ConvTranspose((3, 3), 2 => 2, stride=2, outpad=(1, 1))  # 38 parameters");
}

TEST(ConvLayerPrinting, PoolsAndFlattenLikeFlux) {
  EXPECT_EQ(to_text(MaxPool({2, 2})), "MaxPool((2, 2))");
  EXPECT_EQ(to_text(MaxPool({3, 3}, {.stride = 2, .pad = 1})), "MaxPool((3, 3), pad=1, stride=2)");
  EXPECT_EQ(to_text(MaxPool({5}, {.stride = {3}, .pad = 2})), "MaxPool((5,), pad=2, stride=3)");  // Flux's doc example
  EXPECT_EQ(to_text(MaxPool({5, 5}, {.pad = SamePad()})), "MaxPool((5, 5), pad=2)");
  EXPECT_EQ(to_text(MaxPool({2, 2}, {.pad = SamePad()})), "MaxPool((2, 2), pad=(1, 0, 1, 0))");
  EXPECT_EQ(to_text(MaxPool({2, 2}, {.stride = 2})), "MaxPool((2, 2))");  // stride == window is the default
  EXPECT_EQ(to_text(MaxPool({2, 2}, {.stride = 1})), "MaxPool((2, 2), stride=1)");
  EXPECT_EQ(to_text(MeanPool({2, 2})), "MeanPool((2, 2))");
  EXPECT_EQ(to_text(MeanPool({3, 2}, {.stride = {1, 2}, .pad = {1, 0}})), "MeanPool((3, 2), pad=(1, 1, 0, 0), stride=(1, 2))");
  EXPECT_EQ(to_text(GlobalMaxPool()), "GlobalMaxPool()");
  EXPECT_EQ(to_text(GlobalMeanPool()), "GlobalMeanPool()");
  EXPECT_EQ(to_text(AdaptiveMeanPool({1, 1})), "AdaptiveMeanPool((1, 1))");
  EXPECT_EQ(to_text(AdaptiveMaxPool({5})), "AdaptiveMaxPool((5,))");
  EXPECT_EQ(to_text(flatten), "flatten");
  EXPECT_EQ(MaxPool({3, 3}, {.stride = 2, .pad = 1}).pad, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(MeanPool({2, 2}).stride, (std::vector<int64_t>{2, 2}));
}

TEST(ConvLayerPrinting, ChainsLikeFlux) {
  EXPECT_EQ(to_text(lenet()),
            "Chain(\n"
            "  Conv((5, 5), 1 => 6, relu),           # 156 parameters\n"
            "  MaxPool((2, 2)),\n"
            "  Conv((5, 5), 6 => 16, relu),          # 2_416 parameters\n"
            "  MaxPool((2, 2)),\n"
            "  flatten,\n"
            "  Dense(256 => 120, relu),              # 30_840 parameters\n"
            "  Dense(120 => 84, relu),               # 10_164 parameters\n"
            "  Dense(84 => 10),                      # 850 parameters\n"
            ")                   # Total: 10 arrays, 44_426 parameters, 173.539 KiB.");
  EXPECT_EQ(parameter_count(lenet()), 44426);
  // Flux's MaxPool doc example
  EXPECT_EQ(to_text(Chain(Conv({5, 5}, 3, 7, {.pad = SamePad()}), MaxPool({5, 5}, {.pad = SamePad()}))),
            "Chain(\n"
            "  Conv((5, 5), 3 => 7, pad=2),          # 532 parameters\n"
            "  MaxPool((5, 5), pad=2),\n"
            ")");
  EXPECT_EQ(repr(Chain(Conv({3, 3}, 1, 2, relu), GlobalMeanPool(), flatten)),
            "Chain(Conv((3, 3), 1 => 2, relu), GlobalMeanPool(), flatten)  # 20 parameters");
}

TEST(ConvLayerPrinting, ContainersLikeFlux) {
  auto block = SkipConnection(Chain(Conv({3, 3}, 4, 4, relu, {.pad = 1}), Conv({3, 3}, 4, 4, {.pad = 1})), plus);
  EXPECT_EQ(to_text(block),
            "SkipConnection(\n"
            "  Chain(\n"
            "    Conv((3, 3), 4 => 4, relu, pad=1),  # 148 parameters\n"
            "    Conv((3, 3), 4 => 4, pad=1),        # 148 parameters\n"
            "  ),\n"
            "  +,\n"
            ")                   # Total: 4 arrays, 296 parameters, 1.156 KiB.");
  EXPECT_EQ(repr(block),
            "SkipConnection(Chain(Conv((3, 3), 4 => 4, relu, pad=1), Conv((3, 3), 4 => 4, pad=1)), +)  # 296 parameters");
  EXPECT_EQ(to_text(SkipConnection(Dense(2, 2), plus)),
            "SkipConnection(\n"
            "  Dense(2 => 2),                        # 6 parameters\n"
            "  +,\n"
            ")");
  // Flux's Parallel doc example, without the names
  EXPECT_EQ(to_text(Parallel(plus, Dense(10, 2, flux::tanh), Dense(5, 2))),
            "Parallel(\n"
            "  +,\n"
            "  Dense(10 => 2, tanh),                 # 22 parameters\n"
            "  Dense(5 => 2),                        # 12 parameters\n"
            ")                   # Total: 4 arrays, 34 parameters, 136 bytes.");
  EXPECT_EQ(layer_string(Parallel(vcat, Dense(2, 3), Dense(2, 4))), "Parallel(vcat, Dense(2 => 3), Dense(2 => 4))");
  // nested inside a Chain
  EXPECT_EQ(to_text(Chain(Dense(3, 3), SkipConnection(Chain(Dense(3, 4, relu), Dense(4, 3)), plus), relu)),
            "Chain(\n"
            "  Dense(3 => 3),                        # 12 parameters\n"
            "  SkipConnection(\n"
            "    Chain(\n"
            "      Dense(3 => 4, relu),              # 16 parameters\n"
            "      Dense(4 => 3),                    # 15 parameters\n"
            "    ),\n"
            "    +,\n"
            "  ),\n"
            "  relu,\n"
            ")                   # Total: 6 arrays, 43 parameters, 172 bytes.");
  // a container of functions only is one line, as Flux's
  EXPECT_EQ(to_text(SkipConnection(relu, plus)), "SkipConnection(relu, +)");
  EXPECT_EQ(to_text(Chain(Dense(2, 2), SkipConnection(relu, plus))),
            "Chain(\n"
            "  Dense(2 => 2),                        # 6 parameters\n"
            "  SkipConnection(relu, +),\n"
            ")");
}

TEST(ConvLayerState, NamesMatchTorchSequential) {
  auto model = lenet();
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (auto& [name, t] : pytorch_state(model)) names.push_back(name), shapes.push_back(t.shape());
  // torch.nn.Sequential(Conv2d(1, 6, 5), MaxPool2d(2), Conv2d(6, 16, 5), MaxPool2d(2), Flatten(),
  //                     Linear(256, 120), Linear(120, 84), Linear(84, 10)).state_dict()
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "5.weight", "5.bias",
                                             "6.weight", "6.bias", "7.weight", "7.bias"}));
  EXPECT_EQ(shapes[0], (Shape{6, 1, 5, 5}));
  EXPECT_EQ(shapes[2], (Shape{16, 6, 5, 5}));
  EXPECT_EQ(shapes[4], (Shape{120, 256}));
  // containers keep Flux's field names; the Chain's own "layers" is dropped as for nn.Sequential
  auto res = Chain(Conv({3, 3}, 1, 2), SkipConnection(Chain(Conv({3, 3}, 2, 2, {.pad = 1}), Conv({1, 1}, 2, 2)), plus),
                   Parallel(vcat, Dense(2, 3), Dense(2, 1, {.bias = false})));
  names.clear();
  for (auto& [name, t] : pytorch_state(res)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.layers.0.weight", "1.layers.0.bias",
                                             "1.layers.1.weight", "1.layers.1.bias", "2.layers.0.weight",
                                             "2.layers.0.bias", "2.layers.1.weight"}));
  EXPECT_EQ(state(res)[2].first, "layers.1.layers.layers.0.weight");
  EXPECT_EQ(params(res).size(), 9u);
}

// ---------------------------------------------------------------------------------------------
// Initialisers

TEST(Initialisers, FansAsFlux) {
  EXPECT_EQ(nfan(Shape{}), (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_EQ(nfan(Shape{5}), (std::pair<int64_t, int64_t>{1, 5}));
  EXPECT_EQ(nfan(Shape{3, 4}), (std::pair<int64_t, int64_t>{4, 3}));           // Dense (out, in)
  EXPECT_EQ(nfan(Shape{8, 2, 3, 3}), (std::pair<int64_t, int64_t>{18, 72}));   // Conv (out, in / groups, k...)
  EXPECT_EQ(nfan(Shape{4, 2, 3}), (std::pair<int64_t, int64_t>{6, 12}));
}

TEST(Initialisers, DistributionsWithinStatisticalBounds) {
  seed(11);
  const Shape shape{256, 64, 3, 3};  // fan_in 576, fan_out 2304, 147_456 values
  const double n = double(shape.numel()), fan_in = 576, fan_out = 2304;
  auto check_normal = [&](const Tensor& w, double std_want, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(w.shape(), shape);
    auto [m, s] = moments(w);
    EXPECT_LE(std::abs(m), 5 * std_want / std::sqrt(n));
    EXPECT_NEAR(s, std_want, 0.03 * std_want);
  };
  auto check_uniform = [&](const Tensor& w, double limit, const char* what) {
    SCOPED_TRACE(what);
    std::vector<double> v = w.to_vector<double>();
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, -limit);
    EXPECT_LE(hi, limit);
    EXPECT_LT(lo, -0.99 * limit);
    EXPECT_GT(hi, 0.99 * limit);
    auto [m, s] = moments(w);
    EXPECT_LE(std::abs(m), 5 * limit / std::sqrt(3 * n));
    EXPECT_NEAR(s, limit / std::sqrt(3.0), 0.03 * limit / std::sqrt(3.0));
  };
  check_normal(kaiming_normal(shape), std::sqrt(2 / fan_in), "kaiming_normal");
  check_normal(KaimingNormal{.gain = 1}(shape), std::sqrt(1 / fan_in), "kaiming_normal gain 1");
  check_normal(glorot_normal(shape), std::sqrt(2 / (fan_in + fan_out)), "glorot_normal");
  check_normal(GlorotNormal{.gain = 3}(shape), 3 * std::sqrt(2 / (fan_in + fan_out)), "glorot_normal gain 3");
  check_uniform(kaiming_uniform(shape), std::sqrt(6 / fan_in), "kaiming_uniform");
  check_uniform(glorot_uniform(shape), std::sqrt(6 / (fan_in + fan_out)), "glorot_uniform");
  check_uniform(GlorotUniform{.gain = 0.5}(shape), 0.5 * std::sqrt(6 / (fan_in + fan_out)), "glorot_uniform gain");
  check_normal(randn32(shape), 1.0, "randn32");
  std::vector<double> u = rand32(shape).to_vector<double>();
  EXPECT_GE(*std::min_element(u.begin(), u.end()), 0.0);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 1.0);
  EXPECT_EQ(zeros32(Shape{2, 3}).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(ones32(Shape{2, 3}).to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(kaiming_normal(Shape{3, 4}, DType::f64).dtype(), DType::f64);
  EXPECT_EQ(zeros32(Shape{2}).dtype(), DType::f32);
  // the former Dense signature
  EXPECT_EQ(glorot_uniform(4, 6).shape(), (Shape{4, 6}));
  EXPECT_EQ(glorot_uniform(4, 6, DType::f16).dtype(), DType::f16);
}

TEST(Initialisers, OrthogonalIsOrthogonal) {
  seed(12);
  struct Case {
    Shape shape;
    int64_t rows, cols;
    double gain;
  };
  for (const Case& c : {Case{{64, 32}, 64, 32, 1}, Case{{32, 64}, 32, 64, 1}, Case{{40, 40}, 40, 40, 1},
                        Case{{16, 4, 3, 3}, 16, 36, 1}, Case{{48, 4, 3}, 48, 12, 2}}) {
    SCOPED_TRACE(to_string(c.shape));
    Tensor w = c.gain == 1 ? orthogonal(c.shape) : Orthogonal{.gain = c.gain}(c.shape);
    EXPECT_EQ(w.shape(), c.shape);
    EXPECT_EQ(w.dtype(), DType::f32);
    bool columns = c.rows >= c.cols;
    std::vector<double> g = gram(w.to_vector<double>(), c.rows, c.cols, columns);
    EXPECT_LE(max_identity_error(g, columns ? c.cols : c.rows, c.gain * c.gain), 1e-5 * c.gain * c.gain);
  }
  Tensor w64 = orthogonal(Shape{30, 20}, DType::f64);
  EXPECT_LE(max_identity_error(gram(w64.to_vector<double>(), 30, 20, true), 20), 1e-12);
}

TEST(Initialisers, SeededReproducibility) {
  for (const Initialiser& init : std::vector<Initialiser>{glorot_uniform, glorot_normal, kaiming_uniform, kaiming_normal,
                                                          orthogonal, rand32, randn32}) {
    seed(99);
    Tensor a = init(Shape{8, 3, 3, 3}, DType::f32);
    seed(99);
    Tensor b = init(Shape{8, 3, 3, 3}, DType::f32);
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
    EXPECT_NE(a.to_vector<float>(), init(Shape{8, 3, 3, 3}, DType::f32).to_vector<float>());
  }
  seed(5);
  Conv a({3, 3}, 2, 4);
  seed(5);
  Conv b({3, 3}, 2, 4);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
}

TEST(Initialisers, ChosenWithInit) {
  seed(13);
  // Conv's default: glorot_uniform with Flux's fans (fan_in = in / groups * k², fan_out = out * k²)
  Conv c({3, 3}, 64, 128, {.groups = 2});
  double limit = std::sqrt(6.0 / (32 * 9 + 128 * 9));
  std::vector<double> v = c.weight.to_vector<double>();
  EXPECT_LE(*std::max_element(v.begin(), v.end()), limit);
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.99 * limit);
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -limit);
  // .init = kaiming_normal in ConvOptions, ConvTransposeOptions and DenseOptions
  Conv k({3, 3}, 64, 128, relu, {.init = kaiming_normal});
  EXPECT_NEAR(moments(k.weight).second, std::sqrt(2.0 / 576), 0.03 * std::sqrt(2.0 / 576));
  ConvTranspose t({4, 4}, 32, 64, {.init = kaiming_normal});  // weight (32, 64, 4, 4): fan_in = 64 * 16
  EXPECT_NEAR(moments(t.weight).second, std::sqrt(2.0 / 1024), 0.03 * std::sqrt(2.0 / 1024));
  Dense d(30, 50, relu, {.init = orthogonal});
  EXPECT_LE(max_identity_error(gram(d.weight.to_vector<double>(), 50, 30, true), 30), 1e-5);
  Dense d64(3, 2, {.bias = false, .dtype = DType::f64, .init = ones32});
  EXPECT_EQ(d64.weight.dtype(), DType::f64);
  EXPECT_EQ(d64.weight.to_vector<double>(), std::vector<double>(6, 1.0));
  // any callable; a result in another dtype is converted
  Conv z({2, 2}, 1, 1, {.init = [](const Shape& s, DType) { return full(s, 0.5); }, .dtype = DType::f64});
  EXPECT_EQ(z.weight.dtype(), DType::f64);
  EXPECT_EQ(z.weight.to_vector<double>(), std::vector<double>(4, 0.5));
  EXPECT_ERROR_EXACT(Conv({3, 3}, 2, 4, {.init = [](const Shape&, DType) { return zeros({4, 2, 3}); }}),
                     "[Conv] init returned 4×2×3 Tensor{Float32, CPU}; expected shape (4, 2, 3, 3)");
  EXPECT_ERROR_EXACT(Dense(2, 3, {.init = nullptr}), "[Dense] .init is empty; pass an initialiser such as glorot_uniform");
  EXPECT_ERROR_EXACT(orthogonal(Shape{5}), "[orthogonal] needs at least 2 dimensions (a matrix); got shape (5,)");
  EXPECT_ERROR_EXACT(kaiming_normal(Shape{3, 0}), "[kaiming_normal] dimensions must be positive; got (3, 0)");
  EXPECT_ERROR_EXACT(glorot_uniform(0, 3), "[glorot_uniform] dimensions must be positive; got (0, 3)");
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(ConvLayerErrors, ClearMessages) {
  Conv c({5, 5}, 1, 6, relu);
  EXPECT_ERROR_EXACT(c(zeros({2, 3, 28, 28})),
                     "[Conv] input has 3 channels, layer expects 1 (Conv((5, 5), 1 => 6, relu), weight (6, 1, 5, 5)); "
                     "got input of shape (2, 3, 28, 28)");
  EXPECT_ERROR_EXACT(c(zeros({3, 28, 28})),
                     "[Conv] Conv((5, 5), 1 => 6, relu) expects a 4-dimensional (N, C, H, W) input; got shape (3, 28, 28)");
  EXPECT_ERROR_EXACT(Conv({3}, 2, 2)(zeros({2, 2, 4, 4})),
                     "[Conv] Conv((3,), 2 => 2) expects a 3-dimensional (N, C, L) input; got shape (2, 2, 4, 4)");
  EXPECT_ERROR_EXACT(Conv()(zeros({1, 1, 3, 3})), "[Conv] the layer is empty (default-constructed)");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 6, 8, {.groups = 4}),
                     "[Conv] input channels (6) must be divisible by groups (4); got 6 => 8 with groups=4");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 4, 6, {.groups = 4}),
                     "[Conv] output channels (6) must be divisible by groups (4); got 4 => 6 with groups=4");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 4, 4, {.groups = 0}), "[Conv] groups must be >= 1; got 0");
  EXPECT_ERROR_EXACT(Conv({0, 3}, 1, 1), "[Conv] kernel sizes must be positive; got (0, 3)");
  EXPECT_ERROR_EXACT(Conv({3, 3, 3, 3}, 1, 1), "[Conv] kernel sizes need 1 to 3 values (one per spatial axis); got (3, 3, 3, 3)");
  EXPECT_ERROR_EXACT(Conv(std::vector<int64_t>{}, 1, 1), "[Conv] kernel sizes need 1 to 3 values (one per spatial axis); got ()");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 0, 4), "[Conv] channel counts must be positive; got Conv((3, 3), 0 => 4)");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 1, 1, {.stride = {1, 2, 3}}), "[Conv] stride needs 1 or 2 values for 2 spatial axes; got 3");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 1, 1, {.stride = 0}), "[Conv] stride must be >= 1; got (0, 0)");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 1, 1, {.pad = {1, 2, 3}}),
                     "[Conv] padding needs 1, 2 or 4 values for 2 spatial axes (every side, per axis, or (lo, hi) per "
                     "axis); got (1, 2, 3)");
  EXPECT_ERROR_EXACT(Conv({3, 3}, 1, 1, {.pad = -1}), "[Conv] padding must be non-negative; got (-1,)");
  EXPECT_ERROR_EXACT(Conv(randn({4, 2, 3, 3}), randn({3})),
                     "[Conv] bias must have shape (4,) to match weight (4, 2, 3, 3); got (3,)");
  EXPECT_ERROR_EXACT(Conv(randn({4, 2}), Tensor()),
                     "[Conv] weight must be a (out, in / groups, k...) tensor with 1 to 3 spatial axes; got 4×2 "
                     "Tensor{Float32, CPU}");
  EXPECT_ERROR_EXACT(Conv(randn({6, 2, 3, 3}), Tensor(), identity, {.groups = 4}),
                     "[Conv] output channels (6) must be divisible by groups (4); got 8 => 6 with groups=4");
  ConvTranspose t({4, 4}, 32, 16, relu, {.stride = 2, .pad = 1});
  EXPECT_ERROR_EXACT(t(zeros({1, 16, 4, 4})),
                     "[ConvTranspose] input has 16 channels, layer expects 32 (ConvTranspose((4, 4), 32 => 16, relu, "
                     "pad=1, stride=2), weight (32, 16, 4, 4)); got input of shape (1, 16, 4, 4)");
  EXPECT_ERROR_EXACT(MaxPool({2, 2}, {.pad = 2}),
                     "[MaxPool] padding (2, 2, 2, 2) (lo, hi per axis) must be smaller than the window (2, 2) on every side");
  EXPECT_ERROR_EXACT(MaxPool({2, 2})(zeros({4, 4})),
                     "[MaxPool] MaxPool((2, 2)) expects a 4-dimensional (N, C, H, W) input; got shape (4, 4)");
  EXPECT_ERROR_EXACT(MeanPool({2, 2, 2, 2}), "[MeanPool] window sizes need 1 to 3 values (one per spatial axis); got (2, 2, 2, 2)");
  EXPECT_ERROR_EXACT(AdaptiveMeanPool({0, 1}), "[AdaptiveMeanPool] output sizes must be positive; got (0, 1)");
}

TEST(ConvLayerErrors, ShapesTheOpsRefuse) {
  // kernel larger than the padded input: the conv op names the sizes
  EXPECT_ERROR_HAS(Conv({5, 5}, 1, 1)(zeros({1, 1, 4, 4})), "is larger than the padded input (4, 4)");
  EXPECT_ERROR_HAS(MaxPool({3, 3})(zeros({1, 1, 2, 2})), "[maxpool]");
  // dtype mismatch between input and weight (Float64 input is converted with Flux's warning instead:
  // tests/test_error_hints.cpp)
  EXPECT_ERROR_HAS(Conv({3, 3}, 1, 1)(zeros({1, 1, 4, 4}, DType::i32)), "[conv] supports Float32, Float64, Float16 and BFloat16 inputs; got Int32");
  EXPECT_EQ(Conv({3, 3}, 1, 1)(zeros({1, 1, 4, 4}, DType::f64)).dtype(), DType::f32);
}

// ---------------------------------------------------------------------------------------------
// Forward values on every device

TEST_P(ConvLayers, ConvForwardMatchesFloat64Reference) {
  Device d = GetParam();
  seed(21);
  struct Case {
    const char* name;
    Conv layer;
    Shape x;
  };
  std::vector<Case> cases = {
      {"plain", Conv({3, 3}, 2, 3), {2, 2, 7, 6}},
      {"stride 2 SamePad", Conv({3, 3}, 2, 4, {.stride = 2, .pad = SamePad()}), {2, 2, 9, 8}},
      {"even kernel SamePad", Conv({2, 2}, 3, 2, {.pad = SamePad()}), {1, 3, 5, 5}},
      {"dilation 2, asymmetric pad", Conv({3, 2}, 2, 2, {.pad = {2, 1, 0, 1}, .dilation = {2, 1}}), {2, 2, 8, 6}},
      {"groups 2, stride (2, 1)", Conv({3, 3}, 4, 6, {.stride = {2, 1}, .pad = 1, .groups = 2}), {2, 4, 6, 5}},
      {"depthwise, no bias", Conv({3, 3}, 3, 3, {.pad = 1, .groups = 3, .bias = false}), {1, 3, 5, 5}},
  };
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.layer.bias.defined()) c.layer.bias = randn({c.layer.out_channels()});
    Tensor x = randn(c.x);
    Conv dl = c.layer | d;
    Tensor y = dl(to(x, d));
    Shape ys;
    auto want = conv2d_ref(x.to_vector<double>(), c.x, host(c.layer.weight), c.layer.weight.shape(),
                           c.layer.bias.defined() ? host(c.layer.bias) : std::vector<double>{},
                           {c.layer.stride, c.layer.pad, c.layer.dilation, c.layer.groups}, ys);
    EXPECT_EQ(y.shape(), ys);
    EXPECT_EQ(y.device(), d);
    EXPECT_LE(max_rel_error(y, want), 1e-5);
  }
  // 1-D: the 2-D reference with a (1, k) kernel; 3-D: shapes
  Conv c1({3}, 2, 4, {.stride = 2, .pad = 1, .dilation = 1});
  c1.bias = randn({4});
  Tensor x1 = randn({2, 2, 9});
  Tensor y1 = (c1 | d)(to(x1, d));
  Shape ys1;
  auto want1 = conv2d_ref(x1.to_vector<double>(), Shape{2, 2, 1, 9}, host(c1.weight), Shape{4, 2, 1, 3}, host(c1.bias),
                          {{1, 2}, {0, 0, 1, 1}, {1, 1}, 1}, ys1);
  EXPECT_EQ(y1.shape(), (Shape{2, 4, 5}));
  EXPECT_LE(max_rel_error(y1, want1), 1e-5);
  EXPECT_EQ((Conv({3, 3, 3}, 2, 3, {.pad = SamePad()}) | d)(to(zeros({1, 2, 4, 5, 6}), d)).shape(), (Shape{1, 3, 4, 5, 6}));
  // stride 2 with SamePad keeps ceil(in / stride)
  Tensor y = (Conv({5, 5}, 3, 7, {.stride = 2, .pad = SamePad()}) | d)(to(zeros({1, 3, 11, 10}), d));
  EXPECT_EQ(y.shape(), (Shape{1, 7, 6, 5}));
  // the activation runs after the bias
  Conv r({3, 3}, 1, 2, relu);
  r.bias = randn({2});
  Tensor x = randn({2, 1, 4, 4});
  Shape ys;
  auto want = conv2d_ref(x.to_vector<double>(), x.shape(), host(r.weight), r.weight.shape(), host(r.bias), {{1, 1}, {0, 0, 0, 0}, {1, 1}, 1}, ys);
  for (double& v : want) v = std::max(v, 0.0);
  EXPECT_LE(max_rel_error((r | d)(to(x, d)), want), 1e-5);
}

TEST_P(ConvLayers, ConvTransposeForwardMatchesFloat64Reference) {
  Device d = GetParam();
  seed(22);
  struct Case {
    const char* name;
    ConvTranspose layer;
    Shape x;
  };
  std::vector<Case> cases = {
      {"stride 2 pad 1", ConvTranspose({4, 4}, 3, 2, {.stride = 2, .pad = 1}), {2, 3, 4, 5}},
      {"output padding", ConvTranspose({3, 3}, 2, 2, {.stride = 2, .output_padding = 1}), {1, 2, 3, 3}},
      {"groups, dilation", ConvTranspose({3, 2}, 4, 6, {.dilation = {1, 2}, .groups = 2}), {2, 4, 3, 4}},
      {"SamePad, no bias", ConvTranspose({4, 4}, 2, 3, {.stride = 2, .pad = SamePad(), .bias = false}), {1, 2, 3, 3}},
  };
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.layer.bias.defined()) c.layer.bias = randn({c.layer.out_channels()});
    Tensor x = randn(c.x);
    Tensor y = (c.layer | d)(to(x, d));
    Shape ys;
    auto want = conv_transpose2d_ref(x.to_vector<double>(), c.x, host(c.layer.weight),
                                     c.layer.weight.shape(), c.layer.bias.defined() ? host(c.layer.bias) : std::vector<double>{},
                                     {c.layer.stride, c.layer.pad, c.layer.dilation, c.layer.groups},
                                     c.layer.output_padding, ys);
    EXPECT_EQ(y.shape(), ys);
    EXPECT_LE(max_rel_error(y, want), 1e-5);
  }
  // Flux's SamePad for ConvTranspose doubles the size with stride 2
  EXPECT_EQ((ConvTranspose({4, 4}, 1, 1, {.stride = 2, .pad = SamePad()}) | d)(to(zeros({1, 1, 5, 6}), d)).shape(),
            (Shape{1, 1, 10, 12}));
}

TEST_P(ConvLayers, PoolLayersMatchFloat64Reference) {
  Device d = GetParam();
  seed(23);
  Tensor x = randn({2, 3, 6, 5});
  std::vector<double> xv = x.to_vector<double>();
  auto at = [&](int64_t n, int64_t c, int64_t i, int64_t j) { return xv[size_t(((n * 3 + c) * 6 + i) * 5 + j)]; };
  Tensor xd = to(x, d);
  // MaxPool((2, 2)) on 6 x 5: 3 x 2 windows (the last column dropped)
  std::vector<double> mx, mn, gmax, gmean;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 2; ++j) {
          double m = -1e300, s = 0;
          for (int64_t a = 0; a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b) m = std::max(m, at(n, c, 2 * i + a, 2 * j + b)), s += at(n, c, 2 * i + a, 2 * j + b);
          mx.push_back(m);
          mn.push_back(s / 4);
        }
      double m = -1e300, s = 0;
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t j = 0; j < 5; ++j) m = std::max(m, at(n, c, i, j)), s += at(n, c, i, j);
      gmax.push_back(m);
      gmean.push_back(s / 30);
    }
  Tensor y = MaxPool({2, 2})(xd);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3, 2}));
  EXPECT_LE(max_rel_error(y, mx), 1e-6);
  EXPECT_LE(max_rel_error(MeanPool({2, 2})(xd), mn), 1e-6);
  EXPECT_EQ(GlobalMaxPool()(xd).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_LE(max_rel_error(GlobalMaxPool()(xd), gmax), 1e-6);
  EXPECT_LE(max_rel_error(GlobalMeanPool()(xd), gmean), 1e-6);
  EXPECT_LE(max_rel_error(AdaptiveMeanPool({1, 1})(xd), gmean), 1e-6);
  EXPECT_LE(max_rel_error(AdaptiveMaxPool({1, 1})(xd), gmax), 1e-6);
  // MaxPool((3, 3), stride 2, pad 1): padding never wins
  Tensor p = MaxPool({3, 3}, {.stride = 2, .pad = 1})(xd);
  EXPECT_EQ(p.shape(), (Shape{2, 3, 3, 3}));
  std::vector<double> want;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          double m = -1e300;
          for (int64_t a = 0; a < 3; ++a)
            for (int64_t b = 0; b < 3; ++b) {
              int64_t r = 2 * i - 1 + a, q = 2 * j - 1 + b;
              if (r >= 0 && r < 6 && q >= 0 && q < 5) m = std::max(m, at(n, c, r, q));
            }
          want.push_back(m);
        }
  EXPECT_LE(max_rel_error(p, want), 1e-6);
  // flatten keeps observations on the first axis
  Tensor f = flatten(xd);
  EXPECT_EQ(f.shape(), (Shape{2, 90}));
  EXPECT_EQ(f.to_vector<double>(), xv);
}

TEST_P(ConvLayers, LeNetShapesAndValuesOnDevice) {
  Device d = GetParam();
  seed(24);
  auto model = lenet();
  auto dev_model = model | d;
  for (const Tensor& t : params(dev_model)) EXPECT_EQ(t.device(), d);
  Tensor x = rand({3, 1, 28, 28});
  Tensor y = dev_model(to(x, d));
  EXPECT_EQ(y.shape(), (Shape{3, 10}));
  EXPECT_EQ(y.device(), d);
  // against the float64 CPU model
  Tensor want = to_f64(model)(x.f64());
  EXPECT_LE(max_rel_error(y, want.to_vector<double>()), 1e-5);
  // intermediate shapes: (3, 6, 24, 24), (3, 6, 12, 12), (3, 16, 8, 8), (3, 16, 4, 4), (3, 256)
  Tensor h = dev_model.get<0>()(to(x, d));
  EXPECT_EQ(h.shape(), (Shape{3, 6, 24, 24}));
  h = dev_model.get<3>()(dev_model.get<2>()(dev_model.get<1>()(h)));
  EXPECT_EQ(h.shape(), (Shape{3, 16, 4, 4}));
  EXPECT_EQ(flatten(h).shape(), (Shape{3, 256}));
  // back to the CPU
  auto back = dev_model | cpu;
  EXPECT_EQ(back.get<0>().weight.device(), Device());
  EXPECT_EQ(back.get<0>().weight.to_vector<float>(), model.get<0>().weight.to_vector<float>());
}

TEST_P(ConvLayers, ContainersForward) {
  Device d = GetParam();
  seed(25);
  auto inner = Chain(Conv({3, 3}, 4, 4, relu, {.pad = 1}), Conv({3, 3}, 4, 4, {.pad = 1}));
  auto block = SkipConnection(inner, plus) | d;
  Tensor x = to(randn({2, 4, 5, 5}), d);
  Tensor y = block(x);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_LE(max_rel_error(y, host(block.layers(x) + x)), 1e-6);
  // a custom connection: channel concatenation, as Flux's doc example
  auto cat = SkipConnection(Conv({3, 3}, 4, 7, {.pad = 1}) | d,
                            [](const Tensor& mx, const Tensor& xx) { return concat({mx, xx}, 1); });
  EXPECT_EQ(cat(x).shape(), (Shape{2, 11, 5, 5}));
  // Parallel: vcat along the feature axis (axis 1), plus, one input per layer, one layer for many inputs
  auto par = Parallel(vcat, Dense(5, 4), Chain(Dense(5, 7), Dense(7, 4))) | d;
  Tensor v = to(randn({3, 5}), d);
  Tensor pv = par(v);
  EXPECT_EQ(pv.shape(), (Shape{3, 8}));
  EXPECT_LE(max_rel_error(pv, host(concat({par.get<0>()(v), par.get<1>()(v)}, 1))), 1e-6);
  EXPECT_EQ(par(to(randn({5}), d)).shape(), (Shape{8}));  // one observation: features on axis 0
  auto sum2 = Parallel(plus, Dense(10, 2, flux::tanh), Dense(5, 2)) | d;
  Tensor a = to(randn({4, 10}), d), b = to(randn({4, 5}), d);
  EXPECT_LE(max_rel_error(sum2(a, b), host(sum2.get<0>()(a) + sum2.get<1>()(b))), 1e-6);
  auto one = Parallel(plus, Dense(3, 2)) | d;
  Tensor c1 = to(randn({2, 3}), d), c2 = to(randn({2, 3}), d), c3 = to(randn({2, 3}), d);
  EXPECT_LE(max_rel_error(one(c1, c2, c3), host(one.get<0>()(c1) + one.get<0>()(c2) + one.get<0>()(c3))), 1e-6);
  auto branches = Parallel(vcat, Conv({1, 1}, 4, 2), Conv({3, 3}, 4, 3, {.pad = 1}), MaxPool({3, 3}, {.stride = 1, .pad = 1})) | d;
  EXPECT_EQ(branches(x).shape(), (Shape{2, 9, 5, 5}));  // an Inception-style block
}

// ---------------------------------------------------------------------------------------------
// Gradients

TEST(ConvLayerGradients, ConvMatchesFiniteDifferences) {
  seed(31);
  Conv c({3, 2}, 4, 4, flux::tanh, {.stride = {2, 1}, .pad = {1, 0, 0, 1}, .dilation = {1, 2}, .groups = 2, .dtype = DType::f64});
  c.bias = randn({4}, DType::f64) * 0.1;
  Tensor x = randn({2, 4, 5, 6}, DType::f64);
  Tensor r = randn(c(x).shape(), DType::f64);
  ASSERT_EQ(r.shape(), (Shape{2, 4, 2, 5}));
  auto loss = [&](const Conv& m) { return sum(m(x) * r); };
  auto [value, g] = withgradient(loss, c);
  static_assert(std::is_same_v<decltype(g), Conv>);
  EXPECT_EQ(layer_string(g), layer_string(c));
  expect_close(g.weight, numeric_grad(c, c.weight, loss));
  expect_close(g.bias, numeric_grad(c, c.bias, loss));
  // with respect to the input too
  auto gx = std::get<1>(gradient([&](const Conv& m, const Tensor& xx) { return sum(m(xx) * r); }, c, x));
  expect_close(gx, numeric_grad(x, x, [&](const Tensor& xx) { return sum(c(xx) * r); }));
}

TEST(ConvLayerGradients, ConvTransposeMatchesFiniteDifferences) {
  seed(32);
  ConvTranspose t({3, 3}, 4, 2, flux::tanh, {.stride = 2, .pad = 1, .groups = 2, .output_padding = 1, .dtype = DType::f64});
  t.bias = randn({2}, DType::f64) * 0.1;
  Tensor x = randn({2, 4, 3, 3}, DType::f64);
  Tensor r = randn({2, 2, 6, 6}, DType::f64);
  ASSERT_EQ(t(x).shape(), r.shape());
  auto loss = [&](const ConvTranspose& m) { return sum(m(x) * r); };
  ConvTranspose g = gradient(loss, t);
  expect_close(g.weight, numeric_grad(t, t.weight, loss));
  expect_close(g.bias, numeric_grad(t, t.bias, loss));
  auto gx = std::get<1>(gradient([&](const ConvTranspose& m, const Tensor& xx) { return sum(m(xx) * r); }, t, x));
  expect_close(gx, numeric_grad(x, x, [&](const Tensor& xx) { return sum(t(xx) * r); }));
}

TEST(ConvLayerGradients, SkipConnectionBlockMatchesFiniteDifferences) {
  seed(33);
  auto block = SkipConnection(Chain(Conv({3, 3}, 3, 3, flux::tanh, {.pad = 1, .dtype = DType::f64}),
                                    Conv({3, 3}, 3, 3, {.pad = SamePad(), .dtype = DType::f64})),
                              plus);
  block.layers.get<0>().bias = randn({3}, DType::f64) * 0.1;
  Tensor x = randn({2, 3, 4, 4}, DType::f64), r = randn({2, 3, 4, 4}, DType::f64);
  auto loss = [&](const auto& m) { return sum(flux::tanh(m(x)) * r); };
  auto g = gradient(loss, block);
  static_assert(std::is_same_v<decltype(g), decltype(block)>);
  expect_close(g.layers.get<0>().weight, numeric_grad(block, block.layers.get<0>().weight, loss));
  expect_close(g.layers.get<0>().bias, numeric_grad(block, block.layers.get<0>().bias, loss));
  expect_close(g.layers.get<1>().weight, numeric_grad(block, block.layers.get<1>().weight, loss));
  expect_close(g.layers.get<1>().bias, numeric_grad(block, block.layers.get<1>().bias, loss));
  // the skip path carries the input's gradient too
  auto gx = std::get<1>(gradient([&](const auto& m, const Tensor& xx) { return sum(flux::tanh(m(xx)) * r); }, block, x));
  expect_close(gx, numeric_grad(x, x, [&](const Tensor& xx) { return sum(flux::tanh(block(xx)) * r); }));
  // Parallel's gradient reaches every branch
  auto par = Parallel(vcat, Dense(3, 2, {.dtype = DType::f64}), Dense(3, 4, flux::tanh, {.dtype = DType::f64}));
  Tensor v = randn({5, 3}, DType::f64), rv = randn({5, 6}, DType::f64);
  auto ploss = [&](const auto& m) { return sum(m(v) * rv); };
  auto pg = gradient(ploss, par);
  expect_close(pg.get<0>().weight, numeric_grad(par, par.get<0>().weight, ploss));
  expect_close(pg.get<1>().weight, numeric_grad(par, par.get<1>().weight, ploss));
}

TEST_P(ConvLayers, SmallConvNetGradientMatchesFloat64Cpu) {
  Device d = GetParam();
  seed(34);
  auto model = Chain(Conv({3, 3}, 2, 4, relu, {.pad = 1}), SkipConnection(Conv({3, 3}, 4, 4, flux::tanh, {.pad = 1}), plus),
                     MaxPool({2, 2}), ConvTranspose({2, 2}, 4, 3, {.stride = 2}), MeanPool({2, 2}), flatten,
                     Dense(27, 3));
  auto model64 = to_f64(model);
  for (Tensor& t : std::vector<Tensor>{model64.get<0>().bias, model64.get<3>().bias}) copy_(t, randn(t.shape(), DType::f64) * 0.1);
  Tensor x = randn({4, 2, 6, 6}, DType::f64);
  Tensor y = onehot(Tensor(std::vector<int64_t>{0, 1, 2, 1}, Shape{4}), 3, DType::f64);
  auto loss = [](const Tensor& xx, const Tensor& yy) {
    return [&xx, &yy](const auto& m) { return logitcrossentropy(m(xx), yy); };
  };
  auto want = gradient(loss(x, y), model64);
  auto model32 = fmap([&](const Tensor& t) { return to(t.f32(), d); }, model64);
  Tensor x32 = to(x.f32(), d), y32 = to(y.f32(), d);
  auto [value, got] = withgradient(loss(x32, y32), model32);
  EXPECT_EQ(value.device(), d);
  EXPECT_LE(max_rel_error(value, {logitcrossentropy(model64(x), y).item<double>()}), 1e-5);
  auto gp = params(got), wp = params(want);
  ASSERT_EQ(gp.size(), 8u);  // two Convs, the skip Conv, the ConvTranspose, the Dense: weight and bias each
  ASSERT_EQ(gp.size(), wp.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    EXPECT_EQ(gp[i].device(), d);
    EXPECT_EQ(gp[i].shape(), wp[i].shape());
    EXPECT_LE(max_rel_error(gp[i], wp[i].to_vector<double>()), 1e-4) << "array " << i;
  }
}

TEST_P(ConvLayers, LeNetTrainsOnDevice) {
  Device d = GetParam();
  seed(35);
  auto model = Chain(Conv({3, 3}, 1, 4, relu, {.pad = 1}), MaxPool({2, 2}), Conv({3, 3}, 4, 8, relu), GlobalMeanPool(),
                     flatten, Dense(8, 2)) |
               d;
  // two classes: a bright top half or a bright bottom half
  Tensor x = rand({32, 1, 8, 8}) * 0.5;
  std::vector<int64_t> labels;
  std::vector<double> xv = x.to_vector<double>();
  for (int64_t n = 0; n < 32; ++n) {
    labels.push_back(n % 2);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 8; ++j) xv[size_t(n * 64 + (n % 2 ? 4 + i : i) * 8 + j)] += 1.0;
  }
  Tensor xd = to(Tensor(xv, x.shape()).f32(), d), yd = to(onehot(Tensor(labels, Shape{32}), 2), d);
  auto opt = optimisers::setup(optimisers::Adam(1e-2), model);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto [loss, grads] = withgradient([&](const auto& m) { return logitcrossentropy(m(xd), yd); }, model);
    optimisers::update(opt, model, grads);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, 0.2 * first);
  EXPECT_EQ(model.get<0>().weight.device(), d);
}

FLUX_DEVICE_SUITE(ConvLayers);
