// The same cases as flux_bench.cpp, written as a LibTorch C++ user would write them.
// Usage: torch_bench CASE THREADS   CASE: seed | mnist | mnist_converged | wide | overhead | infer | lenet | fmnist |
//                                    resnet | lstm | lstm_converged | transformer | serve | versions
// serve [THREADS [SECONDS]]: flux_bench.cpp's serve case (SECONDS per measurement, default 1).
// resnet_train, encoder: the mixed-precision rows (bench_common.hpp). --bf16 (after THREADS) runs mnist, infer,
// resnet, resnet_train and encoder with the model and its float inputs cast to bf16 (model->to(kBFloat16)):
// LibTorch's C++ API has no autocast, so a bf16 copy of the model is its only C++ form of bf16.
// The *_converged cases time the same steps after bench_common.hpp's k*ConvergeSteps steps of training.
// Builds against Debian's LibTorch 1.13 (bench/CMakeLists.txt inside the project) and against the
// LibTorch 2.x of PyPI's torch wheel (bench/CMakeLists.txt configured on its own; scripts/bench).
#include <ATen/Version.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"

namespace {

namespace nn = torch::nn;

torch::Dtype g_dtype = torch::kFloat;  // --bf16: torch::kBFloat16 for the model and its float inputs

// The model and a float input in the run's dtype (float32, or bf16 with --bf16).
template <class M> M& in_dtype(M& model) {
  model->to(g_dtype);
  return model;
}
torch::Tensor in_dtype(const torch::Tensor& x) { return x.to(g_dtype); }

template <class Model, class Loss>
double train_steps_per_s(Model& model, const torch::Tensor& x, const torch::Tensor& y, Loss loss, int warmup,
                         double seconds) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto step = [&] {
    opt.zero_grad();
    torch::Tensor l = loss(model->forward(x), y);
    l.backward();
    opt.step();
    return l.item<float>();
  };
  for (int i = 0; i < warmup; ++i) step();
  return bench::rate(step, seconds);
}

void seed_case() {
  nn::Sequential model(nn::Linear(10, 64), nn::ReLU(), nn::Linear(64, 1));
  torch::Tensor x = torch::rand({64, 10}), y = torch::rand({64, 1});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::mse_loss(a, b); }, 50, 1.0);
  std::printf("seed_steps_per_s %.6g\n", r);
}

void mnist_case(int pretrain = 0) {
  nn::Sequential model(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
  in_dtype(model);
  torch::Tensor x = in_dtype(torch::rand({128, 784}));
  torch::Tensor y = (torch::arange(128, torch::kLong) * 7) % 10;  // class indices, as flux's one-hot
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               pretrain ? pretrain : 5, 1.5);
  std::printf("%s %.6g\n", pretrain ? "mnist_converged_steps_per_s" : "mnist_steps_per_s", r);
}

void wide_case() {
  nn::Sequential model(nn::Linear(1024, 4096), nn::ReLU(), nn::Linear(4096, 4096), nn::ReLU(), nn::Linear(4096, 1024));
  torch::Tensor x = torch::rand({256, 1024}), y = torch::rand({256, 1024});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::mse_loss(a, b); }, 1, 2.5);
  std::printf("wide_steps_per_s %.6g\nwide_gflops %.6g\n", r, r * bench::wide_step_flops() * 1e-9);
  std::printf("peak_rss_mb %.6g\n", bench::peak_rss_mb());
}

void overhead_case() {
  torch::Tensor a = torch::rand({16}), b = torch::rand({16}), c;
  double per_add = 1e6 / bench::rate_cpu([&] { c = torch::add(a, b); return 0.f; }, 0.5, 1000);
  std::printf("add16_us %.6g\n", per_add);
  nn::Linear d(16, 16);
  torch::Tensor x = torch::rand({16, 16});
  auto fwd_bwd = [&] {
    d->forward(x).sum().backward();
    return 0.f;
  };
  for (int i = 0; i < 100; ++i) fwd_bwd();
  std::printf("dense16_us %.6g\n", 1e6 / bench::rate_cpu(fwd_bwd, 0.5, 100));
}

void infer_case() {
  nn::Sequential model(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
  in_dtype(model);
  torch::NoGradGuard no_grad;
  for (int64_t batch : {1, 128}) {
    torch::Tensor x = in_dtype(torch::rand({batch, 784}));
    auto run = [&] {
      torch::Tensor y = model->forward(x);
      return 0.f;
    };
    for (int i = 0; i < 20; ++i) run();
    std::printf("infer%lld_us %.6g\n", (long long)batch, 1e6 / bench::rate(run, 0.7));
  }
}


// LeNet-5 on 28x28, batch 128: conv 5x5 1->6 relu, maxpool 2, conv 5x5 6->16 relu, maxpool 2, flatten,
// 256 -> 120 -> 84 -> 10; Adam, cross entropy on class indices.
void lenet_case() {
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(1, 6, 5)), nn::ReLU(), nn::MaxPool2d(2),
                       nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                       nn::Linear(256, 120), nn::ReLU(), nn::Linear(120, 84), nn::ReLU(), nn::Linear(84, 10));
  torch::Tensor x = torch::rand({bench::kCnnBatch, 1, 28, 28});
  torch::Tensor y = (torch::arange(bench::kCnnBatch, torch::kLong) * 7) % 10;
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               5, 2.0);
  std::printf("lenet_steps_per_s %.6g\n", r);
}

// The Fashion-MNIST CNN: two blocks conv 3x3 pad 1 -> batchnorm -> relu -> maxpool 2 (1->32, 32->64),
// dropout 0.25, 3136 -> 128 (relu) -> 10; batch 128 of synthetic 28x28 images, train mode.
void fmnist_case() {
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::BatchNorm2d(32), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::BatchNorm2d(64),
                       nn::ReLU(), nn::MaxPool2d(2), nn::Dropout(0.25), nn::Flatten(), nn::Linear(3136, 128),
                       nn::ReLU(), nn::Linear(128, 10));
  model->train();
  torch::Tensor x = torch::rand({bench::kCnnBatch, 1, 28, 28});
  torch::Tensor y = (torch::arange(bench::kCnnBatch, torch::kLong) * 7) % 10;
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               3, 2.5);
  std::printf("fmnist_steps_per_s %.6g\n", r);
}

// ResNet-18 as torchvision builds it (BasicBlock x [2, 2, 2, 2], no conv bias, batchnorm, 1x1
// stride-2 downsample), written with LibTorch's C++ modules: torchvision's C++ API is not in Debian.
struct BasicBlockImpl : nn::Module {
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Sequential downsample{nullptr};
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(out));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      downsample = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
};
TORCH_MODULE(BasicBlock);

nn::Sequential resnet18(int64_t classes = 1000) {
  nn::Sequential m(nn::Conv2d(nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)), nn::BatchNorm2d(64),
                   nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t in = 64;
  for (int64_t out : {64, 128, 256, 512}) {
    m->push_back(BasicBlock(in, out, out == 64 ? 1 : 2));
    m->push_back(BasicBlock(out, out, 1));
    in = out;
  }
  m->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
  m->push_back(nn::Flatten());
  m->push_back(nn::Linear(512, classes));
  return m;
}

// ResNet-18 inference in eval mode (running statistics), batch 1 and 32, at bench::kResnetSize.
void resnet_case() {
  nn::Sequential model = resnet18();
  in_dtype(model);
  model->eval();
  torch::InferenceMode guard;
  const int64_t hw = bench::kResnetSize;
  std::printf("resnet_hw %lld\n", (long long)hw);
  for (int64_t batch : {int64_t(1), int64_t(32)}) {
    torch::Tensor x = in_dtype(torch::rand({batch, 3, hw, hw}));
    auto run = [&] {
      torch::Tensor y = model->forward(x);
      return g_dtype == torch::kFloat ? y.data_ptr<float>()[0] : y[0][0].item<float>();
    };
    for (int i = 0; i < (batch == 1 ? 5 : 2); ++i) run();
    std::printf("resnet%lld_ms %.6g\n", (long long)batch, 1e3 / bench::rate(run, batch == 1 ? 1.5 : 2.5));
  }
}

// ResNet-18 training step (BatchNorm in training mode), batch bench::kResnetTrainBatch, 1000 classes;
// peak RSS after the timed steps, beside the RSS before training.
void resnet_train_case() {
  nn::Sequential model = resnet18();
  in_dtype(model);
  model->train();
  const int64_t hw = bench::kResnetSize, n = bench::kResnetTrainBatch;
  torch::Tensor x = in_dtype(torch::rand({n, 3, hw, hw}));
  torch::Tensor y = (torch::arange(n, torch::kLong) * 7) % 1000;
  std::printf("resnet_hw %lld\nresnet_train_rss_before_mb %.6g\n", (long long)hw, bench::peak_rss_mb());
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               1, 3.0);
  std::printf("resnet_train_ms %.6g\nresnet_train_peak_rss_mb %.6g\n", 1e3 / r, bench::peak_rss_mb());
}

// ---- Sequence cases (bench_common.hpp: shapes and the models; the same as flux_bench.cpp). Only API
// present in both LibTorch 1.13 and 2.x. ----

int64_t parameter_count(const nn::Module& m) {
  int64_t n = 0;
  for (const torch::Tensor& p : m.parameters()) n += p.numel();
  return n;
}

void check_parameters(const char* which, const nn::Module& m, int64_t expected) {
  int64_t got = parameter_count(m);
  std::printf("%s_parameters %lld\n", which, (long long)got);
  if (got != expected) {
    std::fprintf(stderr, "torch_bench: the %s model has %lld parameters, bench_common.hpp says %lld\n", which,
                 (long long)got, (long long)expected);
    std::exit(1);
  }
}

torch::Tensor seq_tensor(int64_t shift) {
  std::vector<int64_t> v = bench::seq_ids(shift);
  return torch::tensor(v, torch::kLong).view({bench::kSeqBatch, bench::kSeqLen});
}

// One-hot (N, T, V) -> LSTM(V => H, batch_first) -> (N T, H) -> Linear(H => V).
struct CharLSTMImpl : nn::Module {
  nn::LSTM lstm{nullptr};
  nn::Linear head{nullptr};
  CharLSTMImpl() {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(bench::kVocab, bench::kLstmHidden).batch_first(true)));
    head = register_module("head", nn::Linear(bench::kLstmHidden, bench::kVocab));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = std::get<0>(lstm->forward(x));
    return head(h.reshape({-1, bench::kLstmHidden}));
  }
};
TORCH_MODULE(CharLSTM);

void lstm_case(int pretrain = 0) {
  CharLSTM model;
  check_parameters("lstm", *model, bench::kLstmParameters);
  torch::Tensor x = torch::one_hot(seq_tensor(0), bench::kVocab).to(torch::kFloat);  // (N, T, V)
  torch::Tensor y = seq_tensor(1).reshape({-1});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               pretrain ? pretrain : 3, 2.0);
  std::printf("%s %.6g\n", pretrain ? "lstm_converged_steps_per_s" : "lstm_steps_per_s", r);
}

// A pre-norm block, time-major (T, N, D) as LibTorch's C++ MultiheadAttention takes it (it has no
// batch_first): x + MHA(LN(x)) with a causal additive mask, then x + Linear(4D => D)(gelu(Linear(D => 4D)(LN(x)))),
// gelu in the tanh form (Flux's).
struct BlockImpl : nn::Module {
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::MultiheadAttention attn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
  explicit BlockImpl(int64_t d) {
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d})));
    attn = register_module("attn", nn::MultiheadAttention(nn::MultiheadAttentionOptions(d, bench::kHeads)));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", nn::Linear(d, 4 * d));
    fc2 = register_module("fc2", nn::Linear(4 * d, d));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    torch::Tensor a = ln1(x);
    x = x + std::get<0>(attn->forward(a, a, a, {}, /*need_weights=*/false, mask));
    return x + fc2(torch::gelu(fc1(ln2(x)), "tanh"));
  }
};
TORCH_MODULE(Block);

// ids (T, N) -> token + positional embedding (T, N, D) -> 2 blocks -> LayerNorm -> Linear(D => V): (T N, V).
struct TinyTransformerImpl : nn::Module {
  nn::Embedding token{nullptr}, position{nullptr};
  Block block1{nullptr}, block2{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::Linear head{nullptr};
  torch::Tensor mask;  // (T, T) additive: -inf above the diagonal
  TinyTransformerImpl() {
    const int64_t d = bench::kModelDim;
    token = register_module("token", nn::Embedding(bench::kVocab, d));
    position = register_module("position", nn::Embedding(bench::kSeqLen, d));
    block1 = register_module("block1", Block(d));
    block2 = register_module("block2", Block(d));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({d})));
    head = register_module("head", nn::Linear(d, bench::kVocab));
    mask = torch::full({bench::kSeqLen, bench::kSeqLen}, -std::numeric_limits<float>::infinity()).triu(1);
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t t = ids.size(0);
    torch::Tensor h = token(ids) + position(torch::arange(t, torch::kLong)).unsqueeze(1);
    h = block2(block1(h, mask), mask);
    return head(norm(h)).reshape({-1, bench::kVocab});
  }
};
TORCH_MODULE(TinyTransformer);

void transformer_case() {
  TinyTransformer model;
  check_parameters("transformer", *model, bench::kTransformerParameters);
  // Time-major ids and targets (the layout the C++ attention wants), transposed once like a loader would.
  torch::Tensor x = seq_tensor(0).t().contiguous();
  torch::Tensor y = seq_tensor(1).t().contiguous().reshape({-1});
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::nn::functional::cross_entropy(a, b); },
                               3, 2.0);
  std::printf("transformer_steps_per_s %.6g\n", r);
}

// bench_common.hpp's encoder layer, time-major (T, N, D) as LibTorch's C++ MultiheadAttention takes it (its
// TransformerEncoderLayer has no norm_first in 1.13): x + MHA(LN(x)), then x + Linear(F => D)(relu(Linear(D => F)(LN(x)))).
struct EncoderLayerImpl : nn::Module {
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::MultiheadAttention attn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
  EncoderLayerImpl() {
    const int64_t d = bench::kEncDim;
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d})));
    attn = register_module("attn", nn::MultiheadAttention(nn::MultiheadAttentionOptions(d, bench::kEncHeads)));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", nn::Linear(d, bench::kEncFfn));
    fc2 = register_module("fc2", nn::Linear(bench::kEncFfn, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor a = ln1(x);
    x = x + std::get<0>(attn->forward(a, a, a, {}, /*need_weights=*/false));
    return x + fc2(torch::relu(fc1(ln2(x))));
  }
};
TORCH_MODULE(EncoderLayer);

// Inference (the forward) and a training step (mse against a target of x's shape, Adam) of the encoder.
void encoder_case() {
  nn::Sequential model;
  for (int64_t i = 0; i < bench::kEncLayers; ++i) model->push_back(EncoderLayer());
  model->push_back(nn::LayerNorm(nn::LayerNormOptions({bench::kEncDim})));
  check_parameters("encoder", *model, bench::kEncParameters);
  in_dtype(model);
  torch::Tensor x = in_dtype(torch::rand({bench::kEncLen, bench::kEncBatch, bench::kEncDim}));
  torch::Tensor y = in_dtype(torch::rand({bench::kEncLen, bench::kEncBatch, bench::kEncDim}));
  {
    torch::InferenceMode guard;
    auto run = [&] {
      torch::Tensor out = model->forward(x);
      return 0.f;
    };
    for (int i = 0; i < 2; ++i) run();
    std::printf("encoder_infer_ms %.6g\n", 1e3 / bench::rate(run, 2.0));
  }
  double r = train_steps_per_s(model, x, y, [](auto a, auto b) { return torch::mse_loss(a, b); }, 1, 3.0);
  std::printf("encoder_train_ms %.6g\n", 1e3 / r);
}

// ---- serve (flux_bench.cpp's serve case): one model in eval mode called from 1 and from 2 threads at
// once. Every caller thread sets at::set_num_threads(THREADS) itself (LibTorch's OpenMP thread count is
// the calling thread's) and its own InferenceMode; the outputs are compared bit for bit with each
// caller's output from one caller. ----

int g_threads = 1;  // THREADS: torch::set_num_threads in main and in every caller thread

double serve_rate(const std::function<torch::Tensor(int)>& call, const std::vector<torch::Tensor>& ref, int callers,
                  double seconds, std::atomic<bool>* bitwise) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<int64_t> calls(size_t(callers), 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      at::set_num_threads(g_threads);
      torch::InferenceMode guard;
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      bench::Timer own;
      do {
        torch::Tensor y = call(c).contiguous();
        const torch::Tensor& r = ref[size_t(c)];
        if (y.numel() != r.numel() || std::memcmp(y.data_ptr<float>(), r.data_ptr<float>(), size_t(y.numel()) * sizeof(float)) != 0)
          bitwise->store(false);
        ++calls[size_t(c)];
      } while (own.seconds() < seconds);
    });
  }
  while (ready.load() < callers) std::this_thread::yield();
  bench::Timer t;
  go.store(true);
  for (std::thread& th : threads) th.join();
  const double elapsed = t.seconds();
  int64_t total = 0;
  for (int64_t n : calls) total += n;
  return double(total) / elapsed;
}

void serve_model(const char* name, const std::function<torch::Tensor(int)>& call, double seconds, int rounds) {
  std::vector<torch::Tensor> ref;
  {
    torch::InferenceMode guard;
    for (int c = 0; c < 2; ++c) {
      call(c);
      ref.push_back(call(c).contiguous());
    }
  }
  // As flux_bench: the best round's rates, the median of the rounds' own 2-caller / 1-caller ratios.
  std::atomic<bool> bitwise{true};
  double one = 0, two = 0;
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    const double a = serve_rate(call, ref, 1, seconds, &bitwise), b = serve_rate(call, ref, 2, seconds, &bitwise);
    one = std::max(one, a);
    two = std::max(two, b);
    ratios.push_back(b / a);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t m = ratios.size() / 2;
  const double scaling = ratios.size() % 2 ? ratios[m] : (ratios[m - 1] + ratios[m]) / 2;
  std::printf("serve_%s_1c_per_s %.6g\nserve_%s_2c_per_s %.6g\nserve_%s_scaling %.4g\nserve_%s_1c_ms %.6g\n"
              "serve_%s_bitwise %d\n",
              name, one, name, two, name, scaling, name, 1e3 / one, name, int(bitwise.load()));
  std::fflush(stdout);
}

// LSTM(in => hidden, batch_first) -> (N T, H) -> Linear(H => in).
struct ServeLSTMImpl : nn::Module {
  nn::LSTM lstm{nullptr};
  nn::Linear head{nullptr};
  ServeLSTMImpl() {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(bench::kServeLstmIn, bench::kServeLstmHidden).batch_first(true)));
    head = register_module("head", nn::Linear(bench::kServeLstmHidden, bench::kServeLstmIn));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = std::get<0>(lstm->forward(x));
    return head(h.reshape({-1, bench::kServeLstmHidden}));
  }
};
TORCH_MODULE(ServeLSTM);

void serve_case(double seconds) {
  using namespace bench;
  std::printf("resnet_hw %lld\n", (long long)bench::kResnetSize);
  {
    nn::Sequential mlp(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
    mlp->eval();
    std::vector<torch::Tensor> x = {torch::rand({kServeMlpBatch, 784}), torch::rand({kServeMlpBatch, 784})};
    serve_model("mlp32", [&](int c) { return mlp->forward(x[size_t(c)]); }, seconds / 2, 5);
  }
  {
    nn::Sequential net = resnet18();
    net->eval();
    for (int64_t batch : {int64_t(1), int64_t(32)}) {
      std::vector<torch::Tensor> x = {torch::rand({batch, 3, kResnetSize, kResnetSize}),
                                      torch::rand({batch, 3, kResnetSize, kResnetSize})};
      serve_model(batch == 1 ? "resnet1" : "resnet32", [&](int c) { return net->forward(x[size_t(c)]); },
                  batch == 1 ? seconds / 2 : 1.5 * seconds, batch == 1 ? 5 : 3);
    }
  }
  {
    ServeLSTM lstm;
    lstm->eval();
    std::vector<torch::Tensor> x = {torch::rand({kServeLstmBatch, kServeLstmSteps, kServeLstmIn}),
                                    torch::rand({kServeLstmBatch, kServeLstmSteps, kServeLstmIn})};
    serve_model("lstm4", [&](int c) { return lstm->forward(x[size_t(c)]); }, seconds / 2, 5);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: torch_bench seed|mnist|mnist_converged|wide|overhead|infer|lenet|fmnist|resnet|resnet_train|lstm|lstm_converged|transformer|encoder|serve [threads [--bf16]]\n");
    return 2;
  }
  std::string which = argv[1];
  if (which == "versions") {  // text lines for the table's header: the version and what it was built with
    std::printf("version libtorch %s\n", TORCH_VERSION);
    std::string config = at::show_config();
    for (size_t pos = 0; pos < config.size();) {
      size_t end = config.find('\n', pos);
      if (end == std::string::npos) end = config.size();
      std::string line = config.substr(pos, end - pos);
      pos = end + 1;
      size_t b = line.find_first_not_of(" -");
      if (b == std::string::npos) continue;
      line = line.substr(b);
      for (const char* key : {"Intel(R) oneAPI Math Kernel Library", "Intel(R) Math Kernel Library", "Intel(R) MKL-DNN",
                              "OpenMP", "CPU capability usage"})
        if (line.rfind(key, 0) == 0) std::printf("config %s\n", line.c_str());
      if (size_t k = line.find("BLAS_INFO="); k != std::string::npos)
        std::printf("config %s\n", line.substr(k, line.find(',', k) - k).c_str());
    }
    return 0;
  }
  if (argc > 2) torch::set_num_threads(g_threads = std::atoi(argv[2]));
  for (int i = 3; i < argc; ++i)
    if (std::string(argv[i]) == "--bf16") g_dtype = torch::kBFloat16;
  torch::manual_seed(1);
  std::printf("torch_threads %d\ntorch_mkldnn %d\n", torch::get_num_threads(), int(at::globalContext().hasMKLDNN()));
  if (which == "seed") seed_case();
  else if (which == "mnist") mnist_case();
  else if (which == "mnist_converged") mnist_case(int(bench::kMnistConvergeSteps));
  else if (which == "wide") wide_case();
  else if (which == "overhead") overhead_case();
  else if (which == "infer") infer_case();
  else if (which == "lenet") lenet_case();
  else if (which == "fmnist") fmnist_case();
  else if (which == "resnet") resnet_case();
  else if (which == "resnet_train") resnet_train_case();
  else if (which == "encoder") encoder_case();
  else if (which == "lstm") lstm_case();
  else if (which == "lstm_converged") lstm_case(int(bench::kLstmConvergeSteps));
  else if (which == "transformer") transformer_case();
  else if (which == "serve") serve_case(argc > 3 ? std::atof(argv[3]) : 1.0);
  else {
    std::fprintf(stderr, "torch_bench: unknown case %s\n", which.c_str());
    return 2;
  }
  return 0;
}
