// Device parity of gradients (issue 33): for every differentiable public op, loss, activation and
// layer, the gradient with respect to EVERY floating input (predictions and targets, float masks,
// weights and biases, initial states, scale/shift, running statistics) on every test device and in
// every swept dtype equals the float64 CPU gradient within that dtype's tolerance.
//
// One table (parity_cases) generates the cases. GradientParityTable.CoversEveryPublicName reads the
// public headers and fails for any op, loss, activation or layer that has neither a case nor an entry
// in not_differentiable() with its reason, so a new op cannot be added without a case.
//
// Each case is L = sum(f(inputs) * W), W fixed in [0.5, 1.5], so that every entry of the Jacobian
// counts. Inputs are drawn in float64 and rounded to float32 first, so that every dtype starts from
// the same numbers and the error is the op's own rounding. Finite-difference checks of the CPU
// float64 gradients themselves are tests/test_gradients.cpp.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "test_devices.hpp"

using namespace flux;

namespace {

using V = const std::vector<Tensor>&;
using Fn = std::function<Tensor(V)>;

struct Range {
  double lo = -2, hi = 2;
  bool binary = false;  // values in {0, 1} (hard targets), drawn with probability 1/2
};
const Range kProb{0.05, 0.95}, kPositive{0.5, 2.0}, kBinary{0, 1, true}, kUnit{-1, 1};

struct In {
  Shape shape;
  Range range = {};
};

struct ParityCase {
  std::string api;   // the public name it covers (as CoversEveryPublicName enumerates them)
  std::string name;  // unique
  std::vector<In> inputs;
  Fn f;
  double tol_scale = 1;  // > 1 only with a reason at the case
};

// ---- per-dtype tolerance (max error relative to max(1, |reference|)) ----
// The hook for the half types: once the bf16/f16 paths exist (their own issue), add them to
// swept_dtypes(); their tolerances are already here. Until then the half types only round-trip
// through float32 kernels and are not swept.
double tolerance(DType t) {
  switch (t) {
    case DType::f64: return 1e-9;
    case DType::f32: return 2e-4;
    case DType::f16: return 2e-2;
    case DType::bf16: return 1e-1;
    default: return 0;
  }
}
std::vector<DType> swept_dtypes() { return {DType::f64, DType::f32}; }
// The dtype whose values the inputs hold: float32 for float32 and float64 runs (one reference for
// both), the half type itself for half runs (their reference starts from the same rounded inputs).
DType input_rounding(DType t) { return t == DType::f16 || t == DType::bf16 ? t : DType::f32; }

Device dev_of(V v) { return v[0].device(); }
Tensor idx64(std::vector<int64_t> v, Device d) {
  int64_t n = int64_t(v.size());
  return to(Tensor(v, Shape{n}), d);
}

std::vector<double> draw(int64_t n, Range r, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(r.lo, r.hi), coin(0, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = r.binary ? (coin(gen) < 0.5 ? 0.0 : 1.0) : double(float(u(gen)));
  if (r.binary && n >= 2) v[0] = 1, v[1] = 0;  // both values, whatever the draw
  return v;
}

std::vector<std::vector<double>> inputs_of(const ParityCase& c) {
  std::mt19937_64 gen(std::hash<std::string>{}(c.name));
  std::vector<std::vector<double>> out;
  for (const In& in : c.inputs) out.push_back(draw(in.shape.numel(), in.range, gen));
  return out;
}

struct Result {
  double value = 0;
  std::vector<Tensor> grads;
};

// L and its gradient with respect to every input, computed on d in dtype t. With `alone` >= 0 only
// that input is on the tape (the others are constants): grads then holds its gradient alone. The
// ops skip the backward of untracked operands, so that is a path of its own (a target differentiated
// while the prediction is data, a mask while x is data).
// The inputs hold values of `rounding` (the dtype they were rounded to; see input_rounding).
Result run_case(const ParityCase& c, DType t, const Device& d, int alone = -1, DType rounding = DType::f32) {
  auto in = inputs_of(c);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < in.size(); ++i)
    xs.push_back(to(Tensor(in[i], c.inputs[i].shape).cast(rounding).cast(t), d));
  std::vector<double> weights;
  auto objective = [&](const std::vector<Tensor>& v) {
    seed(20261205);  // the random ops (dropout) draw the same numbers on every device
    Tensor y = c.f(v);
    if (weights.empty()) {
      std::mt19937_64 gen(7);
      weights = draw(y.numel(), Range{0.5, 1.5}, gen);
    }
    return sum(y * to(Tensor(weights, y.shape()).cast(y.dtype()), y.device()));
  };
  if (alone >= 0) {
    auto [value, grad] = withgradient(
        [&](const Tensor& tracked) {
          std::vector<Tensor> v = xs;
          v[size_t(alone)] = tracked;
          return objective(v);
        },
        xs[size_t(alone)]);
    return {value.item<double>(), {grad}};
  }
  auto [value, grads] = withgradient(objective, xs);
  return {value.item<double>(), grads};
}

// Cases with 2 or 3 inputs also run with each input alone on the tape (binary ops, losses, conv
// with bias, the normalisations, Dense); larger layers only all together, to keep the sweep short:
// their untracked-operand paths are those of the same primitive ops.
bool runs_each_input_alone(const ParityCase& c) { return c.inputs.size() == 2 || c.inputs.size() == 3; }

// ---- the table ----
std::vector<ParityCase> op_cases() {
  const Range pos = kPositive;
  return {
      {"add", "add", {{{3, 4}}, {{3, 4}}}, [](V v) { return add(v[0], v[1]); }},
      {"add", "add_broadcast", {{{2, 1, 4}}, {{3, 1}}}, [](V v) { return add(v[0], v[1]); }},
      {"sub", "sub_broadcast", {{{3, 1}}, {{1, 4}}}, [](V v) { return sub(v[0], v[1]); }},
      {"mul", "mul_broadcast", {{{2, 3}}, {{3}}}, [](V v) { return mul(v[0], v[1]); }},
      {"mul", "mul_float_mask", {{{4, 5}}, {{4, 5}, kBinary}}, [](V v) { return mul(v[0], v[1]); }},
      {"div", "div_broadcast", {{{2, 3}}, {{2, 1}, pos}}, [](V v) { return div(v[0], v[1]); }},
      {"pow", "pow_tensor", {{{2, 3}, pos}, {{2, 3}, {-1.5, 1.5}}}, [](V v) { return pow(v[0], v[1]); }},
      {"pow", "pow_scalar", {{{5}, pos}}, [](V v) { return pow(v[0], 2.5); }},
      {"maximum", "maximum_broadcast", {{{3, 4}}, {{4}}}, [](V v) { return maximum(v[0], v[1]); }},
      {"minimum", "minimum_broadcast", {{{3, 1}}, {{3, 4}}}, [](V v) { return minimum(v[0], v[1]); }},
      {"operator+", "plus_tensor_and_scalars", {{{3}}, {{3}}}, [](V v) { return (v[0] + v[1]) + 1.5 + (2.0 + v[0]); }},
      {"operator-", "minus_tensor_scalars_unary", {{{3}}, {{3}}}, [](V v) { return (v[0] - v[1]) - 1.5 + (2.0 - v[1]) + -v[0]; }},
      {"operator*", "times_tensor_and_scalars", {{{3}}, {{3}}}, [](V v) { return (v[0] * v[1]) * 1.5 + 2.0 * v[1]; }},
      {"operator/", "divide_tensor_and_scalars", {{{3}}, {{3}, pos}}, [](V v) { return v[0] / v[1] / 1.5 + 2.0 / v[1]; }},
      {"where", "where_both_branches", {{{3, 4}}, {{3, 4}}}, [](V v) { return where(v[0] > 0.0, v[0] * v[1], v[1]); }},
      {"where", "where_broadcast", {{{3, 4}}, {{4}}}, [](V v) { return where(v[0] < v[1], v[0], v[1]); }},
      {"neg", "neg", {{{6}}}, [](V v) { return neg(v[0]); }},
      {"exp", "exp", {{{6}}}, [](V v) { return exp(v[0]); }},
      {"erf", "erf", {{{6}}}, [](V v) { return erf(v[0]); }},
      {"log", "log", {{{6}, pos}}, [](V v) { return log(v[0]); }},
      {"sqrt", "sqrt", {{{6}, pos}}, [](V v) { return sqrt(v[0]); }},
      {"abs", "abs", {{{8}}}, [](V v) { return abs(v[0]); }},
      {"sign", "sign_times_x", {{{8}}}, [](V v) { return sign(v[0]) * v[0]; }},
      {"square", "square", {{{6}}}, [](V v) { return square(v[0]); }},
      {"sin", "sin", {{{6}}}, [](V v) { return sin(v[0]); }},
      {"cos", "cos", {{{6}}}, [](V v) { return cos(v[0]); }},
      {"log1p", "log1p", {{{6}, {-0.5, 2}}}, [](V v) { return log1p(v[0]); }},
      {"tanh", "tanh", {{{6}}}, [](V v) { return flux::tanh(v[0]); }},
      {"clamp", "clamp", {{{10}}}, [](V v) { return clamp(v[0], -1.0, 0.5); }},
      {"matmul", "matmul_nn", {{{3, 4}}, {{4, 5}}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul", "matmul_tt", {{{4, 3}}, {{5, 4}}}, [](V v) { return matmul(v[0], v[1], true, true); }},
      {"matmul", "matmul_batched_broadcast", {{{2, 1, 3, 4}}, {{3, 4, 2}}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul", "matmul_vec_mat", {{{4}}, {{4, 5}}}, [](V v) { return matmul(v[0], v[1]); }},
      {"sum", "sum_all", {{{3, 4}}}, [](V v) { return sum(v[0]); }},
      {"sum", "sum_axis", {{{2, 3, 4}}}, [](V v) { return sum(v[0], -2, true); }},
      {"sum", "sum_axes", {{{2, 3, 4}}}, [](V v) { return sum(v[0], std::vector<int>{0, 2}); }},
      {"mean", "mean_all", {{{3, 4}}}, [](V v) { return mean(v[0]); }},
      {"mean", "mean_axis", {{{3, 4}}}, [](V v) { return mean(v[0], 0); }},
      {"max", "max_all", {{{3, 4}}}, [](V v) { return max(v[0]); }},
      {"max", "max_axis", {{{2, 3, 4}}}, [](V v) { return max(v[0], 1, true); }},
      {"min", "min_all", {{{3, 4}}}, [](V v) { return min(v[0]); }},
      {"min", "min_axis", {{{2, 3, 4}}}, [](V v) { return min(v[0], -1); }},
      {"Softmax", "softmax_middle", {{{2, 3, 4}}}, [](V v) { return softmax(v[0], 1); }},
      {"LogSoftmax", "logsoftmax_last", {{{3, 5}}}, [](V v) { return logsoftmax(v[0]); }},
      {"logsumexp", "logsumexp_axis0", {{{3, 5}}}, [](V v) { return logsumexp(v[0], 0, true); }},
      {"broadcast_to", "broadcast_to", {{{3, 1}}}, [](V v) { return broadcast_to(v[0], Shape{2, 3, 4}); }},
      {"sum_to", "sum_to", {{{2, 3, 4}}}, [](V v) { return sum_to(v[0], Shape{3, 1}); }},
      {"permute", "permute", {{{2, 3, 4}}}, [](V v) { return permute(v[0], {2, 0, 1}); }},
      {"concat", "concat", {{{2, 3}}, {{2, 2}}}, [](V v) { return concat({v[0], v[1], v[0]}, 1); }},
      {"stack", "stack", {{{2, 3}}, {{2, 3}}}, [](V v) { return stack({v[0], v[1]}, 1); }},
      {"index_select", "index_select", {{{4, 3}}}, [](V v) { return index_select(v[0], 0, idx64({2, 0, 2, 3}, dev_of(v))); }},
      {"gather", "gather", {{{2, 3, 4}}}, [](V v) { return gather(v[0], -1, idx64({3, 0, 3}, dev_of(v))); }},
      {"slice", "slice", {{{3, 5}}}, [](V v) { return slice(v[0], 1, 1, 4); }},
      {"reshape", "reshape", {{{3, 4}}}, [](V v) { return square(v[0].reshape(Shape{2, -1})); }},
      {"transpose", "transpose", {{{2, 3, 4}}}, [](V v) { return v[0].transpose(); }},
      {"operator[]", "row", {{{4, 3}}}, [](V v) { return v[0][2]; }},
      {"cast", "cast", {{{5}}}, [](V v) { return square(v[0].cast(DType::f64)).cast(v[0].dtype()); }},
      {"f32", "f32", {{{5}}}, [](V v) { return square(v[0].f32()).cast(v[0].dtype()); }},
      {"f64", "f64", {{{5}}}, [](V v) { return square(v[0].f64()).cast(v[0].dtype()); }},
      {"contiguous_copy", "contiguous_copy", {{{5}}}, [](V v) { return square(v[0].contiguous_copy()); }},
      {"to", "to_cpu_and_back", {{{5}}}, [](V v) { return to(square(to(v[0], Device())), dev_of(v)); }},
      {"conv", "conv2d_stride_pad_bias", {{{2, 2, 5, 5}}, {{3, 2, 3, 3}}, {{3}}},
       [](V v) { return conv(v[0], v[1], v[2], {.stride = 2, .pad = 1}); }},
      {"conv", "conv1d_dilation_groups", {{{1, 4, 7}}, {{4, 2, 2}}, {{4}}},
       [](V v) { return conv(v[0], v[1], v[2], {.dilation = 2, .groups = 2}); }},
      {"conv", "conv3d", {{{1, 1, 3, 3, 3}}, {{2, 1, 2, 2, 2}}}, [](V v) { return conv(v[0], v[1]); }},
      {"conv_transpose", "conv_transpose2d", {{{1, 2, 3, 3}}, {{2, 3, 3, 3}}, {{3}}},
       [](V v) { return conv_transpose(v[0], v[1], v[2], {.stride = 2, .pad = 1, .output_padding = 1}); }},
      {"maxpool", "maxpool2d", {{{1, 2, 4, 4}}}, [](V v) { return maxpool(v[0], {2, 2}); }},
      {"maxpool", "maxpool1d_overlapping_pad", {{{1, 2, 7}}}, [](V v) { return maxpool(v[0], {3}, {.stride = 2, .pad = 1}); }},
      {"meanpool", "meanpool2d_pad", {{{1, 2, 5, 5}}}, [](V v) { return meanpool(v[0], {3, 3}, {.stride = 2, .pad = 1}); }},
      {"adaptive_maxpool", "adaptive_maxpool", {{{1, 2, 5, 6}}}, [](V v) { return adaptive_maxpool(v[0], {2, 3}); }},
      {"adaptive_meanpool", "adaptive_meanpool", {{{1, 2, 5, 6}}}, [](V v) { return adaptive_meanpool(v[0], {3, 2}); }},
      {"global_maxpool", "global_maxpool", {{{2, 2, 3, 3}}}, [](V v) { return global_maxpool(v[0]); }},
      {"global_meanpool", "global_meanpool", {{{2, 2, 3, 3}}}, [](V v) { return global_meanpool(v[0]); }},
      {"Flatten", "flatten", {{{2, 2, 3}}}, [](V v) { return square(flatten(v[0])); }},
      {"batchnorm", "batchnorm_batch_statistics", {{{4, 3, 2}}, {{3}}, {{3}}},
       [](V v) { return batchnorm(v[0], v[1], v[2], 1e-5); }},
      {"batchnorm", "batchnorm_given_statistics", {{{4, 3}}, {{3}}, {{3}}, {{3}}, {{3}, kPositive}},
       [](V v) { return batchnorm(v[0], v[1], v[2], v[3], v[4], 1e-5); }},
      {"layernorm", "layernorm", {{{2, 3, 5}}, {{5}}, {{5}}}, [](V v) { return layernorm(v[0], v[1], v[2]); }},
      // weight and bias in another dtype than x: the portable (composed) path, not the fused kernel
      {"layernorm", "layernorm_mixed_dtypes", {{{4, 3}}, {{3}}, {{3}}}, [](V v) {
         DType other = v[0].dtype() == DType::f64 ? DType::f32 : DType::f64;
         return layernorm(v[0], v[1].cast(other), v[2].cast(other)).cast(v[0].dtype());
       }},
      {"groupnorm", "groupnorm", {{{2, 4, 3}}, {{4}}, {{4}}}, [](V v) { return groupnorm(v[0], 2, v[1], v[2]); }},
      // recurrences: xg (T, N, G), w_hh (G, H), b_hh (G,), h0 (N, H), c0 (N, H); H = 3
      {"lstm_recurrence", "lstm_recurrence", {{{4, 2, 12}, kUnit}, {{12, 3}, kUnit}, {{12}, kUnit}, {{2, 3}, kUnit}, {{2, 3}, kUnit}},
       [](V v) { return lstm_recurrence(v[0], v[1], v[2], v[3], v[4]); }},
      {"gru_recurrence", "gru_recurrence", {{{4, 2, 9}, kUnit}, {{9, 3}, kUnit}, {{9}, kUnit}, {{2, 3}, kUnit}},
       [](V v) { return gru_recurrence(v[0], v[1], v[2], v[3]); }},
      {"rnn_recurrence", "rnn_recurrence_tanh", {{{4, 2, 3}, kUnit}, {{3, 3}, kUnit}, {{3}, kUnit}, {{2, 3}, kUnit}},
       [](V v) { return rnn_recurrence(v[0], v[1], v[2], v[3]); }},
      {"rnn_recurrence", "rnn_recurrence_relu", {{{4, 2, 3}, kUnit}, {{3, 3}, kUnit}, {{3}, kUnit}, {{2, 3}, kUnit}},
       [](V v) { return rnn_recurrence(v[0], v[1], v[2], v[3], true); }},
      {"dot_product_attention", "dot_product_attention_causal", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}},
       [](V v) { return dot_product_attention(v[0], v[1], v[2], causal_mask(3, 5, dev_of(v))); }},
      {"dot_product_attention", "dot_product_attention_scale_dropout", {{{1, 2, 3, 4}}, {{1, 2, 3, 4}}, {{1, 2, 3, 2}}},
       [](V v) { return dot_product_attention(v[0], v[1], v[2], Tensor(), 0.7, 0.25); }},
      {"dot_product_attention_scores", "dot_product_attention_scores_causal", {{{2, 3, 4}}, {{2, 5, 4}}},
       [](V v) { return dot_product_attention_scores(v[0], v[1], causal_mask(3, 5, dev_of(v))); }},
      {"dropout", "dropout", {{{4, 5}}}, [](V v) { return dropout(v[0], 0.3); }},
      {"dropout", "dropout_dims", {{{3, 4, 2}}}, [](V v) { return dropout(v[0], 0.5, {1}); }},
      {"embedding", "embedding_op", {{{5, 3}}}, [](V v) { return embedding(v[0], idx64({4, 0, 4, 2}, dev_of(v))); }},
  };
}

// Every loss with respect to prediction AND target, every aggregation, 1-D to 3-D, with and without
// an explicit eps; hard (0/1) targets too.
std::vector<ParityCase> loss_cases() {
  std::vector<ParityCase> cs;
  const std::pair<const char*, Agg> aggs[] = {{"mean", Agg::mean}, {"sum", Agg::sum}, {"none", Agg::none}};
  const std::vector<Shape> shapes = {Shape{6}, Shape{4, 3}, Shape{2, 3, 4}};
  using Eps = std::optional<double>;
  for (auto [agg_name, agg] : aggs) {
    LossOptions o{.agg = agg};
    for (const Shape& s : shapes) {
      std::string tag = std::string(agg_name) + "_" + std::to_string(s.size()) + "d";
      for (Eps eps : {Eps(), Eps(1e-3)}) {
        std::string e = eps ? "_eps" : "";
        cs.push_back({"crossentropy", "crossentropy_" + tag + e, {{s, kProb}, {s, kProb}},
                      [o, eps](V v) { return crossentropy(v[0], v[1], o, eps); }});
        cs.push_back({"binarycrossentropy", "binarycrossentropy_" + tag + e, {{s, kProb}, {s, kProb}},
                      [o, eps](V v) { return binarycrossentropy(v[0], v[1], o, eps); }});
        cs.push_back({"kldivergence", "kldivergence_" + tag + e, {{s, kProb}, {s, kProb}},
                      [o, eps](V v) { return kldivergence(v[0], v[1], o, eps); }});
      }
      cs.push_back({"crossentropy", "crossentropy_hard_" + tag, {{s, kProb}, {s, kBinary}},
                    [o](V v) { return crossentropy(v[0], v[1], o); }});
      cs.push_back({"binarycrossentropy", "binarycrossentropy_hard_" + tag, {{s, kProb}, {s, kBinary}},
                    [o](V v) { return binarycrossentropy(v[0], v[1], o); }});
      cs.push_back({"mse", "mse_" + tag, {{s}, {s}}, [o](V v) { return mse(v[0], v[1], o); }});
      cs.push_back({"mae", "mae_" + tag, {{s}, {s}}, [o](V v) { return mae(v[0], v[1], o); }});
      cs.push_back({"huber", "huber_" + tag, {{s, {-3, 3}}, {s, {-3, 3}}}, [o](V v) { return huber(v[0], v[1], o, 0.7); }});
      cs.push_back({"logitcrossentropy", "logitcrossentropy_" + tag, {{s, {-4, 4}}, {s, kProb}},
                    [o](V v) { return logitcrossentropy(v[0], v[1], o); }});
      cs.push_back({"logitbinarycrossentropy", "logitbinarycrossentropy_" + tag, {{s, {-4, 4}}, {s, kProb}},
                    [o](V v) { return logitbinarycrossentropy(v[0], v[1], o); }});
    }
  }
  return cs;
}

// Activations and layers: every parameter, state and input is a case input, put into the layer.
std::vector<ParityCase> layer_cases() {
  return {
      {"Identity", "identity", {{{6}}}, [](V v) { return square(identity(v[0])); }},
      {"Relu", "relu", {{{8}}}, [](V v) { return relu(v[0]); }},
      {"Sigmoid", "sigmoid", {{{8}, {-6, 6}}}, [](V v) { return sigmoid(v[0]); }},
      {"Tanh", "tanh_act", {{{8}}}, [](V v) { return tanh_act(v[0]); }},
      {"Gelu", "gelu", {{{8}, {-3, 3}}}, [](V v) { return gelu(v[0]); }},
      {"GeluErf", "gelu_erf", {{{8}, {-3, 3}}}, [](V v) { return gelu_erf(v[0]); }},
      {"Softplus", "softplus", {{{8}, {-5, 5}}}, [](V v) { return softplus(v[0]); }},
      {"Swish", "swish", {{{8}, {-4, 4}}}, [](V v) { return swish(v[0]); }},
      {"LeakyRelu", "leakyrelu", {{{8}}}, [](V v) { return leakyrelu(v[0]) + leakyrelu(v[0], 0.2); }},
      {"Elu", "elu", {{{8}}}, [](V v) { return elu(v[0]) + elu(v[0], 0.5); }},
      {"Softmax", "softmax", {{{3, 5}}}, [](V v) { return softmax(v[0]) + softmax(v[0], 0); }},
      {"LogSoftmax", "logsoftmax", {{{3, 5}}}, [](V v) { return logsoftmax(v[0]); }},
      {"Dense", "Dense_relu", {{{4, 3}}, {{5, 3}}, {{5}}}, [](V v) { return Dense(v[1], v[2], relu)(v[0]); }},
      {"Dense", "Dense_no_bias_3d", {{{2, 4, 3}}, {{5, 3}}}, [](V v) { return Dense(v[1], Tensor(), gelu)(v[0]); }},
      {"Conv", "Conv_relu", {{{2, 2, 5, 5}}, {{3, 2, 3, 3}}, {{3}}},
       [](V v) { return Conv(v[1], v[2], relu, {.stride = 1, .pad = SamePad()})(v[0]); }},
      {"ConvTranspose", "ConvTranspose", {{{1, 2, 3, 3}}, {{2, 2, 2, 2}}, {{2}}},
       [](V v) { return ConvTranspose(v[1], v[2], sigmoid, {.stride = 2})(v[0]); }},
      {"BatchNorm", "BatchNorm_training", {{{4, 3, 2, 2}}, {{3}}, {{3}}}, [](V v) {
         BatchNorm bn = BatchNorm(3, relu, {.dtype = v[0].dtype()}) | dev_of(v);
         bn.weight = v[1], bn.bias = v[2];
         bn.active = true;  // batch statistics also where no gradient is taken (the differences)
         return bn(v[0]);
       }},
      {"BatchNorm", "BatchNorm_test_running_statistics", {{{4, 3}}, {{3}}, {{3}}, {{3}}, {{3}, kPositive}}, [](V v) {
         BatchNorm bn = BatchNorm(3, {.dtype = v[0].dtype()}) | dev_of(v);
         bn.weight = v[1], bn.bias = v[2], bn.running_mean = v[3], bn.running_var = v[4];
         bn.active = false;
         return bn(v[0]);
       }},
      {"LayerNorm", "LayerNorm", {{{2, 3, 5}}, {{5}}, {{5}}}, [](V v) {
         LayerNorm ln(5, tanh_act, {.dtype = v[0].dtype()});
         ln.weight = v[1], ln.bias = v[2];
         return ln(v[0]);
       }},
      {"GroupNorm", "GroupNorm", {{{2, 4, 3}}, {{4}}, {{4}}}, [](V v) {
         GroupNorm gn(4, 2, Activation(), {.dtype = v[0].dtype()});
         gn.weight = v[1], gn.bias = v[2];
         return gn(v[0]);
       }},
      {"InstanceNorm", "InstanceNorm_affine", {{{2, 3, 4}}, {{3}}, {{3}}}, [](V v) {
         InstanceNorm in(3, {.affine = true, .dtype = v[0].dtype()});
         in.weight = v[1], in.bias = v[2];
         return in(v[0]);
       }},
      {"Embedding", "Embedding", {{{6, 3}}}, [](V v) {
         Embedding e(6, 3, {.dtype = v[0].dtype()});
         e.weight = v[0];
         return e(to(Tensor(std::vector<int64_t>{1, 5, 1, 0, 3, 5}, Shape{2, 3}), dev_of(v)));
       }},
      {"MultiHeadAttention", "MultiHeadAttention_self_causal", {{{2, 3, 4}}, {{12, 4}, kUnit}, {{12}}, {{4, 4}, kUnit}, {{4}}},
       [](V v) {
         MultiHeadAttention m(4, {.nheads = 2, .causal = true, .dtype = v[0].dtype()});
         m.in_proj_weight = v[1], m.in_proj_bias = v[2], m.out_proj = Dense(v[3], v[4]);
         return m(v[0]);
       }},
      {"MultiHeadAttention", "MultiHeadAttention_cross", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 4}}, {{12, 4}, kUnit}, {{12}}, {{4, 4}, kUnit}, {{4}}},
       [](V v) {
         MultiHeadAttention m(4, {.nheads = 2, .dtype = v[0].dtype()});
         m.in_proj_weight = v[3], m.in_proj_bias = v[4], m.out_proj = Dense(v[5], v[6]);
         return m(v[0], v[1], v[2]);
       }},
      // Flux's widths: query, key and value inputs of different widths (PyTorch's kdim/vdim layout)
      {"MultiHeadAttention", "MultiHeadAttention_dims_cross",
       {{{2, 3, 4}}, {{2, 5, 3}}, {{2, 5, 2}}, {{4, 4}, kUnit}, {{4, 3}, kUnit}, {{6, 2}, kUnit}, {{14}}, {{5, 6}, kUnit}, {{5}}},
       [](V v) {
         MultiHeadAttention m({.in = 4, .k_in = 3, .v_in = 2, .qk = 4, .v = 6, .out = 5}, {.nheads = 2, .dtype = v[0].dtype()});
         m.q_proj_weight = v[3], m.k_proj_weight = v[4], m.v_proj_weight = v[5], m.in_proj_bias = v[6];
         m.out_proj = Dense(v[7], v[8]);
         auto [y, scores] = m.forward(v[0], v[1], v[2]);
         return y + sum(scores * scores);  // scores' rows sum to 1: squared so that they carry a gradient
       }},
      {"RNNCell", "RNNCell", {{{2, 3}}, {{2, 4}}, {{4, 3}, kUnit}, {{4, 4}, kUnit}, {{4}}, {{4}}}, [](V v) {
         RNNCell c(3, 4, {.dtype = v[0].dtype()});
         c.weight_ih = v[2], c.weight_hh = v[3], c.bias_ih = v[4], c.bias_hh = v[5];
         return c(v[0], v[1]);
       }},
      {"LSTMCell", "LSTMCell", {{{2, 3}}, {{2, 2}}, {{2, 2}}, {{8, 3}, kUnit}, {{8, 2}, kUnit}, {{8}}, {{8}}}, [](V v) {
         LSTMCell c(3, 2, {.dtype = v[0].dtype()});
         c.weight_ih = v[3], c.weight_hh = v[4], c.bias_ih = v[5], c.bias_hh = v[6];
         LSTMState s = c(v[0], LSTMState{v[1], v[2]});
         return concat({s.h, s.c}, 1);
       }},
      {"GRUCell", "GRUCell", {{{2, 3}}, {{2, 2}}, {{6, 3}, kUnit}, {{6, 2}, kUnit}, {{6}}, {{6}}}, [](V v) {
         GRUCell c(3, 2, {.dtype = v[0].dtype()});
         c.weight_ih = v[2], c.weight_hh = v[3], c.bias_ih = v[4], c.bias_hh = v[5];
         return c(v[0], v[1]);
       }},
      {"RNN", "RNN_h0", {{{2, 4, 3}}, {{1, 2, 2}}, {{2, 3}, kUnit}, {{2, 2}, kUnit}, {{2}}, {{2}}}, [](V v) {
         RNN r(3, 2, {.dtype = v[0].dtype()});
         r.layers[0].weight_ih = v[2], r.layers[0].weight_hh = v[3], r.layers[0].bias_ih = v[4], r.layers[0].bias_hh = v[5];
         SequenceOutput o = r.forward(v[0], v[1]);
         return concat({o.output.reshape(Shape{-1}), o.h.reshape(Shape{-1})}, 0);
       }},
      {"LSTM", "LSTM_state0", {{{2, 4, 3}}, {{1, 2, 2}}, {{1, 2, 2}}, {{8, 3}, kUnit}, {{8, 2}, kUnit}, {{8}}, {{8}}}, [](V v) {
         LSTM r(3, 2, {.dtype = v[0].dtype()});
         r.layers[0].weight_ih = v[3], r.layers[0].weight_hh = v[4], r.layers[0].bias_ih = v[5], r.layers[0].bias_hh = v[6];
         LSTMOutput o = r.forward(v[0], LSTMState{v[1], v[2]});
         return concat({o.output.reshape(Shape{-1}), o.state.h.reshape(Shape{-1}), o.state.c.reshape(Shape{-1})}, 0);
       }},
      {"GRU", "GRU_two_layers_h0", {{{2, 3, 3}}, {{2, 2, 2}}, {{6, 3}, kUnit}, {{6, 2}, kUnit}, {{6}}, {{6}},
                                     {{6, 2}, kUnit}, {{6, 2}, kUnit}, {{6}}, {{6}}},
       [](V v) {
         GRU r(3, 2, {.num_layers = 2, .dtype = v[0].dtype()});
         for (int l = 0; l < 2; ++l) {
           r.layers[l].weight_ih = v[2 + 4 * l], r.layers[l].weight_hh = v[3 + 4 * l];
           r.layers[l].bias_ih = v[4 + 4 * l], r.layers[l].bias_hh = v[5 + 4 * l];
         }
         SequenceOutput o = r.forward(v[0], v[1]);
         return concat({o.output.reshape(Shape{-1}), o.h.reshape(Shape{-1})}, 0);
       }},
      {"MaxPool", "MaxPool", {{{1, 2, 4, 4}}}, [](V v) { return MaxPool({2, 2})(v[0]); }},
      {"MeanPool", "MeanPool", {{{1, 2, 4, 4}}}, [](V v) { return MeanPool({2, 2}, {.stride = 1})(v[0]); }},
      {"GlobalMaxPool", "GlobalMaxPool", {{{2, 2, 3, 3}}}, [](V v) { return GlobalMaxPool()(v[0]); }},
      {"GlobalMeanPool", "GlobalMeanPool", {{{2, 2, 3, 3}}}, [](V v) { return GlobalMeanPool()(v[0]); }},
      {"AdaptiveMaxPool", "AdaptiveMaxPool", {{{1, 2, 5, 5}}}, [](V v) { return AdaptiveMaxPool({2, 2})(v[0]); }},
      {"AdaptiveMeanPool", "AdaptiveMeanPool", {{{1, 2, 5, 5}}}, [](V v) { return AdaptiveMeanPool({3, 2})(v[0]); }},
      {"Flatten", "Flatten", {{{2, 2, 3}}}, [](V v) { return square(Flatten()(v[0])); }},
      {"Dropout", "Dropout_training", {{{4, 5}}}, [](V v) { return trainmode(Dropout(0.4))(v[0]); }},
      {"Chain", "Chain", {{{3, 4}}, {{5, 4}}, {{5}}, {{2, 5}}, {{2}}},
       [](V v) { return Chain(Dense(v[1], v[2], relu), Dense(v[3], v[4]), softmax)(v[0]); }},
      {"SkipConnection", "SkipConnection_plus", {{{3, 4}}, {{4, 4}}, {{4}}},
       [](V v) { return SkipConnection(Dense(v[1], v[2], tanh_act), plus)(v[0]); }},
      {"Plus", "Plus", {{{3}}, {{3}}, {{3}}}, [](V v) { return plus(v[0], v[1], v[2]); }},
      {"Parallel", "Parallel_vcat", {{{3, 4}}, {{2, 4}}, {{2}}, {{3, 4}}, {{3}}},
       [](V v) { return Parallel(vcat, Dense(v[1], v[2]), Dense(v[3], v[4], relu))(v[0]); }},
      {"Vcat", "Vcat", {{{2, 3}}, {{2, 2}}}, [](V v) { return vcat(v[0], v[1]); }},
      {"Maxout", "Maxout", {{{3, 4}}, {{2, 4}}, {{2}}, {{2, 4}}, {{2}}},
       [](V v) { return Maxout(Dense(v[1], v[2]), Dense(v[3], v[4]))(v[0]); }},
      {"PairwiseFusion", "PairwiseFusion", {{{3, 2}}, {{2, 2}}, {{2}}, {{2, 2}}, {{2}}}, [](V v) {
         std::vector<Tensor> ys = PairwiseFusion(plus, Dense(v[1], v[2], tanh_act), Dense(v[3], v[4]))(v[0]);
         return concat(ys, 1);
       }},
      {"Bilinear", "Bilinear", {{{3, 2}}, {{3, 4}}, {{5, 2, 4}}, {{5}}}, [](V v) {
         Bilinear b(2, 4, 5, sigmoid, {.dtype = v[0].dtype()});
         b.weight = v[2], b.bias = v[3];
         return b(v[0], v[1]);
       }},
  };
}

std::vector<ParityCase> parity_cases() {
  std::vector<ParityCase> cs = op_cases();
  for (auto* family : {&loss_cases, &layer_cases})
    for (ParityCase& c : (*family)()) cs.push_back(std::move(c));
  return cs;
}

// Public names that take tensors but have no gradient to check, each with its reason.
const std::map<std::string, std::string>& not_differentiable() {
  static const std::map<std::string, std::string> m = {
      {"eq", "comparison: Bool result"}, {"ne", "comparison: Bool result"}, {"lt", "comparison: Bool result"},
      {"le", "comparison: Bool result"}, {"gt", "comparison: Bool result"}, {"ge", "comparison: Bool result"},
      {"operator==", "comparison: Bool result"}, {"operator!=", "comparison: Bool result"},
      {"operator<", "comparison: Bool result"}, {"operator<=", "comparison: Bool result"},
      {"operator>", "comparison: Bool result"}, {"operator>=", "comparison: Bool result"},
      {"argmax", "Int64 indices"}, {"argmin", "Int64 indices"}, {"onecold", "Int64 indices"},
      {"onehot", "built from integer labels: no floating input"},
      {"causal_mask", "a Bool mask built from sizes"},
      {"rand_like", "random values: depends on x only through its shape"},
      {"zeros", "constructor"}, {"ones", "constructor"}, {"full", "constructor"}, {"rand", "constructor"},
      {"randn", "constructor"}, {"arange", "constructor"},
      {"zeros_like", "a constant of x's shape"}, {"ones_like", "a constant of x's shape"},
      {"full_like", "a constant of x's shape"}, {"fill_like", "a constant of x's shape"},
      {"randn_like", "random values: depends on x only through its shape"},
  };
  return m;
}

// Public structs of the scanned headers that are not layers, each with its reason.
const std::map<std::string, std::string>& not_layers() {
  static const std::map<std::string, std::string> m = {
      {"DenseOptions", "options"}, {"ConvOptions", "options"}, {"ConvTransposeOptions", "options"},
      {"BatchNormOptions", "options"}, {"LayerNormOptions", "options"}, {"GroupNormOptions", "options"},
      {"InstanceNormOptions", "options"}, {"EmbeddingOptions", "options"}, {"MultiHeadAttentionOptions", "options"},
      {"PoolOptions", "options"}, {"DropoutOptions", "options"}, {"RecurrentOptions", "options"},
      {"BilinearOptions", "options"}, {"LSTMState", "a result/state holder (its tensors are inputs of LSTMCell/LSTM cases)"},
      {"SequenceOutput", "a result holder"}, {"LSTMOutput", "a result holder"},
      {"GlorotUniform", "initialiser"}, {"GlorotNormal", "initialiser"}, {"KaimingUniform", "initialiser"},
      {"KaimingNormal", "initialiser"}, {"Orthogonal", "initialiser"}, {"Zeros32", "initialiser"},
      {"Ones32", "initialiser"}, {"Rand32", "initialiser"}, {"Randn32", "initialiser"},
      {"PoolParams", "options"}, {"SamePad", "a padding tag"}, {"Storage", "a tensor's memory, not an op"},
      {"TensorImpl", "a tensor's handle data, not an op"}, {"ConvParams", "options"},
      {"ConvTransposeParams", "options"}, {"Dims", "per-axis sizes"}, {"Padding", "padding sizes"},
      {"LossOptions", "options"}, {"MultiHeadAttentionDims", "widths (options)"},
      {"AttentionOutput", "a result holder (its scores are checked in MultiHeadAttention_dims_cross)"},
      {"FunctionLayer", "a function pointer wrapper: its gradient is the wrapped op's, checked with that op"},
      {"InferSize", "a size placeholder resolved by autosize"},
  };
  return m;
}

// ---- enumerating the public names from the headers ----
std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Free functions and Tensor methods returning Tensor, activation and layer structs, outside
// `namespace detail { ... }` blocks, from the public headers that declare ops, losses and layers.
std::set<std::string> public_names() {
  const std::string inc = std::string(FLUX_SOURCE_DIR) + "/include/flux/";
  std::vector<std::string> files = {"ops.hpp", "losses.hpp", "tensor.hpp"};
  for (const char* nn : {"activations", "attention", "chain", "containers", "conv", "dense", "dropout", "embedding",
                         "init", "normalisation", "pooling", "recurrent", "conv_fusion", "show"})
    files.push_back(std::string("nn/") + nn + ".hpp");
  const std::regex function(R"(^(?:inline )?Tensor (operator\S+?|\w+)\()");
  const std::regex method(R"(^  Tensor (operator\[\]|\w+)\(.*\) const)");
  const std::regex type(R"(^(?:template <[^>]*> )?struct (\w+) \{)");
  const std::regex activation(R"(^FLUX_ACTIVATION_\((\w+),)");
  std::set<std::string> names;
  for (const std::string& file : files) {
    std::stringstream text(read_text(inc + file));
    EXPECT_FALSE(text.str().empty()) << "cannot read " << inc + file;
    std::string line;
    bool in_detail = false;
    while (std::getline(text, line)) {
      if (line.rfind("namespace detail {", 0) == 0) in_detail = true;
      if (line.rfind("}  // namespace detail", 0) == 0) in_detail = false;
      if (in_detail) continue;
      std::smatch m;
      bool tensor_file = file == "tensor.hpp";
      if (std::regex_search(line, m, function) || (tensor_file && std::regex_search(line, m, method)) ||
          std::regex_search(line, m, type) || std::regex_search(line, m, activation))
        names.insert(m[1]);
    }
  }
  return names;
}

// Every call of autodiff::record in the library's sources, as "src/ops/elementwise.cpp:160": one
// per backward the library has (the unary ops share one, whose cases the header scan counts).
std::set<std::string> record_calls_in_source() {
  namespace fs = std::filesystem;
  const fs::path root(FLUX_SOURCE_DIR);
  std::set<std::string> out;
  for (const char* dir : {"src", "include/flux"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      if (rel == "src/autodiff.cpp" || rel == "include/flux/autodiff.hpp") continue;  // the definition
      std::ifstream f(e.path());
      std::string line;
      for (int n = 1; std::getline(f, line); ++n)
        if (line.find("autodiff::record(") != std::string::npos) out.insert(rel + ":" + std::to_string(n));
    }
  }
  return out;
}

// Backwards that a device may legitimately not reach, keyed by "file:line", with the reason.
const std::map<std::string, std::string>& unreached_backwards() {
  static const std::map<std::string, std::string> m = {
      {"src/autocast.cpp:162",
       "autocast's weight cast: bf16/f16 rounding is outside this table's per-dtype tolerances; "
       "tests/test_autocast.cpp checks gradients through autocast against finite differences"},
      {"src/ops/matmul.cpp:100",
       "Dense in bf16 training, bias and relu in the GEMM's epilogue (bf16 kernels only, not swept here): "
       "tests/test_autocast.cpp's DenseReluInTrainingMatchesFloat64AndFiniteDifferences"}};
  return m;
}

// A recorded site's file as the compiler named it (absolute, or relative to the build folder) ->
// relative to the source tree.
std::string source_relative(const std::string& site) {
  for (const char* top : {"src/", "include/flux/"}) {
    if (site.rfind(top, 0) == 0) return site;
    size_t at = site.rfind(std::string("/") + top);
    if (at != std::string::npos) return site.substr(at + 1);
  }
  return site;
}

// ---- the float64 CPU references, computed once per case and input rounding ----
const Result& reference(const ParityCase& c, DType rounding) {
  static std::map<std::pair<std::string, DType>, Result> cache;
  auto key = std::make_pair(c.name, rounding);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run_case(c, DType::f64, Device(), -1, rounding)).first;
  return it->second;
}

// Compares one run with the reference: the value, and the gradient of every input it holds (all, or
// `alone`'s). Returns false, after one failure per disagreement, when anything differs.
bool agrees(const ParityCase& c, const Result& want, DType t, const Device& d, int alone) {
  const double tol = tolerance(t) * c.tol_scale;
  std::string where = c.name + " on " + to_string(d) + " in " + dtype_name(t) +
                      (alone >= 0 ? " (input " + std::to_string(alone) + " alone on the tape)" : "");
  Result got;
  try {
    got = run_case(c, t, d, alone, input_rounding(t));
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": threw " << e.what();
    return false;
  }
  bool ok = true;
  if (!(std::abs(got.value - want.value) <= tol * std::max(1.0, std::abs(want.value)))) {
    ADD_FAILURE() << where << ": value " << got.value << ", float64 CPU " << want.value;
    ok = false;
  }
  for (size_t k = 0; k < got.grads.size(); ++k) {
    const size_t i = alone >= 0 ? size_t(alone) : k;
    const Tensor& g = got.grads[k];
    if (g.device() != d || g.dtype() != t || g.shape() != c.inputs[i].shape) {
      ADD_FAILURE() << where << ": input " << i << " gradient is " << summary(g);
      ok = false;
      continue;
    }
    double err = flux::testing::max_rel_error(g, want.grads[i].to_vector<double>());
    if (!(err <= tol)) {
      ADD_FAILURE() << where << ": gradient of input " << i << " " << to_string(c.inputs[i].shape)
                    << " differs from the float64 CPU gradient by " << err << " (tolerance " << tol << ")";
      ok = false;
    }
  }
  return ok;
}

// Runs `cases` on device d in every swept dtype (and each input alone where the case allows it).
void sweep(const std::vector<ParityCase>& cases, const Device& d) {
  int failing = 0, checked = 0;
  std::vector<std::string> failed_names;
  for (const ParityCase& c : cases) {
    bool case_failed = false;
    for (DType t : swept_dtypes()) {
      const Result& want = reference(c, input_rounding(t));
      std::vector<int> variants;
      if (!(d == Device() && t == DType::f64)) variants.push_back(-1);  // else it is the reference itself
      if (runs_each_input_alone(c))
        for (int i = 0; i < int(c.inputs.size()); ++i) variants.push_back(i);
      for (int alone : variants) {
        ++checked;
        if (!agrees(c, want, t, d, alone)) {
          ++failing;
          case_failed = true;
        }
      }
    }
    if (case_failed) failed_names.push_back(c.name);
  }
  std::string list;
  for (const std::string& n : failed_names) list += " " + n;
  std::printf("[parity] %s: %d of %d runs (case, dtype, inputs on the tape) disagree; %zu of %zu cases:%s\n",
              to_string(d).c_str(), failing, checked, failed_names.size(), cases.size(), list.c_str());
}

}  // namespace

// ---- the table itself ----
TEST(GradientParityTable, CaseNamesAreUniqueAndEveryCaseHasInputs) {  // names key the references
  std::set<std::string> seen;
  for (const ParityCase& c : parity_cases()) {
    EXPECT_TRUE(seen.insert(c.name).second) << "duplicate case name " << c.name;
    EXPECT_FALSE(c.inputs.empty()) << c.name;
  }
}

TEST(GradientParityTable, CoversEveryPublicName) {
  std::set<std::string> names = public_names();
  ASSERT_GT(names.size(), 100u) << "the header scan found too few names; did a header move?";
  std::set<std::string> covered;
  for (const ParityCase& c : parity_cases()) covered.insert(c.api);
  for (const std::string& n : names) {
    bool listed = covered.count(n) || not_differentiable().count(n) || not_layers().count(n);
    EXPECT_TRUE(listed) << "public name `" << n << "` has no gradient-parity case: add one to parity_cases() in "
                        << "tests/test_gradient_parity.cpp (or, if it has no gradient, an entry with the reason "
                        << "to not_differentiable() / not_layers())";
  }
  // and nothing in the table names something the headers no longer declare
  for (const std::string& n : covered) EXPECT_TRUE(names.count(n)) << "case api `" << n << "` is not a public name";
  for (const auto& [n, why] : not_differentiable()) EXPECT_TRUE(names.count(n)) << "`" << n << "` (" << why << ") is gone";
  for (const auto& [n, why] : not_layers()) EXPECT_TRUE(names.count(n)) << "`" << n << "` (" << why << ") is gone";
}

// The table reaches every backward the library records: each autodiff::record call in src/ must
// put a node on a tape while the cases run on the test devices, in every swept dtype. A new op
// with its own backward therefore fails here until a case reaches it.
TEST(GradientParityTable, ReachesEveryRecordedBackward) {
  std::set<std::string> calls = record_calls_in_source();
  ASSERT_GT(calls.size(), 20u) << "the source scan found too few autodiff::record calls; did src/ move?";
  autodiff::note_recorded_sites(true);
  for (const ParityCase& c : parity_cases())
    for (const Device& d : flux::testing::test_devices())
      for (DType t : swept_dtypes()) {
        try {
          run_case(c, t, d, -1, input_rounding(t));
        } catch (const std::exception& e) {
          ADD_FAILURE() << c.name << " on " << to_string(d) << " in " << dtype_name(t) << ": threw " << e.what();
        }
      }
  autodiff::note_recorded_sites(false);
  std::set<std::string> reached;
  for (const std::string& s : autodiff::recorded_sites()) reached.insert(source_relative(s));
  for (const std::string& call : calls) {
    auto why = unreached_backwards().find(call);
    if (why != unreached_backwards().end() && !reached.count(call)) continue;
    EXPECT_TRUE(reached.count(call)) << "no gradient-parity case reaches the backward recorded at " << call
                                     << ": add a case for its op to parity_cases() in tests/test_gradient_parity.cpp";
  }
  for (const std::string& s : reached) EXPECT_TRUE(calls.count(s)) << "recorded at " << s << ", not found by the source scan";
}

// ---- the float64 CPU gradients themselves, against central differences ----
// The sweep above compares every device with the float64 CPU gradient, so a rule that is wrong the
// same way everywhere (crossentropy's gradient in a zero target was 0 on every device, where Flux's is
// log(yhat + eps)) passes it. Here every case's float64 gradient meets an independent reference:
// central differences of the same objective, L = sum(f(inputs) * W), in float64.
double objective_at(const ParityCase& c, const std::vector<std::vector<double>>& in) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < in.size(); ++i) xs.push_back(Tensor(in[i], c.inputs[i].shape).cast(DType::f64));
  seed(20261205);  // as run_case: the random ops draw the same numbers in every evaluation
  Tensor y = c.f(xs);
  std::mt19937_64 gen(7);
  std::vector<double> weights = draw(y.numel(), Range{0.5, 1.5}, gen);
  return sum(y * Tensor(weights, y.shape()).cast(DType::f64)).item<double>();
}

// Cases whose float64 gradient is right although differences cannot show it, each with the reason.
const std::map<std::string, std::string>& not_finite_differenced() {
  static const std::map<std::string, std::string> m = {};
  return m;
}

// Cases that compute in Float32 inside a float64 objective: float32 rounding (~1e-7 of the value)
// divided by the step swamps differences at h = 1e-6, so they take h = 1e-2 and a tolerance of 1e-3
// of the gradient's scale (truncation O(h^2) ~ 1e-4, rounding ~1e-5), still far below a wrong rule.
bool computes_in_float32(const std::string& name) {
  return name == "f32" || name == "layernorm_mixed_dtypes";
}

TEST(GradientParityTable, Float64GradientsMatchFiniteDifferences) {
  int checked = 0;
  for (const ParityCase& c : parity_cases()) {
    if (not_finite_differenced().count(c.name)) continue;
    const Result& want = reference(c, DType::f32);
    std::vector<std::vector<double>> in = inputs_of(c);
    for (auto& v : in)
      for (double& x : v) x = double(float(x));  // as reference(c, Float32): inputs rounded to float32
    const bool coarse = computes_in_float32(c.name);
    const double step = coarse ? 1e-2 : 1e-6, tolerance = coarse ? 1e-3 : 1e-6;
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<double> analytic = want.grads[i].to_vector<double>(), fd(in[i].size());
      double scale = 1;
      for (size_t k = 0; k < in[i].size(); ++k) {
        const double x = in[i][k], h = step * std::max(1.0, std::abs(x));
        in[i][k] = x + h;
        const double up = objective_at(c, in);
        in[i][k] = x - h;
        const double down = objective_at(c, in);
        in[i][k] = x;
        fd[k] = (up - down) / (2 * h);
        scale = std::max(scale, std::abs(fd[k]));
      }
      // Differences at step h carry ~1e-10 of rounding and O(h^2) of truncation: 1e-6 of the
      // gradient's own scale separates a wrong rule from both.
      double err = 0;
      size_t worst = 0;
      for (size_t k = 0; k < fd.size(); ++k)
        if (!(std::abs(analytic[k] - fd[k]) <= err)) err = std::abs(analytic[k] - fd[k]), worst = k;
      ++checked;
      EXPECT_LE(err / scale, tolerance) << c.name << ": input " << i << " " << to_string(c.inputs[i].shape)
                                   << " element " << worst << ": float64 gradient " << analytic[worst]
                                   << ", central differences " << fd[worst];
    }
  }
  std::printf("[parity] %d inputs of %zu cases checked against central differences\n", checked,
              parity_cases().size());
}

// ---- the sweep on every device ----
class GradientParity : public ::testing::TestWithParam<Device> {};

TEST_P(GradientParity, Ops) { sweep(op_cases(), GetParam()); }
TEST_P(GradientParity, Losses) { sweep(loss_cases(), GetParam()); }
TEST_P(GradientParity, LayersAndActivations) { sweep(layer_cases(), GetParam()); }

FLUX_DEVICE_SUITE(GradientParity);
