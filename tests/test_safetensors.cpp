// safetensors: the byte format, PyTorch names, every device to every device, checkpoints that resume
// bit-identically, and a clear error for every kind of bad file. (Atomic writes under SIGKILL: test_save_faults.cpp.)
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::test_devices;

namespace {

/// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/flux-safetensors-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.push_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}
/// A file from a header text and a data section, as a hand-written (possibly broken) writer would.
std::string file_bytes(const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; }

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  return n;
}
nlohmann::json header_json(const std::string& bytes) {
  return nlohmann::json::parse(bytes.substr(8, header_length(bytes)));
}

/// The raw bytes of a tensor (any device, any dtype).
std::string tensor_bytes(const Tensor& t) {
  std::string out(t.nbytes(), '\0');
  if (t.nbytes()) t.backend().copy_to_host(t.device().index(), out.data(), t.buffer(), t.nbytes());
  return out;
}

template <class M> std::vector<std::string> model_bytes(const M& m) {
  std::vector<std::string> out;
  for (const Tensor& t : params(m)) out.push_back(tensor_bytes(t));
  return out;
}

/// Expects f to throw flux::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a flux::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    std::string what = e.what();
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

/// A user-defined layer holding a Chain: its own field names stay, the Chain's "layers" goes.
struct Encoder {
  Chain<Dense, Relu, Dense> body;
  Dense head;
  Tensor operator()(const Tensor& x) const { return head(body(x)); }
};
FLUX_LAYER(Encoder, body, head)

using Mlp = Chain<Dense, Dense>;
Mlp make_mlp(uint64_t s) {
  seed(s);
  return Chain(Dense(3, 5, relu), Dense(5, 2));
}

}  // namespace

// ---- the format itself ----

TEST(Safetensors, FileFollowsTheSpecification) {
  TempDir dir;
  auto model = make_mlp(1);
  save(dir.file("m.safetensors"), model, {{"note", "hello"}});
  std::string bytes = read_bytes(dir.file("m.safetensors"));
  uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only
  nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["note"], "hello");
  std::vector<std::string> names;
  for (auto& [k, v] : j.items())
    if (k != "__metadata__") names.push_back(k);
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.weight"}));
  EXPECT_EQ(j["0.weight"]["dtype"], "F32");
  EXPECT_EQ(j["0.weight"]["shape"], nlohmann::json({5, 3}));
  EXPECT_EQ(j["1.bias"]["shape"], nlohmann::json({2}));
  // Sorted by name within one dtype, tiling the data section.
  EXPECT_EQ(j["0.bias"]["data_offsets"], nlohmann::json({0, 20}));
  EXPECT_EQ(j["0.weight"]["data_offsets"], nlohmann::json({20, 80}));
  EXPECT_EQ(j["1.bias"]["data_offsets"], nlohmann::json({80, 88}));
  EXPECT_EQ(j["1.weight"]["data_offsets"], nlohmann::json({88, 128}));
  EXPECT_EQ(bytes.size(), 8 + n + 128);
  EXPECT_EQ(bytes.substr(8 + n + 20, 60), tensor_bytes(model.get<0>().weight));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});  // no temporary left behind
}

TEST(Safetensors, EveryDtypeRoundTripsSortedByAlignment) {
  TempDir dir;
  TensorMap tensors{
      {"f32", Tensor(std::vector<float>{1.5f, -2, 3}, {3})},
      {"f64", Tensor(std::vector<double>{1e300, -0.25}, {2, 1})},
      {"f16", Tensor(std::vector<float>{0.5f, 1, 65504}, {3}).cast(DType::f16)},
      {"bf16", Tensor(std::vector<float>{0.5f, -1, 3e38f}, {1, 3}).cast(DType::bf16)},
      {"i32", Tensor(std::vector<int32_t>{-7, 2147483647}, {2})},
      {"i64", Tensor(std::vector<int64_t>{int64_t(1) << 60, -1}, {2})},
      {"u8", Tensor(std::vector<uint8_t>{0, 255, 7}, {3})},
      {"bool", Tensor(std::vector<uint8_t>{1, 0, 1, 1}, {2, 2}, DType::boolean)},
      {"scalar", Tensor(std::vector<float>{42}, Shape{})},
      {"empty", Tensor::empty({0, 4})},
  };
  save_state(dir.file("all.safetensors"), tensors);
  std::string bytes = read_bytes(dir.file("all.safetensors"));
  nlohmann::json j = header_json(bytes);
  EXPECT_EQ(j["bf16"]["dtype"], "BF16");
  EXPECT_EQ(j["bool"]["dtype"], "BOOL");
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
  // Alignment first (8-byte, then 4, 2, 1), then name.
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (auto& [k, v] : j.items()) by_offset.emplace_back(v["data_offsets"][0].get<uint64_t>() * 100 + v["data_offsets"][1].get<uint64_t>(), k);
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> order;
  for (auto& [o, k] : by_offset) order.push_back(k);
  EXPECT_EQ(order, (std::vector<std::string>{"f64", "i64", "empty", "f32", "i32", "scalar", "bf16", "f16", "bool", "u8"}));

  TensorMap back = load_state(dir.file("all.safetensors"));
  ASSERT_EQ(back.size(), tensors.size());
  for (auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(back[name].dtype(), t.dtype());
    EXPECT_EQ(back[name].shape(), t.shape());
    EXPECT_EQ(tensor_bytes(back[name]), tensor_bytes(t));
  }
  EXPECT_TRUE(load_metadata(dir.file("all.safetensors")).empty());
}

TEST(Safetensors, PytorchNamesDropChainSegments) {
  auto nested = Chain(Dense(2, 3, relu), Chain(Dense(3, 4), Dense(4, 1, DenseOptions{.bias = false})));
  std::vector<std::string> names;
  for (auto& [name, t] : pytorch_state(nested)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.1.weight"}));
  // Only the segments Chains add are dropped; a layer's own field called "layers" stays.
  EXPECT_EQ(pytorch_name("layers.0.layers.1.weight", {"layers", "layers.0.layers"}), "0.1.weight");
  EXPECT_EQ(pytorch_name("layers.0.layers.1.weight", {"layers"}), "0.layers.1.weight");
  EXPECT_EQ(pytorch_name("weight", {}), "weight");

  seed(20);
  Encoder enc{Chain(Dense(2, 3), relu, Dense(3, 3)), Dense(3, 1)};
  names.clear();
  for (auto& [name, t] : pytorch_state(enc)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                                             "head.weight", "head.bias"}));
  TempDir dir;
  save(dir.file("enc.safetensors"), enc);
  seed(21);
  Encoder other{Chain(Dense(2, 3), relu, Dense(3, 3)), Dense(3, 1)};
  load(dir.file("enc.safetensors"), other);
  EXPECT_EQ(model_bytes(other), model_bytes(enc));
}

TEST(Safetensors, OverwriteIsAtomicAndKeepsTheFileMode) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save(path, make_mlp(30));
  ::chmod(path.c_str(), 0640);
  auto second = make_mlp(31);
  save(path, second);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
  auto back = make_mlp(32);
  load(path, back);
  EXPECT_EQ(model_bytes(back), model_bytes(second));
}

// Loading across dtypes is never silent: an error naming every such tensor, both dtypes and the
// option, before anything changes; LoadOptions{.convert_dtypes = true} converts as load_state_dict.
TEST(Safetensors, LoadAcrossDtypesIsAnErrorUnlessAsked) {
  TempDir dir;
  auto model = make_mlp(2);
  TensorMap f64;
  for (auto& [name, t] : pytorch_state(model)) f64[name] = t.f64();
  f64["1.bias"] = model.get<1>().bias;  // one tensor of the model's own dtype
  save_state(dir.file("f64.safetensors"), f64);
  auto other = make_mlp(3);
  const auto before = model_bytes(other);
  expect_error([&] { load(dir.file("f64.safetensors"), other); },
               {"[load] " + dir.file("f64.safetensors"), "dtype mismatch: '0.weight' is Float64 in the file but Float32 in the model, "
                "'0.bias' is Float64 in the file but Float32 in the model, '1.weight' is Float64 in the file but "
                "Float32 in the model (load(path",
                "load(path, model, {.convert_dtypes = true}) converts them"});
  EXPECT_EQ(model_bytes(other), before) << "a refused load changed the model";
  load(dir.file("f64.safetensors"), other, {.convert_dtypes = true});
  EXPECT_EQ(model_bytes(other), model_bytes(model));  // f32 -> f64 -> f32 is exact
  EXPECT_EQ(other.get<0>().weight.dtype(), DType::f32);

  // A checkpoint has no such option: its message says so.
  auto opt = optimisers::setup(optimisers::Descent(0.1), model);
  save_checkpoint(dir.file("ckpt.safetensors"), model, opt);
  auto low = fmap([](const Tensor& t) { return t.cast(DType::bf16); }, make_mlp(4));
  auto low_opt = optimisers::setup(optimisers::Descent(0.1), low);
  expect_error([&] { load_checkpoint(dir.file("ckpt.safetensors"), low, low_opt); },
               {"[load_checkpoint]", "'model.0.weight' is Float32 in the file but BFloat16 in the model",
                "a checkpoint loads into a model and optimiser state of the dtypes it was saved from"});
}

// ---- every device to every device ----

class SafetensorsDevices : public ::testing::TestWithParam<Device> {};

TEST_P(SafetensorsDevices, SaveFromThisDeviceLoadOntoEvery) {
  TempDir dir;
  Device from = GetParam();
  auto model = make_mlp(4) | from;
  Tensor x = to(rand({6, 3}), from);
  std::vector<float> want = model(x).to_vector<float>();
  save(dir.file("m.safetensors"), model);
  for (const Device& onto : test_devices()) {
    SCOPED_TRACE(to_string(from) + " -> " + to_string(onto));
    auto other = make_mlp(5) | onto;
    load(dir.file("m.safetensors"), other);
    EXPECT_EQ(other.get<0>().weight.device(), onto);
    EXPECT_EQ(model_bytes(other), model_bytes(model));
    EXPECT_LE(flux::testing::max_rel_error(other(to(x, onto)), std::vector<double>(want.begin(), want.end())), 1e-5);
    TensorMap state = load_state(dir.file("m.safetensors"), onto);
    EXPECT_EQ(state.at("1.weight").device(), onto);
    EXPECT_EQ(tensor_bytes(state.at("1.weight")), tensor_bytes(model.get<1>().weight));
  }
}

TEST_P(SafetensorsDevices, EveryDtypeFromAndToThisDevice) {
  TempDir dir;
  Device d = GetParam();
  TensorMap tensors;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean})
    tensors[dtype_name(t)] = to(Tensor(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3}).cast(t), d);
  save_state(dir.file("d.safetensors"), tensors);
  TensorMap back = load_state(dir.file("d.safetensors"), d);
  for (auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(back[name].device(), d);
    EXPECT_EQ(tensor_bytes(back[name]), tensor_bytes(t));
  }
}
// bf16 and f16 models save and load bit for bit from and to every device; a Float32 file converted
// into them rounds exactly as Tensor::cast does (round to nearest even, PyTorch's .to(dtype)).
TEST_P(SafetensorsDevices, LowPrecisionModelsFromThisDevice) {
  TempDir dir;
  Device from = GetParam();
  save(dir.file("f32.safetensors"), make_mlp(50));
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    auto cast = [t](const Mlp& m) { return fmap([t](const Tensor& x) { return x.cast(t); }, m); };
    Mlp model = cast(make_mlp(50)) | from;
    save(dir.file("low.safetensors"), model);
    nlohmann::json header = header_json(read_bytes(dir.file("low.safetensors")));
    EXPECT_EQ(header["0.weight"]["dtype"], t == DType::bf16 ? "BF16" : "F16");
    for (const Device& onto : test_devices()) {
      SCOPED_TRACE(to_string(from) + " -> " + to_string(onto));
      Mlp other = cast(make_mlp(51)) | onto;
      load(dir.file("low.safetensors"), other);
      EXPECT_EQ(other.get<0>().weight.dtype(), t);
      EXPECT_EQ(model_bytes(other), model_bytes(model));
      Mlp converted = cast(make_mlp(52)) | onto;
      expect_error([&] { load(dir.file("f32.safetensors"), converted); },
                   {std::string("'0.weight' is Float32 in the file but ") + dtype_name(t) + " in the model"});
      load(dir.file("f32.safetensors"), converted, {.convert_dtypes = true});
      EXPECT_EQ(model_bytes(converted), model_bytes(model));
    }
  }
}

TEST_P(SafetensorsDevices, CheckpointFromThisDeviceRestoresOntoEvery) {
  TempDir dir;
  Device from = GetParam();
  auto model = make_mlp(40) | from;
  auto opt = optimisers::setup(optimisers::Adam(1e-2), model);
  Tensor x = to(rand({8, 3}), from), y = to(rand({8, 2}), from);
  for (int i = 0; i < 2; ++i) {
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
    optimisers::update(opt, model, grads);
  }
  save_checkpoint(dir.file("ckpt.safetensors"), model, opt);
  for (const Device& onto : test_devices()) {
    SCOPED_TRACE(to_string(from) + " -> " + to_string(onto));
    auto other = make_mlp(41) | onto;
    auto opt2 = optimisers::setup(optimisers::Adam(1e-2), other);
    load_checkpoint(dir.file("ckpt.safetensors"), other, opt2);
    EXPECT_EQ(model_bytes(other), model_bytes(model));
    ASSERT_EQ(opt2.leaves.size(), opt.leaves.size());
    for (size_t i = 0; i < opt.leaves.size(); ++i) {
      EXPECT_EQ(opt2.leaves[i].t, opt.leaves[i].t);
      for (size_t j = 0; j < opt.leaves[i].buffers.size(); ++j) {
        EXPECT_EQ(opt2.leaves[i].buffers[j].device(), onto);
        EXPECT_EQ(tensor_bytes(opt2.leaves[i].buffers[j]), tensor_bytes(opt.leaves[i].buffers[j]));
      }
    }
  }
}
FLUX_DEVICE_SUITE(SafetensorsDevices);

// ---- checkpoints ----

namespace {
template <class M> void train_steps(M& model, optimisers::State& opt, const Tensor& x, const Tensor& y, int n) {
  for (int i = 0; i < n; ++i) {
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
    optimisers::update(opt, model, grads);
  }
}
}  // namespace

TEST(Safetensors, CheckpointResumesBitIdentically) {
  TempDir dir;
  seed(11);
  Tensor x = rand({16, 3}), y = rand({16, 2});
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "Adam" : "OptimiserChain(WeightDecay, Momentum)");
    auto rule = [&]() -> std::shared_ptr<optimisers::Rule> {
      if (variant == 0) return std::make_shared<optimisers::Adam>(1e-2);
      return std::make_shared<optimisers::OptimiserChain>(optimisers::WeightDecay(1e-3), optimisers::Momentum(1e-2));
    };
    auto model = make_mlp(6);
    auto opt = optimisers::setup(*rule(), model);
    train_steps(model, opt, x, y, 3);
    save_checkpoint(dir.file("ckpt.safetensors"), model, opt, {{"epoch", "3"}});
    train_steps(model, opt, x, y, 3);

    auto resumed = make_mlp(7);
    auto opt2 = optimisers::setup(*rule(), resumed);
    Metadata meta = load_checkpoint(dir.file("ckpt.safetensors"), resumed, opt2);
    EXPECT_EQ(meta.at("epoch"), "3");
    EXPECT_EQ(meta.at("flux.rule"), opt.rule->name());
    if (variant == 0) {
      EXPECT_EQ(opt2.leaves.at(0).t, 3);
    }
    train_steps(resumed, opt2, x, y, 3);
    EXPECT_EQ(model_bytes(resumed), model_bytes(model));
    for (size_t i = 0; i < opt.leaves.size(); ++i)
      for (size_t j = 0; j < opt.leaves[i].buffers.size(); ++j)
        EXPECT_EQ(tensor_bytes(opt2.leaves[i].buffers[j]), tensor_bytes(opt.leaves[i].buffers[j]));
  }
}

TEST(Safetensors, CheckpointRejectsOtherFilesAndRules) {
  TempDir dir;
  auto model = make_mlp(8);
  auto adam = optimisers::setup(optimisers::Adam(), model);
  save(dir.file("model.safetensors"), model);
  expect_error([&] { load_checkpoint(dir.file("model.safetensors"), model, adam); },
               {"[load_checkpoint]", dir.file("model.safetensors"), "not a flux checkpoint"});
  save_checkpoint(dir.file("ckpt.safetensors"), model, adam);
  auto momentum = optimisers::setup(optimisers::Momentum(), model);
  expect_error([&] { load_checkpoint(dir.file("ckpt.safetensors"), model, momentum); },
               {dir.file("ckpt.safetensors"), "Adam", "Momentum"});
  // The model part of a checkpoint is named as a plain model file is, under "model.".
  TensorMap state = load_state(dir.file("ckpt.safetensors"));
  EXPECT_EQ(tensor_bytes(state.at("model.0.weight")), tensor_bytes(model.get<0>().weight));
  EXPECT_EQ(state.at("optimiser.0.t").dtype(), DType::i64);
}

// ---- atomic writes ----

// A writer SIGKILLed at random points: tests/test_save_faults.cpp.

TEST(Safetensors, SaveErrorsNameTheFile) {
  TempDir dir;
  auto model = make_mlp(9);
  const std::string nowhere = dir.file("no/such/folder/m.safetensors");
  expect_error([&] { save(nowhere, model); }, {"[save]", nowhere, "cannot create a temporary file"});
  expect_error([&] { save_state(dir.file("x.safetensors"), {{"__metadata__", zeros({1})}}); }, {"__metadata__"});
  expect_error([&] { save_state(dir.file("x.safetensors"), {{"u", Tensor()}}); }, {"'u'", "undefined"});
}

// ---- bad input: each a clear flux::Error naming the file and the problem ----

class SafetensorsBadInput : public ::testing::Test {
 protected:
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  /// Loads `bytes` every way a user can, expecting the same kind of error each time, named after the
  /// function called (load_checkpoint's said [load_metadata] before it read the file once).
  void expect_bad(const std::string& bytes, const std::vector<std::string>& parts) {
    write_bytes(path, bytes);
    auto with = [&](const std::string& api) {
      std::vector<std::string> all = parts;
      all.push_back("[" + api + "] " + path + ": ");
      return all;
    };
    expect_error([&] { load_state(path); }, with("load_state"));
    expect_error([&] { load_metadata(path); }, with("load_metadata"));
    auto model = make_mlp(10);
    auto before = model_bytes(model);
    expect_error([&] { load(path, model); }, with("load"));
    EXPECT_EQ(model_bytes(model), before);  // untouched
    auto opt = optimisers::setup(optimisers::Adam(), model);
    auto moments = tensor_bytes(opt.leaves.at(0).buffers.at(0));
    opt.leaves.at(0).t = 5;
    expect_error([&] { load_checkpoint(path, model, opt); }, with("load_checkpoint"));
    EXPECT_EQ(model_bytes(model), before);
    EXPECT_EQ(tensor_bytes(opt.leaves.at(0).buffers.at(0)), moments);
    EXPECT_EQ(opt.leaves.at(0).t, 5);
  }
};

TEST_F(SafetensorsBadInput, TruncatedFile) {
  expect_bad("", {"truncated file", "0 bytes"});
  expect_bad(std::string("\x10\0\0", 3), {"truncated file", "3 bytes"});
  TensorMap t{{"a", zeros({4})}};
  save_state(dir.file("good.safetensors"), t);
  std::string good = read_bytes(dir.file("good.safetensors"));
  expect_bad(good.substr(0, good.size() - 3), {"truncated file", "'a'", "ends at data byte 16"});
  expect_bad(good.substr(0, 20), {"header length", "larger than"});
}

TEST_F(SafetensorsBadInput, HeaderLengthTooLarge) {
  expect_bad(u64_le(1000) + "{}", {"header length 1000 is larger than the 2 bytes"});
  expect_bad(u64_le(200'000'000) + std::string(64, ' '), {"header length 200000000 exceeds the limit of 100000000"});
  expect_bad(u64_le(~uint64_t(0)) + "{}", {"exceeds the limit"});
}

TEST_F(SafetensorsBadInput, InvalidJson) {
  expect_bad(file_bytes("{\"a\": ", ""), {"invalid JSON header"});
  expect_bad(file_bytes("[1, 2]  ", ""), {"invalid JSON header", "'{'"});
  expect_bad(file_bytes("{}garbage", ""), {"invalid JSON header"});
  expect_bad(file_bytes(std::string("{\"\xff\": 1}"), ""), {"invalid JSON header"});
  expect_bad(file_bytes("{\"a\": 5}", ""), {"'a'", "expected an object"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [[[1]]], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"nested deeper"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"duplicate key 'a'"});
  expect_bad(file_bytes(R"({"__metadata__": {"k": 3}})", ""), {"__metadata__", "'k'", "must be a string"});
  expect_bad(file_bytes(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')), {"'a'", "missing \"dtype\""});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"'a'", "non-negative integer"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"'a'", "non-negative integer"});
}

TEST_F(SafetensorsBadInput, UnknownDtype) {
  expect_bad(file_bytes(R"({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"tensor 'a'", "unknown dtype 'F33'"});
  expect_bad(file_bytes(R"({"a": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"tensor 'a'", "dtype I16 is not supported"});
}

TEST_F(SafetensorsBadInput, ShapeOffsetMismatch) {
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", std::string(8, '\0')),
             {"tensor 'a'", "shape (2, 2) of F32 needs 16 bytes but data_offsets [0, 8] span 8"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", std::string(4, '\0')),
             {"tensor 'a'", "end before they begin"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", ""),
             {"tensor 'a'", "too many elements"});
  expect_bad(file_bytes(R"({"a": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 1]}})", std::string(1, '\0')),
             {"tensor 'a'", "9 dimensions"});
}

TEST_F(SafetensorsBadInput, OverlappingOrGappedOffsets) {
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", std::string(12, '\0')),
             {"tensor 'b'", "overlaps tensor 'a'"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(8, '\0')),
             {"overlaps tensor"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})", std::string(20, '\0')),
             {"gap of 4 bytes before tensor 'b'"});
  expect_bad(file_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(12, '\0')),
             {"the data section has 12 bytes but the tensors cover only 8"});
}

TEST_F(SafetensorsBadInput, MissingExtraAndMismatchedNamesAgainstTheModel) {
  auto model = make_mlp(12);
  auto before = model_bytes(model);
  TensorMap state;
  for (auto& [name, t] : pytorch_state(make_mlp(13))) state[name] = t;

  TensorMap missing = state;
  missing.erase("1.bias");
  save_state(path, missing);
  expect_error([&] { load(path, model); }, {"[load]", path, "missing from the file: '1.bias'"});

  TensorMap extra = state;
  extra["2.weight"] = zeros({2, 2});
  save_state(path, extra);
  expect_error([&] { load(path, model); }, {"[load]", path, "in the file but not in the model: '2.weight'"});

  TensorMap wrong = state;
  wrong["0.weight"] = zeros({3, 5});
  save_state(path, wrong);
  expect_error([&] { load(path, model); }, {"[load]", path, "shape mismatch", "'0.weight' is (3, 5) in the file but (5, 3) in the model"});

  EXPECT_EQ(model_bytes(model), before);
}

// A state_dict without BatchNorm's num_batches_tracked (PyTorch before 0.4.1, converted weights)
// loads with the count 0, as load_state_dict fills it in; every other missing name is still an error,
// and a checkpoint (flux's own files) must hold it.
TEST_F(SafetensorsBadInput, BatchNormCounterMayBeAbsentFromAModelFile) {
  auto src = Chain(Dense(3, 4), BatchNorm(4));
  src.get<1>().num_batches_tracked = Tensor(std::vector<int64_t>{7}, Shape{});
  src.get<1>().running_mean = Tensor(std::vector<float>{1, 2, 3, 4}, Shape{4});
  TensorMap state;
  for (auto& [name, t] : pytorch_state(src)) state[name] = t;
  state.erase("1.num_batches_tracked");
  save_state(path, state);
  auto model = Chain(Dense(3, 4), BatchNorm(4));
  model.get<1>().num_batches_tracked = Tensor(std::vector<int64_t>{5}, Shape{});
  load(path, model);
  EXPECT_EQ(model.get<1>().num_batches_tracked.item<int64_t>(), 0);
  EXPECT_EQ(model.get<1>().running_mean.to_vector<float>(), std::vector<float>({1, 2, 3, 4}));
  state.erase("1.running_var");
  save_state(path, state);
  expect_error([&] { load(path, model); }, {"missing from the file: '1.running_var'"});
  // checkpoints are flux's own files: the counter must be there
  auto opt = optimisers::setup(optimisers::Adam(), model);
  save_checkpoint(path, model, opt);
  TensorMap ck = load_state(path);
  ck.erase("model.1.num_batches_tracked");
  save_state(path, ck, load_metadata(path));
  expect_error([&] { load_checkpoint(path, model, opt); }, {"missing from the file: 'model.1.num_batches_tracked'"});
}

TEST_F(SafetensorsBadInput, NotAFile) {
  expect_error([&] { load_state(dir.file("absent.safetensors")); }, {"[load_state]", dir.file("absent.safetensors"), "cannot open"});
  expect_error([&] { load_state(dir.path()); }, {"[load_state]", dir.path(), "not a regular file"});
}
