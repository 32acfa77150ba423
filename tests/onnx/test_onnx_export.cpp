// onnx::save on every test device: the written graph (read back with ONNX's own protobuf classes),
// initialiser names, the dynamic batch axis, user layers and lambdas, errors, and the atomic write.
// ONNX Runtime's agreement is checked by tests/onnx/ort_check.py (ctest onnx_export.ort.*).
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include <onnx/onnx_pb.h>

#include "flux/flux.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::device_test_name;
using flux::testing::test_devices;

namespace {

std::string temp_dir() {
  std::string pattern = ::testing::TempDir() + "flux-onnx-XXXXXX";
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return pattern;
}

::onnx::ModelProto read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  ::onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(ss.str())) << path;
  return m;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = d ? ::readdir(d) : nullptr)
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
  if (d) ::closedir(d);
  return out;
}

std::multiset<std::string> op_types(const ::onnx::ModelProto& m) {
  std::multiset<std::string> s;
  for (const auto& n : m.graph().node()) s.insert(n.op_type());
  return s;
}

/// A user layer: a residual MLP block written by hand from ops.
struct Residual {
  Tensor weight, bias;
  Tensor operator()(const Tensor& x) const { return x + flux::tanh(matmul(x, weight, false, true) + bias); }
};
FLUX_LAYER(Residual, weight, bias)

class OnnxExport : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  }
};

TEST_P(OnnxExport, InitialisersAreTheStateNamesAndTheBatchIsDynamic) {
  const Device dev = GetParam();
  seed(1);
  auto model = Chain(Dense(4, 8, relu), Dense(8, 3)) | dev;
  const std::string dir = temp_dir(), path = dir + "/mlp.onnx";
  flux::onnx::save(path, model, to(rand({2, 4}), dev));
  ::onnx::ModelProto m = read(path);
  EXPECT_EQ(m.opset_import(0).version(), 17);
  std::set<std::string> inits, want;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  for (const auto& [name, t] : state(model)) want.insert(name);
  for (const std::string& name : want) EXPECT_TRUE(inits.count(name)) << name;
  // The weight's values as stored: the model's own.
  for (const auto& t : m.graph().initializer())
    if (t.name() == "layers.0.weight") {
      ASSERT_EQ(t.raw_data().size(), 32 * sizeof(float));
      std::vector<float> stored(32);
      std::memcpy(stored.data(), t.raw_data().data(), t.raw_data().size());
      std::vector<float> have = model.get<0>().weight.to_vector<float>();
      EXPECT_EQ(stored, have);
    }
  ASSERT_EQ(m.graph().input_size(), 1);
  const auto& shape = m.graph().input(0).type().tensor_type().shape();
  ASSERT_EQ(shape.dim_size(), 2);
  EXPECT_EQ(shape.dim(0).dim_param(), "batch");
  EXPECT_EQ(shape.dim(1).dim_value(), 4);
  EXPECT_EQ(m.graph().output(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(op_types(m).count("Gemm"), 2u);
  EXPECT_EQ(op_types(m).count("Relu"), 1u);
  // Written atomically: nothing else is left in the folder.
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"mlp.onnx"});
}

TEST_P(OnnxExport, UserLayersLambdasAndAFixedReshapeExport) {
  const Device dev = GetParam();
  seed(2);
  auto twice = [](const Tensor& x) { return x * 2.0 - 1.0; };
  auto model = Chain(Residual{rand({6, 6}), rand({6})}, twice, [](const Tensor& x) { return x.reshape({x.size(0), 2, 3}); },
                     [](const Tensor& x) { return sum(x, 1); }) |
               dev;
  const std::string dir = temp_dir(), path = dir + "/user.onnx";
  flux::onnx::save(path, model, to(rand({3, 6}), dev));
  ::onnx::ModelProto m = read(path);
  auto ops = op_types(m);
  for (const char* op : {"MatMul", "Tanh", "Add", "Mul", "Sub", "Reshape", "ReduceSum"}) EXPECT_TRUE(ops.count(op)) << op;
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  EXPECT_TRUE(inits.count("layers.0.weight"));
  EXPECT_TRUE(inits.count("layers.0.bias"));
  // The reshape to (N, 2, 3) follows the batch: written with -1 for the batch axis.
  for (const auto& n : m.graph().node())
    if (n.op_type() == "Reshape")
      for (const auto& t : m.graph().initializer())
        if (t.name() == n.input(1)) {
          ASSERT_EQ(t.int64_data_size(), 3);
          EXPECT_EQ(t.int64_data(0), -1);
          EXPECT_EQ(t.int64_data(1), 2);
          EXPECT_EQ(t.int64_data(2), 3);
        }
}

TEST_P(OnnxExport, TrainingModeDropoutIsAnErrorNamingTheOpAndLayer) {
  const Device dev = GetParam();
  auto model = Chain(Dense(4, 8), Dropout(0.5), Dense(8, 2)) | dev;
  trainmode(model);
  const std::string dir = temp_dir(), path = dir + "/drop.onnx";
  try {
    flux::onnx::save(path, model, to(rand({2, 4}), dev));
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[onnx::save]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'dropout'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("testmode"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer 'layers.0'"), std::string::npos) << msg;
  }
  EXPECT_TRUE(files_in(dir).empty());
  // In test mode the same model exports, without any dropout node.
  testmode(model);
  flux::onnx::save(path, model, to(rand({2, 4}), dev));
  EXPECT_EQ(op_types(read(path)).count("Gemm"), 2u);
}

TEST_P(OnnxExport, ZeroStateFollowsTheBatchAndSequenceAxesCanBeDynamic) {
  const Device dev = GetParam();
  auto model = Chain(GRU(3, 5), [](const Tensor& h) { return h.slice(0, h.size(0)); }) | dev;
  const std::string dir = temp_dir(), path = dir + "/gru.onnx";
  flux::onnx::save(path, model, to(rand({2, 4, 3}), dev), {.dynamic_axes = {{0, 1}}});
  ::onnx::ModelProto m = read(path);
  auto ops = op_types(m);
  EXPECT_TRUE(ops.count("GRU"));
  EXPECT_TRUE(ops.count("ConstantOfShape"));  // the zero initial state, (N, H) from the input's N
  const auto& in = m.graph().input(0).type().tensor_type().shape();
  EXPECT_EQ(in.dim(0).dim_param(), "batch");
  EXPECT_EQ(in.dim(1).dim_param(), "input_dim1");
  const auto& out = m.graph().output(0).type().tensor_type().shape();
  EXPECT_EQ(out.dim(0).dim_param(), "batch");
  EXPECT_EQ(out.dim(1).dim_param(), "input_dim1");
  EXPECT_EQ(out.dim(2).dim_value(), 5);
}

/// A decoder block whose masks come from the input's length, as users write them: MultiHeadAttention
/// with .causal (causal_mask(T, T)) and a second attention masked by positions from arange(T).
struct CausalBlock {
  MultiHeadAttention self_attn = MultiHeadAttention(16, {.nheads = 4, .causal = true});
  MultiHeadAttention cross = MultiHeadAttention(16, {.nheads = 2});
  LayerNorm norm = LayerNorm(16);
  Tensor operator()(const Tensor& x) const {
    const int64_t t = x.size(1);
    Tensor pos = arange(0, double(t), 1, DType::f32, x.device());            // (T,), made from the length
    Tensor mask = le(pos.reshape({1, t}), pos.reshape({t, 1}) + 1.0);         // key j <= query i + 1
    Tensor h = x + self_attn(norm(x));
    return h + cross.forward(h, h, h, mask).output * gelu_erf(h);
  }
};
FLUX_LAYER(CausalBlock, self_attn, cross, norm)

// Issue 48: causal attention and masks from a dynamic sequence length export (Range and comparison
// nodes compute them), and the file read back equals the model at two batch sizes and two lengths,
// with the same parameter count (the exporter's float constants come back non-trainable).
TEST_P(OnnxExport, CausalMasksFromTheDynamicLengthExportAndRoundTrip) {
  const Device dev = GetParam();
  seed(7);
  CausalBlock block;
  for (auto& [name, t] : state(block)) copy_(t, rand(t.shape()) - 0.5);  // biases and norms not all equal
  auto model = block | dev;
  const std::string dir = temp_dir(), path = dir + "/causal.onnx";
  flux::onnx::save(path, model, to(rand({2, 5, 16}), dev), {.dynamic_axes = {{0, 1}}});
  auto ops = op_types(read(path));
  EXPECT_TRUE(ops.count("Range")) << "positions and the causal mask computed in the graph";
  auto net = flux::onnx::load(path) | dev;
  EXPECT_EQ(parameter_count(net), parameter_count(model));
  for (auto [n, t] : {std::pair<int64_t, int64_t>{2, 5}, {3, 7}, {1, 4}}) {
    Tensor x = to(rand({n, t, 16}), dev);
    std::vector<double> got = to(net(x), Device()).to_vector<double>(), want = to(model(x), Device()).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "batch " << n << ", length " << t << ", [" << i << "]";
  }
}

// GELU, exact (gelu_erf, PyTorch's default) and tanh (flux's gelu): one Gelu node from opset 20 (its
// approximate attribute "tanh" for the latter), the formula's nodes before; read back, each file equals
// the model at two batch sizes with the same parameter count.
TEST_P(OnnxExport, GeluIsOneNodeFromOpset20AndRoundTrips) {
  const Device dev = GetParam();
  seed(11);
  for (bool exact : {true, false}) {
    for (int64_t opset : {17, 20}) {
      SCOPED_TRACE(std::string(exact ? "gelu_erf" : "gelu") + " at opset " + std::to_string(opset));
      auto act = [exact](const Tensor& x) { return exact ? gelu_erf(x) : gelu(x); };
      auto model = Chain(Dense(6, 8), act, Dense(8, 3)) | dev;
      const std::string path = temp_dir() + "/gelu.onnx";
      flux::onnx::save(path, model, to(rand({2, 6}), dev), {.opset = opset});
      ::onnx::ModelProto m = read(path);
      auto ops = op_types(m);
      EXPECT_EQ(ops.count("Gelu"), opset >= 20 ? 1u : 0u);
      EXPECT_EQ(ops.count("Erf") + ops.count("Sigmoid"), opset >= 20 ? 0u : 1u);
      for (const auto& n : m.graph().node()) {
        if (n.op_type() != "Gelu") continue;
        std::string approximate = "none";
        for (const auto& a : n.attribute())
          if (a.name() == "approximate") approximate = a.s();
        EXPECT_EQ(approximate, exact ? "none" : "tanh");
      }
      auto net = flux::onnx::load(path) | dev;
      EXPECT_EQ(parameter_count(net), parameter_count(model));
      for (int64_t n : {2, 5}) {
        Tensor x = to(rand({n, 6}) * 6.0 - 3.0, dev);
        std::vector<double> got = to(net(x), Device()).to_vector<double>(), want = to(model(x), Device()).to_vector<double>();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "batch " << n << ", [" << i << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OnnxExport, ::testing::ValuesIn(test_devices()), device_test_name);

TEST(OnnxExportErrors, OpsetNewerThanSupportedNamesBoth) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  auto model = Dense(2, 2);
  try {
    flux::onnx::save(temp_dir() + "/x.onnx", model, rand({1, 2}), {.opset = 22});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("opset 22"), std::string::npos) << msg;
    EXPECT_NE(msg.find("13 to 21"), std::string::npos) << msg;
  }
}

// Newer opsets on request, in their forms (ReduceMax/Min axes as an input from 18), with the IR
// version each came with; read back by onnx::load (which follows the file's opset) they match.
TEST(OnnxExportErrors, NewerOpsetsOnRequestInTheirForms) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  auto model = [](const Tensor& x) { return max(x, 1, true) - min(x, 1, true) + sum(x, 1, true); };
  Tensor x = rand({3, 5});
  for (int64_t opset : {13, 17, 18, 20, 21}) {
    SCOPED_TRACE(opset);
    const std::string path = temp_dir() + "/r.onnx";
    flux::onnx::save(path, model, x, {.opset = opset});
    ::onnx::ModelProto m = read(path);
    EXPECT_EQ(m.opset_import(0).version(), opset);
    EXPECT_EQ(m.ir_version(), opset >= 21 ? 10 : opset >= 19 ? 9 : 8);
    for (const auto& n : m.graph().node()) {
      if (n.op_type() == "ReduceMax" || n.op_type() == "ReduceMin") {
        EXPECT_EQ(n.input_size(), opset >= 18 ? 2 : 1) << n.op_type();
      }
    }
    EXPECT_EQ(flux::onnx::load(path)(x).to_vector<float>(), model(x).to_vector<float>());
  }
}

TEST(OnnxExportErrors, BadDynamicAxesAndMissingFolder) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  auto model = Dense(2, 2);
  EXPECT_THROW(flux::onnx::save(temp_dir() + "/x.onnx", model, rand({1, 2}), {.dynamic_axes = {{0}, {1}}}), Error);
  EXPECT_THROW(flux::onnx::save(temp_dir() + "/x.onnx", model, rand({1, 2}), {.dynamic_axes = {{5}}}), Error);
  try {
    flux::onnx::save("/nonexistent-flux-folder/x.onnx", model, rand({1, 2}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-flux-folder"), std::string::npos) << e.what();
  }
}

// Names that would mean two values in the graph (which onnx::load then refuses) are refused at save
// time, naming them, and nothing is written: a good file already at the path stays as it was.
TEST(OnnxExportErrors, CollidingNamesAreRefusedBeforeWriting) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  const std::string dir = temp_dir(), path = dir + "/x.onnx";
  auto model = Dense(2, 2);
  flux::onnx::save(path, model, rand({1, 2}));
  const std::string good = read(path).SerializeAsString();
  auto two = [](const Tensor& a, const Tensor& b) { return a + b; };
  auto refused = [&](const std::function<void()>& f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(read(path).SerializeAsString(), good);
    EXPECT_EQ(files_in(dir).size(), 1u);
  };
  refused([&] { flux::onnx::save(path, two, std::array<Tensor, 2>{rand({1, 2}), rand({1, 2})}, {.input_names = {"a", "a"}}); },
          "[onnx::save] input_names: 'a' would name both input 0 and input 1");
  refused([&] { flux::onnx::save(path, model, rand({1, 2}), {.input_names = {"weight"}}); },
          "'weight' would name both the model's weight 'weight' and input 0");
  refused([&] { flux::onnx::save(path, model, rand({1, 2}), {.input_names = {"x"}, .output_names = {"x"}}); },
          "[onnx::save] output_names: 'x' would name both input 0 and output 0");
  refused([&] { flux::onnx::save(path, model, rand({1, 2}), {.output_names = {"y", "z"}}); },
          "output_names lists 2 names but the model returns 1 tensor(s)");
  refused([&] { flux::onnx::save(path, model, rand({1, 2}), {.input_names = {"x", "y"}}); },
          "input_names lists 2 names but the model is called with 1 input(s)");
  refused([&] { flux::onnx::save(path, model, rand({1, 2}), {.input_names = {""}}); }, "input_names gives input 0 an empty name");
  // a user name meeting a generated one: one value per name, whatever produced it
  refused([&] { flux::onnx::save(path, [](const Tensor& x) { return x * 2.0f; }, rand({1, 2}), {.output_names = {"const_0"}}); },
          "the name 'const_0' would name 2 values of the graph");
}

TEST(OnnxExportErrors, ShapeDependentTensorsMadeOutsideOpsAreRefused) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  // A tensor built on the host from the input's values cannot be computed by the graph.
  auto model = [](const Tensor& x) { return x + Tensor(x.to_vector<float>(), x.shape()); };
  try {
    flux::onnx::save(temp_dir() + "/x.onnx", model, rand({2, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside flux's ops"), std::string::npos) << e.what();
  }
  // A shape-following tensor of no known form (random values per length) names the layer whose
  // parameter reads it downstream, never "()".
  auto model2 = Chain(
      [](const Tensor& x) { return x * to(rand({x.size(0), x.size(1)}), x.device()); }, Dense(3, 2));
  try {
    flux::onnx::save(temp_dir() + "/y.onnx", model2, rand({2, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'layers.1'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("()"), std::string::npos) << e.what();
  }
}

}  // namespace
