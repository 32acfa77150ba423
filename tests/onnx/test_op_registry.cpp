// The op registry (src/ops/registry.hpp) against its readers: every entry has one ONNX form or a
// reason; the importer lists exactly the operators it dispatches, and runs a registry entry's op for
// the operators it maps one to one; every op a broad forward traces is a listed entry, and every ONNX
// operator the exporter writes for it is one the importer runs.
#define FLUX_HAVE_ONNX 1
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "flux/flux.hpp"
#include "flux/onnx.hpp"
#include "src/onnx/import_ops.hpp"
#include "src/ops/registry.hpp"

using namespace flux;

namespace {

/// A forward touching most traced ops: dense, conv, pooling, normalisation, recurrent, attention-like
/// matmuls, activations, shapes and indexing.
Tensor broad_forward(const Tensor& x) {
  static auto conv = Conv({3, 3}, 2, 4, relu, {.pad = 1});
  static auto bn = BatchNorm(4);
  static auto ln = LayerNorm(8);
  static auto lstm = LSTM(8, 8);
  static auto gru = GRU(8, 8);
  static auto dense = Dense(8, 8, gelu);
  testmode(bn);
  Tensor y = maxpool(bn(conv(x)), {2, 2});                         // (N, 4, 2, 2)
  y = meanpool(y, {1, 1}).reshape({x.size(0), 2, 8});              // (N, 2, 8)
  y = ln(y);
  y = lstm(y) + gru(y);
  y = dense(y) * sigmoid(y) - swish(y) / (exp(neg(abs(y))) + 1.0);
  y = concat({y, elu(y), leakyrelu(y, 0.2)}, 1);                   // (N, 6, 8)
  y = matmul(y, permute(y, {0, 2, 1}));                            // (N, 6, 6)
  y = softmax(y, -1) + logsoftmax(y, -1) + sqrt(square(y) + 1.0) + log1p(relu(y)) + flux::tanh(y) + sin(y) * cos(y);
  y = where(gt(y, zeros({1}, y.dtype(), y.device())), y, maximum(y, minimum(y, erf(y))));
  return sum(slice(y, 1, 1, 4), 2) + slice(mean(y, 1), 1, 0, 3);
}

}  // namespace

TEST(OpRegistry, EveryEntryHasOneNameAndOneOnnxForm) {
  std::set<std::string> names;
  for (const ops::Op* op : ops::all()) {
    ASSERT_NE(op->name, nullptr);
    EXPECT_TRUE(names.insert(op->name).second) << "two entries named " << op->name;
    const int forms = (op->onnx != nullptr) + (op->write != nullptr) + (op->no_onnx != nullptr);
    EXPECT_EQ(forms, 1) << op->name << ": one of onnx, write, no_onnx";
    if (op->unary || op->binary) {
      EXPECT_NE(op->onnx, nullptr) << op->name << ": an import function without an ONNX operator";
      EXPECT_FALSE(op->unary && op->binary) << op->name;
    }
  }
}

TEST(OpRegistry, TheImporterListsExactlyWhatItDispatches) {
  const auto& table = flux::onnx::detail::operator_table();
  std::vector<std::string> keys;
  for (const auto& [name, entry] : table) {
    keys.push_back(name);
    EXPECT_NE(entry.run, nullptr) << name << " is listed without a runner";
    EXPECT_LE(flux::onnx::detail::kMinImportOpset, entry.since) << name;
    EXPECT_LE(entry.since, entry.until) << name;
    EXPECT_LE(entry.until, flux::onnx::detail::kMaxImportOpset) << name;
    if (entry.entry) {
      EXPECT_STREQ(entry.entry->onnx, name.c_str()) << name << " runs the registry entry of another operator";
      EXPECT_TRUE(entry.entry->unary || entry.entry->binary) << name;
    }
  }
  EXPECT_EQ(flux::onnx::supported_operators(), keys);
  // Each registry op's one-to-one ONNX operator imports, and is the op itself where it has an import
  // function.
  for (const ops::Op* op : ops::all()) {
    if (op->onnx) {
      EXPECT_TRUE(table.count(op->onnx)) << op->name << " exports as " << op->onnx << ", which does not import";
    }
    if (op->unary || op->binary) {
      auto it = table.find(op->onnx);
      ASSERT_NE(it, table.end()) << op->onnx;
      EXPECT_EQ(it->second.entry, op) << op->onnx << " does not run the entry '" << op->name << "'";
    }
  }
}

TEST(OpRegistry, TracedOpsAreListedEntriesAndTheirOnnxFormsImport) {
  const Tensor x = rand({2, 2, 4, 4});
  trace::Events rec;
  {
    autodiff::NoGrad inference;
    trace::Scope scope(&rec);
    broad_forward(x);
  }
  const auto& all = ops::all();
  std::set<const ops::Op*> listed(all.begin(), all.end()), seen;
  for (const trace::Event& e : rec.events) {
    ASSERT_NE(e.op, nullptr);
    EXPECT_TRUE(listed.count(e.op)) << "the traced op '" << e.op->name << "' is not in ops::all()";
    seen.insert(e.op);
  }
  EXPECT_GE(seen.size(), size_t(30)) << "the forward should cover most of the registry";

  const std::string path = ::testing::TempDir() + "flux-op-registry.onnx";
  flux::onnx::save(path, [](const Tensor& t) { return broad_forward(t); }, x, {.opset = 17});
  std::ifstream f(path, std::ios::binary);
  std::stringstream bytes;
  bytes << f.rdbuf();
  ::onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(bytes.str()));
  const std::vector<std::string> supported = flux::onnx::supported_operators();
  const std::set<std::string> importable(supported.begin(), supported.end());
  for (const auto& n : m.graph().node())
    EXPECT_TRUE(importable.count(n.op_type())) << "the exporter writes " << n.op_type() << ", which the importer does not run";
  // And the file runs: the importer gives the traced forward's values.
  auto net = flux::onnx::load(path);
  Tensor want, got;
  {
    autodiff::NoGrad inference;
    want = broad_forward(x);
    got = net(x);
  }
  EXPECT_LE(max(abs(want - got)).item<float>(), 1e-4f);
}
