// The importer's operators (not installed): ONE table, name -> {opsets, runner, load-time check}, from
// which onnx::supported_operators() and every node's dispatch are made (import.cpp resolves each node
// to its entry once, at load). The operators that are an op of the registry (src/ops/registry.hpp)
// input for input come from its entries. Runners read the file's opset for the semantics that changed between
// versions (axes as inputs from 13/18, Softmax's axis at 13, GroupNormalization's scale at 21, ...).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "flux/ops.hpp"
#include "flux/tensor.hpp"
#include "src/ops/registry.hpp"

#if FLUX_HAVE_ONNX
#include <onnx/onnx_pb.h>

namespace flux::onnx::detail {

/// The opsets (default domain) and IR versions this importer reads: PyTorch 1.13 writes 17 (IR 8),
/// PyTorch 2.x 18 to 20 (IR 10 with the dynamo exporter), ONNX Runtime 1.2x reads up to 21/22.
inline constexpr int64_t kMinImportOpset = 11, kMaxImportOpset = 21, kMaxIrVersion = 10;

/// One node as a runner sees it: its proto, the file's opset, and its operator's registry entry.
struct Node {
  const ::onnx::NodeProto& proto;
  int64_t opset;
  const ops::Op* entry = nullptr;
};
using Run = std::vector<Tensor> (*)(const Node&, const std::vector<Tensor>&);
/// A load-time check of a node's attributes: "" when the runner can run it, else what it lacks.
using Check = std::string (*)(const Node&);
struct Operator {
  int64_t since = kMinImportOpset;  // the first opset whose form the runner reads
  int64_t until = kMaxImportOpset;  // the last
  Run run = nullptr;
  Check check = nullptr;  // nullptr: any attributes the runner reads are fine
  const ops::Op* entry = nullptr;  // the registry's op it runs (run_entry), or none
};
/// The table, sorted by name.
const std::map<std::string, Operator>& operator_table();

/// "node 'name' (OpType)".
std::string where(const ::onnx::NodeProto& n);
/// A TensorProto's tensor on the CPU, its data checked against its shape (import.cpp); `folder` is the
/// model's folder for external data ("" when read from bytes).
Tensor from_proto(const ::onnx::TensorProto& p, const std::string& context, const std::string& folder = "");
/// ONNX Conv attributes (strides, pads, dilations, group) for a weight of w's rank.
ConvParams conv_params(const ::onnx::NodeProto& n, const Tensor& w);
double attr_f(const ::onnx::NodeProto& n, const char* name, double dflt);
/// A Gemm node's A Bᵀ + c (then relu) as Dense runs it (flux::detail::linear: bias and relu fused, W
/// kept packed; under autocast in its low dtype): undefined when the node is not that form (transA,
/// no transB, alpha or beta not 1, c not (N,)) or the operands do not fit; the caller composes the ops.
Tensor gemm_linear(const ::onnx::NodeProto& n, const Tensor& a, const Tensor& b, const Tensor& c, bool relu);
/// x on device d (no copy when it is there already, or undefined).
Tensor on(const Tensor& x, const Device& d);
/// The device where an op runs: that of its first input not on the CPU (data), else the CPU.
Device device_of(const std::vector<Tensor>& in);
Tensor in_or(const std::vector<Tensor>& in, size_t k);

}  // namespace flux::onnx::detail
#endif
