// onnx::load on every test device: gradients of an imported model equal the native layers' (the
// model exported by onnx::save, imported again), safetensors save/load and an optimiser step on it,
// and the load-time errors (every unsupported operator with its node name, a newer opset, truncated or
// inconsistent files), built with ONNX's own protobuf classes.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <onnx/onnx_pb.h>

#include "flux/flux.hpp"
#include "flux/io/safetensors.hpp"
#include "flux/onnx.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::device_test_name;
using flux::testing::test_devices;

namespace {

std::string temp_dir() {
  std::string pattern = ::testing::TempDir() + "flux-onnx-import-XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::vector<double> host_of(const Tensor& t) { return to(t, Device()).to_vector<double>(); }

std::string error_of(const std::string& bytes) {
  try {
    flux::onnx::load_from_bytes(bytes, "test model");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// y = Relu(Gemm(x, w, b)) with a (3, 2) weight, as the building block of the error tests.
::onnx::ModelProto small_model(int64_t opset = 17) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_version(opset);
  auto* g = m.mutable_graph();
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(::onnx::TensorProto::FLOAT);
  w->add_dims(3), w->add_dims(2);
  for (int i = 0; i < 6; ++i) w->add_float_data(0.1f * float(i));
  auto* in = g->add_input();
  in->set_name("x");
  auto* gemm = g->add_node();
  gemm->set_op_type("Gemm"), gemm->set_name("gemm0");
  gemm->add_input("x"), gemm->add_input("w"), gemm->add_output("h");
  auto* relu = g->add_node();
  relu->set_op_type("Relu"), relu->set_name("relu0");
  relu->add_input("h"), relu->add_output("y");
  g->add_output()->set_name("y");
  return m;
}

/// One node `op` reading the graph input "x" and the int64 initialiser "axes" (when given), output "y".
::onnx::ModelProto one_node(const std::string& op, const std::vector<int64_t>& axes, int64_t opset = 17) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  auto* g = m.mutable_graph();
  g->add_input()->set_name("x");
  auto* n = g->add_node();
  n->set_op_type(op), n->set_name(op + "_node"), n->add_input("x"), n->add_output("y");
  if (!axes.empty()) {
    auto* a = g->add_initializer();
    a->set_name("axes"), a->set_data_type(::onnx::TensorProto::INT64), a->add_dims(int64_t(axes.size()));
    for (int64_t v : axes) a->add_int64_data(v);
    n->add_input("axes");
  }
  g->add_output()->set_name("y");
  return m;
}

std::string run_error(const ::onnx::ModelProto& m, const Tensor& x) {
  try {
    flux::onnx::load_from_bytes(m.SerializeAsString(), "test model")(x);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class OnnxImport : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  }
};

TEST_P(OnnxImport, GradientsEqualTheNativeLayersAndItTrainsAndSaves) {
  const Device dev = GetParam();
  seed(3);
  auto model = Chain(Conv({3, 3}, 2, 4, relu, {.pad = 1}), BatchNorm(4), MaxPool({2, 2}), flatten, Dense(64, 8, tanh),
                     Dense(8, 3));
  testmode(model);
  for (auto& [name, t] : state(model))
    if (name.find("running_var") != std::string::npos) copy_(t, rand(t.shape()) + 0.5);
  const std::string dir = temp_dir();
  Tensor x = rand({2, 2, 8, 8});
  flux::onnx::save(dir + "/m.onnx", model, x);
  auto net = flux::onnx::load(dir + "/m.onnx") | dev;
  auto native = model | dev;
  Tensor xd = to(x, dev);
  // Names as in the file (state(model)'s), BatchNorm statistics NonTrainable.
  EXPECT_EQ(parameter_count(net), parameter_count(model));
  EXPECT_EQ(nontrainable_count(net), nontrainable_count(model));
  std::vector<double> y = to(net(xd), Device()).to_vector<double>(), want = to(native(xd), Device()).to_vector<double>();
  ASSERT_EQ(y.size(), want.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5);

  auto loss = [&](const auto& m) { return sum(square(m(xd))); };
  auto g_net = gradient(loss, net);
  auto g_native = gradient(loss, native);
  std::map<std::string, Tensor> native_grads;
  for (auto& [name, t] : state(g_native)) native_grads[name] = t;
  int compared = 0;
  for (auto& [name, t] : g_net.parameters) {
    ASSERT_TRUE(native_grads.count(name)) << name;
    std::vector<double> a = to(t, Device()).to_vector<double>(), b = to(native_grads[name], Device()).to_vector<double>();
    ASSERT_EQ(a.size(), b.size()) << name;
    double scale = 1e-6;
    for (double v : b) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * scale) << name << "[" << i << "]";
    ++compared;
  }
  EXPECT_EQ(compared, 8);  // conv, BatchNorm and two Dense: weight and bias each

  // An optimiser step moves the imported parameters; safetensors save/load restores them exactly.
  auto opt = optimisers::setup(optimisers::Adam(1e-2), net);
  Tensor before = to(net(xd), Device());
  optimisers::update(opt, net, g_net);
  Tensor after = to(net(xd), Device());
  EXPECT_GT(max(abs(after - before)).item<double>(), 1e-4);
  save(dir + "/ft.safetensors", net);
  auto again = flux::onnx::load(dir + "/m.onnx");
  load(dir + "/ft.safetensors", again);
  EXPECT_EQ(to((again | dev)(xd), Device()).to_vector<float>(), after.to_vector<float>());  // same device, same values
  std::ostringstream os;
  os << net;
  EXPECT_NE(os.str().find("Conv × 1"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("parameters"), std::string::npos) << os.str();
}

TEST_P(OnnxImport, ConvBatchNormReluAndResidualAreFusedAtLoadAndMatchTheLayers) {
  const Device dev = GetParam();
  seed(4);
  // Exports as Conv -> BatchNormalization -> Relu, then a residual block Conv -> BatchNormalization ->
  // Add(its input) -> Relu, then Conv -> BatchNormalization -> Relu, GlobalAveragePool, Gemm.
  auto model = Chain(Conv({3, 3}, 3, 8, identity, {.pad = 1}), BatchNorm(8, relu),
                     SkipConnection(Chain(Conv({3, 3}, 8, 8, identity, {.pad = 1}), BatchNorm(8)), plus), relu,
                     Conv({3, 3}, 8, 8, identity), BatchNorm(8, relu), GlobalMeanPool(), flatten, Dense(8, 4));
  for (auto& [name, t] : state(model))
    copy_(t, name.find("running_var") != std::string::npos ? rand(t.shape()) + 0.5 : rand(t.shape()) - 0.5);
  testmode(model);
  const std::string dir = temp_dir();
  Tensor x = rand({2, 3, 10, 10});
  flux::onnx::save(dir + "/cbr.onnx", model, x);
  auto net = flux::onnx::load(dir + "/cbr.onnx") | dev;
  EXPECT_NE(net.summary().find("3 Conv fused"), std::string::npos) << net.summary();
  Tensor xd = to(x, dev);
  std::vector<double> fused = to(net(xd), Device()).to_vector<double>();
  std::vector<double> want = to((model | dev)(xd), Device()).to_vector<double>();
  // Under a tape the same nodes run composed (conv, batchnorm, relu): the same values.
  Tensor taped;
  gradient([&](const auto& m) { taped = m(xd); return sum(taped); }, net);
  std::vector<double> composed = to(taped, Device()).to_vector<double>();
  ASSERT_EQ(fused.size(), want.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_NEAR(fused[i], want[i], 1e-5);
    EXPECT_NEAR(composed[i], want[i], 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OnnxImport, ::testing::ValuesIn(test_devices()), device_test_name);

// Erf (PyTorch's exact GELU is Div/Erf/Add/Mul/Mul): flux::erf against std::erf in float64, its
// gradient against 2/sqrt(pi) exp(-x^2) and central differences, through an imported one-node graph.
TEST_P(OnnxImport, ErfMatchesStdErfAndItsGradient) {
  const Device dev = GetParam();
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->add_input()->set_name("x");
  auto* n = g->add_node();
  n->set_op_type("Erf"), n->set_name("erf0"), n->add_input("x"), n->add_output("y");
  g->add_output()->set_name("y");
  auto net = flux::onnx::load_from_bytes(m.SerializeAsString(), "erf model") | dev;
  std::vector<double> xs;
  for (int i = -40; i <= 40; ++i) xs.push_back(0.1 * i + 0.013);
  for (DType t : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const double tol = t == DType::f32 ? 1e-6 : 1e-14;
    Tensor x64 = Tensor(xs, Shape{int64_t(xs.size())}).f64();
    Tensor x = to(t == DType::f32 ? x64.f32() : x64, dev);
    std::vector<double> y = host_of(t == DType::f32 ? net(x) : erf(x));
    ASSERT_EQ(y.size(), xs.size());
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(y[i], std::erf(xs[i]), tol) << "x = " << xs[i];
    autodiff::Tape tape;
    Tensor leaf = tape.leaf(x);
    tape.backward(sum(t == DType::f32 ? net(leaf) : erf(leaf)));
    std::vector<double> dx = host_of(tape.grad(leaf));
    ASSERT_EQ(dx.size(), xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const double h = 1e-5, fd = (std::erf(xs[i] + h) - std::erf(xs[i] - h)) / (2 * h);
      EXPECT_NEAR(dx[i], 1.1283791670955126 * std::exp(-xs[i] * xs[i]), tol) << "x = " << xs[i];
      EXPECT_NEAR(dx[i], fd, 1e-6) << "x = " << xs[i];
    }
  }
  // An imported Erf exports again as Erf.
  const std::string dir = temp_dir();
  flux::onnx::save(dir + "/erf.onnx", flux::onnx::load_from_bytes(m.SerializeAsString(), "erf model"), ones({3}));
  ::onnx::ModelProto back;
  std::ifstream in(dir + "/erf.onnx", std::ios::binary);
  ASSERT_TRUE(back.ParseFromIstream(&in));
  int erfs = 0;
  for (const auto& node : back.graph().node()) erfs += node.op_type() == "Erf";
  EXPECT_EQ(erfs, 1);
}

// ReduceL2 of a zero vector (swin_v2's padded window tokens through F.normalize): value 0 and a zero
// gradient, as PyTorch's norm gives, not sqrt's infinite derivative times 0 (NaN); x / |x| elsewhere.
TEST_P(OnnxImport, ReduceL2OfAZeroVectorHasAZeroGradient) {
  const Device dev = GetParam();
  auto net = flux::onnx::load_from_bytes(one_node("ReduceL2", {1}, 18).SerializeAsString(), "reducel2 model") | dev;
  const std::vector<double> xs = {3, -4, 0, 0, 0, 0, 1, 2, -2};
  Tensor x = to(Tensor(xs, Shape{3, 3}).f32(), dev);
  autodiff::Tape tape;
  Tensor leaf = tape.leaf(x);
  Tensor y = net(leaf);
  EXPECT_EQ(y.shape(), (Shape{3, 1}));
  const std::vector<double> norms = host_of(y), want = {5, 0, 3};
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(norms[i], want[i], 1e-6) << "row " << i;
  tape.backward(sum(y));
  const std::vector<double> dx = host_of(tape.grad(leaf));
  ASSERT_EQ(dx.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double n = want[i / 3];
    EXPECT_NEAR(dx[i], n == 0 ? 0.0 : xs[i] / n, 1e-6) << "element " << i;
  }
}

TEST_P(OnnxImport, ExternalDataIsWrittenAndRead) {
  const Device dev = GetParam();
  seed(5);
  auto model = Chain(Dense(16, 32, relu), Dense(32, 16)) | dev;
  const std::string dir = temp_dir(), path = dir + "/ext.onnx";
  Tensor x = to(rand({3, 16}), dev);
  flux::onnx::save(path, model, x, {.external_data = true});
  std::ifstream model_file(path, std::ios::binary | std::ios::ate), data_file(path + ".data", std::ios::binary | std::ios::ate);
  ASSERT_TRUE(model_file && data_file);
  EXPECT_GE(int64_t(data_file.tellg()), int64_t((16 * 32 + 32 * 16) * sizeof(float)));  // both weights (>= 1 KiB)
  EXPECT_LT(int64_t(model_file.tellg()), 2048);  // the graph and the biases
  auto net = flux::onnx::load(path) | dev;
  std::vector<float> got = to(net(x), Device()).to_vector<float>(), want = to(model(x), Device()).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5);
  // Without a folder (from bytes), a location leaving it, or a short data file: errors, nothing read.
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(error_of(ss.str()).find("onnx::load(path)"), std::string::npos);
  ::onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(ss.str()));
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    for (auto& kv : *t.mutable_external_data())
      if (kv.key() == "location") kv.set_value("../ext.onnx.data");
  std::ofstream(dir + "/bad.onnx", std::ios::binary) << m.SerializeAsString();
  try {
    flux::onnx::load(dir + "/bad.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("relative to the model's folder"), std::string::npos) << e.what();
  }
  { std::ofstream(path + ".data", std::ios::binary | std::ios::trunc) << "short"; }
  try {
    flux::onnx::load(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 bytes"), std::string::npos) << e.what();
  }
}

TEST(OnnxImportErrors, EveryUnsupportedOperatorIsListedWithItsNode) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  ::onnx::ModelProto m = small_model();
  auto* g = m.mutable_graph();
  for (auto [op, name] : {std::pair{"Foo", "first_foo"}, std::pair{"Bar", "the_bar"}}) {
    auto* n = g->add_node();
    n->set_op_type(op), n->set_name(name), n->add_input("y"), n->add_output(std::string(name) + "_out");
  }
  auto* lstm = g->add_node();
  lstm->set_op_type("LSTM"), lstm->set_name("bi");
  auto* a = lstm->add_attribute();
  a->set_name("layout"), a->set_type(::onnx::AttributeProto::INT), a->set_i(1);
  std::string msg = error_of(m.SerializeAsString());
  EXPECT_NE(msg.find("3 node(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Foo (node 'first_foo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Bar (node 'the_bar'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("LSTM (node 'bi': layout 1"), std::string::npos) << msg;
}

TEST(OnnxImportErrors, NewerOpsetNamesBothVersions) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  std::string msg = error_of(small_model(22).SerializeAsString());
  EXPECT_NE(msg.find("opset 22 is newer than this importer reads (opsets 11 to 21)"), std::string::npos) << msg;
  for (int64_t opset : {11, 13, 17, 18, 20, 21}) EXPECT_EQ(error_of(small_model(opset).SerializeAsString()), "") << opset;
  ::onnx::ModelProto m = small_model(21);
  m.set_ir_version(11);
  msg = error_of(m.SerializeAsString());
  EXPECT_NE(msg.find("IR version 11 is newer than this importer reads (up to 10)"), std::string::npos) << msg;
  m.set_ir_version(10);
  EXPECT_EQ(error_of(m.SerializeAsString()), "");
  // An operator newer than the file's opset is refused naming both.
  m = one_node("Gelu", {}, 18);
  msg = error_of(m.SerializeAsString());
  EXPECT_NE(msg.find("Gelu (node 'Gelu_node': this importer reads it in opsets 20 to 21; the file's is 18)"), std::string::npos) << msg;
}

TEST(OnnxImportErrors, TruncatedCorruptAndInconsistentFiles) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  const std::string good = small_model().SerializeAsString();
  // Every truncation is an error or a smaller valid model, never a crash.
  int errors = 0;
  for (size_t n = 0; n < good.size(); ++n) errors += !error_of(good.substr(0, n)).empty();
  EXPECT_GT(errors, int(good.size()) / 2);
  EXPECT_NE(error_of("this is not protobuf \xff\xff\xff").find("not an ONNX model"), std::string::npos);
  // Initialiser data that do not match the shape.
  ::onnx::ModelProto m = small_model();
  m.mutable_graph()->mutable_initializer(0)->add_dims(1000000);
  std::string msg = error_of(m.SerializeAsString());
  EXPECT_NE(msg.find("holds 6 values"), std::string::npos) << msg;
  // A huge claimed shape with raw data: refused from the byte count, nothing allocated.
  m = small_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_raw_data(std::string(24, '\0'));
  w->set_dims(0, int64_t(1) << 40);
  EXPECT_NE(error_of(m.SerializeAsString()).find("more elements than any file"), std::string::npos);
  // A value read before anything defines it, and external data.
  m = small_model();
  m.mutable_graph()->mutable_node(0)->set_input(0, "nowhere");
  EXPECT_NE(error_of(m.SerializeAsString()).find("reads 'nowhere' before anything defines it"), std::string::npos);
  m = small_model();
  m.mutable_graph()->mutable_initializer(0)->set_data_location(::onnx::TensorProto::EXTERNAL);
  EXPECT_NE(error_of(m.SerializeAsString()).find("external file"), std::string::npos);
  // A missing file names the path.
  try {
    flux::onnx::load("/nonexistent/flux.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/flux.onnx"), std::string::npos);
  }
}

// Issue 49: a repeated Squeeze axis crashed (heap corruption), a repeated Unsqueeze axis was accepted
// or inserted past the end; each is now an error naming the node and the axes.
TEST(OnnxImportErrors, RepeatedSqueezeAndUnsqueezeAxes) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  std::string msg = run_error(one_node("Squeeze", {1, -1}), ones({4, 1}));
  EXPECT_NE(msg.find("node 'Squeeze_node' (Squeeze): axes [1, -1] name an axis twice"), std::string::npos) << msg;
  msg = run_error(one_node("Unsqueeze", {0, 0}), ones({3}));
  EXPECT_NE(msg.find("node 'Unsqueeze_node' (Unsqueeze): axes [0, 0] name an axis twice"), std::string::npos) << msg;
  msg = run_error(one_node("Unsqueeze", {2, 2}), ones({3}));
  EXPECT_NE(msg.find("axes [2, 2] name an axis twice"), std::string::npos) << msg;
  msg = run_error(one_node("Unsqueeze", {3}), ones({3}));
  EXPECT_NE(msg.find("axis 3 is out of range for rank 2"), std::string::npos) << msg;
  // What is well-formed still works: (4, 1) squeezed at -1, (3,) unsqueezed at [0, 2].
  EXPECT_EQ(flux::onnx::load_from_bytes(one_node("Squeeze", {-1}).SerializeAsString())(ones({4, 1})).shape(), Shape({4}));
  EXPECT_EQ(flux::onnx::load_from_bytes(one_node("Unsqueeze", {0, 2}).SerializeAsString())(ones({3})).shape(),
            Shape({1, 3, 1}));
}

// Dropout in training mode: the identity with ratio 0 (torchvision's swin under torch 1.13), an error
// naming the node and the ratio with any other.
TEST(OnnxImportErrors, TrainingModeDropoutRunsOnlyWithRatioZero) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  auto model = [](float ratio) {
    ::onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto* g = m.mutable_graph();
    g->add_input()->set_name("x");
    auto* r = g->add_initializer();
    r->set_name("r"), r->set_data_type(::onnx::TensorProto::FLOAT), r->add_float_data(ratio);
    auto* t = g->add_initializer();
    t->set_name("t"), t->set_data_type(::onnx::TensorProto::BOOL), t->add_int32_data(1);
    auto* n = g->add_node();
    n->set_op_type("Dropout"), n->set_name("drop0"), n->add_input("x"), n->add_input("r"), n->add_input("t");
    n->add_output("y"), n->add_output("mask");
    g->add_output()->set_name("y");
    return m;
  };
  Tensor x = Tensor(std::vector<double>{1, -2, 3}, Shape{3}).f32();
  EXPECT_EQ(host_of(flux::onnx::load_from_bytes(model(0.0f).SerializeAsString())(x)), (std::vector<double>{1, -2, 3}));
  const std::string msg = run_error(model(0.25f), x);
  EXPECT_NE(msg.find("node 'drop0' (Dropout): training_mode is true with ratio 0.25"), std::string::npos) << msg;
}

// Mod by zero: integers are an error naming the node (the spec leaves it undefined), floats no
// undefined cast (the quotient is clamped before its trip through Int64).
TEST(OnnxImportErrors, ModByZero) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->add_input()->set_name("a"), g->add_input()->set_name("b");
  auto* n = g->add_node();
  n->set_op_type("Mod"), n->set_name("mod0"), n->add_input("a"), n->add_input("b"), n->add_output("y");
  auto* f = n->add_attribute();
  f->set_name("fmod"), f->set_type(::onnx::AttributeProto::INT), f->set_i(1);
  g->add_output()->set_name("y");
  auto net = flux::onnx::load_from_bytes(m.SerializeAsString());
  try {
    net.forward({Tensor(std::vector<int64_t>{7, -7}, Shape{2}), Tensor(std::vector<int64_t>{2, 0}, Shape{2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'mod0' (Mod): integer Mod by zero"), std::string::npos) << e.what();
  }
  std::vector<float> y = net.forward({Tensor({7.5f, -7.5f}), Tensor({2.0f, -2.0f})})[0].to_vector<float>();
  EXPECT_EQ(y, (std::vector<float>{1.5f, -1.5f}));
  EXPECT_EQ(net.forward({Tensor({7.5f}), Tensor({0.0f})})[0].numel(), 1);
}

// What PyTorch 2's exporters write besides parameters: one-element constants with generated names
// ("val_67": a scale) and folded attention masks (0 and -inf) come back NonTrainable; a module path's
// one-element bias ("head.bias") and generated names of larger tensors (a transposed weight) train.
TEST(OnnxImportErrors, ExporterConstantsAreNotTrainable) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  ::onnx::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(20);
  auto* g = m.mutable_graph();
  g->add_input()->set_name("x");
  auto add_float = [&](const std::string& name, std::vector<int64_t> dims, std::vector<float> values) {
    auto* t = g->add_initializer();
    t->set_name(name), t->set_data_type(::onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
  };
  add_float("val_67", {1}, {0.5f});
  add_float("scale", {}, {2.0f});
  add_float("head.bias", {1}, {0.25f});
  add_float("val_13", {2, 1}, {1.0f, -1.0f});
  add_float("unsqueeze_5", {2, 2}, {0.0f, -INFINITY, 0.0f, 0.0f});
  std::string prev = "x";
  for (const char* c : {"val_67", "scale", "head.bias", "val_13", "unsqueeze_5"}) {  // x (2, 2) + each, broadcast
    auto* n = g->add_node();
    n->set_op_type("Add"), n->set_name(std::string("add_") + c), n->add_input(prev), n->add_input(c);
    prev = std::string("y_") + c;
    n->add_output(prev);
  }
  g->add_output()->set_name(prev);
  auto net = flux::onnx::load_from_bytes(m.SerializeAsString());
  std::set<std::string> trained, fixed;
  for (auto& [name, t] : net.parameters) trained.insert(name);
  for (auto& [name, t] : net.buffers) fixed.insert(name);
  EXPECT_EQ(trained, (std::set<std::string>{"head.bias", "val_13"}));
  EXPECT_EQ(fixed, (std::set<std::string>{"val_67", "scale", "unsqueeze_5"}));
  std::vector<float> y = net(Tensor(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}, Shape{2, 2})).to_vector<float>();
  EXPECT_EQ(y, (std::vector<float>{3.75f, -INFINITY, 1.75f, 1.75f}));
}

// Issue 49: an initialiser declaring 2^38 floats in a sparse external data file (1 TiB, no blocks)
// threw std::bad_alloc; the size is checked against what the CPU can give first.
TEST(OnnxImportErrors, ExternalDataLargerThanMemoryIsRefusedByName) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  const std::string dir = temp_dir();
  const int64_t n = int64_t(1) << 38;
  {
    std::ofstream data(dir + "/huge.onnx.data", std::ios::binary);
    ASSERT_TRUE(data.good());
  }
  ASSERT_EQ(::truncate((dir + "/huge.onnx.data").c_str(), off_t(n * 4)), 0);  // sparse: no disk used
  ::onnx::ModelProto m = small_model();
  auto* big = m.mutable_graph()->add_initializer();
  big->set_name("huge_weight"), big->set_data_type(::onnx::TensorProto::FLOAT), big->add_dims(n);
  big->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto* kv = big->add_external_data();
  kv->set_key("location"), kv->set_value("huge.onnx.data");
  std::ofstream(dir + "/huge.onnx", std::ios::binary) << m.SerializeAsString();
  try {
    flux::onnx::load(dir + "/huge.onnx");
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'huge_weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the CPU can give at most"), std::string::npos) << e.what();
  }
}

// The fuzz target's seeds (tests/fuzz/make_onnx_seeds.py: one per operator family, opsets 17 to 21)
// are models the importer reads: mutations start from every runner's inputs and attributes.
TEST(OnnxImportErrors, EveryFuzzSeedLoads) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  const std::string dir = std::string(FLUX_SOURCE_DIR) + "/tests/fuzz/corpus/onnx_load";
  int loaded = 0;
  for (const char* name : {"cnn", "convtranspose", "expand_tile_slice", "gelu_hard", "groupnorm_einsum", "gru_bidirectional", "lstm",
                           "mlp", "pad_resize", "pool_ceil", "shapes", "split_reduce", "trilu_where_range"}) {
    SCOPED_TRACE(name);
    auto net = flux::onnx::load(dir + "/" + name + ".onnx");
    EXPECT_FALSE(net.summary().empty());
    ++loaded;
  }
  EXPECT_EQ(loaded, 13);
}

TEST(OnnxImportErrors, WrongInputCountAndEmptyModel) {
  if (!flux::onnx::available()) GTEST_SKIP() << "built without ONNX";
  auto net = flux::onnx::load_from_bytes(small_model().SerializeAsString());
  EXPECT_EQ(net(ones({1, 3})).shape(), Shape({1, 2}));
  EXPECT_THROW(net.forward({ones({1, 3}), ones({1, 3})}), Error);
  flux::onnx::Model empty;
  EXPECT_THROW(empty(ones({1, 3})), Error);
}

}  // namespace
