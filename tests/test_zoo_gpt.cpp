// The model of the Flux model zoo's GPT as examples/zoo/gpt.hpp writes it (issue 32): its parameter
// count is Flux's (239,829 in the porter's setting: vocabulary 85, context 64, the zoo's 6 layers),
// it prints as Flux's nested tree, it is causal, and it runs the same on every device.
#include <gmock/gmock.h>

#include "examples/zoo/gpt.hpp"
#include "sequence_test_support.hpp"

using namespace flux;
using namespace flux::testing;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {
class ZooGptDevices : public ::testing::TestWithParam<Device> {};
}  // namespace

TEST(ZooGpt, ParameterCountIsFluxs) {
  seed(1);
  zoo::TransformerGPT gpt(85, 64);
  EXPECT_EQ(parameter_count(gpt), 239829);
  EXPECT_EQ(zoo::flux_parameter_count(85, 64, {}), 239829);
  // Per block (Flux): LayerNorm 128 + MultiHeadAttention(64 => 16 => 64) 4,096 + MLP 33,216.
  EXPECT_EQ(parameter_count(gpt.blocks[0]), 128 + 4096 + 128 + 16640 + 16448);
  EXPECT_EQ(parameter_count(gpt.blocks[0].mha), 4096);
  zoo::GPTConfig small{.n_embed = 32, .n_hidden = 48, .qk_dim = 8, .v_dim = 16, .n_heads = 2, .n_layers = 2};
  EXPECT_EQ(parameter_count(zoo::TransformerGPT(20, 16, small)), zoo::flux_parameter_count(20, 16, small));
}

TEST(ZooGpt, PrintsAsFluxsTree) {
  seed(1);
  const std::string text = to_text(zoo::TransformerGPT(85, 64));
  EXPECT_THAT(text, StartsWith("TransformerGPT(\n"
                               "  Embedding(85 => 64),                  # 5_440 parameters\n"
                               "  Embedding(64 => 64),                  # 4_096 parameters\n"
                               "  Dropout(0),\n"
                               "  [\n"
                               "    GPTBlock(\n"
                               "      LayerNorm(64),                    # 128 parameters\n"
                               "      MultiHeadAttention(64 => 16 => 64; nheads=4),  # 4_096 parameters\n"
                               "      Chain(\n"
                               "        LayerNorm(64),                  # 128 parameters\n"
                               "        Dense(64 => 256, gelu),         # 16_640 parameters\n"));
  EXPECT_THAT(text, HasSubstr("  LayerNorm(64),                        # 128 parameters\n"
                              "  Dense(64 => 85),                      # 5_525 parameters\n"
                              ")                   # Total: 66 arrays, 239_829 parameters, 936.832 KiB."));
}

TEST(ZooGpt, IsCausal) {
  seed(2);
  zoo::GPTConfig c{.n_embed = 16, .n_hidden = 32, .qk_dim = 8, .v_dim = 8, .n_heads = 2, .n_layers = 2};
  zoo::TransformerGPT gpt(10, 8, c);
  Tensor a = Tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, Shape{1, 6});
  Tensor b = Tensor(std::vector<int64_t>{1, 2, 3, 9, 9, 9}, Shape{1, 6});
  std::vector<float> ya = gpt(a).to_vector<float>(), yb = gpt(b).to_vector<float>();
  ASSERT_EQ(ya.size(), 60u);
  for (size_t i = 0; i < 30; ++i) EXPECT_FLOAT_EQ(ya[i], yb[i]) << i;  // positions 0..2 see only tokens 0..2
  double later = 0;
  for (size_t i = 30; i < 60; ++i) later += std::abs(ya[i] - yb[i]);
  EXPECT_GT(later, 1e-3);
}

TEST_P(ZooGptDevices, MatchesFloat64CpuWithGradients) {
  Device d = GetParam();
  seed(3);
  zoo::GPTConfig c{.n_embed = 16, .n_hidden = 32, .qk_dim = 8, .v_dim = 12, .n_heads = 4, .n_layers = 2};
  zoo::TransformerGPT gpt(12, 8, c);
  zoo::TransformerGPT ref = to_f64_cpu(gpt);
  zoo::TransformerGPT on = gpt | d;
  Tensor ids = Tensor(std::vector<int64_t>{0, 3, 5, 7, 11, 2, 4, 4, 9, 1, 0, 8}, Shape{2, 6});
  Tensor r = uniform_tensor(Shape{2, 6, 12}, 4);
  EXPECT_LT(max_rel_error(on(to(ids, d)), ref(ids).to_vector<double>()), 1e-4);
  auto g64 = gradient([&](const zoo::TransformerGPT& m) { return sum(m(ids) * r); }, ref);
  auto g = gradient([&](const zoo::TransformerGPT& m) { return sum(m(to(ids, d)) * to(r.f32(), d)); }, on);
  auto got = state(g), want = state(g64);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LT(max_rel_error(got[i].second, want[i].second.to_vector<double>()), 1e-3) << got[i].first;
}
FLUX_DEVICE_SUITE(ZooGptDevices);
