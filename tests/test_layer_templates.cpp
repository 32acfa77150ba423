// Issue 32: FLUX_LAYER on class templates (`template <class A> struct Block`, `template <int N>`),
// Flux's nested display of user layers (a tree with per-layer counts and a total, as Flux 0.15's
// @layer), readable names of functions used as layers, and activations with parameters.
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

namespace templated {

/// A generic pre-norm residual block, as a transformer block is written in C++.
template <class Mix> struct Block {
  LayerNorm norm;
  Mix mix;
  Tensor operator()(const Tensor& x) const { return x + mix(norm(x)); }
};
FLUX_LAYER(Block, norm, mix)

/// A value-parameterised layer: N stacked Denses.
template <int N> struct Stack {
  std::array<Dense, N> layers;
  Tensor operator()(const Tensor& x) const {
    Tensor y = x;
    for (const Dense& d : layers) y = d(y);
    return y;
  }
};
FLUX_LAYER(Stack, layers)

/// Tensors and values only: prints on one line.
template <class T> struct Scale {
  Tensor weight;
  T factor;
  Tensor operator()(const Tensor& x) const { return x * weight * double(factor); }
};
FLUX_LAYER(Scale, weight, factor)

Tensor halve(const Tensor& x) { return x * 0.5; }

}  // namespace templated

namespace {
template <class M> std::string to_text(const M& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}
class LayerTemplateDevices : public ::testing::TestWithParam<Device> {};
}  // namespace

TEST(LayerTemplates, FluxLayerWalksClassTemplates) {
  seed(2);
  templated::Block<Dense> block{LayerNorm(4), Dense(4, 4)};
  auto names = state(block);
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0].first, "norm.weight");
  EXPECT_EQ(names[2].first, "mix.weight");
  EXPECT_EQ(parameter_count(block), 8 + 20);
  templated::Stack<3> stack{{Dense(4, 4), Dense(4, 4), Dense(4, 2)}};
  EXPECT_EQ(state(stack)[4].first, "layers.2.weight");
  EXPECT_EQ(parameter_count(stack), 20 + 20 + 10);
  // Nested specialisations, in a Chain: every tensor is walked, so params, fmap and deepcopy see them.
  auto model = Chain(templated::Block<templated::Block<Dense>>{LayerNorm(4), block}, stack);
  EXPECT_EQ(params(model).size(), 2 + 4 + 6u);
  auto copy = deepcopy(model);
  EXPECT_NE(params(copy)[0].impl(), params(model)[0].impl());
  EXPECT_EQ(fmap([](const Tensor& t) { return t * 0.0; }, model)(ones(Shape{1, 4})).to_vector<float>(),
            (std::vector<float>{0, 0}));
  EXPECT_EQ(std::string(flux_layer_name(&block)), "Block");
  EXPECT_EQ(std::string(flux_layer_name(&stack)), "Stack");
}

TEST_P(LayerTemplateDevices, TemplateLayersTrainAndMove) {
  Device d = GetParam();
  seed(3);
  auto model = Chain(templated::Block<Chain<Dense, Dense>>{LayerNorm(3), Chain(Dense(3, 8, relu), Dense(8, 3))},
                     templated::Stack<1>{{Dense(3, 1)}}) | d;
  EXPECT_EQ(params(model)[0].device(), d);
  Tensor x = to(rand(Shape{16, 3}), d), y = to(rand(Shape{16, 1}), d);
  auto opt = optimisers::setup(optimisers::Adam(1e-2), model);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
    optimisers::update(opt, model, grads);
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);
  // The gradient has the model's own type, tensor for tensor.
  auto grads = gradient([&](auto& m) { return mse(m(x), y); }, model);
  auto got = state(grads), want = state(model);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second.shape());
    EXPECT_EQ(got[i].second.device(), d);
  }
}
FLUX_DEVICE_SUITE(LayerTemplateDevices);

TEST(LayerTemplates, ChainOfUserLayersPrintsAsATree) {
  seed(4);
  auto model = Chain(templated::Block<Dense>{LayerNorm(4), Dense(4, 4)},
                     templated::Block<Chain<Dense, Dense>>{LayerNorm(4), Chain(Dense(4, 8, gelu), Dense(8, 4))},
                     templated::Scale<int>{ones(Shape{4}), 2}, Dense(4, 2));
  EXPECT_EQ(to_text(model),
            "Chain(\n"
            "  Block(\n"
            "    LayerNorm(4),                       # 8 parameters\n"
            "    Dense(4 => 4),                      # 20 parameters\n"
            "  ),\n"
            "  Block(\n"
            "    LayerNorm(4),                       # 8 parameters\n"
            "    Chain(\n"
            "      Dense(4 => 8, gelu),              # 40 parameters\n"
            "      Dense(8 => 4),                    # 36 parameters\n"
            "    ),\n"
            "  ),\n"
            "  Scale(weight = 4-element Tensor{Float32, CPU}, 2),  # 4 parameters\n"
            "  Dense(4 => 2),                        # 10 parameters\n"
            ")                   # Total: 13 arrays, 126 parameters, 504 bytes.");
  // The one-line form: tensor fields named, as in the tree.
  EXPECT_EQ(repr(model), "Chain(Block(LayerNorm(4), Dense(4 => 4)), Block(LayerNorm(4), Chain(Dense(4 => 8, gelu), "
                         "Dense(8 => 4))), Scale(weight = 4-element Tensor{Float32, CPU}, 2), Dense(4 => 2))  # 126 parameters");
  // A user layer on its own: a tree with its total, as Flux shows a @layer struct.
  templated::Block<Chain<Dense, Dense>> block{LayerNorm(4), Chain(Dense(4, 8, gelu), Dense(8, 4))};
  EXPECT_EQ(to_text(block),
            "Block(\n"
            "  LayerNorm(4),                         # 8 parameters\n"
            "  Chain(\n"
            "    Dense(4 => 8, gelu),                # 40 parameters\n"
            "    Dense(8 => 4),                      # 36 parameters\n"
            "  ),\n"
            ")                   # Total: 6 arrays, 84 parameters, 336 bytes.");
  // Vectors and arrays of layers nest as Flux's [ ... ].
  EXPECT_EQ(to_text(templated::Stack<2>{{Dense(2, 2), Dense(2, 1)}}),
            "Stack(\n"
            "  [\n"
            "    Dense(2 => 2),                      # 6 parameters\n"
            "    Dense(2 => 1),                      # 3 parameters\n"
            "  ],\n"
            ")                   # Total: 4 arrays, 9 parameters, 36 bytes.");
  // Tensors and values only: one line.
  EXPECT_EQ(to_text(templated::Scale<double>{ones(Shape{3}), 0.5}), "Scale(weight = 3-element Tensor{Float32, CPU}, 0.5)");
}

TEST(LayerTemplates, FunctionsAndParametrisedActivationsPrintReadably) {
  auto model = Chain(Dense(2, 3, LeakyRelu{0.2}), LeakyRelu{0.2}, leakyrelu, Elu{0.5}, elu, templated::halve);
  EXPECT_EQ(repr(model), "Chain(Dense(2 => 3, leakyrelu(0.2)), leakyrelu(0.2), leakyrelu, elu(0.5), elu, "
                         "templated::halve)  # 9 parameters");
  EXPECT_THAT(to_text(model), HasSubstr("\n  templated::halve,\n"));
  EXPECT_THAT(to_text(model), HasSubstr("\n  leakyrelu(0.2),\n"));
  // A plain function as Dense's activation prints by its name too.
  EXPECT_EQ(layer_string(Dense(2, 3, templated::halve)), "Dense(2 => 3, templated::halve)");
  // The slope is used, not only printed.
  Tensor x = Tensor(std::vector<double>{-1.0, 2.0}, Shape{2}).f32();
  EXPECT_EQ(Chain(LeakyRelu{0.2})(x).to_vector<float>(), (std::vector<float>{-0.2f, 2.0f}));
}
