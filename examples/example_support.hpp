// What the CNN examples share: command-line flags, --device parsing, exit codes, a per-epoch progress
// bar (batches, loss, steps/s), accuracy in batches, and the digits data set (data/digits.csv.gz).
// Header-only; each example includes it once.
//
// Exit status of every example: 0 ok, 1 accuracy below --min-accuracy, 2 bad command line, 3 missing
// or corrupt data, 4 a flux::Error or other failure, 5 the --device is not available (ctest: skipped).
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <flux/flux.hpp>

#ifndef FLUX_SOURCE_DIR
#define FLUX_SOURCE_DIR "."
#endif

namespace examples {

using namespace flux;

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

inline long long parse_int(const std::string& flag, const std::string& s, long long lo, long long hi) {
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

inline double parse_double(const std::string& flag, const std::string& s) {
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

/// Walks argv: `while (args.next()) { if (args.is("--epochs")) n = args.integer(1, 100); ... }`.
/// Flags take "--flag value" or "--flag=value".
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    return true;
  }
  const std::string& arg() const { return arg_; }
  bool is(const std::string& flag) const { return arg_ == flag || arg_.rfind(flag + "=", 0) == 0; }
  bool is_flag() const { return arg_.size() > 1 && arg_[0] == '-'; }
  std::string value() {
    auto eq = arg_.find('=');
    if (arg_.rfind("--", 0) == 0 && eq != std::string::npos) return arg_.substr(eq + 1);
    if (i_ + 1 >= argc_) throw UsageError(arg_ + " needs a value");
    return argv_[++i_];
  }
  long long integer(long long lo, long long hi) {
    std::string flag = name();
    return parse_int(flag, value(), lo, hi);
  }
  double number() {
    std::string flag = name();
    return parse_double(flag, value());
  }
  std::string name() const { return arg_.substr(0, arg_.find('=')); }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
};

/// "CPU" -> the CPU; "OpenCL:1" -> OpenCL device 1; "" -> get_device(), verbose. The spelling is
/// flux's parse_device (a bad one is a usage error, exit 2); a device that does not exist here is a
/// DeviceError (exit 5).
inline Device pick_device(const std::string& spec) {
  if (spec.empty()) return get_device({.verbose = true});
  Device parsed;
  try {
    parsed = parse_device(spec);
  } catch (const Error& e) {
    throw UsageError(std::string("--device: ") + e.what());
  }
  try {
    return get_device(parsed.backend(), parsed.index());
  } catch (const Error& e) {
    throw DeviceError(e.what());
  }
}

/// One line per epoch: "epoch 2/5 [=====>    ] 120/469  loss 0.4123  38.2 steps/s  12.5s". On a
/// terminal it is redrawn in place as the batches go by; in a log, each epoch prints at its end (and
/// at each quarter when it has 100 batches or more).
class ProgressBar {
 public:
  ProgressBar(int epochs, int64_t batches)
      : epochs_(epochs), batches_(batches), tty_(isatty(fileno(stdout)) != 0), start_(now()), epoch_start_(start_) {}

  void start_epoch() { epoch_start_ = now(); }
  void update(int epoch, int64_t batch, double loss) {
    const bool done = batch == batches_;
    const bool quarter = batches_ >= 100 && (batch * 4 / batches_) != ((batch - 1) * 4 / batches_);
    if (!tty_ && !done && !quarter) return;
    auto t = now();
    if (tty_ && !done && t - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = t;
    constexpr int width = 30;
    int filled = int(width * batch / batches_);
    std::string bar(size_t(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    double epoch_s = seconds(epoch_start_, t);
    int ew = int(std::to_string(epochs_).size());
    std::printf("%sepoch %*d/%d [%s] %*lld/%lld  loss %.4f  %.1f steps/s  %.1fs%s", tty_ ? "\r" : "", ew, epoch, epochs_, bar.c_str(),
                int(std::to_string(batches_).size()), (long long)batch, (long long)batches_, loss,
                epoch_s > 0 ? double(batch) / epoch_s : 0.0, seconds(start_, t), done || !tty_ ? "\n" : "");
    std::fflush(stdout);
  }
  double elapsed() const { return seconds(start_, now()); }

 private:
  using Clock = std::chrono::steady_clock;
  static Clock::time_point now() { return Clock::now(); }
  static double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  int epochs_;
  int64_t batches_;
  bool tty_;
  Clock::time_point start_, epoch_start_, last_draw_{};
};

/// Fraction of rows of X whose argmax of model(X) equals y (Int64), in batches of `batchsize`, outside
/// gradient() (so BatchNorm uses its running statistics and Dropout passes through).
template <class Model>
double accuracy(const Model& model, const Tensor& X, const Tensor& y, const Device& dev, int64_t batchsize = 1000) {
  int64_t correct = 0, n = X.shape()[0];
  for (int64_t start = 0; start < n; start += batchsize) {
    int64_t stop = std::min(n, start + batchsize);
    std::vector<int64_t> pred = onecold(model(to(X.slice(start, stop), dev))).template to_vector<int64_t>();
    std::vector<int64_t> truth = y.slice(start, stop).to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
  }
  return double(correct) / double(n);
}

/// Runs `body`, turning each kind of failure into its message on stderr and its exit status.
inline int run_main(const char* program, const std::function<int()>& body, const std::function<void()>& usage) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    usage();
    return kExitUsage;
  } catch (const DataError& e) {
    std::fprintf(stderr, "%s: data error: %s\n", program, e.what());
    return kExitData;
  } catch (const DeviceError& e) {
    std::fprintf(stderr, "%s: device not available: %s\n", program, e.what());
    return kExitNoDevice;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", program, e.what());
    return kExitFailure;
  }
}

// ---- the digits data set: 1,797 rows of 64 pixels 0..16 and a label, comma-separated, gzip ----

struct Digits {
  Tensor pixels;  // (n, 64) Float32, scaled to [0, 1]
  Tensor labels;  // (n,) Int64, in 0..9
  int64_t n = 0;
  std::string path;
};

/// The path given, else data/digits.csv.gz of the source tree (compiled in), else next to or above
/// the executable.
inline std::string find_digits(const std::string& given) {
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

/// Reads the digits file with data::read_csv (64 whole pixel values 0..16 and a label 0..9 per row)
/// and checks the ranges; a malformed file is a DataError naming the line and column.
inline Digits load_digits(const std::string& given_path) {
  Digits d;
  d.path = find_digits(given_path);
  Tensor table;
  try {
    table = data::read_csv(d.path, {.dtype = DType::i64});
  } catch (const Error& e) {
    throw DataError(e.what());
  }
  const auto bad = [&](const std::string& why) {
    return DataError("'" + d.path + "': " + why + " (expected 64 pixel values 0..16 and a label 0..9 per row)");
  };
  if (table.shape()[1] != 65) throw bad(std::to_string(table.shape()[1]) + " columns");
  d.n = table.shape()[0];
  if (d.n < 10) throw bad("only " + std::to_string(d.n) + " rows, too few to split");
  std::vector<int64_t> v = table.to_vector<int64_t>();
  for (int64_t i = 0; i < d.n; ++i)
    for (int64_t j = 0; j < 65; ++j) {
      const int64_t x = v[size_t(i * 65 + j)], hi = j < 64 ? 16 : 9;
      if (x < 0 || x > hi)
        throw bad("row " + std::to_string(i + 1) + (j < 64 ? ", pixel " + std::to_string(j + 1) : std::string(", label")) +
                  " = " + std::to_string(x) + " is outside 0.." + std::to_string(hi));
    }
  d.pixels = slice(table, 1, 0, 64).f32() / 16.0;
  d.labels = slice(table, 1, 64, 65).reshape({d.n});
  return d;
}

/// Rows `idx` of the digits as (X: n x 64 Float32, labels: n Int64).
inline std::pair<Tensor, Tensor> digits_subset(const Digits& d, const std::vector<int64_t>& idx) {
  return {data::take_obs(d.pixels, idx), data::take_obs(d.labels, idx)};
}

}  // namespace examples
