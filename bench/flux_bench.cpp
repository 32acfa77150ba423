// One benchmark case with flux-cpp; prints "key value" lines for bench/run_bench.py.
// Usage: flux_bench CASE [DEVICE]   CASE: seed | mnist | mnist_converged | wide | overhead | infer | sgemm | lenet |
//                                         fmnist | resnet | resnet_train | onnx_resnet | onnx_encoder | lstm | lstm_converged |
//                                         transformer | encoder | decoder | attention_memory | passes | serve | blas | info
// --autocast=bf16|f16 runs mnist, infer, resnet, resnet_train, encoder, decoder, onnx_resnet and onnx_encoder
// under flux's autocast (training: withgradient with .autocast; inference: autocast(dtype, model call));
// without it they run in float32.
// info: the CPU backend's ISA and bf16/f16 units line of versioninfo(), and its libraries line
// (what OpenBLAS and oneDNN run against the CPU), for the table's header.
// passes: the CPU backend's full-tensor conversion passes and kernel calls in one step (see passes_case).
// serve: one testmode model called from 1 and from 2 threads at once (throughput, and whether the outputs
// are bitwise those of one caller); --seconds=S sets each of its measurements (default 1 s).
// The *_converged cases time the same steps after kConvergeSteps steps of training (bench_common.hpp),
// when small gradients have driven Adam's moments towards the subnormal range.
// DEVICE: cpu (default) or opencl. --gemm=auto|openblas|onednn (after DEVICE) forces the CPU GEMM engine;
// --seconds=S times every training case for S seconds (e.g. the 30 s system-time check). Threads come from FLUX_NUM_THREADS / OPENBLAS_NUM_THREADS;
// --batch=N runs the inference cases at batch N only; --stages makes resnet print each stage's time too.
// --checksum: resnet and infer also print KEY_checksum, an FNV-1a checksum of the bits of their first
// output and of one after the timing; the training cases (mnist, ...) train_checksum, of the warm-up
// steps' losses and the parameters after them (bench/determinism.sh compares two processes').
// --linear=auto|onednn|panels forces the kernel of Dense inference (linear_forward: oneDNN or flux's panels);
// --winograd=auto|off|on the Winograd F(2x2, 3x3) path of 3x3 convs at inference (off: oneDNN; on: where it fits).
// FLUX_LIBRARY_KERNELS=0 forces the portable im2col + GEMM convolution path instead of oneDNN.
// The same work, written with LibTorch, is in torch_bench.cpp; shapes are listed in bench_common.hpp.
#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <flux/flux.hpp>

// The convolutional cases need the layers of issue 11; each case is compiled once its headers exist
// (flux_bench prints "skipped" otherwise, and the table shows "—").
#if __has_include(<flux/nn/conv.hpp>) && __has_include(<flux/nn/pooling.hpp>)
#include <flux/nn/conv.hpp>
#include <flux/nn/pooling.hpp>
#define FLUX_BENCH_LENET 1
// From src/ops/ops_internal.hpp (not installed): whether conv may use oneDNN (FLUX_LIBRARY_KERNELS).
namespace flux::detail {
bool library_kernels();
}
#if __has_include(<flux/nn/normalisation.hpp>) && __has_include(<flux/nn/dropout.hpp>)
#include <flux/nn/dropout.hpp>
#include <flux/nn/normalisation.hpp>
#define FLUX_BENCH_FMNIST 1
#endif
#if __has_include(<flux/onnx.hpp>)
#include <flux/onnx.hpp>
#define FLUX_BENCH_ONNX 1
#endif
#if __has_include(<flux/models/resnet.hpp>)
#include <flux/models/resnet.hpp>
#define FLUX_BENCH_RESNET 1
#elif defined(FLUX_BENCH_FMNIST)
#define FLUX_BENCH_RESNET 1
#define FLUX_BENCH_LOCAL_RESNET 1  // flux/models/resnet.hpp not there: the network below, from the layers
#endif
#endif

#if __has_include(<flux/autocast.hpp>)
#include <flux/autocast.hpp>
#define FLUX_BENCH_AUTOCAST 1
#endif

#include <optional>
#include <sstream>

#include "bench_common.hpp"
#include "examples/example_models.hpp"
#include "src/storage_stats.hpp"

// From src/backends/cpu (not installed): the CPU kernels' ISA level and a cap on it (FLUX_BENCH_MAX_ISA,
// set by run_bench.py --max-isa), and the GEMM engine override (--gemm=auto|openblas|onednn; auto, the
// default, is the per-shape measured choice).
namespace flux::detail {
const char* cpu_isa_name();
int cpu_force_isa(int level);
void cpu_pass_counts(int64_t* conversions, int64_t* conversion_bytes, int64_t* kernels);  // backend.cpp
void cpu_reset_pass_counts();
bool cpu_force_kernel(const std::string& site, const std::string& kernel);
int64_t cpu_gemm_engine_calls(const std::string& engine);
size_t peak_storage_bytes();  // src/storage_stats.hpp
}  // namespace flux::detail

using namespace flux;
using bench::Timer;

namespace {

Device g_dev;
double g_train_seconds = 0;  // --seconds=S: every training case runs S seconds (0: the case's own)
int64_t g_only_batch = 0;    // --batch=N: the inference cases (infer, resnet) run batch N alone (profiling)
int g_converge_steps = 0;   // --converge-steps=N: the *_converged cases train N steps first (0: bench_common.hpp's)
bool g_stages = false;       // --stages: resnet also prints each stage's time (torchvision's ResNet-18 only)
bool g_checksum = false;     // --checksum: resnet, infer and the training cases print FNV-1a checksums of their outputs
std::optional<DType> g_autocast;  // --autocast=bf16|f16: the mixed-precision rows' low dtype (none: float32)

// The model's forward, under autocast when --autocast is given.
template <class M> Tensor forward(const M& model, const Tensor& x) {
#ifdef FLUX_BENCH_AUTOCAST
  if (g_autocast) return autocast(*g_autocast, [&] { return model(x); });
#endif
  return model(x);
}

// withgradient(f, model), with the autocast option when --autocast is given.
template <class F, class M> auto value_and_gradient(F&& f, const M& model) {
#ifdef FLUX_BENCH_AUTOCAST
  if (g_autocast) return withgradient(std::forward<F>(f), model, GradientOptions{.autocast = *g_autocast});
#endif
  return withgradient(std::forward<F>(f), model);
}

// FNV-1a (64-bit) over the bits of floats: equal checksums mean bitwise-equal values (bench/determinism.sh
// compares two processes' checksums).
struct Checksum {
  uint64_t h = 14695981039346656037ull;
  void add(const std::vector<float>& v) {
    for (float f : v) {
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      for (int i = 0; i < 4; ++i) h = (h ^ ((bits >> (8 * i)) & 0xffu)) * 1099511628211ull;
    }
  }
  void add(const Tensor& t) { add(t.to_vector<float>()); }
  void print(const std::string& key) const { std::printf("%s_checksum %016llx\n", key.c_str(), (unsigned long long)h); }
};

// One-hot targets (batch, classes) with class i % classes.
Tensor onehot_targets(int64_t batch, int64_t classes) {
  std::vector<float> v(size_t(batch * classes), 0.f);
  for (int64_t i = 0; i < batch; ++i) v[size_t(i * classes + (i * 7) % classes)] = 1.f;
  return to(Tensor(v, Shape{batch, classes}), g_dev);
}

template <class Model, class Loss>
double train_steps_per_s(Model& model, const Tensor& x, const Tensor& y, Loss loss, int warmup, double seconds) {
  auto opt = optimisers::setup(optimisers::Adam(1e-3), model);
  auto step = [&] {
    auto [l, grads] = value_and_gradient([&](auto& m) { return loss(m(x), y); }, model);
    optimisers::update(opt, model, grads);
    return l.template item<float>();
  };
  if (g_checksum) {  // the warm-up steps' losses and the parameters after them
    Checksum c;
    for (int i = 0; i < warmup; ++i) c.add(std::vector<float>{step()});
    for (const Tensor& p : params(model)) c.add(p);
    c.print("train");
  } else {
    for (int i = 0; i < warmup; ++i) step();
  }
  // Also the process's CPU time per step (all threads, user and system): on shared, loaded cores
  // it moves far less than the rate, and the system share shows page faults and wake-ups.
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  Timer t;
  double r = bench::rate(step, g_train_seconds > 0 ? g_train_seconds : seconds);
  double steps = r * t.seconds();
  getrusage(RUSAGE_SELF, &r1);
  auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_usec - a.tv_usec); };
  double user = secs(r0.ru_utime, r1.ru_utime), sys = secs(r0.ru_stime, r1.ru_stime);
  std::printf("train_cpu_ms_per_step %.6g\ntrain_sys_ms_per_step %.6g\ntrain_minflt_per_step %.6g\n",
              1e3 * (user + sys) / steps, 1e3 * sys / steps, double(r1.ru_minflt - r0.ru_minflt) / steps);
  return r;
}

void seed_case() {
  auto model = Chain(Dense(10, 64, relu), Dense(64, 1)) | g_dev;
  Tensor x = to(rand({64, 10}), g_dev), y = to(rand({64, 1}), g_dev);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return mse(a, b); }, 50, 1.0);
  std::printf("seed_steps_per_s %.6g\n", r);
}

void mnist_case(int pretrain = 0) {
  auto model = Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10)) | g_dev;
  Tensor x = to(rand({128, 784}), g_dev), y = onehot_targets(128, 10);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); },
                               pretrain ? pretrain : 5, 1.5);
  std::printf("%s %.6g\n", pretrain ? "mnist_converged_steps_per_s" : "mnist_steps_per_s", r);
}

void wide_case() {
  auto model = Chain(Dense(1024, 4096, relu), Dense(4096, 4096, relu), Dense(4096, 1024)) | g_dev;
  Tensor x = to(rand({256, 1024}), g_dev), y = to(rand({256, 1024}), g_dev);
  std::printf("rss_after_init_mb %.6g\n", bench::peak_rss_mb());
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return mse(a, b); }, 1, 2.5);
  std::printf("wide_steps_per_s %.6g\nwide_gflops %.6g\n", r, r * bench::wide_step_flops() * 1e-9);
  std::printf("peak_rss_mb %.6g\n", bench::peak_rss_mb());
}

void overhead_case() {
  Tensor a = to(rand({16}), g_dev), b = to(rand({16}), g_dev);
  Tensor c;
  double per_add = 1e6 / bench::rate_cpu([&] { c = add(a, b); return 0.f; }, 0.5, 1000);
  g_dev.synchronize();
  std::printf("add16_us %.6g\n", per_add);
  Dense d = Dense(16, 16) | g_dev;
  Tensor x = to(rand({16, 16}), g_dev);
  auto fwd_bwd = [&] {
    auto g = gradient([&](auto& m) { return sum(m(x)); }, d);
    return 0.f;
  };
  for (int i = 0; i < 100; ++i) fwd_bwd();
  double per_dense = 1e6 / bench::rate_cpu(fwd_bwd, 0.5, 100);
  g_dev.synchronize();
  std::printf("dense16_us %.6g\n", per_dense);
}

void infer_case() {
  auto model = Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10)) | g_dev;
  for (int64_t batch : {1, 128}) {
    if (g_only_batch && batch != g_only_batch) continue;
    Tensor x = to(rand({batch, 784}), g_dev);
    auto run = [&] {
      Tensor y = forward(model, x);
      g_dev.synchronize();
      return 0.f;
    };
    Checksum c;  // --checksum: the first output and one after the timing
    if (g_checksum) c.add(forward(model, x));
    for (int i = 0; i < 20; ++i) run();
    std::printf("infer%lld_us %.6g\n", (long long)batch, 1e6 / bench::rate(run, 0.7));
    if (g_checksum) {
      c.add(forward(model, x));
      c.print("infer" + std::to_string(batch));
    }
  }
}

// OpenBLAS sgemm alone on the wide MLP's GEMMs, with the transposes the training step uses.
void sgemm_case() {
  double flops = 0, secs = 0;
  for (const bench::GemmShape& s : bench::wide_gemms()) {
    std::vector<float> a(size_t(s.m * s.k), 0.5f), b(size_t(s.k * s.n), 0.25f), c(size_t(s.m * s.n));
    auto call = [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m),
                  int(s.n), int(s.k), 1.f, a.data(), int(s.ta ? s.m : s.k), b.data(), int(s.tb ? s.k : s.n), 0.f,
                  c.data(), int(s.n));
      return c[0];
    };
    call();
    double r = bench::rate(call, 0.4);
    flops += 2.0 * double(s.m) * double(s.n) * double(s.k);
    secs += 1.0 / r;
  }
  std::printf("sgemm_gflops %.6g\n", flops / secs * 1e-9);
}


// ---- Convolutional cases (bench_common.hpp: batch and image sizes). The same networks are in
// torch_bench.cpp. ----

#ifdef FLUX_BENCH_LENET
void lenet_case() {
  auto model = Chain(Conv({5, 5}, 1, 6, relu), MaxPool({2, 2}), Conv({5, 5}, 6, 16, relu), MaxPool({2, 2}), flatten,
                     Dense(256, 120, relu), Dense(120, 84, relu), Dense(84, 10)) |
               g_dev;
  Tensor x = to(rand({bench::kCnnBatch, 1, 28, 28}), g_dev), y = onehot_targets(bench::kCnnBatch, 10);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); },
                               5, 2.0);
  std::printf("lenet_steps_per_s %.6g\n", r);
}
#else
void lenet_case() { std::printf("skipped Conv/MaxPool layers not built\n"); }
#endif

#ifdef FLUX_BENCH_FMNIST
void fmnist_case() {
  auto model = Chain(Conv({3, 3}, 1, 32, identity, {.pad = 1}), BatchNorm(32, relu), MaxPool({2, 2}),
                     Conv({3, 3}, 32, 64, identity, {.pad = 1}), BatchNorm(64, relu), MaxPool({2, 2}), Dropout(0.25),
                     flatten, Dense(3136, 128, relu), Dense(128, 10)) |
               g_dev;
  Tensor x = to(rand({bench::kCnnBatch, 1, 28, 28}), g_dev), y = onehot_targets(bench::kCnnBatch, 10);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); },
                               3, 2.5);
  std::printf("fmnist_steps_per_s %.6g\n", r);
}
#else
void fmnist_case() { std::printf("skipped Conv/BatchNorm/Dropout layers not built\n"); }
#endif

#ifdef FLUX_BENCH_LOCAL_RESNET
// torchvision's ResNet-18 (BasicBlock x [2, 2, 2, 2], convs without bias, 1x1 stride-2 downsample),
// built from flux's layers, as torch_bench.cpp builds it from LibTorch's modules.
struct BasicBlock {
  Conv conv1, conv2, down;  // down: undefined weight when the block keeps its shape
  BatchNorm bn1, bn2, down_bn;
  BasicBlock() = default;
  BasicBlock(int64_t in, int64_t out, int64_t stride)
      : conv1({3, 3}, in, out, {.stride = stride, .pad = 1, .bias = false}),
        conv2({3, 3}, out, out, {.pad = 1, .bias = false}),
        bn1(out, relu),
        bn2(out) {
    if (stride != 1 || in != out) {
      down = Conv({1, 1}, in, out, {.stride = stride, .bias = false});
      down_bn = BatchNorm(out);
    }
  }
  Tensor operator()(const Tensor& x) const {
    Tensor y = bn2(conv2(bn1(conv1(x))));
    return relu(add(y, down.weight.defined() ? down_bn(down(x)) : x));
  }
};
FLUX_LAYER(BasicBlock, conv1, bn1, conv2, bn2, down, down_bn)

struct BenchResNet18 {
  Conv conv1 = Conv({7, 7}, 3, 64, {.stride = 2, .pad = 3, .bias = false});
  BatchNorm bn1 = BatchNorm(64, relu);
  MaxPool pool = MaxPool({3, 3}, {.stride = 2, .pad = 1});
  std::vector<BasicBlock> layers;
  Dense fc = Dense(512, 1000);
  BenchResNet18() {
    int64_t in = 64;
    for (int64_t out : {64, 128, 256, 512}) {
      layers.emplace_back(in, out, out == 64 ? 1 : 2);
      layers.emplace_back(out, out, 1);
      in = out;
    }
  }
  Tensor operator()(const Tensor& x) const {
    Tensor y = pool(bn1(conv1(x)));
    for (const BasicBlock& b : layers) y = b(y);
    return fc(flatten(global_meanpool(y)));
  }
};
FLUX_LAYER(BenchResNet18, conv1, bn1, layers, fc)
namespace models {
using ResNet18 = BenchResNet18;
}  // namespace models
#endif

#ifdef FLUX_BENCH_RESNET
#ifndef FLUX_BENCH_LOCAL_RESNET
// --stages: the mean time of each stage of models::ResNet18 over as many inferences as fit in ~2 s
// (diagnostic, for comparing with ONNX Runtime's per-node profile: bench/ort_profile.py). Each stage's
// output is what the next one reads (a conv's may stay in its blocked copy: nothing is forced out).
void resnet_stages(const models::ResNet18& net, const Tensor& x, int64_t batch) {
  using clock = std::chrono::steady_clock;
  const char* names[] = {"stem", "maxpool", "layer1", "layer2", "layer3", "layer4", "head"};
  double total[7] = {};
  int runs = 0;
  const auto start = clock::now();
  while (runs < 3 || std::chrono::duration<double>(clock::now() - start).count() < 2.0) {
    clock::time_point t[8];
    t[0] = clock::now();
    Tensor y = detail::conv_batchnorm(net.conv1, net.bn1, x);
    if (!y.defined()) y = net.bn1(net.conv1(x));
    t[1] = clock::now();
    y = net.maxpool(y);
    t[2] = clock::now();
    y = net.layer1(y);
    t[3] = clock::now();
    y = net.layer2(y);
    t[4] = clock::now();
    y = net.layer3(y);
    t[5] = clock::now();
    y = net.layer4(y);
    t[6] = clock::now();
    y = net.fc(flatten(net.avgpool(y)));
    g_dev.synchronize();
    t[7] = clock::now();
    for (int i = 0; i < 7; ++i) total[i] += std::chrono::duration<double, std::micro>(t[i + 1] - t[i]).count();
    ++runs;
  }
  for (int i = 0; i < 7; ++i) std::printf("resnet%lld_%s_us %.6g\n", (long long)batch, names[i], total[i] / runs);
}
#endif

void resnet_case() {
  auto model = models::ResNet18() | g_dev;
  testmode(model);
  const int64_t hw = bench::kResnetSize;
  std::printf("resnet_hw %lld\n", (long long)hw);
  for (int64_t batch : {int64_t(1), int64_t(32)}) {
    if (g_only_batch && batch != g_only_batch) continue;
    Tensor x = to(rand({batch, 3, hw, hw}), g_dev);
    auto run = [&] {
      Tensor y = forward(model, x);
      g_dev.synchronize();
      return 0.f;
    };
    // The first inference also makes the primitives, keeps the weights and times the kernel choices
    // (conv.cpp's Winograd against oneDNN): printed apart, as what a one-shot user waits.
    const auto t0 = std::chrono::steady_clock::now();
    Tensor first = forward(model, x);
    g_dev.synchronize();
    std::printf("resnet%lld_first_ms %.6g\n", (long long)batch,
                1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (int i = 0; i < (batch == 1 ? 5 : 2); ++i) run();
    std::printf("resnet%lld_ms %.6g\n", (long long)batch, 1e3 / bench::rate(run, batch == 1 ? 1.5 : 2.5));
    if (g_checksum) {  // the first output and one after the timing
      Checksum c;
      c.add(first);
      c.add(forward(model, x));
      c.print("resnet" + std::to_string(batch));
    }
#ifndef FLUX_BENCH_LOCAL_RESNET
    if (g_stages) resnet_stages(model, x, batch);
#endif
  }
}

// resnet_train (mixed-precision rows): a training step of ResNet-18 (BatchNorm training), batch
// bench::kResnetTrainBatch. The peak RSS of the process after the timed steps is the memory figure
// (flux has no device high-water mark; each dtype runs in its own process), beside the RSS before training.
void resnet_train_case() {
  auto model = models::ResNet18() | g_dev;
  const int64_t hw = bench::kResnetSize, n = bench::kResnetTrainBatch;
  Tensor x = to(rand({n, 3, hw, hw}), g_dev), y = onehot_targets(n, 1000);
  std::printf("resnet_hw %lld\nresnet_train_rss_before_mb %.6g\n", (long long)hw, bench::peak_rss_mb());
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); },
                               1, 3.0);
  std::printf("resnet_train_ms %.6g\nresnet_train_peak_rss_mb %.6g\nresnet_train_storage_peak_mb %.6g\n"
              "resnet_train_pool_reserved_mb %.6g\n",
              1e3 / r, bench::peak_rss_mb(), double(detail::peak_storage_bytes()) / (1 << 20),
              double(g_dev.memory().reserved) / (1 << 20));
}
#else
void resnet_case() { std::printf("skipped ResNet-18 (flux/models/resnet.hpp) not built\n"); }
void resnet_train_case() { resnet_case(); }
#endif

#ifdef FLUX_BENCH_ONNX
// The same model built from layers and imported (onnx::save then onnx::load), timed alternately in
// this one process (3 rounds, so that a load change hits both alike), under --autocast when given.
// Prints KEY_layers_ms, KEY_onnx_ms (wall time per call), KEY_layers_cpu_ms, KEY_onnx_cpu_ms (process
// CPU time per call, all threads: steadier on shared cores) and KEY_onnx_ratio, KEY_onnx_cpu_ratio.
template <class M, class N> void compare_imported(const std::string& key, const M& model, const N& net, const Tensor& x,
                                                  double seconds) {
  auto layers = [&] { Tensor y = forward(model, x); g_dev.synchronize(); return 0.f; };
  auto imported = [&] { Tensor y = forward(net, x); g_dev.synchronize(); return 0.f; };
  for (int i = 0; i < 3; ++i) layers(), imported();
  auto cpu_now = [] {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  auto timed = [&](const auto& run, double* wall_ms, double* cpu_ms) {
    const double c0 = cpu_now();
    Timer t;
    const double r = bench::rate(run, seconds);
    *wall_ms += 1e3 / r;
    *cpu_ms += 1e3 * (cpu_now() - c0) / (r * t.seconds());
  };
  double a = 0, b = 0, ac = 0, bc = 0;
  for (int round = 0; round < 3; ++round) timed(layers, &a, &ac), timed(imported, &b, &bc);
  const char* k = key.c_str();
  std::printf("%s_layers_ms %.6g\n%s_onnx_ms %.6g\n%s_onnx_ratio %.4g\n%s_layers_cpu_ms %.6g\n%s_onnx_cpu_ms %.6g\n"
              "%s_onnx_cpu_ratio %.4g\n",
              k, a / 3, k, b / 3, k, b / a, k, ac / 3, k, bc / 3, k, bc / ac);
  std::fflush(stdout);
}

// A model through onnx::save (traced on x) and onnx::load, on g_dev.
template <class M> onnx::Model imported(const M& model, const Tensor& x, const char* name) {
  const std::string path = "/tmp/flux_bench_" + std::string(name) + "_" + std::to_string(::getpid()) + ".onnx";
  onnx::save(path, model, x);
  auto net = onnx::load(path) | g_dev;
  std::remove(path.c_str());
  return net;
}
#endif

#if defined(FLUX_BENCH_RESNET) && !defined(FLUX_BENCH_LOCAL_RESNET) && defined(FLUX_BENCH_ONNX)
// onnx_resnet: models::ResNet18 exported with onnx::save and imported with onnx::load, timed against
// the layers themselves (compare_imported), batch 1 and 32: the import's cost (issue 48 asks within 10%).
void onnx_resnet_case() {
  if (!onnx::available()) {
    std::printf("skipped onnx_resnet: built without ONNX\n");
    return;
  }
  auto model = models::ResNet18() | g_dev;
  testmode(model);
  const int64_t hw = bench::kResnetSize;
  auto net = imported(model, to(rand({1, 3, hw, hw}), g_dev), "resnet18");
  std::printf("onnx_resnet_hw %lld\n", (long long)hw);
  for (int64_t batch : {int64_t(1), int64_t(32)}) {
    if (g_only_batch && batch != g_only_batch) continue;
    compare_imported("resnet" + std::to_string(batch), model, net, to(rand({batch, 3, hw, hw}), g_dev),
                     batch == 1 ? 0.5 : 1.0);
  }
}
#else
void onnx_resnet_case() { std::printf("skipped onnx_resnet: flux/onnx.hpp or models::ResNet18 missing\n"); }
#endif

// ---- Sequence cases (bench_common.hpp: shapes; the same models are in torch_bench.cpp and
// torch_bench.py). The batch is encoded once, as a data loader hands it over. ----

// examples/char_lstm.cpp's model (examples/example_models.hpp): one-hot (N, T, V) -> LSTM(V => H) -> (N T, H)
// -> Dense(H => V).
using examples::CharModel;

// Next-symbol targets (N T, V) one-hot.
Tensor seq_targets() { return to(onehot(Tensor(bench::seq_ids(1), Shape{bench::kSeqBatch * bench::kSeqLen}), bench::kVocab), g_dev); }

void check_parameters(const char* which, int64_t got, int64_t expected) {
  std::printf("%s_parameters %lld\n", which, (long long)got);
  if (got != expected) {
    std::fprintf(stderr, "flux_bench: the %s model has %lld parameters, bench_common.hpp says %lld\n", which,
                 (long long)got, (long long)expected);
    std::exit(1);
  }
}

void lstm_case(int pretrain = 0) {
  using namespace bench;
  auto model = CharModel(kVocab, kLstmHidden) | g_dev;
  check_parameters("lstm", parameter_count(model), kLstmParameters);
  Tensor ids(seq_ids(), Shape{kSeqBatch * kSeqLen});
  Tensor x = to(onehot(ids, kVocab).reshape({kSeqBatch, kSeqLen, kVocab}), g_dev), y = seq_targets();
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); },
                               pretrain ? pretrain : 3, 2.0);
  std::printf("%s %.6g\n", pretrain ? "lstm_converged_steps_per_s" : "lstm_steps_per_s", r);
}

// examples/tiny_transformer.cpp's model at its defaults (examples/example_models.hpp; kHeads = its 4);
// its logits (N, T, V) are scored as (N T, V) rows.
void transformer_case() {
  using namespace bench;
  static_assert(kHeads == 4, "examples::TinyTransformer has 4 heads");
  auto model = examples::TinyTransformer(kVocab, kSeqLen, kModelDim) | g_dev;
  check_parameters("transformer", parameter_count(model), kTransformerParameters);
  Tensor x = to(Tensor(seq_ids(), Shape{kSeqBatch, kSeqLen}), g_dev), y = seq_targets();
  double r = train_steps_per_s(model, x, y,
                               [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a.reshape({-1, kVocab}), b); },
                               3, 2.0);
  std::printf("transformer_steps_per_s %.6g\n", r);
}

// encoder (mixed-precision rows): bench_common.hpp's pre-norm encoder, 4 layers, on x (N, T, D):
// inference (the forward) and a training step (mse against a target of x's shape, Adam).
auto encoder_layer() {
  using namespace bench;
  return Chain(SkipConnection(Chain(LayerNorm(kEncDim), MultiHeadAttention(kEncDim, {.nheads = kEncHeads})), plus),
               SkipConnection(Chain(LayerNorm(kEncDim), Dense(kEncDim, kEncFfn, relu), Dense(kEncFfn, kEncDim)), plus));
}

void encoder_case() {
  using namespace bench;
  static_assert(kEncLayers == 4, "encoder_case builds 4 layers");
  auto model = Chain(encoder_layer(), encoder_layer(), encoder_layer(), encoder_layer(), LayerNorm(kEncDim)) | g_dev;
  check_parameters("encoder", parameter_count(model), kEncParameters);
  Tensor x = to(rand({kEncBatch, kEncLen, kEncDim}), g_dev), y = to(rand({kEncBatch, kEncLen, kEncDim}), g_dev);
  auto run = [&] {
    Tensor out = forward(model, x);
    g_dev.synchronize();
    return 0.f;
  };
  for (int i = 0; i < 2; ++i) run();
  // Also the process's CPU time per call (all threads), as the decoder's: steadier on shared cores.
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  Timer t;
  const double rate = bench::rate(run, 2.0), calls = rate * t.seconds();
  getrusage(RUSAGE_SELF, &r1);
  auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_usec - a.tv_usec); };
  std::printf("encoder_infer_ms %.6g\nencoder_infer_cpu_ms %.6g\nencoder_infer_minflt_per_call %.6g\n", 1e3 / rate,
              1e3 * (secs(r0.ru_utime, r1.ru_utime) + secs(r0.ru_stime, r1.ru_stime)) / calls,
              double(r1.ru_minflt - r0.ru_minflt) / calls);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return mse(a, b); }, 1, 3.0);
  std::printf("encoder_train_ms %.6g\nencoder_peak_rss_mb %.6g\nencoder_storage_peak_mb %.6g\n", 1e3 / r,
              bench::peak_rss_mb(), double(detail::peak_storage_bytes()) / (1 << 20));
}

// passes: the CPU backend's passes over memory (src/backends/cpu/pass_count.hpp) in one training step
// (after a warm-up step) and one forward of ResNet-18 (b32) and of the encoder: full-tensor float32 <->
// bf16/f16 conversions (count and MB) and kernel calls.
template <class M, class L> void count_passes(const std::string& name, M& model, const Tensor& x, const Tensor& y, L loss) {
  auto opt = optimisers::setup(optimisers::Adam(1e-3), model);
  auto step = [&] {
    auto [l, grads] = value_and_gradient([&](auto& m) { return loss(m(x), y); }, model);
    optimisers::update(opt, model, grads);
    return l.template item<float>();
  };
  auto counted = [&](const std::string& what, const auto& run) {
    run();  // warm-up: caches and prepared weights as in the timed cases
    detail::cpu_reset_pass_counts();
    run();
    int64_t conversions = 0, bytes = 0, kernels = 0;
    detail::cpu_pass_counts(&conversions, &bytes, &kernels);
    std::printf("%s_%s_conversion_passes %lld\n%s_%s_conversion_mb %.4g\n%s_%s_kernel_calls %lld\n", name.c_str(),
                what.c_str(), (long long)conversions, name.c_str(), what.c_str(), double(bytes) / 1e6, name.c_str(),
                what.c_str(), (long long)kernels);
  };
  counted("train", step);
  counted("infer", [&] {
    Tensor out = forward(model, x);
    g_dev.synchronize();
  });
}

void passes_case() {
#ifndef FLUX_BENCH_LOCAL_RESNET
  {
    auto model = models::ResNet18() | g_dev;
    const int64_t n = bench::kResnetTrainBatch, hw = bench::kResnetSize;
    Tensor x = to(rand({n, 3, hw, hw}), g_dev), y = onehot_targets(n, 1000);
    count_passes("resnet", model, x, y, [](const Tensor& a, const Tensor& b) { return logitcrossentropy(a, b); });
  }
#endif
  using namespace bench;
  auto model = Chain(encoder_layer(), encoder_layer(), encoder_layer(), encoder_layer(), LayerNorm(kEncDim)) | g_dev;
  Tensor x = to(rand({kEncBatch, kEncLen, kEncDim}), g_dev), y = to(rand({kEncBatch, kEncLen, kEncDim}), g_dev);
  count_passes("encoder", model, x, y, [](const Tensor& a, const Tensor& b) { return mse(a, b); });
}

// onnx_encoder: the encoder case's model exported with onnx::save and imported with onnx::load, timed
// against the layers (compare_imported) at batch 1 and kEncBatch, inference.
void onnx_encoder_case() {
#ifdef FLUX_BENCH_ONNX
  if (!onnx::available()) {
    std::printf("skipped onnx_encoder: built without ONNX\n");
    return;
  }
  using namespace bench;
  auto model = Chain(encoder_layer(), encoder_layer(), encoder_layer(), encoder_layer(), LayerNorm(kEncDim)) | g_dev;
  testmode(model);
  auto net = imported(model, to(rand({2, kEncLen, kEncDim}), g_dev), "encoder");
  for (int64_t batch : {int64_t(1), kEncBatch}) {
    if (g_only_batch && batch != g_only_batch) continue;
    compare_imported("encoder" + std::to_string(batch), model, net, to(rand({batch, kEncLen, kEncDim}), g_dev),
                     batch == 1 ? 0.5 : 1.0);
  }
#else
  std::printf("skipped onnx_encoder: flux/onnx.hpp missing\n");
#endif
}

// decoder (issue 44): bench_common.hpp's GPT-style causal decoder; inference and a training step as
// the encoder's. FLUX_FUSED_ATTENTION=0 runs the composed attention for the side-by-side row.
auto decoder_layer() {
  using namespace bench;
  return Chain(
      SkipConnection(Chain(LayerNorm(kDecDim), MultiHeadAttention(kDecDim, {.nheads = kDecHeads, .causal = true})), plus),
      SkipConnection(Chain(LayerNorm(kDecDim), Dense(kDecDim, kDecFfn, relu), Dense(kDecFfn, kDecDim)), plus));
}

void decoder_case() {
  using namespace bench;
  static_assert(kDecLayers == 4, "decoder_case builds 4 layers");
  auto model = Chain(decoder_layer(), decoder_layer(), decoder_layer(), decoder_layer(), LayerNorm(kDecDim)) | g_dev;
  check_parameters("decoder", parameter_count(model), kDecParameters);
  std::printf("decoder_fused_attention %d\n", int(detail::fused_attention_enabled()));
  Tensor x = to(rand({kDecBatch, kDecLen, kDecDim}), g_dev), y = to(rand({kDecBatch, kDecLen, kDecDim}), g_dev);
  auto run = [&] {
    Tensor out = forward(model, x);
    g_dev.synchronize();
    return 0.f;
  };
  run();
  // Also the process's CPU time per call (all threads): on shared, loaded cores it moves far less
  // than the wall time, as train_cpu_ms_per_step.
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  Timer t;
  const double rate = bench::rate(run, 3.0), calls = rate * t.seconds();
  getrusage(RUSAGE_SELF, &r1);
  auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_usec - a.tv_usec); };
  std::printf("decoder_infer_ms %.6g\ndecoder_infer_cpu_ms %.6g\n", 1e3 / rate,
              1e3 * (secs(r0.ru_utime, r1.ru_utime) + secs(r0.ru_stime, r1.ru_stime)) / calls);
  double r = train_steps_per_s(model, x, y, [](const Tensor& a, const Tensor& b) { return mse(a, b); }, 1, 6.0);
  std::printf("decoder_train_ms %.6g\n", 1e3 / r);
  std::printf("decoder_peak_rss_mb %.6g\n", bench::peak_rss_mb());
}

// attention_memory (issue 44): peak tensor storage of one causal MultiHeadAttention's forward and
// backward beyond its input and parameters, fused and composed, at T = 256, 512, 1024; and the
// process CPU time of that forward + backward (best of 3).
void attention_memory_case() {
  using namespace bench;
  MultiHeadAttention mha = MultiHeadAttention(kDecDim, {.nheads = kDecHeads, .causal = true}) | g_dev;
  for (int64_t t : {256, 512, 1024}) {
    Tensor x = to(rand({kMemBatch, t, kDecDim}), g_dev);
    for (bool fused : {true, false}) {
      detail::set_fused_attention(fused);
      const size_t before = detail::live_storage_bytes();
      detail::reset_peak_storage_bytes();
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        rusage r0{}, r1{};
        getrusage(RUSAGE_SELF, &r0);
        auto g = gradient([&](const MultiHeadAttention& m, const Tensor& v) { return sum(m(v)); }, mha, x);
        getrusage(RUSAGE_SELF, &r1);
        auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_usec - a.tv_usec); };
        best = std::min(best, secs(r0.ru_utime, r1.ru_utime) + secs(r0.ru_stime, r1.ru_stime));
      }
      const double mb = double(detail::peak_storage_bytes() - before) / 1e6;
      const char* how = fused ? "fused" : "composed";
      std::printf("attention_memory_T%lld_%s_mb %.6g\n", (long long)t, how, mb);
      std::printf("attention_train_T%lld_%s_cpu_ms %.6g\n", (long long)t, how, 1e3 * best);
    }
  }
  detail::set_fused_attention(true);
}

// info: the CPU backend's lines of versioninfo() that name the ISA and the bf16/f16 units.
void info_case() {
  std::ostringstream os;
  versioninfo(os);
  std::istringstream lines(os.str());
  for (std::string line; std::getline(lines, line);)
    if (line.find("bf16/f16 units") != std::string::npos) {
      std::printf("units %s\n", line.substr(line.find_first_not_of(' ')).c_str());
    } else if (const size_t at = line.find("Libraries: "); at != std::string::npos) {
      std::printf("libraries %s\n", line.substr(at + 11).c_str());
    }
}

// ---- serve: one model loaded once, in testmode, answering requests from several threads (issue 37).
// Each model (bench_common.hpp's serve shapes) is timed with 1 caller thread and with 2 caller threads
// calling the same model at once, alternating rounds; the pool size is FLUX_NUM_THREADS as for every
// case. Printed per model M: serve_M_1c_per_s and serve_M_2c_per_s (total calls per second of all
// callers), serve_M_scaling (2 callers / 1 caller), serve_M_1c_ms (ms per call, 1 caller) and
// serve_M_bitwise (1 when every output of every caller equals, bit for bit, that caller's input's output
// from one caller computed before the timing). The same cases with LibTorch are in torch_bench.cpp. ----

// Total calls per second of `callers` threads calling call(i) (i: the caller) for `seconds` at once,
// each output compared with ref[i]; *bitwise becomes false on the first difference.
double serve_rate(const std::function<Tensor(int)>& call, const std::vector<std::vector<float>>& ref, int callers,
                  double seconds, std::atomic<bool>* bitwise) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<int64_t> calls(size_t(callers), 0);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(callers));
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      try {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        Timer own;
        do {
          std::vector<float> y = call(c).to_vector<float>();
          if (y.size() != ref[size_t(c)].size() ||
              std::memcmp(y.data(), ref[size_t(c)].data(), y.size() * sizeof(float)) != 0)
            bitwise->store(false);
          ++calls[size_t(c)];
        } while (own.seconds() < seconds);
      } catch (...) {
        errors[size_t(c)] = std::current_exception();
      }
    });
  }
  while (ready.load() < callers) std::this_thread::yield();
  Timer t;
  go.store(true);
  for (std::thread& th : threads) th.join();
  const double elapsed = t.seconds();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  int64_t total = 0;
  for (int64_t n : calls) total += n;
  return double(total) / elapsed;
}

// call(i) answers caller i's request (each caller its own input). `rounds` rounds of 1 then 2 callers,
// each `seconds` long: the rates are the best round's, the scaling the median of the rounds' own ratios
// (a round's two phases are seconds apart, so a slow spell of this shared machine hits both).
void serve_model(const char* name, const std::function<Tensor(int)>& call, double seconds, int rounds) {
  std::vector<std::vector<float>> ref;
  for (int c = 0; c < 2; ++c) {
    call(c);  // first call: primitives, prepared weights and kernel choices
    ref.push_back(call(c).to_vector<float>());
  }
  std::atomic<bool> bitwise{true};
  double one = 0, two = 0;
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    const double a = serve_rate(call, ref, 1, seconds, &bitwise), b = serve_rate(call, ref, 2, seconds, &bitwise);
    one = std::max(one, a);
    two = std::max(two, b);
    ratios.push_back(b / a);
    std::fprintf(stderr, "serve %s round %d: 1 caller %.6g/s, 2 callers %.6g/s, %.3fx\n", name, r + 1, a, b, b / a);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t m = ratios.size() / 2;
  const double scaling = ratios.size() % 2 ? ratios[m] : (ratios[m - 1] + ratios[m]) / 2;
  std::printf("serve_%s_1c_per_s %.6g\nserve_%s_2c_per_s %.6g\nserve_%s_scaling %.4g\nserve_%s_1c_ms %.6g\n"
              "serve_%s_bitwise %d\n",
              name, one, name, two, name, scaling, name, 1e3 / one, name, int(bitwise.load()));
  std::fflush(stdout);
}

void serve_case() {
  using namespace bench;
  auto run = [&](const auto& model, std::vector<Tensor> inputs) {
    return [&model, inputs](int c) { return model(inputs[size_t(c)]); };
  };
  std::printf("resnet_hw %lld\n", (long long)bench::kResnetSize);
  const double s = g_train_seconds > 0 ? g_train_seconds : 1.0;  // --seconds=S: each measurement S seconds
  {
    auto mlp = Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10)) | g_dev;
    testmode(mlp);
    serve_model("mlp32", run(mlp, {to(rand({kServeMlpBatch, 784}), g_dev), to(rand({kServeMlpBatch, 784}), g_dev)}), s / 2, 5);
  }
#if defined(FLUX_BENCH_RESNET)
  {
    auto net = models::ResNet18() | g_dev;
    testmode(net);
    for (int64_t batch : {int64_t(1), int64_t(32)}) {
      if (g_only_batch && batch != g_only_batch) continue;
      const int64_t hw = kResnetSize;
      serve_model(batch == 1 ? "resnet1" : "resnet32",
                  run(net, {to(rand({batch, 3, hw, hw}), g_dev), to(rand({batch, 3, hw, hw}), g_dev)}),
                  batch == 1 ? s / 2 : 1.5 * s, batch == 1 ? 5 : 3);  // ~0.3 s a call at batch 32
    }
  }
#endif
  {
    auto lstm = CharModel(kServeLstmIn, kServeLstmHidden) | g_dev;
    testmode(lstm);
    const Shape x{kServeLstmBatch, kServeLstmSteps, kServeLstmIn};
    serve_model("lstm4", run(lstm, {to(rand(x), g_dev), to(rand(x), g_dev)}), s / 2, 5);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: flux_bench seed|mnist|mnist_converged|wide|overhead|infer|sgemm|lenet|fmnist|resnet|resnet_train|onnx_resnet|onnx_encoder|lstm|lstm_converged|transformer|encoder|decoder|attention_memory|passes|serve|blas|info [cpu|opencl] [--autocast=bf16|f16]\n");
    return 2;
  }
  std::string which = argv[1], device = argc > 2 ? argv[2] : "cpu";
  if (which == "blas") {  // for the table's header: the OpenBLAS build and the kernels it chose for this CPU
    std::printf("blas_config %s\nblas_core %s\n", openblas_get_config(), openblas_get_corename());
    return 0;
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) {
      g_train_seconds = std::atof(a.c_str() + 10);
      if (i == 2) device = "cpu";
      continue;
    }
    if (a.rfind("--converge-steps=", 0) == 0) {
      g_converge_steps = std::atoi(a.c_str() + 17);
      if (i == 2) device = "cpu";
      continue;
    }
    if (a.rfind("--autocast=", 0) == 0) {
      const std::string v = a.substr(11);
      if (v != "bf16" && v != "f16") {
        std::fprintf(stderr, "flux_bench: --autocast takes bf16 or f16, got %s\n", v.c_str());
        return 2;
      }
      g_autocast = v == "bf16" ? DType::bf16 : DType::f16;
      if (i == 2) device = "cpu";
      continue;
    }
    if (a == "--checksum") {
      g_checksum = true;
      if (i == 2) device = "cpu";
      continue;
    }
    if (a == "--stages") {
      g_stages = true;
      if (i == 2) device = "cpu";
      continue;
    }
    if (a.rfind("--batch=", 0) == 0) {
      g_only_batch = std::atoll(a.c_str() + 8);
      if (i == 2) device = "cpu";
      continue;
    }
    // Kernel overrides for A/B runs (the CPU backend's kernel-choice seam): --FLAG=NAME forces the
    // kernel `names` maps NAME to ("": the seam's own choice).
    struct Override {
      const char* flag;
      const char* site;
      std::vector<std::pair<std::string, std::string>> names;  // flag value -> kernel name
    };
    const Override overrides[] = {
        {"--gemm=", "gemm", {{"auto", ""}, {"openblas", "openblas"}, {"onednn", "onednn"}}},
        {"--linear=", "linear", {{"auto", ""}, {"onednn", "onednn"}, {"panels", "panels"}}},
        {"--winograd=", "conv_forward", {{"auto", ""}, {"off", "onednn"}, {"on", "winograd"}}}};
    for (const Override& o : overrides) {
      if (a.rfind(o.flag, 0) != 0) continue;
      if (i == 2) device = "cpu";
      const std::string v = a.substr(std::strlen(o.flag));
      auto at = std::find_if(o.names.begin(), o.names.end(), [&](const auto& p) { return p.first == v; });
      if (at == o.names.end()) {
        std::fprintf(stderr, "flux_bench: %s takes %s, %s or %s, got %s\n", o.flag, o.names[0].first.c_str(),
                     o.names[1].first.c_str(), o.names[2].first.c_str(), v.c_str());
        std::exit(2);
      }
      detail::cpu_force_kernel(o.site, at->second);
    }
  }
  if (const char* cap = std::getenv("FLUX_BENCH_MAX_ISA"); cap && *cap) {
    std::string c = cap;
    int level = c == "baseline" ? 0 : c == "avx2" ? 1 : c == "avx512" ? 2 : -1;
    if (level < 0) {
      std::fprintf(stderr, "flux_bench: FLUX_BENCH_MAX_ISA takes baseline, avx2 or avx512, got %s\n", cap);
      return 2;
    }
    detail::cpu_force_isa(level);
  }
  std::printf("flux_cpu_isa %s\n", detail::cpu_isa_name());
#ifndef FLUX_BENCH_AUTOCAST
  if (g_autocast) {  // the table shows "—" for the autocast rows until flux/autocast.hpp exists
    std::printf("skipped --autocast: flux/autocast.hpp not built\n");
    return 0;
  }
#endif
  seed(1);
  if (device == "opencl") {
    if (!functional("OpenCL")) {
      std::printf("skipped OpenCL backend not functional\n");
      return 0;
    }
    g_dev = get_device("OpenCL", 0);
  } else {
    g_dev = get_device("CPU");
  }
#ifdef FLUX_BENCH_LENET
  if (which == "lenet" || which == "fmnist" || which == "resnet")
    std::printf("flux_library_kernels %d\n", int(detail::library_kernels()));
#endif
  if (which == "seed") seed_case();
  else if (which == "mnist") mnist_case();
  else if (which == "mnist_converged") mnist_case(g_converge_steps ? g_converge_steps : int(bench::kMnistConvergeSteps));
  else if (which == "wide") wide_case();
  else if (which == "overhead") overhead_case();
  else if (which == "infer") infer_case();
  else if (which == "sgemm") sgemm_case();
  else if (which == "lenet") lenet_case();
  else if (which == "fmnist") fmnist_case();
  else if (which == "resnet") resnet_case();
  else if (which == "resnet_train") resnet_train_case();
  else if (which == "encoder") encoder_case();
  else if (which == "passes") passes_case();
  else if (which == "decoder") decoder_case();
  else if (which == "attention_memory") attention_memory_case();
  else if (which == "info") info_case();
  else if (which == "onnx_resnet") onnx_resnet_case();
  else if (which == "onnx_encoder") onnx_encoder_case();
  else if (which == "lstm") lstm_case();
  else if (which == "lstm_converged") lstm_case(g_converge_steps ? g_converge_steps : int(bench::kLstmConvergeSteps));
  else if (which == "transformer") transformer_case();
  else if (which == "serve") serve_case();
  else {
    std::fprintf(stderr, "flux_bench: unknown case %s\n", which.c_str());
    return 2;
  }
  // The engines the case's float32 GEMMs ran on (the table's rows name them).
  if (device == "cpu" && which != "info")
    std::printf("flux_gemm_openblas_calls %lld\nflux_gemm_onednn_calls %lld\n",
                (long long)detail::cpu_gemm_engine_calls("openblas"), (long long)detail::cpu_gemm_engine_calls("onednn"));
  return 0;
}
