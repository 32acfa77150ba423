// The misuse sweep of the APIs added since tests/misuse/test_misuse.cpp (issue 49): optimiser
// hyper-parameters, train() options and schedules, checkpoints of mismatched state, hostile and
// interrupted files, random states, mixed precision and GradScaler, onnx::save/load, distributed
// options, tuning options and every FLUX_* environment variable. One case per ctest entry (own
// process); each expects a flux::Error with a message fragment, or the correct value; a failed write
// must leave a good file at the same path loadable. MisuseEnvNew cases run only through
// tests/misuse.cmake's entries, which set their environment.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>

#include "flux/flux.hpp"
#include "flux/onnx.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("flux-misuse-new-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

using Mlp = decltype(Chain(Dense(3, 4, relu), Dense(4, 2)));
Mlp mlp() { return Chain(Dense(3, 4, relu), Dense(4, 2)); }

std::vector<std::vector<float>> values(const Mlp& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : pytorch_state(m)) out.push_back(t.to_vector<float>());
  return out;
}

// A good checkpoint at `path` (model and Adam state after one step); returns the model's values.
std::vector<std::vector<float>> good_checkpoint(const std::string& path) {
  seed(3);
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  auto [l, g] = withgradient([](auto& mm) { return sum(mm(ones({2, 3}))); }, m);
  optimisers::update(s, m, g);
  save_checkpoint(path, m, s);
  return values(m);
}

// The file at `path` still loads into a fresh model and holds `want`.
void expect_loads(const std::string& path, const std::vector<std::vector<float>>& want) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  EXPECT_NO_THROW(load_checkpoint(path, m, s)) << path;
  EXPECT_EQ(values(m), want) << path << " changed";
  EXPECT_EQ(s.steps, 1);
}

std::string misuse_env() {
  const char* v = std::getenv("FLUX_MISUSE_ENV");
  return v ? v : "";
}
}  // namespace

// ---------------- optimiser hyper-parameters ----------------

TEST(MisuseNew, OptimiserRatesAreValidatedWhereSet) {
  using namespace optimisers;
  EXPECT_FLUX_ERROR(Adam(kNaN), "[Adam] invalid learning rate: nan (must be finite and >= 0)");
  EXPECT_FLUX_ERROR(Adam(-1e-3), "[Adam] invalid learning rate: -0.001 (must be finite and >= 0)");
  EXPECT_FLUX_ERROR(Adam(kInf), "[Adam] invalid learning rate: inf");
  EXPECT_FLUX_ERROR(Descent(-1), "[Descent] invalid learning rate: -1");
  EXPECT_FLUX_ERROR(Momentum(0.01, 1.5), "[Momentum] invalid momentum rho: 1.5 (must be in [0, 1))");
  EXPECT_FLUX_ERROR(Nesterov(0.01, -0.1), "[Nesterov] invalid momentum rho: -0.1");
  EXPECT_FLUX_ERROR(RMSProp(0.01, 0.9, kNaN), "[RMSProp] invalid epsilon: nan");
  EXPECT_FLUX_ERROR(Adam({.beta = {0.9, 1.0}}), "[Adam] invalid beta parameter at index 1: 1");
  EXPECT_FLUX_ERROR(AdamW({.lambda = -1e-2}), "[AdamW] invalid weight decay lambda: -0.01");
  EXPECT_FLUX_ERROR(WeightDecay(kInf), "[WeightDecay] invalid weight decay lambda: inf");
  EXPECT_FLUX_ERROR(ClipGrad(kNaN), "[ClipGrad] invalid delta: nan");
  EXPECT_FLUX_ERROR(ClipNorm(1.0, -2), "[ClipNorm] invalid norm p: -2");
}

TEST(MisuseNew, AdjustToNaNOrNegativeKeepsTheRate) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(1e-3), m);
  EXPECT_FLUX_ERROR(optimisers::adjust(s, kNaN), "[Adam] invalid learning rate: nan");
  EXPECT_FLUX_ERROR(optimisers::adjust(s, -1e-3), "[Adam] invalid learning rate: -0.001");
  EXPECT_EQ(static_cast<optimisers::Adam&>(*s.rule).eta, 1e-3);
  auto chain = optimisers::setup(optimisers::OptimiserChain(optimisers::ClipGrad(1.0), optimisers::Adam()), m);
  EXPECT_FLUX_ERROR(optimisers::adjust(chain, kInf), "invalid learning rate: inf");
}

TEST(MisuseNew, RateSetThroughTheFieldIsRefusedByUpdate) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  static_cast<optimisers::Adam&>(*s.rule).eta = kNaN;
  const auto before = values(m);
  auto [l, g] = withgradient([](auto& mm) { return sum(mm(ones({2, 3}))); }, m);
  EXPECT_FLUX_ERROR(optimisers::update(s, m, g), "[Adam] invalid learning rate: nan");
  EXPECT_EQ(values(m), before);
  optimisers::Descent bad;
  bad.eta = -1;
  EXPECT_FLUX_ERROR(optimisers::setup(bad, m), "[Descent] invalid learning rate: -1");
}

// ---------------- train() ----------------

TEST(MisuseNew, TrainScheduleYieldingNaNStopsAtItsStep) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  std::vector<std::array<Tensor, 2>> data(3, {ones({2, 3}), zeros({2, 2})});
  auto loss = [](auto& mm, const Tensor& x, const Tensor& y) { return mse(mm(x), y); };
  EXPECT_FLUX_ERROR(train(loss, m, data, s, {.progress = false, .schedule = [](int64_t t) { return t < 2 ? 1e-3 : kNaN; }}),
                    "[train] the schedule gives the learning rate nan at step 2 (epoch 1, batch 3)");
  for (const auto& v : values(m))
    for (float x : v) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(s.steps, 2);
}

TEST(MisuseNew, TrainOverAnEmptyLoaderReportsNaNNotZero) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  auto loader = DataLoader({zeros({0, 3}), zeros({0, 2})}, {.batchsize = 4});
  TrainResult r = train([](auto& mm, const Tensor& x, const Tensor& y) { return mse(mm(x), y); }, m, loader, s,
                        {.epochs = 2, .progress = false});
  ASSERT_EQ(r.epoch_loss.size(), 2u);
  EXPECT_TRUE(std::isnan(r.epoch_loss[0])) << r.epoch_loss[0];
  EXPECT_EQ(r.steps, 0);
}

TEST(MisuseNew, TrainOptionsOutOfRange) {
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  std::vector<std::array<Tensor, 2>> data(2, {ones({2, 3}), zeros({2, 2})});
  auto loss = [](auto& mm, const Tensor& x, const Tensor& y) { return mse(mm(x), y); };
  EXPECT_FLUX_ERROR(train(loss, m, data, s, {.progress = false, .start_step = -3}), "[train] start_step must be >= 0, got -3");
  EXPECT_FLUX_ERROR(train(loss, m, data, s, {.epochs = -1, .progress = false}), "[train] epochs must be >= 0, got -1");
  std::vector<std::array<Tensor, 2>> none;
  EXPECT_FLUX_ERROR(train(loss, m, none, s, {.progress = false, .start_step = 5}), "[train] start_step = 5 but the data has no batches");
  // past the end: nothing runs, the step is kept
  TrainResult r = train(loss, m, data, s, {.epochs = 1, .progress = false, .start_step = 7});
  EXPECT_EQ(r.steps, 7);
  EXPECT_TRUE(r.epoch_loss.empty());
}

// ---------------- checkpoints ----------------

TEST(MisuseNew, CheckpointWithAnotherModelsStateKeepsTheGoodFile) {
  const std::string path = (scratch("ckpt-other") / "run.safetensors").string();
  const auto want = good_checkpoint(path);
  auto m = mlp();
  auto other = Chain(Dense(3, 5), Dense(5, 2));
  auto other_state = optimisers::setup(optimisers::Adam(), other);
  EXPECT_FLUX_ERROR(save_checkpoint(path, m, other_state), "[save_checkpoint] the optimiser state of array 0");
  auto bigger = optimisers::setup(optimisers::Adam(), Chain(Dense(3, 4), Dense(4, 2), Dense(2, 2)));
  EXPECT_FLUX_ERROR(save_checkpoint(path, m, bigger), "[save_checkpoint] the model has 4 arrays but the optimiser state was set up for 6");
  optimisers::State empty;
  EXPECT_FLUX_ERROR(save_checkpoint(path, m, empty), "[save_checkpoint] the optimiser state is empty");
  auto s = optimisers::setup(optimisers::Adam(), m);
  s.leaves[0].t = -5;
  EXPECT_FLUX_ERROR(save_checkpoint(path, m, s), "step count -5");
  s.leaves[0].t = 0;
  s.steps = -1;
  EXPECT_FLUX_ERROR(save_checkpoint(path, m, s), "step count is -1");
  expect_loads(path, want);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(MisuseNew, CheckpointWithNegativeStepCountIsRefusedOnLoad) {
  const auto dir = scratch("ckpt-steps");
  const std::string path = (dir / "run.safetensors").string();
  good_checkpoint(path);
  TensorMap t = load_state(path);
  Metadata meta = load_metadata(path);
  t["optimiser.2.t"] = Tensor(std::vector<int64_t>{-5}, Shape{});
  save_state((dir / "t.safetensors").string(), t, meta);
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  const auto before = values(m);
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "t.safetensors").string(), m, s), "'optimiser.2.t' (a step count) is -5; expected >= 0");
  EXPECT_EQ(values(m), before);
  meta["flux.steps"] = "-5";
  save_state((dir / "steps.safetensors").string(), load_state(path), meta);
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "steps.safetensors").string(), m, s), "\"flux.steps\" is '-5'");
  EXPECT_EQ(values(m), before);
  EXPECT_EQ(s.steps, 0);
}

TEST(MisuseNew, CheckpointHostileFiles) {
  const auto dir = scratch("ckpt-hostile");
  const std::string path = (dir / "run.safetensors").string();
  good_checkpoint(path);
  const std::string bytes = read_bytes(path);
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  const auto before = values(m);
  write_bytes(dir / "truncated.safetensors", bytes.substr(0, bytes.size() / 2));
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "truncated.safetensors").string(), m, s), "[load_checkpoint]");
  write_bytes(dir / "empty.safetensors", "");
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "empty.safetensors").string(), m, s), "[load_checkpoint]");
  Metadata meta = load_metadata(path);
  meta["flux.random_state"] = "banana";
  save_state((dir / "random.safetensors").string(), load_state(path), meta);
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "random.safetensors").string(), m, s), "\"flux.random_state\" is malformed (nothing was loaded)");
  auto d = optimisers::setup(optimisers::Descent(), m);
  EXPECT_FLUX_ERROR(load_checkpoint(path, m, d), "the checkpoint's optimiser is Adam");
  optimisers::GradScaler scaler;
  EXPECT_FLUX_ERROR(load_checkpoint(path, m, s, scaler), "holds no GradScaler state");
  auto f64m = f64(mlp());
  auto f64s = optimisers::setup(optimisers::Adam(), f64m);
  EXPECT_FLUX_ERROR(load_checkpoint(path, f64m, f64s), "dtype mismatch");
  EXPECT_FLUX_ERROR(load_checkpoint((dir / "absent.safetensors").string(), m, s), "[load_checkpoint]");
  EXPECT_EQ(values(m), before);
}

// A writer killed mid-save (SIGKILL) leaves the previous checkpoint whole.
TEST(MisuseNew, CheckpointWriterKilledMidSaveKeepsTheGoodFile) {
  const auto dir = scratch("ckpt-killed");
  const std::string path = (dir / "run.safetensors").string();
  const auto want = good_checkpoint(path);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto big = Chain(Dense(3, 4, relu), Dense(4, 2));
    auto s = optimisers::setup(optimisers::Adam(), big);
    for (int i = 0; i < 100000; ++i) save_checkpoint(path, big, s);  // killed while saving
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  // The file is either the good one or one of the child's complete saves (fresh weights, steps 0).
  auto m = mlp();
  auto s = optimisers::setup(optimisers::Adam(), m);
  EXPECT_NO_THROW(load_checkpoint(path, m, s));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
}

TEST(MisuseNew, StateFileWithoutBatchNormCounterLoads) {
  const auto dir = scratch("bn-counter");
  auto src = Chain(Dense(3, 4), BatchNorm(4));
  TensorMap t;
  for (auto& [name, x] : pytorch_state(src)) t[name] = x;
  t.erase("1.num_batches_tracked");
  save_state((dir / "old.safetensors").string(), t);
  auto m = Chain(Dense(3, 4), BatchNorm(4));
  load((dir / "old.safetensors").string(), m);
  EXPECT_EQ(m.get<1>().num_batches_tracked.item<int64_t>(), 0);
}

// ---------------- random state ----------------

TEST(MisuseNew, RandomStateParseOfBadText) {
  EXPECT_FLUX_ERROR(parse_random_state("banana"), "[parse_random_state] expected text starting with");
  EXPECT_FLUX_ERROR(parse_random_state(""), "[parse_random_state]");
  const std::string good = to_string(random_state());
  EXPECT_FLUX_ERROR(parse_random_state(good.substr(0, good.size() / 2)), "[parse_random_state]");
  EXPECT_FLUX_ERROR(parse_random_state(good + " 7"), "[parse_random_state] unexpected text after");
  // a round trip restores the exact stream
  seed(11);
  RandomState at = random_state();
  std::vector<float> first = rand({8}).to_vector<float>();
  set_random_state(parse_random_state(to_string(at)));
  EXPECT_EQ(rand({8}).to_vector<float>(), first);
}

// ---------------- mixed precision ----------------

TEST(MisuseNew, AutocastAndGradScalerOptions) {
  EXPECT_FLUX_ERROR(autocast(DType::i32, [] { return 0; }), "[autocast] runs in Float16 or BFloat16");
  EXPECT_FLUX_ERROR(autocast(DType::f64, [] { return 0; }), "[autocast] runs in Float16 or BFloat16");
  EXPECT_FLUX_ERROR(optimisers::GradScaler({.init_scale = kNaN}), "init_scale must be finite and positive");
  EXPECT_FLUX_ERROR(optimisers::GradScaler({.init_scale = -1}), "init_scale must be finite and positive");
  EXPECT_FLUX_ERROR(optimisers::GradScaler({.growth_factor = 0.5}), "growth_factor must be finite and > 1");
  EXPECT_FLUX_ERROR(optimisers::GradScaler({.backoff_factor = 1.5}), "backoff_factor must be in (0, 1)");
  EXPECT_FLUX_ERROR(optimisers::GradScaler({.growth_interval = 0}), "growth_interval must be >= 1");
  optimisers::GradScaler scaler;
  EXPECT_FLUX_ERROR(scaler.scale(Tensor(std::vector<int64_t>{1}, Shape{})), "[GradScaler::scale] the loss must be floating point");
  // a correct value: bf16 autocast of a Dense is close to Float32
  auto d = Dense(4, 3);
  Tensor x = rand({2, 4});
  Tensor low = autocast(DType::bf16, [&] { return d(x); });
  std::vector<float> a = low.to_vector<float>(), b = d(x).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.05) << i;
}

// ---------------- ONNX ----------------

TEST(MisuseNew, OnnxSaveCollidingNamesKeepsTheGoodFile) {
  if (!onnx::available()) GTEST_SKIP() << "built without ONNX";
  const auto dir = scratch("onnx-names");
  const std::string path = (dir / "m.onnx").string();
  auto model = Dense(2, 2);
  onnx::save(path, model, rand({1, 2}));
  const std::string good = read_bytes(path);
  auto two = [](const Tensor& a, const Tensor& b) { return a + b; };
  EXPECT_FLUX_ERROR(onnx::save(path, two, std::array<Tensor, 2>{rand({1, 2}), rand({1, 2})}, {.input_names = {"a", "a"}}),
                    "input_names: 'a' would name both input 0 and input 1");
  EXPECT_FLUX_ERROR(onnx::save(path, model, rand({1, 2}), {.input_names = {"bias"}}), "'bias' would name both the model's weight 'bias'");
  EXPECT_FLUX_ERROR(onnx::save(path, model, rand({1, 2}), {.output_names = {"input"}}), "'input' would name both input 0 and output 0");
  EXPECT_FLUX_ERROR(onnx::save(path, model, rand({1, 2}), {.opset = 99}), "opset 99 is not supported");
  EXPECT_EQ(read_bytes(path), good);
  EXPECT_NO_THROW(onnx::load(path));
}

TEST(MisuseNew, OnnxLoadHostileFiles) {
  if (!onnx::available()) GTEST_SKIP() << "built without ONNX";
  const auto dir = scratch("onnx-hostile");
  const std::string path = (dir / "m.onnx").string();
  auto model = Chain(Dense(16, 32, relu), Dense(32, 4));
  onnx::save(path, model, rand({1, 16}), {.external_data = true});
  const std::string bytes = read_bytes(path), data = read_bytes(path + ".data");
  ASSERT_NE(bytes.find("m.onnx.data"), std::string::npos);
  // truncated, empty, garbage, a folder, absent
  write_bytes(dir / "cut.onnx", bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(onnx::load((dir / "cut.onnx").string()), Error);
  write_bytes(dir / "empty.onnx", "");
  EXPECT_THROW(onnx::load((dir / "empty.onnx").string()), Error);
  write_bytes(dir / "junk.onnx", std::string(1000, '\xff'));
  EXPECT_THROW(onnx::load((dir / "junk.onnx").string()), Error);
  EXPECT_THROW(onnx::load(dir.string()), Error);
  EXPECT_THROW(onnx::load((dir / "absent.onnx").string()), Error);
  // external data pointing outside the model's folder (same length, so the protobuf stays valid)
  for (const std::string& outside : {std::string("/etc/passwd"), std::string("../m.o.data")}) {
    std::string hostile = bytes;
    for (size_t at = hostile.find("m.onnx.data"); at != std::string::npos; at = hostile.find("m.onnx.data", at))
      hostile.replace(at, 11, outside);
    write_bytes(dir / "outside.onnx", hostile);
    EXPECT_FLUX_ERROR(onnx::load((dir / "outside.onnx").string()), "") << outside;
  }
  // external data shorter than the tensors it must hold
  write_bytes(path + ".data", data.substr(0, data.size() / 3));
  EXPECT_THROW(onnx::load(path), Error);
  write_bytes(path + ".data", data);
  EXPECT_NO_THROW(onnx::load(path));
}

// ---------------- distributed, tuning ----------------

TEST(MisuseNew, DistributedAndTuneOptions) {
  EXPECT_FLUX_ERROR(distributed::initialize({.timeout = kNaN}), "[distributed::initialize] timeout must be a finite number");
  EXPECT_FLUX_ERROR(distributed::initialize({.timeout = kInf}), "[distributed::initialize] timeout must be a finite number");
  auto work = [] { (void)matmul(ones({8, 8}), ones({8, 8})); };
  EXPECT_FLUX_ERROR(tune_kernels(work, {.reps = 0, .save = false}), "[tune_kernels] reps must be at least 1");
  EXPECT_FLUX_ERROR(tune_kernels(work, {.margin = kNaN, .save = false}), "[tune_kernels] margin must be in [0, 1)");
  EXPECT_FLUX_ERROR(tune_kernels(work, {.margin = 1.5, .save = false}), "[tune_kernels] margin must be in [0, 1)");
}

// ---------------- environment variables (tests/misuse.cmake sets them) ----------------

TEST(MisuseEnvNew, Variables) {
  const std::string env = misuse_env();
  if (env.rfind("new_", 0) != 0) GTEST_SKIP() << "run by tests/misuse.cmake with a FLUX_* variable set";
  auto conv = [] {
    Conv c({3, 3}, 1, 2);
    return c(rand({1, 1, 6, 6}));
  };
  if (env == "new_cpu_limit_negative") {
    EXPECT_FLUX_ERROR(zeros({4}), "FLUX_CPU_MEMORY_LIMIT='-1' is not allowed: expected bytes");
  } else if (env == "new_emulate_false") {
    EXPECT_FALSE(autocast_emulation());  // "false" used to turn it on
  } else if (env == "new_emulate_on") {
    EXPECT_TRUE(autocast_emulation());
  } else if (env == "new_emulate_junk") {
    EXPECT_FLUX_ERROR(autocast_emulation(), "FLUX_AUTOCAST_EMULATE='maybe' is not allowed: expected 0, 1, true, false, on, off");
  } else if (env == "new_library_kernels_junk") {
    EXPECT_FLUX_ERROR(conv(), "FLUX_LIBRARY_KERNELS='banana' is not allowed");
  } else if (env == "new_library_kernels_off") {
    Tensor y = conv();  // the portable path, a correct value
    EXPECT_EQ(y.shape(), Shape({1, 2, 4, 4}));
  } else if (env == "new_onednn_layout_junk") {
#if FLUX_TEST_HAVE_ONEDNN
    EXPECT_FLUX_ERROR(conv(), "FLUX_ONEDNN_LAYOUT='banana' is not allowed: expected auto, plain, any, plain-src");
#endif
  } else if (env == "new_onednn_threading_junk") {
#if FLUX_TEST_HAVE_ONEDNN
    EXPECT_FLUX_ERROR(conv(), "FLUX_ONEDNN_THREADING='banana' is not allowed: expected pool, omp");
#endif
  } else if (env == "new_denormals_junk") {
    EXPECT_FLUX_ERROR(flushes_denormals(Float32), "FLUX_FLUSH_DENORMALS='2' is not allowed: expected 0, 1, all");
  } else if (env == "new_timeout_junk") {
    EXPECT_FLUX_ERROR(distributed::initialize(), "FLUX_DISTRIBUTED_TIMEOUT='soon' is not allowed");
  } else if (env == "new_debug_backends_junk") {
    // a log switch: one warning, and the program goes on (the device list was made before this test)
    ::testing::internal::CaptureStderr();
    Device d = get_device();
    EXPECT_NE(d.backend(), "");
    const std::string err = ::testing::internal::GetCapturedStderr();
    (void)err;
  } else if (env == "new_opencl_devices_junk") {
    // a warning and the reason, never an exception: the CPU is used
    ::testing::internal::CaptureStderr();
    Device d = get_device();
    ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(d.backend(), "CPU");
    EXPECT_FALSE(functional("OpenCL"));
  } else {
    FAIL() << "unknown FLUX_MISUSE_ENV " << env;
  }
}
