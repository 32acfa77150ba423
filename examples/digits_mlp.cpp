// The 8x8 digits classifier: an MLP trained on scikit-learn's digits data set (1,797 images of
// 64 pixels in 0..16, shipped in data/digits.csv.gz), 80/20 split with a fixed seed.
//
// Usage: digits_mlp [options] [path/to/digits.csv.gz]
//   --epochs N            training epochs (default 30)
//   --device NAME[:i]     e.g. CPU, OpenCL:0, CUDA:1 (default: get_device(), the best available)
//   --min-accuracy A      exit with status 1 when the test accuracy is below A (for CI)
//   --seed N              seed for the split, the initial weights and the shuffling (default 42)
//   --lr X, --batchsize N Adam's learning rate (default 3e-3) and the batch size (default 32)
//   --plot PREFIX         write PREFIX.csv (epoch, training loss, test accuracy) and PREFIX.gp, and
//                         draw PREFIX.png with gnuplot when it is on PATH (./scripts/demo passes it)
//
// Exit status: 0 ok, 1 accuracy below --min-accuracy, 2 bad command line, 3 missing or corrupt
// data file, 4 a flux::Error or other failure while training, 5 the device named by --device is not
// available (unknown backend, plugin not loaded, no such index; ctest treats it as "skipped").
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "example_models.hpp"
#include "example_support.hpp"

using namespace examples;

namespace {

constexpr int kPixels = 64;
constexpr int kClasses = 10;

struct Options {
  int epochs = 30;
  double min_accuracy = -1;  // < 0: no check
  std::string device;        // empty: get_device()
  uint64_t seed = 42;
  double lr = 3e-3;
  int64_t batchsize = 32;
  std::string data_path;     // empty: the default search
  std::string plot;          // empty: no plot files
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--epochs N] [--device NAME[:i]] [--min-accuracy A] [--seed N] "
               "[--lr X] [--batchsize N] [--plot PREFIX] [path/to/digits.csv.gz]\n",
               argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  Args args(argc, argv);
  while (args.next()) {
    if (args.arg() == "-h" || args.arg() == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (args.is("--epochs")) {
      o.epochs = int(args.integer(1, 100000));
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number();
    } else if (args.is("--device")) {
      o.device = args.value();
      if (o.device.empty()) throw UsageError("--device expects NAME or NAME:i, e.g. CPU or OpenCL:0");
    } else if (args.is("--seed")) {
      o.seed = uint64_t(args.integer(0, 1LL << 62));
    } else if (args.is("--lr")) {
      o.lr = args.number();
      if (!(o.lr > 0)) throw UsageError("--lr must be positive");
    } else if (args.is("--batchsize")) {
      o.batchsize = args.integer(1, 1 << 20);
    } else if (args.is("--plot")) {
      o.plot = args.value();
      if (o.plot.empty()) throw UsageError("--plot expects a path prefix, e.g. build-demo/digits_mlp");
    } else if (args.is_flag()) {
      throw UsageError("unknown option '" + args.arg() + "'");
    } else if (o.data_path.empty()) {
      o.data_path = args.arg();
    } else {
      throw UsageError("more than one data path given ('" + o.data_path + "', '" + args.arg() + "')");
    }
  }
  return o;
}


/// Why `dev` is the device: named on the command line, or get_device()'s automatic choice with the
/// state of each GPU backend it tried, in its order (CUDA, AMDGPU, Metal, OpenCL).
std::string device_reason(const std::string& spec, const Device& dev) {
  if (!spec.empty()) return "named by --device " + spec;
  std::string why = "get_device():";
  for (std::string name : {"CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    if (name == dev.backend()) return why + " " + name + " functional (first in order, or preferred)";
    if (!loaded(name)) why += " " + name + " no plugin,";
    else if (!functional(name)) why += " " + name + " plugin loaded but no usable device,";
    else if (name == "OpenCL") why += " OpenCL only CPU devices (PoCL; used when named: --device OpenCL:0),";
    else why += " " + name + " functional but not preferred,";
  }
  why.back() = ';';
  return why + " so the CPU";
}

struct EpochRecord {
  int epoch;
  double train_loss;     // mean over the epoch's batches
  double test_accuracy;  // after the epoch
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string gnuplot_quote(const std::string& s) {  // gnuplot's single-quoted strings double a quote
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

/// The first executable `gnuplot` on PATH, or "".
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (!dir.empty()) {
      std::string candidate = dir + "/gnuplot";
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    start = end + 1;
  }
  return "";
}

/// Writes PREFIX.csv and PREFIX.gp (the gnuplot script drawing PREFIX.png from the CSV: training loss
/// on a log scale on the left axis, test accuracy on the right), runs gnuplot when it is on PATH, and
/// says where everything went.
void write_plot(const std::string& prefix, const std::vector<EpochRecord>& history) {
  namespace fs = std::filesystem;
  fs::path base = fs::absolute(fs::path(prefix));
  std::error_code ec;
  if (base.has_parent_path()) fs::create_directories(base.parent_path(), ec);
  std::string csv = base.string() + ".csv", gp = base.string() + ".gp", png = base.string() + ".png";
  {
    std::ofstream out(csv);
    out << "epoch,train_loss,test_accuracy\n";
    for (const EpochRecord& r : history) {
      char line[96];
      std::snprintf(line, sizeof line, "%d,%.6g,%.4f\n", r.epoch, r.train_loss, r.test_accuracy);
      out << line;
    }
    if (!out) throw std::runtime_error("--plot: cannot write '" + csv + "'");
  }
  {
    std::ofstream out(gp);
    out << "# Draws " << png << " from " << csv << " (written by digits_mlp --plot).\n"
        << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 900,500 } "
           "else { set terminal png size 900,500 }\n"
        << "set output " << gnuplot_quote(png) << "\n"
        << "set datafile separator ','\n"
        << "set title 'digits\\_mlp: training loss and test accuracy per epoch'\n"
        << "set xlabel 'epoch'\nset ylabel 'training loss (mean over the epoch)'\nset logscale y\n"
        << "set y2label 'test accuracy'\nset y2range [0:1]\nset ytics nomirror\nset y2tics 0.1\n"
        << "set key center right\nset grid\n"
        << "plot " << gnuplot_quote(csv) << " skip 1 using 1:2 with linespoints title 'training loss' axes x1y1, \\\n"
        << "     " << gnuplot_quote(csv) << " skip 1 using 1:3 with linespoints title 'test accuracy' axes x1y2\n";
    if (!out) throw std::runtime_error("--plot: cannot write '" + gp + "'");
  }
  std::string gnuplot = find_gnuplot();
  if (gnuplot.empty()) {
    std::printf("plot data: %s (gnuplot not found; draw it with: gnuplot %s  [apt-get install gnuplot-nox])\n",
                csv.c_str(), gp.c_str());
    return;
  }
  fs::remove(png, ec);
  std::fflush(stdout);
  int status = std::system((shell_quote(gnuplot) + " " + shell_quote(gp)).c_str());
  if (status == 0 && fs::is_regular_file(png, ec)) {
    std::printf("plot: %s (loss and accuracy per epoch; data %s)\n", png.c_str(), csv.c_str());
  } else {
    std::printf("plot: gnuplot %s failed (status %d); the data is in %s, the script in %s\n", gnuplot.c_str(),
                status, csv.c_str(), gp.c_str());
  }
}

int run(const Options& opt) {
  Digits data = load_digits(opt.data_path);  // data::read_csv, checked (examples/example_support.hpp)

  seed(opt.seed);
  Device dev = pick_device(opt.device);

  // Fixed-seed 80/20 split (the global generator, seeded above).
  auto [train, test] = data::splitobs({data.pixels, data.labels}, {.at = 0.8});
  auto [Xtrain, ytrain] = train;
  Tensor Ytrain = onehot(ytrain, kClasses);
  Tensor Xtest = to(test[0], dev), ytest = to(test[1], dev);
  const int64_t ntrain = Xtrain.shape()[0];

  std::printf("digits: %lld images from %s, %lld train / %lld test\n", (long long)data.n, data.path.c_str(),
              (long long)ntrain, (long long)(data.n - ntrain));
  std::printf("device %s (%s): %s\n", to_string(dev).c_str(), dev.name().c_str(),
              device_reason(opt.device, dev).c_str());

  auto model = examples::digits_mlp() | dev;
  std::cout << model << "\n";

  DataLoader loader({Xtrain, Ytrain}, {.batchsize = opt.batchsize, .shuffle = true});
  auto opt_state = optimisers::setup(optimisers::Adam(opt.lr), model);

  std::vector<int64_t> truth = ytest.to_vector<int64_t>();
  auto test_accuracy = [&](int64_t* correct_out) {
    std::vector<int64_t> pred = onecold(model(Xtest)).to_vector<int64_t>();
    int64_t correct = 0;
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
    if (correct_out) *correct_out = correct;
    return double(correct) / double(pred.size());
  };
  std::vector<EpochRecord> history;

  ProgressBar progress(opt.epochs, loader.size());
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x0, y0] : loader) {
      Tensor x = to(x0, dev), y = to(y0, dev);
      auto [loss, grads] = withgradient([&](auto& m) { return logitcrossentropy(m(x), y); }, model);
      optimisers::update(opt_state, model, grads);
      epoch_loss += loss.item<float>();
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches));
    }
    if (!opt.plot.empty()) history.push_back({epoch, epoch_loss / double(batches), test_accuracy(nullptr)});
  }

  int64_t correct = 0;
  double accuracy = test_accuracy(&correct);
  std::printf("%lld of %lld test images right after %d epochs, %.1fs\n", (long long)correct,
              (long long)truth.size(), opt.epochs, progress.elapsed());
  std::printf("test accuracy: %.4f\n", accuracy);
  if (!opt.plot.empty()) write_plot(opt.plot, history);

  if (opt.min_accuracy >= 0 && accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "digits_mlp: test accuracy %.4f is below --min-accuracy %.4f\n", accuracy,
                 opt.min_accuracy);
    return kExitAccuracy;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  return run_main(
      "digits_mlp",
      [&] {
        opt = parse_args(argc, argv);
        return run(opt);
      },
      [&] { print_usage(stderr, argv[0]); });
}
