// The op registry (not installed): one entry per op that reports itself to the tracer, read by the
// forward (its errors' "[name]"), the tracer (trace::emit(ops::relu, ...)), the ONNX exporter (the
// entry's ONNX form, per opset) and the importer (the ONNX operators that run an entry's op as they
// are). Adding an op: one entry here and in registry.cpp, and its kernel (CONTRIBUTING.md).
#pragma once
#include <string>
#include <variant>
#include <vector>

#include "flux/tensor.hpp"
#include "src/trace.hpp"

namespace flux::ops {

/// The ONNX graph onnx::save is writing (src/onnx/export.cpp) as a writer sees it; values are names.
class OnnxGraph {
 public:
  struct Attr {
    const char* name;
    std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<std::string>, DType, Tensor> value;
  };
  virtual ~OnnxGraph() = default;
  virtual int64_t opset() const = 0;  // the opset being written
  /// Adds a node; returns its first output (outs[0], or a fresh name when outs is empty).
  virtual std::string node(const char* type, const std::vector<std::string>& in, const std::vector<Attr>& attrs = {},
                           const std::vector<std::string>& outs = {}) = 0;
  virtual std::string fresh(const std::string& stem) = 0;    // a name no other value has
  virtual std::string ints(const std::vector<int64_t>& v) = 0;  // a 1-D INT64 initialiser
  virtual std::string constant(const Tensor& x) = 0;            // a Constant node
  /// A 1-D INT64 shape for shapes s1 and s2 in the two traces (sizes that follow the dynamic axes become
  /// nodes). `minus_one`: one varying dimension may be -1 (Reshape); in1/in2: dims equal to the input's
  /// aligned dim in both traces are 1 (Expand broadcasts them).
  virtual std::string shape(const char* api, const Shape& s1, const Shape& s2, bool minus_one, const Shape* in1 = nullptr,
                            const Shape* in2 = nullptr) = 0;
};

/// One traced call as its writer sees it: the event in the first trace and its partner in the second
/// (grown dynamic axes), the names of its inputs ("" for an absent one) and of its output.
struct Call {
  const trace::Event &e, &e2;
  const std::vector<std::string>& in;
  const std::string& out;
};

struct Op {
  const char* name;  // the API name: errors "[name]", trace events, ONNX node names
  /// The ONNX operator it is, input for input and without attributes: onnx::save writes it, and
  /// onnx::load runs `unary` or `binary` for it where one is set.
  const char* onnx = nullptr;
  /// Otherwise how onnx::save writes a call (reading g.opset() where the form changed between opsets).
  void (*write)(OnnxGraph& g, const Call& c) = nullptr;
  const char* no_onnx = nullptr;  // otherwise: why the op has no ONNX form
  Tensor (*unary)(const Tensor&) = nullptr;
  Tensor (*binary)(const Tensor&, const Tensor&) = nullptr;
};

extern const Op add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge, where,
    neg, exp, log, sqrt, abs, sign, square, sin, cos, erf, log1p, tanh, sigmoid, relu, leakyrelu, elu, gelu, gelu_erf, softplus, swish,
    cast, to, reshape, broadcast_to, permute, slice, concat, index_select, embedding, shape,
    matmul, linear, reduce, softmax, logsoftmax, conv, conv_transpose, maxpool, meanpool, batchnorm, batchnorm_train, rownorm,
    lstm_recurrence, gru_recurrence, rnn_recurrence, dropout, rand_like;

/// Every entry, in the order above.
const std::vector<const Op*>& all();

}  // namespace flux::ops
