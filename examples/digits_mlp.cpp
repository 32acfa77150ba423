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
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <flux/flux.hpp>
using namespace flux;

#ifndef FLUX_SOURCE_DIR
#define FLUX_SOURCE_DIR "."
#endif

namespace {

constexpr int kPixels = 64;
constexpr int kClasses = 10;
constexpr int kExitAccuracy = 1, kExitUsage = 2, kExitData = 3, kExitFailure = 4, kExitNoDevice = 5;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

long long parse_int(const std::string& flag, const std::string& s, long long lo, long long hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < lo || v > hi)
    throw UsageError(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + s + "'");
  return v;
}

double parse_double(const std::string& flag, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) throw UsageError(flag + " expects a number, got '" + s + "'");
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      // "--flag value" or "--flag=value"
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) return a.substr(flag.size() + 1);
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      return argv[++i];
    };
    auto is = [&](const std::string& flag) { return a == flag || a.rfind(flag + "=", 0) == 0; };
    if (a == "-h" || a == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (is("--epochs")) {
      o.epochs = int(parse_int("--epochs", value("--epochs"), 1, 100000));
    } else if (is("--min-accuracy")) {
      o.min_accuracy = parse_double("--min-accuracy", value("--min-accuracy"));
    } else if (is("--device")) {
      o.device = value("--device");
      if (o.device.empty()) throw UsageError("--device expects NAME or NAME:i, e.g. CPU or OpenCL:0");
    } else if (is("--seed")) {
      o.seed = uint64_t(parse_int("--seed", value("--seed"), 0, (1LL << 62)));
    } else if (is("--lr")) {
      o.lr = parse_double("--lr", value("--lr"));
      if (!(o.lr > 0)) throw UsageError("--lr must be positive");
    } else if (is("--batchsize")) {
      o.batchsize = parse_int("--batchsize", value("--batchsize"), 1, 1 << 20);
    } else if (is("--plot")) {
      o.plot = value("--plot");
      if (o.plot.empty()) throw UsageError("--plot expects a path prefix, e.g. build-demo/digits_mlp");
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + a + "'");
    } else if (o.data_path.empty()) {
      o.data_path = a;
    } else {
      throw UsageError("more than one data path given ('" + o.data_path + "', '" + a + "')");
    }
  }
  return o;
}

Device named_device(const std::string& name, int index) {
  try {
    return get_device(name, index);
  } catch (const Error& e) {
    throw DeviceError(e.what());
  }
}

/// "CPU" -> get_device("CPU", 0); "OpenCL:1" -> get_device("OpenCL", 1); "" -> get_device().
Device pick_device(const std::string& spec) {
  if (spec.empty()) return get_device({.verbose = true});
  auto colon = spec.rfind(':');
  if (colon == std::string::npos) return named_device(spec, 0);
  std::string name = spec.substr(0, colon);
  if (name.empty()) throw UsageError("--device expects NAME or NAME:i, got '" + spec + "'");
  int index = int(parse_int("--device index", spec.substr(colon + 1), 0, 1 << 20));
  return named_device(name, index);
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

/// The data file: the path given, else data/digits.csv.gz of the source tree (compiled in), else
/// next to or above the executable (an installed or relocated build).
std::string find_data(const std::string& given) {
  namespace fs = std::filesystem;
  if (!given.empty()) return given;
  std::vector<fs::path> candidates = {fs::path(FLUX_SOURCE_DIR) / "data" / "digits.csv.gz"};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (fs::path p : {dir, dir.parent_path(), dir.parent_path().parent_path()}) {
      candidates.push_back(p / "data" / "digits.csv.gz");
      candidates.push_back(p / "share" / "flux" / "data" / "digits.csv.gz");
    }
  }
  for (const auto& c : candidates)
    if (fs::is_regular_file(c, ec)) return c.string();
  std::string msg = "digits.csv.gz not found; looked in:";
  for (const auto& c : candidates) msg += "\n  " + c.string();
  msg += "\npass the path as an argument";
  throw DataError(msg);
}

struct Digits {
  std::vector<float> pixels;   // n x 64, scaled to [0, 1]
  std::vector<int64_t> labels; // n, in 0..9
  int64_t n = 0;
};

/// Reads the whole (gzip-compressed or plain) file; zlib reads plain files unchanged.
std::string read_gz(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError("cannot open '" + path + "': no such file");
  if (fs::is_directory(path, ec)) throw DataError("cannot open '" + path + "': is a directory");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw DataError("cannot open '" + path + "'");
  std::string text;
  char buf[1 << 16];
  for (;;) {
    int got = gzread(f, buf, sizeof buf);
    if (got < 0) {
      int err = 0;
      std::string why = gzerror(f, &err);
      gzclose(f);
      throw DataError("'" + path + "' is corrupt (gzip: " + why + ")");
    }
    if (got == 0) break;
    text.append(buf, size_t(got));
  }
  int rc = gzclose(f);
  if (rc != Z_OK) throw DataError("'" + path + "' is corrupt (gzip stream truncated or bad checksum)");
  return text;
}

/// Parses rows of 64 integers in 0..16 followed by a label in 0..9, comma-separated, no header.
Digits parse_digits(const std::string& text, const std::string& path) {
  Digits d;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return DataError("'" + path + "' line " + std::to_string(line_no) + ": " + why +
                       " (expected 64 pixel values 0..16 and a label 0..9, comma-separated)");
    };
    int field = 0;
    size_t p = 0;
    while (true) {
      size_t q = line.find(',', p);
      std::string tok = line.substr(p, q == std::string::npos ? std::string::npos : q - p);
      while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
      while (!tok.empty() && tok.back() == ' ') tok.pop_back();
      // Values are whole numbers; accept "5" and "5.0".
      char* stop = nullptr;
      double v = tok.empty() ? 0 : std::strtod(tok.c_str(), &stop);
      if (tok.empty() || stop != tok.c_str() + tok.size() || v != double(int64_t(v)))
        throw bad("field " + std::to_string(field + 1) + " is '" + tok + "', not a whole number");
      if (field < kPixels) {
        if (v < 0 || v > 16) throw bad("pixel " + std::to_string(field + 1) + " = " + tok + " is outside 0..16");
        d.pixels.push_back(float(v / 16.0));
      } else if (field == kPixels) {
        if (v < 0 || v >= kClasses) throw bad("label " + tok + " is outside 0..9");
        d.labels.push_back(int64_t(v));
      } else {
        throw bad("more than 65 fields");
      }
      ++field;
      if (q == std::string::npos) break;
      p = q + 1;
    }
    if (field != kPixels + 1) throw bad(std::to_string(field) + " fields");
    ++d.n;
  }
  if (d.n == 0) throw DataError("'" + path + "' holds no rows");
  if (d.n < 10) throw DataError("'" + path + "' holds only " + std::to_string(d.n) + " rows, too few to split");
  return d;
}

/// Rows `idx` of the data set as (X: n x 64 Float32, labels: n Int64).
std::pair<Tensor, Tensor> subset(const Digits& d, const std::vector<int64_t>& idx) {
  std::vector<float> x;
  std::vector<int64_t> y;
  x.reserve(idx.size() * kPixels);
  y.reserve(idx.size());
  for (int64_t i : idx) {
    x.insert(x.end(), d.pixels.begin() + i * kPixels, d.pixels.begin() + (i + 1) * kPixels);
    y.push_back(d.labels[size_t(i)]);
  }
  int64_t n = int64_t(idx.size());
  return {Tensor(x, Shape{n, kPixels}), Tensor(y, Shape{n})};
}

/// One line per epoch; on a terminal it is redrawn in place as the batches go by.
class ProgressBar {
 public:
  ProgressBar(int epochs, int64_t batches)
      : epochs_(epochs), batches_(batches), tty_(isatty(fileno(stdout)) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void update(int epoch, int64_t batch, double loss, bool done) {
    if (!tty_ && !done) return;
    constexpr int width = 30;
    int filled = int(width * batch / batches_);
    std::string bar(size_t(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    int ew = int(std::to_string(epochs_).size());
    std::printf("\repoch %*d/%d [%s] %*lld/%lld  loss %.4f  %.1fs%s", ew, epoch, epochs_, bar.c_str(),
                int(std::to_string(batches_).size()), (long long)batch, (long long)batches_, loss, elapsed(),
                done ? "\n" : "");
    std::fflush(stdout);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  int epochs_;
  int64_t batches_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

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
  std::string path = find_data(opt.data_path);
  Digits data = parse_digits(read_gz(path), path);

  seed(opt.seed);
  Device dev = pick_device(opt.device);

  // Fixed-seed 80/20 split.
  std::vector<int64_t> perm = randperm(data.n);
  int64_t ntrain = data.n * 8 / 10;
  std::vector<int64_t> train_idx(perm.begin(), perm.begin() + ntrain), test_idx(perm.begin() + ntrain, perm.end());
  auto [Xtrain, ytrain] = subset(data, train_idx);
  auto [Xtest0, ytest0] = subset(data, test_idx);
  Tensor Ytrain = onehot(ytrain, kClasses);
  Tensor Xtest = to(Xtest0, dev), ytest = to(ytest0, dev);

  std::printf("digits: %lld images from %s, %lld train / %lld test\n", (long long)data.n, path.c_str(),
              (long long)ntrain, (long long)(data.n - ntrain));
  std::printf("device %s (%s): %s\n", to_string(dev).c_str(), dev.name().c_str(),
              device_reason(opt.device, dev).c_str());

  auto model = Chain(Dense(kPixels, 128, relu), Dense(128, 64, relu), Dense(64, kClasses)) | dev;
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
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x0, y0] : loader) {
      Tensor x = to(x0, dev), y = to(y0, dev);
      auto [loss, grads] = withgradient([&](auto& m) { return logitcrossentropy(m(x), y); }, model);
      optimisers::update(opt_state, model, grads);
      epoch_loss += loss.item<float>();
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches), batches == loader.size());
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
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "digits_mlp: %s\n", e.what());
    print_usage(stderr, argv[0]);
    return kExitUsage;
  } catch (const DataError& e) {
    std::fprintf(stderr, "digits_mlp: data error: %s\n", e.what());
    return kExitData;
  } catch (const DeviceError& e) {
    std::fprintf(stderr, "digits_mlp: device not available: %s\n", e.what());
    return kExitNoDevice;
  } catch (const Error& e) {
    std::fprintf(stderr, "digits_mlp: %s\n", e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "digits_mlp: unexpected error: %s\n", e.what());
    return kExitFailure;
  }
}
