// flux-tune: times the CPU kernel candidates for stock models' shapes on this machine and saves the
// fastest in the kernel table later runs read (flux::tune_kernels, include/flux/tune.hpp).
//   flux-tune mlp resnet18 lstm --batch 1,32 --threads 1,2
// Each thread count runs in a child process of its own (the pool's size is fixed per process); each
// adds its shapes to the same table.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "flux/autocast.hpp"
#include "flux/flux.hpp"
#include "flux/models/resnet.hpp"

using namespace flux;

namespace {

// examples/char_lstm.cpp's model, as bench/flux_bench.cpp times it: (N, T, 62) -> LSTM(62 => 256) ->
// (N T, 256) -> Dense(256 => 62).
struct CharLSTM {
  LSTM lstm;
  Dense head;
  Tensor operator()(const Tensor& x) const {
    Tensor h = lstm(x);
    return head(h.reshape({h.size(0) * h.size(1), h.size(2)}));
  }
};
FLUX_LAYER(CharLSTM, lstm, head)

struct Options {
  std::vector<std::string> models;
  std::vector<int64_t> batches{1, 32};
  std::vector<int64_t> threads;  // empty: the pool's default (FLUX_NUM_THREADS or the cores)
  int64_t image = 224, seq = 64;
  bool train = false;
  std::optional<DType> autocast;  // --autocast: inference and training under autocast to this dtype
  TuneOptions tune;
};

const char* const kUsage =
    "usage: flux-tune MODEL... [--batch 1,32] [--threads N,...] [--train] [--autocast bf16|f16] [--image 224]\n"
    "                 [--seq 64] [--reps 5] [--margin 0.05] [--output PATH] [--dry-run]\n"
    "Runs each MODEL (mlp: Dense 784-512-512-10; resnet18: ResNet-18 on 3 x image x image; lstm:\n"
    "LSTM(62 => 256) + Dense over seq steps) at each batch size, inference (and with --train a gradient\n"
    "step), times every CPU kernel candidate for the shapes it uses, and saves the fastest (the built-in\n"
    "rule's kernel unless another is faster by the margin) in the kernel table, added to what the table\n"
    "already holds for this machine. Later runs of any flux program read it. --threads tunes for each\n"
    "pool size (a child process each); --autocast runs the model under autocast (the mixed-precision\n"
    "kernels' shapes: bf16 GEMMs, a training Dense's weights); --dry-run measures and prints without saving.\n"
    "The table: --output, else $FLUX_KERNEL_TABLE, else flux-kernels.tsv beside LocalPreferences.toml\n"
    "($FLUX_PREFERENCES or the current folder).\n";

std::vector<int64_t> parse_list(const char* flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 1) {
      std::cerr << "flux-tune: " << flag << " takes positive whole numbers separated by commas; got \"" << text
                << "\"\n";
      std::exit(2);
    }
    out.push_back(v);
  }
  if (out.empty()) {
    std::cerr << "flux-tune: " << flag << " needs at least one number\n";
    std::exit(2);
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::cerr << "flux-tune: " << argv[i] << " needs a value; try --help\n";
      std::exit(2);
    }
    return argv[++i];
  };
  auto number = [&](int& i) {
    const char* flag = argv[i];
    return parse_list(flag, value(i)).at(0);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--batch") {
      o.batches = parse_list("--batch", value(i));
    } else if (a == "--threads") {
      o.threads = parse_list("--threads", value(i));
    } else if (a == "--image") {
      o.image = number(i);
    } else if (a == "--seq") {
      o.seq = number(i);
    } else if (a == "--reps") {
      o.tune.reps = int(number(i));
    } else if (a == "--margin") {
      o.tune.margin = std::atof(value(i).c_str());
    } else if (a == "--output" || a == "-o") {
      o.tune.path = value(i);
    } else if (a == "--train") {
      o.train = true;
    } else if (a == "--autocast") {
      const std::string d = value(i);
      if (d != "bf16" && d != "f16") {
        std::cerr << "flux-tune: --autocast takes bf16 or f16; got \"" << d << "\"\n";
        std::exit(2);
      }
      o.autocast = d == "bf16" ? BFloat16 : Float16;
    } else if (a == "--dry-run") {
      o.tune.save = false;
    } else if (a == "mlp" || a == "resnet18" || a == "lstm") {
      o.models.push_back(a);
    } else {
      std::cerr << "flux-tune: unknown argument \"" << a << "\"; models are mlp, resnet18, lstm; try --help\n";
      std::exit(2);
    }
  }
  if (o.models.empty()) {
    std::cerr << kUsage;
    std::exit(2);
  }
  return o;
}

// Inference at each batch size, and a gradient step with --train (under autocast with --autocast).
template <class Model> void run(const Model& model, const Options& o, auto&& input) {
  for (int64_t batch : o.batches) {
    Tensor x = input(batch);
    auto forward = [&] { return model(x); };
    (void)(o.autocast ? autocast(*o.autocast, forward) : forward());
    if (o.train) (void)gradient([&](const Model& m) { return sum(m(x)); }, model, {.autocast = o.autocast});
  }
}

void workload(const Options& o) {
  seed(1);
  for (const std::string& name : o.models) {
    if (name == "mlp") {
      auto model = Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10));
      run(model, o, [](int64_t n) { return rand({n, 784}); });
    } else if (name == "resnet18") {
      models::ResNet18 model;
      run(model, o, [&](int64_t n) { return rand({n, 3, o.image, o.image}); });
    } else if (name == "lstm") {
      CharLSTM model{LSTM(62, 256), Dense(256, 62)};
      run(model, o, [&](int64_t n) { return rand({n, o.seq, 62}); });
    }
  }
}

int tune(const Options& o) {
  try {
    TuneReport report = tune_kernels([&] { workload(o); }, o.tune);
    std::cout << report;
    std::cout.flush();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "flux-tune: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads.empty()) return tune(o);
  // One child per pool size, one after the other (each reads the table the previous one saved). The
  // parent touches no flux state before forking, so each child makes its pool at its own size.
  int status_all = 0;
  for (int64_t n : o.threads) {
    std::cout.flush();
    const pid_t child = fork();
    if (child < 0) {
      std::perror("flux-tune: fork");
      return 1;
    }
    if (child == 0) {
      setenv("FLUX_NUM_THREADS", std::to_string(n).c_str(), 1);
      std::cout << "== " << n << " thread(s)\n";
      std::exit(tune(o));
    }
    int status = 0;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) status_all = 1;
  }
  return status_all;
}
