// Replays tests/reference/generate.py's PyTorch float64 references on every test device, in float64
// and float32: each case's op runs on the inputs, the outputs are compared with the references, and
// the gradient of sum(output * cotangent) with respect to every differentiable input is compared
// with PyTorch's. Error cases must throw flux::Error with the exact message. One test per device and
// dtype; it prints every case that differs and fails with the list of ops.
//
// Error measure, per tensor: max_i |got_i - want_i| / max_j |want_j|, relative to the tensor's scale
// (all-zero references compare absolutely). This is what rounding-error analysis bounds: an element
// computed by sums of n products carries an error up to about n u sum_k |a_k b_k|, which follows the
// size of the terms (the tensor's scale), not the element's own value; an element that cancels to a
// small value keeps the absolute error of its terms. (The earlier measure, relative to each element
// with a floor at 1% of the scale, failed a gradient element 100x smaller than its tensor's largest
// on an AMX Xeon at 2.06e-5, an error of 2e-7 of the scale.) Integer and Bool outputs compare
// exactly. Default tolerances per dtype: kTolerance below; a case may raise its own in generate.py
// ("tol").
//
// The cases file comes from $FLUX_REFERENCE_CASES (ctest sets it; see tests/reference.cmake).
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "flux/flux.hpp"
#include "test_devices.hpp"

namespace flux {
namespace {

using json = nlohmann::json;
using Inputs = std::vector<Tensor>;
// An op of the table: the (device, dtype) inputs, the case's args and the float dtype of the run.
using OpFn = std::function<std::vector<Tensor>(const Inputs&, const json&, DType)>;

// float32: unit roundoff u = 6.0e-8; the cases' reductions are at most a few hundred terms long
// (gamma_n = n u <= 2e-5 for n <= 330) through a few chained ops, and kernels may sum in any order
// (blocked GEMMs, AVX2 vs AVX-512 vs AMX), so 2e-5 of the scale is the bound; measured worst: see
// the replay's summary line. float64: u = 1.1e-16, the same analysis gives ~4e-14; 1e-10 leaves room
// for the float64 references' own rounding (PyTorch's kernels) and a few ill-conditioned cases.
const std::map<std::string, double> kTolerance = {{"f64", 1e-10}, {"f32", 2e-5}};

const json& reference() {
  static const json data = [] {
    const char* path = std::getenv("FLUX_REFERENCE_CASES");
    if (!path || !*path) return json();
    std::ifstream in(path);
    if (!in) return json();
    return json::parse(in);
  }();
  return data;
}

DType dtype_of(const std::string& s) {
  static const std::map<std::string, DType> names = {{"f64", DType::f64}, {"f32", DType::f32}, {"i64", DType::i64},
                                                      {"i32", DType::i32}, {"bool", DType::boolean}};
  return names.at(s);
}

// ---- option helpers (the args written by generate.py) ----
std::vector<int64_t> ints(const json& args, const char* key, std::vector<int64_t> fallback = {}) {
  return args.contains(key) ? args[key].get<std::vector<int64_t>>() : fallback;
}
int axis(const json& args) { return args.at("axes")[0].get<int>(); }
bool keepdims(const json& args) { return args.value("keepdims", false); }
Agg agg(const json& args) {
  std::string a = args.value("agg", "mean");
  return a == "sum" ? Agg::sum : a == "none" ? Agg::none : Agg::mean;
}
Padding padding(const json& args) {
  if (args.contains("pad") && args["pad"].is_string()) return Padding(SamePad());
  return Padding(ints(args, "pad", {0}));
}
ConvParams conv_params(const json& args) {
  return {.stride = Dims(ints(args, "stride", {1})), .pad = padding(args), .dilation = Dims(ints(args, "dilation", {1})),
          .groups = args.value("groups", int64_t(1))};
}
ConvTransposeParams conv_transpose_params(const json& args) {
  return {.stride = Dims(ints(args, "stride", {1})), .pad = padding(args), .dilation = Dims(ints(args, "dilation", {1})),
          .groups = args.value("groups", int64_t(1)), .output_padding = Dims(ints(args, "output_padding", {0}))};
}
PoolParams pool_params(const json& args) {
  PoolParams p;
  if (args.contains("stride")) p.stride = Dims(ints(args, "stride"));
  p.pad = padding(args);
  return p;
}
PoolOptions pool_options(const json& args) {
  PoolOptions o;
  if (args.contains("stride")) o.stride = Dims(ints(args, "stride"));
  o.pad = padding(args);
  return o;
}
Activation activation(const json& args) {
  std::string a = args.value("activation", "identity");
  if (a == "relu") return relu;
  if (a == "sigmoid") return sigmoid;
  if (a == "tanh") return tanh_act;
  if (a == "gelu") return gelu;
  if (a != "identity") throw std::runtime_error("replay: unknown activation " + a);
  return Activation();
}
Tensor optional(const Inputs& in, size_t i) { return i < in.size() ? in[i] : Tensor(); }

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

// The op table: one entry per `op` key used in generate.py.
const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = [] {
    std::map<std::string, OpFn> t;
    auto unary = [&](const char* name, Tensor (*fn)(const Tensor&)) {
      t[name] = [fn](const Inputs& in, const json&, DType) { return one(fn(in[0])); };
    };
    auto binary = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&)) {
      t[name] = [fn](const Inputs& in, const json&, DType) { return one(fn(in[0], in[1])); };
    };
    // elementwise
    binary("add", add); binary("sub", sub); binary("mul", mul); binary("div", div);
    binary("maximum", maximum); binary("minimum", minimum);
    binary("eq", eq); binary("ne", ne); binary("lt", lt); binary("le", le); binary("gt", gt); binary("ge", ge);
    t["pow"] = [](const Inputs& in, const json&, DType) { return one(pow(in[0], in[1])); };
    t["pow_scalar"] = [](const Inputs& in, const json& a, DType) { return one(pow(in[0], a.at("exponent").get<double>())); };
    auto scalar = [&](const char* name, Tensor (*fn)(const Tensor&, double)) {
      t[name] = [fn](const Inputs& in, const json& a, DType) { return one(fn(in[0], a.at("scalar").get<double>())); };
    };
    scalar("add_scalar", [](const Tensor& x, double s) { return x + s; });
    scalar("sub_scalar", [](const Tensor& x, double s) { return x - s; });
    scalar("mul_scalar", [](const Tensor& x, double s) { return x * s; });
    scalar("div_scalar", [](const Tensor& x, double s) { return x / s; });
    scalar("scalar_add", [](const Tensor& x, double s) { return s + x; });
    scalar("scalar_sub", [](const Tensor& x, double s) { return s - x; });
    scalar("scalar_mul", [](const Tensor& x, double s) { return s * x; });
    scalar("scalar_div", [](const Tensor& x, double s) { return s / x; });
    t["where"] = [](const Inputs& in, const json&, DType) { return one(where(in[0], in[1], in[2])); };
    unary("neg", neg); unary("exp", exp); unary("log", log); unary("sqrt", sqrt); unary("abs", abs);
    unary("sign", sign); unary("square", square); unary("sin", sin); unary("cos", cos); unary("log1p", log1p);
    unary("tanh", flux::tanh);
    t["clamp"] = [](const Inputs& in, const json& a, DType) {
      return one(clamp(in[0], a.at("lo").get<double>(), a.at("hi").get<double>()));
    };
    // activations (the layer values)
    t["sigmoid"] = [](const Inputs& in, const json&, DType) { return one(sigmoid(in[0])); };
    t["relu"] = [](const Inputs& in, const json&, DType) { return one(relu(in[0])); };
    t["tanh_act"] = [](const Inputs& in, const json&, DType) { return one(tanh_act(in[0])); };
    t["identity"] = [](const Inputs& in, const json&, DType) { return one(identity(in[0])); };
    t["gelu"] = [](const Inputs& in, const json&, DType) { return one(gelu(in[0])); };
    t["softplus"] = [](const Inputs& in, const json&, DType) { return one(softplus(in[0])); };
    t["swish"] = [](const Inputs& in, const json&, DType) { return one(swish(in[0])); };
    t["leakyrelu"] = [](const Inputs& in, const json& a, DType) {
      return one(a.contains("a") ? leakyrelu(in[0], a["a"].get<double>()) : leakyrelu(in[0]));
    };
    t["elu"] = [](const Inputs& in, const json& a, DType) {
      return one(a.contains("a") ? elu(in[0], a["a"].get<double>()) : elu(in[0]));
    };
    // linear algebra, reductions, softmax
    t["matmul"] = [](const Inputs& in, const json& a, DType) {
      return one(matmul(in[0], in[1], a.value("trans_a", false), a.value("trans_b", false)));
    };
    auto reduction = [&](const char* name, Tensor (*all)(const Tensor&), Tensor (*along)(const Tensor&, int, bool)) {
      t[name] = [all, along](const Inputs& in, const json& a, DType) {
        return one(a.contains("axes") ? along(in[0], axis(a), keepdims(a)) : all(in[0]));
      };
    };
    reduction("mean", mean, mean);
    reduction("max", max, max);
    reduction("min", min, min);
    t["sum"] = [](const Inputs& in, const json& a, DType) {
      if (!a.contains("axes")) return one(sum(in[0]));
      if (a["axes"].size() == 1) return one(sum(in[0], axis(a), keepdims(a)));
      return one(sum(in[0], a["axes"].get<std::vector<int>>(), keepdims(a)));
    };
    t["argmax"] = [](const Inputs& in, const json& a, DType) { return one(argmax(in[0], axis(a), keepdims(a))); };
    t["argmin"] = [](const Inputs& in, const json& a, DType) { return one(argmin(in[0], axis(a), keepdims(a))); };
    t["softmax"] = [](const Inputs& in, const json& a, DType) { return one(softmax(in[0], axis(a))); };
    t["logsoftmax"] = [](const Inputs& in, const json& a, DType) { return one(logsoftmax(in[0], axis(a))); };
    t["logsumexp"] = [](const Inputs& in, const json& a, DType) { return one(logsumexp(in[0], axis(a), keepdims(a))); };
    // shape and indexing
    t["broadcast_to"] = [](const Inputs& in, const json& a, DType) { return one(broadcast_to(in[0], Shape(ints(a, "shape")))); };
    t["sum_to"] = [](const Inputs& in, const json& a, DType) { return one(sum_to(in[0], Shape(ints(a, "shape")))); };
    t["permute"] = [](const Inputs& in, const json& a, DType) { return one(permute(in[0], a.at("axes").get<std::vector<int>>())); };
    t["reshape"] = [](const Inputs& in, const json& a, DType) { return one(in[0].reshape(Shape(ints(a, "shape")))); };
    t["transpose"] = [](const Inputs& in, const json&, DType) { return one(in[0].transpose()); };
    t["flatten"] = [](const Inputs& in, const json&, DType) { return one(flatten(in[0])); };
    t["concat"] = [](const Inputs& in, const json& a, DType) { return one(concat(in, axis(a))); };
    t["stack"] = [](const Inputs& in, const json& a, DType) { return one(stack(in, axis(a))); };
    t["index_select"] = [](const Inputs& in, const json& a, DType) { return one(index_select(in[0], axis(a), in[1])); };
    t["gather"] = [](const Inputs& in, const json& a, DType) { return one(gather(in[0], axis(a), in[1])); };
    t["slice"] = [](const Inputs& in, const json& a, DType) {
      return one(slice(in[0], axis(a), a.at("start").get<int64_t>(), a.at("stop").get<int64_t>()));
    };
    t["slice_rows"] = [](const Inputs& in, const json& a, DType) {
      return one(in[0].slice(a.at("start").get<int64_t>(), a.at("stop").get<int64_t>()));
    };
    t["onehot"] = [](const Inputs& in, const json& a, DType d) { return one(onehot(in[0], a.at("nclasses").get<int64_t>(), d)); };
    t["onecold"] = [](const Inputs& in, const json&, DType) { return one(onecold(in[0])); };
    // convolution, pooling, normalisation
    t["conv"] = [](const Inputs& in, const json& a, DType) { return one(conv(in[0], in[1], optional(in, 2), conv_params(a))); };
    t["conv_transpose"] = [](const Inputs& in, const json& a, DType) {
      return one(conv_transpose(in[0], in[1], optional(in, 2), conv_transpose_params(a)));
    };
    t["maxpool"] = [](const Inputs& in, const json& a, DType) { return one(maxpool(in[0], Dims(ints(a, "window")), pool_params(a))); };
    t["meanpool"] = [](const Inputs& in, const json& a, DType) { return one(meanpool(in[0], Dims(ints(a, "window")), pool_params(a))); };
    t["adaptive_maxpool"] = [](const Inputs& in, const json& a, DType) { return one(adaptive_maxpool(in[0], Dims(ints(a, "out")))); };
    t["adaptive_meanpool"] = [](const Inputs& in, const json& a, DType) { return one(adaptive_meanpool(in[0], Dims(ints(a, "out")))); };
    t["global_maxpool"] = [](const Inputs& in, const json&, DType) { return one(global_maxpool(in[0])); };
    t["global_meanpool"] = [](const Inputs& in, const json&, DType) { return one(global_meanpool(in[0])); };
    t["batchnorm"] = [](const Inputs& in, const json& a, DType) {
      return one(batchnorm(in[0], optional(in, 1), optional(in, 2), a.at("eps").get<double>()));
    };
    t["batchnorm_stats"] = [](const Inputs& in, const json& a, DType) {
      return one(batchnorm(in[0], in[1], in[2], in[3], in[4], a.at("eps").get<double>()));
    };
    // losses
    auto loss = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&, LossOptions)) {
      t[name] = [fn](const Inputs& in, const json& a, DType) { return one(fn(in[0], in[1], {.agg = agg(a)})); };
    };
    loss("mse", mse); loss("mae", mae); loss("logitcrossentropy", logitcrossentropy);
    loss("logitbinarycrossentropy", logitbinarycrossentropy);
    t["huber"] = [](const Inputs& in, const json& a, DType) {
      return one(huber(in[0], in[1], {.agg = agg(a)}, a.value("delta", 1.0)));
    };
    // eps absent: the default (Flux's epseltype(yhat)) is what these cases check
    auto eps_loss = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&, LossOptions, std::optional<double>)) {
      t[name] = [fn](const Inputs& in, const json& a, DType) {
        return one(a.contains("eps") ? fn(in[0], in[1], {.agg = agg(a)}, a["eps"].get<double>())
                                     : fn(in[0], in[1], {.agg = agg(a)}, std::nullopt));
      };
    };
    eps_loss("crossentropy", crossentropy);
    eps_loss("binarycrossentropy", binarycrossentropy);
    eps_loss("kldivergence", kldivergence);
    // layers, built from the case's arrays
    t["Dense"] = [](const Inputs& in, const json& a, DType) { return one(Dense(in[1], optional(in, 2), activation(a))(in[0])); };
    t["Conv"] = [](const Inputs& in, const json& a, DType) {
      return one(Conv(in[1], optional(in, 2), activation(a), conv_params(a))(in[0]));
    };
    t["ConvTranspose"] = [](const Inputs& in, const json& a, DType) {
      return one(ConvTranspose(in[1], optional(in, 2), activation(a), conv_transpose_params(a))(in[0]));
    };
    t["MaxPool"] = [](const Inputs& in, const json& a, DType) { return one(MaxPool(Dims(ints(a, "window")), pool_options(a))(in[0])); };
    t["MeanPool"] = [](const Inputs& in, const json& a, DType) { return one(MeanPool(Dims(ints(a, "window")), pool_options(a))(in[0])); };
    t["AdaptiveMaxPool"] = [](const Inputs& in, const json& a, DType) { return one(AdaptiveMaxPool(Dims(ints(a, "out")))(in[0])); };
    t["AdaptiveMeanPool"] = [](const Inputs& in, const json& a, DType) { return one(AdaptiveMeanPool(Dims(ints(a, "out")))(in[0])); };
    t["GlobalMaxPool"] = [](const Inputs& in, const json&, DType) { return one(GlobalMaxPool()(in[0])); };
    t["GlobalMeanPool"] = [](const Inputs& in, const json&, DType) { return one(GlobalMeanPool()(in[0])); };
    t["BatchNorm"] = [](const Inputs& in, const json& a, DType d) {
      BatchNorm bn(in[1].size(0), activation(a), {.momentum = a.value("momentum", 0.1), .dtype = d});
      bn.weight = in[1];
      bn.bias = in[2];
      // fresh copies: the layer updates its running statistics in place
      bn.running_mean = in[3].contiguous_copy();
      bn.running_var = in[4].contiguous_copy();
      bn.num_batches_tracked = to(bn.num_batches_tracked, in[0].device());
      bn.active = a.value("train", false);
      Tensor y = bn(in[0]);
      if (!a.value("train", false)) return one(y);
      return std::vector<Tensor>{y, bn.running_mean, bn.running_var};
    };
    t["Chain_mlp"] = [](const Inputs& in, const json&, DType) {
      return one(Chain(Dense(in[1], in[2], relu), Dense(in[3], in[4]), softmax)(in[0]));
    };
    t["SkipConnection"] = [](const Inputs& in, const json&, DType) {
      return one(SkipConnection(Dense(in[1], in[2], tanh_act), plus)(in[0]));
    };
    t["Parallel"] = [](const Inputs& in, const json&, DType) {
      return one(Parallel(vcat, Dense(in[1], in[2]), Dense(in[3], in[4], relu))(in[0]));
    };
    // sequence layers: normalisation, embedding, attention, recurrent cells and layers, fusion
    t["layernorm"] = [](const Inputs& in, const json& a, DType) {
      return one(layernorm(in[0], optional(in, 1), optional(in, 2), a.at("eps").get<double>()));
    };
    t["LayerNorm"] = [](const Inputs& in, const json& a, DType d) {
      LayerNorm l(in[0].size(-1), activation(a), {.dtype = d});
      l.weight = in[1];
      l.bias = in[2];
      return one(l(in[0]));
    };
    t["groupnorm"] = [](const Inputs& in, const json& a, DType) {
      return one(groupnorm(in[0], a.at("groups").get<int64_t>(), optional(in, 1), optional(in, 2), a.at("eps").get<double>()));
    };
    t["GroupNorm"] = [](const Inputs& in, const json& a, DType d) {
      GroupNorm g(in[0].size(1), a.at("groups").get<int64_t>(), {.dtype = d});
      g.weight = in[1];
      g.bias = in[2];
      return one(g(in[0]));
    };
    t["InstanceNorm"] = [](const Inputs& in, const json& a, DType d) {
      InstanceNorm l(in[0].size(1), {.affine = a.value("affine", false), .dtype = d});
      if (l.weight.defined()) {
        l.weight = in[1];
        l.bias = in[2];
      }
      return one(l(in[0]));
    };
    t["embedding"] = [](const Inputs& in, const json&, DType) { return one(embedding(in[0], in[1])); };
    t["Embedding"] = [](const Inputs& in, const json&, DType) { return one(Embedding(in[0])(in[1])); };
    t["dot_product_attention"] = [](const Inputs& in, const json& a, DType) {
      Tensor mask = optional(in, 3);
      if (a.value("causal", false)) mask = causal_mask(in[0].size(-2), in[1].size(-2), in[0].device());
      return one(dot_product_attention(in[0], in[1], in[2], mask, a.value("scale", 0.0)));
    };
    auto attention_layer = [](const json& a, DType d, const Tensor& w_in, const Tensor& b_in, const Tensor& w_out,
                              const Tensor& b_out) {
      MultiHeadAttention m(w_in.size(1), {.nheads = a.at("nheads").get<int64_t>(), .causal = a.value("causal", false),
                                          .bias = b_in.defined(), .dtype = d});
      m.in_proj_weight = w_in;
      m.in_proj_bias = b_in;
      m.out_proj.weight = w_out;
      m.out_proj.bias = b_out;
      return m;
    };
    t["MultiHeadAttention"] = [attention_layer](const Inputs& in, const json& a, DType d) {
      return one(attention_layer(a, d, in[1], in[2], in[3], in[4])(in[0]));
    };
    t["MultiHeadAttention_cross"] = [attention_layer](const Inputs& in, const json& a, DType d) {
      return one(attention_layer(a, d, in[3], Tensor(), in[4], Tensor())(in[0], in[1], in[2]));
    };
    // cells: weights from `first` on in PyTorch's order weight_ih, weight_hh[, bias_ih, bias_hh]
    auto set_cell = [](auto& cell, const Inputs& in, size_t first) {
      cell.weight_ih = in[first];
      cell.weight_hh = in[first + 1];
      cell.bias_ih = optional(in, first + 2);
      cell.bias_hh = optional(in, first + 3);
    };
    auto options = [](const json& a, DType d) {
      return RecurrentOptions{.num_layers = a.value("num_layers", int64_t(1)), .bias = a.value("bias", true), .dtype = d};
    };
    t["RNNCell"] = [=](const Inputs& in, const json& a, DType d) {
      RNNCell cell(in[0].size(1), in[1].size(1), a.value("activation", "") == "relu" ? Activation(relu) : Activation(tanh_act), options(a, d));
      set_cell(cell, in, 2);
      return one(cell(in[0], in[1]));
    };
    t["LSTMCell"] = [=](const Inputs& in, const json& a, DType d) {
      LSTMCell cell(in[0].size(1), in[1].size(1), options(a, d));
      set_cell(cell, in, 3);
      LSTMState s = cell(in[0], {in[1], in[2]});
      return std::vector<Tensor>{s.h, s.c};
    };
    t["GRUCell"] = [=](const Inputs& in, const json& a, DType d) {
      GRUCell cell(in[0].size(1), in[1].size(1), options(a, d));
      set_cell(cell, in, 2);
      return one(cell(in[0], in[1]));
    };
    // sequence layers: x, the initial state(s), then each layer's weights (4 per layer, 2 without bias)
    auto set_layers = [=](auto& layer, const Inputs& in, size_t first, const json& a) {
      size_t per = a.value("bias", true) ? 4 : 2;
      for (size_t l = 0; l < layer.layers.size(); ++l) set_cell(layer.layers[l], in, first + l * per);
      if (per == 2)
        for (auto& cell : layer.layers) cell.bias_ih = cell.bias_hh = Tensor();
    };
    t["RNN"] = [=](const Inputs& in, const json& a, DType d) {
      RNN rnn(in[0].size(2), in[1].size(2), tanh_act, options(a, d));
      set_layers(rnn, in, 2, a);
      SequenceOutput o = rnn.forward(in[0], in[1]);
      return std::vector<Tensor>{o.output, o.h};
    };
    t["LSTM"] = [=](const Inputs& in, const json& a, DType d) {
      LSTM lstm(in[0].size(2), in[1].size(2), options(a, d));
      set_layers(lstm, in, 3, a);
      LSTMOutput o = lstm.forward(in[0], {in[1], in[2]});
      return std::vector<Tensor>{o.output, o.state.h, o.state.c};
    };
    t["GRU"] = [=](const Inputs& in, const json& a, DType d) {
      GRU gru(in[0].size(2), in[1].size(2), options(a, d));
      set_layers(gru, in, 2, a);
      SequenceOutput o = gru.forward(in[0], in[1]);
      return std::vector<Tensor>{o.output, o.h};
    };
    t["Maxout"] = [](const Inputs& in, const json&, DType) {
      return one(Maxout(Dense(in[1], in[2]), Dense(in[3], in[4]))(in[0]));
    };
    t["Bilinear"] = [](const Inputs& in, const json& a, DType d) {
      Bilinear b(in[2].size(1), in[2].size(2), in[2].size(0), activation(a), {.dtype = d});
      b.weight = in[2];
      b.bias = in[3];
      return one(b(in[0], in[1]));
    };
    t["Bilinear_self"] = [](const Inputs& in, const json&, DType d) {
      Bilinear b(in[1].size(1), in[1].size(2), in[1].size(0), {.bias = false, .dtype = d});
      b.weight = in[1];
      return one(b(in[0]));
    };
    return t;
  }();
  return table;
}

// ---- running a case ----
Tensor host_tensor(const json& spec, DType float_dtype) {
  Shape shape(spec.at("shape").get<std::vector<int64_t>>());
  std::string kind = spec.at("kind");
  if (kind == "i64") return Tensor(spec.at("data").get<std::vector<int64_t>>(), shape);
  if (kind == "bool") return Tensor(spec.at("data").get<std::vector<uint8_t>>(), shape, DType::boolean);
  return Tensor(spec.at("data").get<std::vector<double>>(), shape).cast(float_dtype);
}

// max_i |got_i - want_i| / max|want|; absolute where the reference is all zeros.
double relative_error(const std::vector<double>& got, const std::vector<double>& want, size_t* where) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  const double denominator = scale > 0 ? scale : 1.0;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double e = std::abs(got[i] - want[i]) / denominator;
    if (!(e <= worst)) {  // NaN counts as the worst
      worst = std::isnan(e) ? INFINITY : e;
      *where = i;
    }
  }
  return worst;
}

// Compares one tensor; returns an empty string when it matches, else what differs.
struct Worst {
  double error = 0;
  std::string where;
};

std::string compare(const std::string& what, const Tensor& got, const json& want, DType float_dtype, double tol, Worst& worst) {
  std::ostringstream os;
  if (!got.defined()) return what + " is undefined";
  Shape shape(want.at("shape").get<std::vector<int64_t>>());
  if (got.shape() != shape) {
    os << what << " has shape " << to_string(got.shape()) << ", expected " << to_string(shape);
    return os.str();
  }
  std::string kind = want.at("kind");
  DType expected = kind == "i64" ? DType::i64 : kind == "bool" ? DType::boolean : float_dtype;
  if (got.dtype() != expected) {
    os << what << " has dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(expected);
    return os.str();
  }
  std::vector<double> g = got.to_vector<double>(), w = want.at("data").get<std::vector<double>>();
  size_t at = 0;
  double err = kind == "float" ? relative_error(g, w, &at) : 0;
  if (kind != "float")
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i]) {
        err = INFINITY;
        at = i;
        break;
      }
  if (kind == "float" && err > worst.error) worst = {err, what};
  if (err <= tol) return "";
  os << what << ": relative error " << err << " > " << tol << " (element " << at << ": got " << g[at] << ", want " << w[at] << ")";
  return os.str();
}

// Runs one case on (device, dtype); returns the list of differences (empty: it matches).
std::vector<std::string> run_case(const json& c, const Device& dev, const std::string& dtype_name_, Worst& worst) {
  DType dt = dtype_of(dtype_name_);
  double tol = c.at("tol").value(dtype_name_, kTolerance.at(dtype_name_));
  const OpFn& fn = op_table().at(c.at("op").get<std::string>());
  const json& specs = c.at("inputs");
  autodiff::Tape tape;
  Inputs inputs;
  std::vector<bool> wanted;
  for (const json& s : specs) {
    Tensor x = to(host_tensor(s, dt), dev);
    wanted.push_back(s.at("grad").get<bool>());
    inputs.push_back(wanted.back() ? tape.leaf(x) : x);
  }
  std::vector<Tensor> outs = fn(inputs, c.at("args"), dt);
  const json& want_outs = c.at("outputs");
  std::vector<std::string> diffs;
  if (outs.size() != want_outs.size()) return {"gave " + std::to_string(outs.size()) + " outputs, expected " + std::to_string(want_outs.size())};
  Tensor total;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (std::string d = compare("output " + std::to_string(k), outs[k], want_outs[k], dt, tol, worst); !d.empty()) diffs.push_back(d);
    const json& cot = want_outs[k].at("cotangent");
    if (cot.is_null() || !diffs.empty()) continue;
    Tensor r = to(Tensor(cot.get<std::vector<double>>(), outs[k].shape()).cast(dt), dev);
    Tensor term = sum(outs[k] * r);
    total = total.defined() ? total + term : term;
  }
  bool any_grad = false;
  for (bool w : wanted) any_grad = any_grad || w;
  if (!diffs.empty() || !any_grad || !total.defined()) return diffs;
  tape.backward(total);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!wanted[i]) continue;
    if (std::string d = compare("gradient of input " + std::to_string(i), tape.grad(inputs[i]), c.at("grads")[i], dt, tol, worst); !d.empty())
      diffs.push_back(d);
  }
  return diffs;
}

class Reference : public ::testing::TestWithParam<std::tuple<Device, std::string>> {
 protected:
  void SetUp() override {
    if (!reference().is_null()) return;
    if (std::getenv("CI")) FAIL() << "no reference cases at $FLUX_REFERENCE_CASES (generate.py's output)";
    GTEST_SKIP() << "no reference cases: set FLUX_REFERENCE_CASES to generate.py's output (ctest does)";
  }
};

TEST_P(Reference, MatchesPyTorchFloat64) {
  auto [dev, dtype] = GetParam();
  std::set<std::string> differing_ops;
  int ran = 0;
  Worst worst_overall;
  for (const json& c : reference().at("cases")) {
    std::vector<std::string> dtypes = c.at("dtypes");
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) continue;
    ++ran;
    std::vector<std::string> diffs;
    Worst worst;
    try {
      diffs = run_case(c, dev, dtype, worst);
    } catch (const std::exception& e) {
      diffs.push_back(std::string("threw: ") + e.what());
    }
    for (const std::string& d : diffs)
      std::printf("DIFFERS %s [%s] on %s %s: %s\n", c.at("name").get<std::string>().c_str(),
                  c.at("op").get<std::string>().c_str(), to_string(dev).c_str(), dtype.c_str(), d.c_str());
    if (!diffs.empty()) differing_ops.insert(c.at("op").get<std::string>());
    if (worst.error > worst_overall.error) worst_overall = {worst.error, c.at("name").get<std::string>() + " " + worst.where};
  }
  std::string list;
  for (const std::string& op : differing_ops) list += (list.empty() ? "" : ", ") + op;
  std::printf("%s %s: %d cases, %zu ops differ%s%s; largest relative error %.3g (%s)\n", to_string(dev).c_str(),
              dtype.c_str(), ran, differing_ops.size(), list.empty() ? "" : ": ", list.c_str(), worst_overall.error,
              worst_overall.where.c_str());
  EXPECT_GT(ran, 100);
  EXPECT_TRUE(differing_ops.empty()) << "ops that differ from PyTorch float64 on " << to_string(dev) << " " << dtype << ": " << list;
}

TEST_P(Reference, ErrorCasesThrowTheirMessage) {
  auto [dev, dtype] = GetParam();
  if (dtype != "f64") GTEST_SKIP() << "error cases carry their own dtypes; run once per device";
  int ran = 0;
  for (const json& c : reference().at("errors")) {
    Inputs inputs;
    for (const json& s : c.at("inputs"))
      inputs.push_back(zeros(Shape(s.at("shape").get<std::vector<int64_t>>()), dtype_of(s.at("dtype")), dev));
    std::string name = c.at("name"), message = c.at("message");
    if (size_t at = message.find("{device}"); at != std::string::npos) message.replace(at, 8, to_string(dev));
    ++ran;
    try {
      op_table().at(c.at("op").get<std::string>())(inputs, c.at("args"), DType::f32);
      ADD_FAILURE() << name << " on " << to_string(dev) << ": no error, expected \"" << message << "\"";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message) << name << " on " << to_string(dev);
    }
  }
  EXPECT_GT(ran, 10);
}

std::string reference_test_name(const ::testing::TestParamInfo<std::tuple<Device, std::string>>& info) {
  std::string s = to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
  for (char& ch : s)
    if (ch == ':') ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Devices, Reference,
                         ::testing::Combine(::testing::ValuesIn(testing::test_devices()), ::testing::Values("f64", "f32")),
                         reference_test_name);

}  // namespace
}  // namespace flux
