// The model zoo's GPT (examples/zoo/gpt.hpp) trained sharded across the ranks of mpirun
// (distributed::shard, DeepSpeed's ZeRO stages 1 to 3, PyTorch's FSDP), on data/kjv_genesis_exodus.txt.gz:
//   mpirun --allow-run-as-root -np 4 --oversubscribe build/bin/sharded_gpt --stage 3 --steps 200 --save ckpt
//   mpirun --allow-run-as-root -np 2 build/bin/sharded_gpt --stage 3 --steps 100 --resume ckpt
// The GPT is laid out as a Chain (token and position embedding, 4 GPTBlocks, LayerNorm, Dense): at
// stage 3 each rank keeps 1/N of every array between steps, and each element of the Chain has its
// arrays all-gathered just before its forward and its backward. A checkpoint is a folder with one
// file per rank; it loads on any number of ranks (and into one process with load_checkpoint).
// Every rank trains on its own batches (DataLoader .shard = comm); rank 0 prints.
//
// Usage: sharded_gpt [options] [text file]
//   --stage 1|2|3 (default 3)      --steps N (default 200)       --batchsize N per rank (default 16)
//   --seq-len T (default 32)       --width E (default 64: n_embed; the MLP is 4E, 4 heads of E/4)
//   --lr X (default 2e-3)          --seed N (default 42)         --device NAME[:i] (default CPU)
//   --save DIR                     sharded checkpoint after training
//   --resume DIR                   load a sharded checkpoint (written at any number of ranks) first
//   --valid-windows N (default 64) --min-drop X: exit 1 unless the validation loss fell by X
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "example_support.hpp"
#include "flux/distributed/shard.hpp"
#include "zoo/gpt.hpp"

using namespace flux;
using namespace examples;

namespace {

/// ids (N, T) Int64 -> tok_embed(ids) .+ pos_embed(0:T-1): (N, T, E), the zoo GPT's first step.
struct TokenAndPosition {
  Embedding tok_embed, pos_embed;
  Tensor operator()(const Tensor& ids) const {
    return tok_embed(ids) + pos_embed(arange(ids.size(1), DType::i64, ids.device()));
  }
};
FLUX_LAYER(TokenAndPosition, tok_embed, pos_embed)

using Block = zoo::GPTBlock<MultiHeadAttention>;
using GPT = Chain<TokenAndPosition, Block, Block, Block, Block, LayerNorm, Dense>;

GPT make_gpt(int64_t vocab, int64_t seq_len, int64_t width) {
  zoo::GPTConfig c;
  c.n_embed = width;
  c.n_hidden = 4 * width;
  c.qk_dim = c.v_dim = width / 4;
  return GPT(TokenAndPosition{Embedding(vocab, width), Embedding(seq_len, width)}, zoo::gpt_block(c), zoo::gpt_block(c),
             zoo::gpt_block(c), zoo::gpt_block(c), LayerNorm(width), Dense(width, vocab));
}

struct Options {
  int stage = 3;
  int64_t steps = 200, batchsize = 16, seq_len = 32, width = 64, valid_windows = 64;
  double lr = 2e-3, min_drop = -1;
  uint64_t seed = 42;
  std::string device = "CPU", save, resume;
  std::string path = FLUX_SOURCE_DIR "/data/kjv_genesis_exodus.txt.gz";
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--stage 1|2|3] [--steps N] [--batchsize N] [--seq-len T] [--width E] [--lr X] [--seed N] "
               "[--device NAME[:i]] [--save DIR] [--resume DIR] [--valid-windows N] [--min-drop X] [text file]\n",
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
    } else if (args.is("--stage")) o.stage = int(args.integer(1, 3));
    else if (args.is("--steps")) o.steps = args.integer(0, 1 << 30);
    else if (args.is("--batchsize")) o.batchsize = args.integer(1, 1 << 16);
    else if (args.is("--seq-len")) o.seq_len = args.integer(2, 4096);
    else if (args.is("--width")) o.width = args.integer(4, 1 << 14);
    else if (args.is("--lr")) o.lr = args.number();
    else if (args.is("--seed")) o.seed = uint64_t(args.integer(0, 1LL << 62));
    else if (args.is("--device")) o.device = args.value();
    else if (args.is("--save")) o.save = args.value();
    else if (args.is("--resume")) o.resume = args.value();
    else if (args.is("--valid-windows")) o.valid_windows = args.integer(1, 1 << 30);
    else if (args.is("--min-drop")) o.min_drop = args.number();
    else if (!a.empty() && a[0] == '-') throw UsageError("unknown option '" + a + "'");
    else o.path = a;
  }
  if (o.width % 4) throw UsageError("--width must be a multiple of 4 (4 heads)");
  return o;
}

Tensor char_loss(const Tensor& logits, const Tensor& targets, int64_t vocab) {
  const int64_t rows = logits.numel() / vocab;
  return logitcrossentropy(logits.reshape(Shape{rows, vocab}), onehot(targets.reshape(Shape{rows}), vocab));
}

// The same windows on every rank (the sharded model's call is collective), in batches of 32.
double validation_loss(const distributed::Sharded<GPT>& model, const data::TextWindows& w, int64_t vocab, const Device& dev) {
  const int64_t n = w.inputs.size(0), batch = 32;
  double total = 0;
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t e = std::min(n, s + batch);
    Tensor logits = model(to(w.inputs.slice(s, e), dev));
    total += char_loss(logits, to(w.targets.slice(s, e), dev), vocab).item<double>() * double(e - s);
  }
  return total / double(n);
}

int run(const Options& opt) {
  auto comm = distributed::initialize();
  const bool root = comm.rank() == 0;
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
  Device dev = pick_device(opt.device == "CUDA" || opt.device == "OpenCL" ? opt.device + ":" + std::to_string(comm.local_rank())
                                                                          : opt.device);

  seed(opt.seed);
  // Every rank starts from rank 0's model; the whole model exists only until shard() has cut it.
  auto [model, state] = [&] {
    GPT whole = distributed::broadcast(comm, make_gpt(v, opt.seq_len, opt.width) | dev, 0);
    if (root) std::cout << whole << "\n";
    return distributed::shard(comm, whole, optimisers::Adam(opt.lr), {.stage = opt.stage});
  }();
  int64_t total = 0, mine = 0, copied = 0;  // copied: masters that are not views of the model's arrays
  const std::vector<Tensor> arrays = params(model.model);
  for (size_t i = 0; i < state.masters.size(); ++i) {
    total += model.plan->shapes[i].numel();
    mine += state.masters[i].numel();
    if (state.masters[i].impl()->storage != arrays[i].impl()->storage) copied += state.masters[i].numel();
  }
  if (root)
    std::printf("sharded_gpt: %d rank(s), stage %d, %lld parameters; each rank holds %lld of them as float32 masters "
                "and Adam moments (%.2f MB of %.2f MB) and %s between steps\n",
                comm.size(), opt.stage, (long long)total, (long long)mine, (8.0 * double(mine) + 4.0 * double(copied)) / 1e6,
                12.0 * double(total) / 1e6, opt.stage == 3 ? "no whole array" : "the whole model");
  if (!opt.resume.empty()) {
    distributed::load_checkpoint(opt.resume, model, state);
    if (root) std::printf("resumed from %s at step %lld\n", opt.resume.c_str(), (long long)state.steps());
  }

  const double start_loss = validation_loss(model, valid, v, dev);
  if (root) std::printf("validation loss: %.4f nats per character (ln %lld = %.4f)\n", start_loss, (long long)v, std::log(double(v)));
  auto loader = DataLoader({train.inputs, train.targets},
                           {.batchsize = opt.batchsize, .shuffle = true, .partial = false, .shard = comm}) | dev;
  int64_t step = 0;
  double window_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (step < opt.steps) {
    for (auto [bx, by] : loader) {
      const Tensor x = bx, y = by;  // plain names: clang 14 captures no structured binding
      auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return char_loss(m(x), y, v); }, model);
      optimisers::update(state, model, grads);
      window_loss += loss.item<double>();
      if (++step % 25 == 0 || step == opt.steps) {
        const int64_t n = step % 25 ? step % 25 : 25;
        const double mean = distributed::allreduce(comm, Tensor::scalar(window_loss / double(n), DType::f64),
                                                   distributed::ReduceOp::mean).item<double>();
        if (root) std::printf("step %lld (optimiser step %lld): training loss %.4f\n", (long long)step, (long long)state.steps(), mean);
        window_loss = 0;
      }
      if (step == opt.steps) break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double valid_loss = validation_loss(model, valid, v, dev);
  if (root)
    std::printf("validation loss: %.4f nats per character (from %.4f) after %lld steps, %.1fs, %d rank(s), stage %d\n", valid_loss,
                start_loss, (long long)step, seconds, comm.size(), opt.stage);
  if (!opt.save.empty()) {
    distributed::save_checkpoint(opt.save, model, state);
    if (root) std::printf("saved %s (%d shard files and index.json)\n", opt.save.c_str(), comm.size());
  }
  if (opt.min_drop >= 0 && start_loss - valid_loss < opt.min_drop) {
    if (root)
      std::fprintf(stderr, "sharded_gpt: the validation loss fell by %.4f (%.4f -> %.4f), less than --min-drop %.4f\n",
                   start_loss - valid_loss, start_loss, valid_loss, opt.min_drop);
    return kExitAccuracy;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("sharded_gpt", [&] { return run(parse_args(argc, argv)); }, [&] { print_usage(stderr, argv[0]); });
}
