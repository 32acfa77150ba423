// What the CNN examples share: command-line flags, --device parsing, exit codes, a per-epoch progress
// bar (batches, loss, steps/s), accuracy in batches, and the digits data set (data/digits.csv.gz).
// Header-only; each example includes it once.
//
// Exit status of every example: 0 ok, 1 accuracy below --min-accuracy, 2 bad command line, 3 missing
// or corrupt data, 4 a flux::Error or other failure, 5 the --device is not available (ctest: skipped).
#pragma once
#include <unistd.h>
#include <zlib.h>

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

inline Device named_device(const std::string& name, int index) {
  try {
    return get_device(name, index);
  } catch (const Error& e) {
    throw DeviceError(e.what());
  }
}

/// "CPU" -> get_device("CPU", 0); "OpenCL:1" -> get_device("OpenCL", 1); "" -> get_device().
inline Device pick_device(const std::string& spec) {
  if (spec.empty()) return get_device({.verbose = true});
  auto colon = spec.rfind(':');
  if (colon == std::string::npos) return named_device(spec, 0);
  std::string name = spec.substr(0, colon);
  if (name.empty()) throw UsageError("--device expects NAME or NAME:i, got '" + spec + "'");
  int index = int(parse_int("--device index", spec.substr(colon + 1), 0, 1 << 20));
  return named_device(name, index);
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
  std::vector<float> pixels;    // n x 64, scaled to [0, 1]
  std::vector<int64_t> labels;  // n, in 0..9
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

/// The whole (gzip-compressed or plain) text file.
inline std::string read_gz_text(const std::string& path) {
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
  if (gzclose(f) != Z_OK) throw DataError("'" + path + "' is corrupt (gzip stream truncated or bad checksum)");
  return text;
}

/// Reads and checks the digits file (64 pixel values 0..16 and a label 0..9 per row).
inline Digits load_digits(const std::string& given_path) {
  Digits d;
  d.path = find_digits(given_path);
  const std::string text = read_gz_text(d.path);
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
      return DataError("'" + d.path + "' line " + std::to_string(line_no) + ": " + why +
                       " (expected 64 pixel values 0..16 and a label 0..9, comma-separated)");
    };
    int field = 0;
    size_t p = 0;
    while (true) {
      size_t q = line.find(',', p);
      std::string tok = line.substr(p, q == std::string::npos ? std::string::npos : q - p);
      while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
      while (!tok.empty() && tok.back() == ' ') tok.pop_back();
      char* stop = nullptr;
      double v = tok.empty() ? 0 : std::strtod(tok.c_str(), &stop);
      if (tok.empty() || stop != tok.c_str() + tok.size() || v != double(int64_t(v)))
        throw bad("field " + std::to_string(field + 1) + " is '" + tok + "', not a whole number");
      if (field < 64) {
        if (v < 0 || v > 16) throw bad("pixel " + std::to_string(field + 1) + " = " + tok + " is outside 0..16");
        d.pixels.push_back(float(v / 16.0));
      } else if (field == 64) {
        if (v < 0 || v >= 10) throw bad("label " + tok + " is outside 0..9");
        d.labels.push_back(int64_t(v));
      } else {
        throw bad("more than 65 fields");
      }
      ++field;
      if (q == std::string::npos) break;
      p = q + 1;
    }
    if (field != 65) throw bad(std::to_string(field) + " fields");
    ++d.n;
  }
  if (d.n < 10) throw DataError("'" + d.path + "' holds only " + std::to_string(d.n) + " rows, too few to split");
  return d;
}

/// Rows `idx` of the digits as (X: n x 64 Float32, labels: n Int64).
inline std::pair<Tensor, Tensor> digits_subset(const Digits& d, const std::vector<int64_t>& idx) {
  std::vector<float> x;
  std::vector<int64_t> y;
  x.reserve(idx.size() * 64);
  for (int64_t i : idx) {
    x.insert(x.end(), d.pixels.begin() + i * 64, d.pixels.begin() + (i + 1) * 64);
    y.push_back(d.labels[size_t(i)]);
  }
  int64_t n = int64_t(idx.size());
  return {Tensor(x, Shape{n, 64}), Tensor(y, Shape{n})};
}

}  // namespace examples
