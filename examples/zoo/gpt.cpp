// The Flux model zoo's GPT (examples/zoo/gpt.hpp) trained character-level on Genesis and Exodus of
// the King James Version (data/kjv_genesis_exodus.txt.gz, public domain; see data/LICENSE-kjv), 90/10
// split, as the zoo trains it: Adam, the next character's logit cross-entropy, windows of seq_len
// characters; then it samples text. It prints the model as Flux does (a tree with per-layer counts),
// checks its parameter count against Flux's formula for the same configuration, and reports the
// validation loss in nats per character (it starts near ln V).
// Full run (defaults): 6 layers, 2,000 steps of batch 32, windows of 64.
// CI (tests/zoo_gpt.cmake) trains 2 layers for 60 steps (12 on PoCL) and checks the validation loss falls by --min-drop.
//
// Usage: zoo_gpt [options] [text file]
//   --device NAME[:i]   e.g. CPU, OpenCL:0 (default: get_device(), the best available)
//   --steps N, --batchsize N, --seq-len T, --layers L, --lr X, --seed N
//   --valid-windows N   validation windows scored (default 256)
//   --min-drop X        exit 1 unless the validation loss falls by at least X nats
//   --sample N          characters to sample at the end (default 200; 0: none)
// Exit status: see examples/example_support.hpp.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>

#include "../example_support.hpp"
#include "gpt.hpp"

using namespace flux;
using namespace examples;

namespace {

struct Options {
  std::string device;
  int64_t steps = 2000, batchsize = 32, seq_len = 64, layers = 6, valid_windows = 256, sample = 200;
  double lr = 1e-3, min_drop = -1;
  uint64_t seed = 42;
  std::string path = FLUX_SOURCE_DIR "/data/kjv_genesis_exodus.txt.gz";
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--device NAME[:i]] [--steps N] [--batchsize N] [--seq-len T] [--layers L] [--lr X] "
               "[--seed N] [--valid-windows N] [--min-drop X] [--sample N] [text file]\n",
               argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  Args args(argc, argv);
  while (args.next()) {
    const std::string& a = args.arg();
    if (a == "-h" || a == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (args.is("--device")) o.device = args.value();
    else if (args.is("--steps")) o.steps = args.integer(1, 1 << 30);
    else if (args.is("--batchsize")) o.batchsize = args.integer(1, 1 << 16);
    else if (args.is("--seq-len")) o.seq_len = args.integer(2, 4096);
    else if (args.is("--layers")) o.layers = args.integer(1, 64);
    else if (args.is("--lr")) o.lr = args.number();
    else if (args.is("--seed")) o.seed = uint64_t(args.integer(0, 1LL << 62));
    else if (args.is("--valid-windows")) o.valid_windows = args.integer(1, 1 << 30);
    else if (args.is("--min-drop")) o.min_drop = args.number();
    else if (args.is("--sample")) o.sample = args.integer(0, 100000);
    else if (!a.empty() && a[0] == '-') throw UsageError("unknown option '" + a + "'");
    else o.path = a;
  }
  return o;
}

// Mean next-character cross-entropy (nats) of logits (N, T, V) against targets (N, T): Flux's
// logitcrossentropy over the flattened positions.
Tensor char_loss(const Tensor& logits, const Tensor& targets, int64_t vocab) {
  const int64_t rows = logits.numel() / vocab;
  return logitcrossentropy(logits.reshape(Shape{rows, vocab}), onehot(targets.reshape(Shape{rows}), vocab));
}

double validation_loss(const zoo::TransformerGPT& model, const data::TextWindows& w, int64_t vocab, const Device& dev) {
  const int64_t n = w.inputs.size(0), batch = 64;
  double total = 0;
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t e = std::min(n, s + batch);
    total += char_loss(model(to(w.inputs.slice(s, e), dev)), to(w.targets.slice(s, e), dev), vocab).item<double>() * double(e - s);
  }
  return total / double(n);
}

// The zoo's generate: the next character drawn from softmax(logits / temperature) of the last position.
std::string generate(const zoo::TransformerGPT& model, const data::CharVocab& vocab, const std::string& prompt, int64_t count,
                     int64_t seq_len, const Device& dev, uint64_t seed, double temperature = 0.8) {
  std::mt19937_64 gen(seed);
  std::vector<int64_t> ids = vocab.encode(prompt).to_vector<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - seq_len);
    std::vector<int64_t> window(ids.begin() + start, ids.end());
    Tensor logits = model(to(Tensor(window, Shape{1, int64_t(window.size())}), dev));  // (1, t, V)
    Tensor last = slice(logits, 1, logits.size(1) - 1, logits.size(1)).reshape(Shape{vocab.size()});
    std::vector<double> p = softmax(last * (1.0 / temperature)).to_vector<double>();
    ids.push_back(int64_t(std::discrete_distribution<int64_t>(p.begin(), p.end())(gen)));
  }
  return vocab.decode(ids);
}

int run(const Options& opt) {
  std::string text;
  try {
    text = data::load_text(opt.path);
  } catch (const Error& e) {
    throw DataError(e.what());
  }
  data::CharVocab vocab(text);
  auto [train_ids, valid_ids] = data::split_text(vocab.encode(text), 0.1);
  data::TextWindows train = data::text_windows(train_ids, opt.seq_len, opt.seq_len / 2);
  data::TextWindows valid = data::text_windows(valid_ids, opt.seq_len);
  if (opt.valid_windows < valid.inputs.size(0))
    valid = {valid.inputs.slice(0, opt.valid_windows), valid.targets.slice(0, opt.valid_windows)};
  const int64_t v = vocab.size();

  seed(opt.seed);
  Device dev = pick_device(opt.device);
  zoo::GPTConfig config;
  config.n_layers = opt.layers;
  zoo::TransformerGPT model = zoo::TransformerGPT(v, opt.seq_len, config) | dev;
  std::cout << model << "\n";
  const int64_t count = parameter_count(model), flux_count = zoo::flux_parameter_count(v, opt.seq_len, config);
  std::printf("%lld parameters (Flux's formula for this configuration: %lld); text: %zu characters, %lld symbols; device %s\n",
              (long long)count, (long long)flux_count, text.size(), (long long)v, to_string(dev).c_str());
  if (count != flux_count) {
    std::fprintf(stderr, "zoo_gpt: %lld parameters where Flux has %lld\n", (long long)count, (long long)flux_count);
    return 1;
  }

  auto loader = DataLoader({train.inputs, train.targets}, {.batchsize = opt.batchsize, .shuffle = true, .partial = false}) | dev;
  auto opt_state = optimisers::setup(optimisers::Adam(opt.lr), model);
  const double start_loss = validation_loss(model, valid, v, dev);
  std::printf("validation loss before training: %.4f nats per character (ln %lld = %.4f)\n", start_loss, (long long)v,
              std::log(double(v)));
  const int64_t per_epoch = int64_t(loader.size());
  const int epochs = int((opt.steps + per_epoch - 1) / per_epoch);
  ProgressBar progress(epochs, std::min(opt.steps, per_epoch));
  int64_t step = 0;
  for (int epoch = 1; epoch <= epochs && step < opt.steps; ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] = withgradient([&](const zoo::TransformerGPT& m) { return char_loss(m(x), y, v); }, model);
      optimisers::update(opt_state, model, grads);
      epoch_loss += loss.item<double>();
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches));
      if (++step == opt.steps) break;
    }
  }
  const double valid_loss = validation_loss(model, valid, v, dev);
  std::printf("validation loss: %.4f nats per character (from %.4f) after %lld steps, %.1fs on %s\n", valid_loss, start_loss,
              (long long)step, progress.elapsed(), to_string(dev).c_str());
  if (opt.sample > 0)
    std::printf("sample:\n%s\n", generate(model, vocab, "And God said", opt.sample, opt.seq_len, dev, opt.seed).c_str());
  if (opt.min_drop >= 0 && start_loss - valid_loss < opt.min_drop) {
    std::fprintf(stderr, "zoo_gpt: the validation loss fell by %.4f (%.4f -> %.4f), less than --min-drop %.4f\n",
                 start_loss - valid_loss, start_loss, valid_loss, opt.min_drop);
    return kExitAccuracy;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("zoo_gpt", [&] { return run(parse_args(argc, argv)); }, [&] { print_usage(stderr, argv[0]); });
}
