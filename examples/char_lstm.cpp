// A character-level LSTM language model on Genesis and Exodus of the King James Version
// (data/kjv_genesis_exodus.txt.gz, public domain, see data/LICENSE-kjv; 366,194 characters, 62 symbols):
//
//   one-hot (N, T, 62) -> LSTM(62 => H) -> (N T, H) -> Dense(H => 62) logits, next-character targets
//
// The last 10% of the text is the validation set. Training: non-overlapping windows of T characters
// from a zero state, logit cross-entropy, ClipNorm(5) then Adam (an OptimiserChain), a progress bar per
// epoch, and the validation loss per character in nats before training and after every epoch. At the
// end it samples text from the model, character by character, carrying the LSTM state.
//
// Full run (defaults: H 256, T 64, batch 32, 6 epochs): see the figure in the note of issue 12.
//
// Usage: char_lstm [options] [text file, plain or gzip]
//   --epochs N            training epochs (default 6)
//   --device NAME[:i]     e.g. CPU, OpenCL:0, CUDA:1 (default: get_device(), the best available)
//   --hidden H, --seq-len T, --batchsize N, --lr X, --seed N   (defaults 256, 64, 32, 2e-3, 42)
//   --train-limit N       train on the first N characters of the training part only
//   --valid-limit N       score the first N characters of the validation part only
//   --max-loss L          exit with status 1 unless the final validation loss is below L (nats)
//   --min-drop D          exit with status 1 unless the validation loss fell by at least D nats
//   --sample N            characters to sample at the end (default 400; 0: none)
// Exit status: see examples/example_support.hpp (3: the text is missing, 5: the device is not available).
#include <cmath>
#include <cstdio>
#include <optional>
#include <iostream>
#include <random>

#include "example_models.hpp"
#include "example_support.hpp"

using namespace flux;
using namespace examples;

namespace {

struct Options {
  int epochs = 6;
  std::string device;
  int64_t hidden = 256, seq_len = 64, batchsize = 32;
  double lr = 2e-3;
  uint64_t seed = 42;
  int64_t train_limit = 0, valid_limit = 0;  // 0: all
  double max_loss = -1, min_drop = -1;
  int64_t sample = 400;
  std::string path = std::string(FLUX_SOURCE_DIR) + "/data/kjv_genesis_exodus.txt.gz";
  std::optional<DType> autocast;  // --autocast bf16|f16: mixed-precision training (flux/autocast.hpp)
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--epochs N] [--device NAME[:i]] [--hidden H] [--seq-len T] [--batchsize N] [--lr X] "
               "[--seed N] [--autocast bf16|f16] [--train-limit N] [--valid-limit N] [--max-loss L] [--min-drop D] [--sample N] [text file]\n",
               argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool path_given = false;
  Args args(argc, argv);
  while (args.next()) {
    if (args.arg() == "-h" || args.arg() == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (args.is("--epochs")) {
      o.epochs = int(args.integer(1, 100000));
    } else if (args.is("--device")) {
      o.device = args.value();
      if (o.device.empty()) throw UsageError("--device expects NAME or NAME:i, e.g. CPU or OpenCL:0");
    } else if (args.is("--hidden")) {
      o.hidden = args.integer(1, 1 << 16);
    } else if (args.is("--seq-len")) {
      o.seq_len = args.integer(1, 1 << 16);
    } else if (args.is("--batchsize")) {
      o.batchsize = args.integer(1, 1 << 20);
    } else if (args.is("--lr")) {
      o.lr = args.number();
      if (!(o.lr > 0)) throw UsageError("--lr must be positive");
    } else if (args.is("--autocast")) {
      const std::string v = args.value();
      if (v == "bf16") o.autocast = BFloat16;
      else if (v == "f16") o.autocast = Float16;
      else throw UsageError("--autocast expects bf16 or f16; got '" + v + "'");
    } else if (args.is("--seed")) {
      o.seed = uint64_t(args.integer(0, 1LL << 62));
    } else if (args.is("--train-limit")) {
      o.train_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--valid-limit")) {
      o.valid_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--max-loss")) {
      o.max_loss = args.number();
    } else if (args.is("--min-drop")) {
      o.min_drop = args.number();
    } else if (args.is("--sample")) {
      o.sample = args.integer(0, 1 << 24);
    } else if (args.is_flag()) {
      throw UsageError("unknown option '" + args.arg() + "'");
    } else if (!path_given) {
      o.path = args.arg();
      path_given = true;
    } else {
      throw UsageError("more than one text file given ('" + o.path + "', '" + args.arg() + "')");
    }
  }
  return o;
}

using examples::CharModel;  // example_models.hpp: (N, T, V) one-hot -> (N T, V) logits

std::ostream& operator<<(std::ostream& os, const CharModel& m) {
  return os << "CharModel(" << layer_string(m.lstm) << ", " << layer_string(m.head) << ")  # "
            << show::underscorise(parameter_count(m)) << " parameters";
}

/// One-hot inputs (N, T, V) and targets (N T, V) of a batch of (N, T) id windows.
std::pair<Tensor, Tensor> encode(const Tensor& inputs, const Tensor& targets, int64_t vocab) {
  const int64_t n = inputs.size(0), t = inputs.size(1);
  return {onehot(inputs.reshape({n * t}), vocab).reshape({n, t, vocab}), onehot(targets.reshape({n * t}), vocab)};
}

/// Mean cross-entropy per character (nats) over every window, in batches, outside gradient().
double validation_loss(const CharModel& model, const data::TextWindows& w, int64_t vocab, const Device& dev) {
  const int64_t n = w.inputs.size(0), batch = 128;
  double total = 0;
  for (int64_t start = 0; start < n; start += batch) {
    int64_t stop = std::min(n, start + batch);
    auto [x, y] = encode(w.inputs.slice(start, stop), w.targets.slice(start, stop), vocab);
    total += logitcrossentropy(model(to(x, dev)), to(y, dev)).item<double>() * double(stop - start);
  }
  return total / double(n);
}

/// Samples `count` characters after `prompt` at temperature 0.8, carrying the LSTM state.
std::string sample_text(const CharModel& model, const data::CharVocab& vocab, const std::string& prompt,
                        int64_t count, const Device& dev, uint64_t seed_value) {
  std::mt19937_64 rng(seed_value);
  const int64_t V = vocab.size();
  LSTMState state = model.lstm.initial_state(1);
  std::string out = prompt;
  Tensor logits;
  auto step = [&](char c) {
    Tensor x = onehot(Tensor(std::vector<int64_t>{vocab.id(c)}, Shape{1}), V).reshape({1, 1, V});
    auto r = model.lstm.forward(to(x, dev), state);
    state = r.state;
    logits = model.head(r.output.reshape({1, model.lstm.hidden_size()}));
  };
  for (char c : prompt) step(c);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<double> p = softmax(logits * (1.0 / 0.8)).to_vector<double>();
    std::discrete_distribution<int64_t> pick(p.begin(), p.end());
    char c = vocab.symbol(pick(rng));
    out.push_back(c);
    step(c);
  }
  return out;
}

int run(const Options& opt) {
  std::string text;
  try {
    text = data::load_text(opt.path);
    if (text.size() < 1000) throw DataError("'" + opt.path + "' holds " + std::to_string(text.size()) +
                                            " characters; char_lstm needs at least 1,000");
  } catch (const Error& e) {
    throw DataError(e.what());
  }
  data::CharVocab vocab(text);
  const int64_t V = vocab.size();
  auto split = data::split_text(vocab.encode(text), 0.1);
  Tensor train_ids = split.train, valid_ids = split.validation;
  if (opt.train_limit > 0 && opt.train_limit < train_ids.size(0)) train_ids = train_ids.slice(0, opt.train_limit);
  if (opt.valid_limit > 0 && opt.valid_limit < valid_ids.size(0)) valid_ids = valid_ids.slice(0, opt.valid_limit);
  data::TextWindows train = data::text_windows(train_ids, opt.seq_len);
  data::TextWindows valid = data::text_windows(valid_ids, opt.seq_len);

  seed(opt.seed);
  Device dev = pick_device(opt.device);
  std::printf("char_lstm: %lld training / %lld validation characters (%lld symbols) from %s, %lld windows of %lld, "
              "device %s\n",
              (long long)train_ids.size(0), (long long)valid_ids.size(0), (long long)V, opt.path.c_str(),
              (long long)train.inputs.size(0), (long long)opt.seq_len, to_string(dev).c_str());

  CharModel model = fmap([&](const Tensor& t) { return to(t, dev); }, CharModel(V, opt.hidden));
  std::cout << model << "\n";
  std::cout.flush();

  auto loader = DataLoader({train.inputs, train.targets}, {.batchsize = opt.batchsize, .shuffle = true});
  auto rule = optimisers::OptimiserChain(optimisers::ClipNorm(5.0), optimisers::Adam(opt.lr));
  auto opt_state = optimisers::setup(rule, model);
  // --autocast f16 scales the loss and skips steps that overflow; bf16 needs no scaling.
  optimisers::GradScaler scaler({.enabled = opt.autocast == Float16});

  const double initial = validation_loss(model, valid, V, dev);
  std::printf("validation loss before training: %.4f nats per character (log %lld = %.4f)\n", initial, (long long)V,
              std::log(double(V)));
  double last = initial;
  ProgressBar progress(opt.epochs, loader.size());
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [ids, next] : loader) {
      auto [x, y] = encode(ids, next, V);
      Tensor xd = to(x, dev), yd = to(y, dev);
      const double scale = scaler.get_scale();
      auto [loss, grads] = withgradient([&](const CharModel& m) { return scaler.scale(logitcrossentropy(m(xd), yd)); },
                                        model, {.autocast = opt.autocast});
      scaler.step(opt_state, model, grads);
      scaler.update();
      epoch_loss += loss.item<double>() / scale;
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches));
    }
    last = validation_loss(model, valid, V, dev);
    std::printf("epoch %d: validation loss %.4f nats per character (%.3f bits)\n", epoch, last, last / std::log(2.0));
    std::fflush(stdout);
  }
  std::printf("validation loss: %.4f nats per character after %d epochs (from %.4f), training %.1fs on %s\n", last,
              opt.epochs, initial, progress.elapsed(), to_string(dev).c_str());

  if (opt.sample > 0) {
    std::string s = sample_text(model, vocab, "And God said", opt.sample, dev, opt.seed);
    std::printf("---- sample (temperature 0.8) ----\n%s\n----\n", s.c_str());
  }

  int status = 0;
  if (opt.max_loss >= 0 && !(last < opt.max_loss)) {
    std::fprintf(stderr, "char_lstm: validation loss %.4f is not below --max-loss %.4f\n", last, opt.max_loss);
    status = kExitAccuracy;
  }
  if (opt.min_drop >= 0 && !(initial - last >= opt.min_drop)) {
    std::fprintf(stderr, "char_lstm: validation loss fell by %.4f nats (%.4f -> %.4f), less than --min-drop %.4f\n",
                 initial - last, initial, last, opt.min_drop);
    status = kExitAccuracy;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("char_lstm", [&] { return run(parse_args(argc, argv)); }, [&] { print_usage(stderr, argv[0]); });
}
