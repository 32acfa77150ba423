// The op registry's entries (registry.hpp): each op's name and ONNX form. The forms follow
// https://onnx.ai/onnx/operators/; a writer reads g.opset() where the form changed between opsets.
#include "src/ops/registry.hpp"

#include <limits>

#include "flux/backend.hpp"
#include "flux/ops.hpp"
#include "src/internal.hpp"
#include "src/ops/ops_internal.hpp"

namespace flux::ops {

using flux::detail::fail;
using G = OnnxGraph;

namespace {

void conv_like(G& g, const Call& c, const char* type) {
  const trace::Event& e = c.e;
  const bool relu = e.int1("relu");
  std::vector<std::string> args{c.in[0], c.in[1]};
  if (!c.in[2].empty()) args.push_back(c.in[2]);
  std::vector<G::Attr> attrs{{"kernel_shape", e.ints("kernel")}, {"strides", e.ints("strides")},
                             {"dilations", e.ints("dilations")}, {"pads", e.ints("pads")}, {"group", e.int1("group")}};
  if (e.op == &conv_transpose) attrs.push_back({"output_padding", e.ints("output_padding")});
  std::string y = g.node(type, args, attrs, {relu ? g.fresh("conv") : c.out});
  if (relu) g.node("Relu", {y}, {}, {c.out});
}

void pool(G& g, const Call& c, const char* type) {
  std::vector<G::Attr> attrs{{"kernel_shape", c.e.ints("kernel")}, {"strides", c.e.ints("strides")}, {"pads", c.e.ints("pads")}};
  if (c.e.op == &meanpool) attrs.push_back({"count_include_pad", int64_t(1)});
  g.node(type, c.in, attrs, {c.out});
}

/// flux's recurrence takes the input gates xg = x W_ihᵀ + b_ih (T, N, G) already computed: ONNX's
/// LSTM/GRU/RNN then gets X = xg with W = a permutation (ONNX's gate order from PyTorch's), zero W
/// bias, R = W_hh with its gate blocks permuted (a Gather on the parameter), Rb = b_hh likewise.
void recurrence(G& g, const Call& c) {
  const Tensor& xg = c.e.inputs[0];
  const int64_t gsize = xg.shape()[2];
  const bool lstm = c.e.op == &lstm_recurrence, gru = c.e.op == &gru_recurrence;
  const int64_t h = gsize / (lstm ? 4 : gru ? 3 : 1);
  // ONNX block b takes PyTorch block order[b]: LSTM ONNX i o f c <- PyTorch i f g o; GRU z r h <- r z n.
  std::vector<int64_t> order = lstm ? std::vector<int64_t>{0, 3, 1, 2} : gru ? std::vector<int64_t>{1, 0, 2} : std::vector<int64_t>{0};
  std::vector<int64_t> rows;
  for (int64_t b : order)
    for (int64_t i = 0; i < h; ++i) rows.push_back(b * h + i);
  std::vector<double> eye(size_t(gsize * gsize), 0.0);
  for (int64_t r = 0; r < gsize; ++r) eye[size_t(r * gsize + rows[size_t(r)])] = 1.0;
  const Tensor w = Tensor(eye, Shape{1, gsize, gsize}).cast(xg.dtype());
  std::string idx = g.ints(rows);
  auto permuted = [&](const std::string& x) { return g.node("Unsqueeze", {g.node("Gather", {x, idx}, {{"axis", int64_t(0)}}), g.ints({0})}); };
  std::string rb = c.in[2].empty() ? g.constant(zeros(Shape{1, gsize}, xg.dtype())) : permuted(c.in[2]);
  std::string bias = g.node("Concat", {g.constant(zeros(Shape{1, gsize}, xg.dtype())), rb}, {{"axis", int64_t(1)}});
  std::vector<std::string> inputs{c.in[0], g.constant(w), permuted(c.in[1]), bias, "", g.node("Unsqueeze", {c.in[3], g.ints({0})})};
  if (lstm) inputs.push_back(g.node("Unsqueeze", {c.in[4], g.ints({0})}));
  std::vector<std::string> outs{g.fresh("Y"), g.fresh("Y_h")};
  if (lstm) outs.push_back(g.fresh("Y_c"));
  std::vector<G::Attr> attrs{{"hidden_size", h}};
  if (gru) attrs.push_back({"linear_before_reset", int64_t(1)});
  if (!lstm && !gru && c.e.int1("relu")) attrs.push_back({"activations", std::vector<std::string>{"Relu"}});
  g.node(lstm ? "LSTM" : gru ? "GRU" : "RNN", inputs, attrs, outs);
  std::string seq = g.node("Squeeze", {outs[0], g.ints({1})}, {}, {lstm ? g.fresh("Squeeze") : c.out});  // (T, N, H)
  if (lstm) g.node("Concat", {seq, outs[2]}, {{"axis", int64_t(0)}}, {c.out});  // rows h_1..h_T, then c_T
}

}  // namespace

// ---- elementwise ----
// Div, Pow, Max, Min, Where and Softplus import through runners of their own (src/onnx/import_ops.cpp):
// ONNX's integer division, exponent dtype, any number of inputs, inputs on two devices, its formula.
const Op add{.name = "add", .onnx = "Add", .binary = flux::add}, sub{.name = "sub", .onnx = "Sub", .binary = flux::sub},
    mul{.name = "mul", .onnx = "Mul", .binary = flux::mul}, div{.name = "div", .onnx = "Div"}, pow{.name = "pow", .onnx = "Pow"},
    maximum{.name = "maximum", .onnx = "Max"}, minimum{.name = "minimum", .onnx = "Min"},
    eq{.name = "eq", .onnx = "Equal", .binary = flux::eq}, lt{.name = "lt", .onnx = "Less", .binary = flux::lt},
    le{.name = "le", .onnx = "LessOrEqual", .binary = flux::le}, gt{.name = "gt", .onnx = "Greater", .binary = flux::gt},
    ge{.name = "ge", .onnx = "GreaterOrEqual", .binary = flux::ge}, where{.name = "where", .onnx = "Where"};
const Op ne{.name = "ne", .write = [](G& g, const Call& c) { g.node("Not", {g.node("Equal", c.in)}, {}, {c.out}); }};
const Op neg{.name = "neg", .onnx = "Neg", .unary = flux::neg}, exp{.name = "exp", .onnx = "Exp", .unary = flux::exp},
    log{.name = "log", .onnx = "Log", .unary = flux::log}, sqrt{.name = "sqrt", .onnx = "Sqrt", .unary = flux::sqrt},
    abs{.name = "abs", .onnx = "Abs", .unary = flux::abs}, sign{.name = "sign", .onnx = "Sign", .unary = flux::sign},
    sin{.name = "sin", .onnx = "Sin", .unary = flux::sin}, cos{.name = "cos", .onnx = "Cos", .unary = flux::cos},
    erf{.name = "erf", .onnx = "Erf", .unary = flux::erf}, tanh{.name = "tanh", .onnx = "Tanh", .unary = detail::tanh_op},
    sigmoid{.name = "sigmoid", .onnx = "Sigmoid", .unary = detail::sigmoid_op},
    relu{.name = "relu", .onnx = "Relu", .unary = detail::relu_op}, softplus{.name = "softplus", .onnx = "Softplus"},
    to{.name = "to", .onnx = "Identity"};
const Op square{.name = "square", .write = [](G& g, const Call& c) { g.node("Mul", {c.in[0], c.in[0]}, {}, {c.out}); }};
const Op log1p{.name = "log1p", .write = [](G& g, const Call& c) {
  g.node("Log", {g.node("Add", {c.in[0], g.constant(Tensor::scalar(1.0, c.e.output.dtype()))})}, {}, {c.out});
}};
const Op leakyrelu{.name = "leakyrelu", .write = [](G& g, const Call& c) { g.node("LeakyRelu", c.in, {{"alpha", c.e.float1("alpha")}}, {c.out}); }};
const Op elu{.name = "elu", .write = [](G& g, const Call& c) { g.node("Elu", c.in, {{"alpha", c.e.float1("alpha")}}, {c.out}); }};
// NNlib's gelu (tanh form): x sigmoid(c2 x (1 + k x²)), c2 = 2 sqrt(2 / pi), k = 0.044715; one Gelu
// node from opset 20.
const Op gelu{.name = "gelu", .write = [](G& g, const Call& c) {
  if (g.opset() >= 20) {
    g.node("Gelu", c.in, {{"approximate", std::string("tanh")}}, {c.out});
    return;
  }
  const DType t = c.e.output.dtype();
  const std::string& x = c.in[0];
  std::string u = g.node("Add", {g.node("Mul", {g.node("Mul", {x, x}), g.constant(Tensor::scalar(0.044715, t))}), g.constant(Tensor::scalar(1.0, t))});
  u = g.node("Mul", {g.node("Mul", {u, x}), g.constant(Tensor::scalar(1.5957691216057308, t))});
  g.node("Mul", {x, g.node("Sigmoid", {u})}, {}, {c.out});
}};
// PyTorch's exact GELU, x (1 + erf(x / sqrt(2))) / 2; one Gelu node from opset 20.
const Op gelu_erf{.name = "gelu_erf", .write = [](G& g, const Call& c) {
  if (g.opset() >= 20) {
    g.node("Gelu", c.in, {}, {c.out});
    return;
  }
  const DType t = c.e.output.dtype();
  std::string u = g.node("Add", {g.node("Erf", {g.node("Mul", {c.in[0], g.constant(Tensor::scalar(0.70710678118654752440, t))})}),
                                 g.constant(Tensor::scalar(1.0, t))});
  g.node("Mul", {g.node("Mul", {c.in[0], u}), g.constant(Tensor::scalar(0.5, t))}, {}, {c.out});
}};
const Op swish{.name = "swish", .write = [](G& g, const Call& c) { g.node("Mul", {c.in[0], g.node("Sigmoid", {c.in[0]})}, {}, {c.out}); }};
const Op cast{.name = "cast", .write = [](G& g, const Call& c) { g.node("Cast", c.in, {{"to", DType(c.e.int1("to"))}}, {c.out}); }};

// ---- shapes and indexing ----
const Op reshape{.name = "reshape", .write = [](G& g, const Call& c) {
  g.node("Reshape", {c.in[0], g.shape("reshape", c.e.output.shape(), c.e2.output.shape(), true)}, {}, {c.out});
}};
const Op broadcast_to{.name = "broadcast_to", .write = [](G& g, const Call& c) {
  Shape i1 = c.e.inputs[0].shape(), i2 = c.e2.inputs[0].shape();
  g.node("Expand", {c.in[0], g.shape("broadcast_to", c.e.output.shape(), c.e2.output.shape(), false, &i1, &i2)}, {}, {c.out});
}};
const Op permute{.name = "permute", .write = [](G& g, const Call& c) { g.node("Transpose", c.in, {{"perm", c.e.ints("perm")}}, {c.out}); }};
const Op slice{.name = "slice", .write = [](G& g, const Call& c) {
  std::vector<int64_t> r1 = c.e.ints("range"), r2 = c.e2.ints("range");
  const int64_t axis = r1[0];
  const int64_t n1 = c.e.inputs[0].shape()[int(axis)], n2 = c.e2.inputs[0].shape()[int(axis)];
  auto bound = [&](int64_t v1, int64_t v2, bool stop) -> int64_t {
    if (stop && v1 == n1 && v2 == n2) return std::numeric_limits<int64_t>::max();
    if (v1 == v2) return v1;
    if (v1 - n1 == v2 - n2) return v1 - n1;  // counted from the end
    fail("[onnx::save] a slice [", r1[1], ", ", r1[2], ") of axis ", axis, " (length ", n1, "; [", r2[1], ", ", r2[2],
         ") of length ", n2, " at the second traced size) is neither fixed nor counted from the end");
  };
  g.node("Slice", {c.in[0], g.ints({bound(r1[1], r2[1], false)}), g.ints({bound(r1[2], r2[2], true)}), g.ints({axis})}, {}, {c.out});
}};
const Op concat{.name = "concat", .write = [](G& g, const Call& c) { g.node("Concat", c.in, {{"axis", c.e.int1("axis")}}, {c.out}); }};
const Op index_select{.name = "index_select", .write = [](G& g, const Call& c) { g.node("Gather", c.in, {{"axis", c.e.int1("axis")}}, {c.out}); }};
const Op embedding{.name = "embedding", .write = [](G& g, const Call& c) { g.node("Gather", c.in, {{"axis", int64_t(0)}}, {c.out}); }};
// The sizes of axes [start, end) (onnx::load's Shape, traced when an imported model is saved again).
const Op shape{.name = "shape", .write = [](G& g, const Call& c) {
  std::vector<int64_t> r = c.e.ints("range");
  std::vector<G::Attr> attrs;
  if (r[0] != 0 || r[1] != c.e.inputs[0].ndim()) {
    if (g.opset() < 15) fail("[onnx::save] a partial Shape needs opset 15; SaveOptions::opset is ", g.opset());
    attrs = {{"start", r[0]}, {"end", r[1]}};
  }
  g.node("Shape", c.in, attrs, {c.out});
}};

// ---- linear algebra, reductions, softmax ----
const Op matmul{.name = "matmul", .write = [](G& g, const Call& c) {
  std::vector<int64_t> tr = c.e.ints("trans");
  std::vector<std::string> ab = c.in;
  for (size_t i = 0; i < 2; ++i)
    if (tr[i]) {
      const int nd = c.e.inputs[i].ndim();
      std::vector<int64_t> perm(static_cast<size_t>(nd));
      for (int j = 0; j < nd; ++j) perm[size_t(j)] = j;
      std::swap(perm[size_t(nd - 1)], perm[size_t(nd - 2)]);
      ab[i] = g.node("Transpose", {ab[i]}, {{"perm", perm}}, {g.fresh("transposed")});
    }
  g.node("MatMul", ab, {}, {c.out});
}};
const Op linear{.name = "linear", .write = [](G& g, const Call& c) {
  const bool relu = c.e.int1("relu");
  std::string y = g.node("Gemm", c.in, {{"transB", int64_t(1)}}, {relu ? g.fresh("gemm") : c.out});
  if (relu) g.node("Relu", {y}, {}, {c.out});
}};
const Op reduce{.name = "reduce", .write = [](G& g, const Call& c) {
  const auto r = backend::ReduceOp(c.e.int1("op"));
  const int64_t axis = c.e.int1("axis"), keep = c.e.int1("keepdims");
  if (r == backend::ReduceOp::sum) {
    g.node("ReduceSum", {c.in[0], g.ints({axis})}, {{"keepdims", keep}}, {c.out});
    return;
  }
  static const char* names[] = {"ReduceSum", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin"};
  const bool arg = r == backend::ReduceOp::argmax || r == backend::ReduceOp::argmin;
  std::vector<std::string> args = c.in;
  std::vector<G::Attr> attrs{{"keepdims", keep}};
  if (arg) attrs.push_back({"axis", axis});
  else if (g.opset() >= 18) args.push_back(g.ints({axis}));  // ReduceMax/Min: axes an input from 18
  else attrs.push_back({"axes", std::vector<int64_t>{axis}});
  g.node(names[int(r)], args, attrs, {c.out});
}};
const Op softmax{.name = "softmax", .write = [](G& g, const Call& c) { g.node("Softmax", c.in, {{"axis", c.e.int1("axis")}}, {c.out}); }};
const Op logsoftmax{.name = "logsoftmax", .write = [](G& g, const Call& c) { g.node("LogSoftmax", c.in, {{"axis", c.e.int1("axis")}}, {c.out}); }};

// ---- convolution, pooling, normalisation ----
const Op conv{.name = "conv", .write = [](G& g, const Call& c) { conv_like(g, c, "Conv"); }};
const Op conv_transpose{.name = "conv_transpose", .write = [](G& g, const Call& c) { conv_like(g, c, "ConvTranspose"); }};
const Op maxpool{.name = "maxpool", .write = [](G& g, const Call& c) { pool(g, c, "MaxPool"); }};
const Op meanpool{.name = "meanpool", .write = [](G& g, const Call& c) { pool(g, c, "AveragePool"); }};
const Op batchnorm{.name = "batchnorm", .write = [](G& g, const Call& c) {
  const int64_t ch = c.e.inputs[0].shape()[1];
  const DType pt = c.e.inputs[3].dtype();
  std::string w = c.in[1].empty() ? g.constant(ones(Shape{ch}, pt)) : c.in[1];
  std::string b = c.in[2].empty() ? g.constant(zeros(Shape{ch}, pt)) : c.in[2];
  g.node("BatchNormalization", {c.in[0], w, b, c.in[3], c.in[4]}, {{"epsilon", c.e.float1("eps")}}, {c.out});
}};
const Op batchnorm_train{.name = "batchnorm_train", .no_onnx = "BatchNorm with batch statistics (training mode: call testmode(model))"};
// Layer and group normalisation over the rows of (R, D).
const Op rownorm{.name = "rownorm", .write = [](G& g, const Call& c) {
  if (g.opset() < 17)
    fail("[onnx::save] layer/group normalisation needs opset 17 (LayerNormalization); SaveOptions::opset is ", g.opset());
  const int64_t d = c.e.inputs[0].shape()[1];
  std::vector<std::string> args{c.in[0], c.in[1].empty() ? g.constant(ones(Shape{d}, c.e.output.dtype())) : c.in[1]};
  if (!c.in[2].empty()) args.push_back(c.in[2]);
  g.node("LayerNormalization", args, {{"axis", int64_t(-1)}, {"epsilon", c.e.float1("eps")}}, {c.out});
}};

// ---- recurrent, random ----
const Op lstm_recurrence{.name = "lstm_recurrence", .write = recurrence}, gru_recurrence{.name = "gru_recurrence", .write = recurrence},
    rnn_recurrence{.name = "rnn_recurrence", .write = recurrence};
const Op dropout{.name = "dropout", .no_onnx = "training-mode Dropout (call testmode(model), or leave its mode automatic)"};
const Op rand_like{.name = "rand_like", .no_onnx = "random numbers"};

const std::vector<const Op*>& all() {
  static const std::vector<const Op*> list = {
      &add, &sub, &mul, &div, &pow, &maximum, &minimum, &eq, &ne, &lt, &le, &gt, &ge, &where,
      &neg, &exp, &log, &sqrt, &abs, &sign, &square, &sin, &cos, &erf, &log1p, &tanh, &sigmoid, &relu, &leakyrelu, &elu, &gelu, &gelu_erf,
      &softplus, &swish, &cast, &to, &reshape, &broadcast_to, &permute, &slice, &concat, &index_select, &embedding, &shape,
      &matmul, &linear, &reduce, &softmax, &logsoftmax, &conv, &conv_transpose, &maxpool, &meanpool, &batchnorm,
      &batchnorm_train, &rownorm, &lstm_recurrence, &gru_recurrence, &rnn_recurrence, &dropout, &rand_like};
  return list;
}

}  // namespace flux::ops
