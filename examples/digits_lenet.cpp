// A LeNet-style convolutional network on scikit-learn's 8x8 digits (data/digits.csv.gz: 1,797
// images of 64 pixels in 0..16), the same seeded 80/20 split as digits_mlp. Images are (N, 1, 8, 8):
//
//   Conv 3x3, 1 => 16, pad 1  -> BatchNorm(16, relu) -> MaxPool 2x2    (N, 16, 4, 4)
//   Conv 3x3, 16 => 32, pad 1 -> BatchNorm(32, relu) -> MaxPool 2x2    (N, 32, 2, 2)
//   flatten -> Dense(128 => 64, relu) -> Dense(64 => 10)                 (N, 10) logits
//
// trained with Adam on logit cross-entropy; BatchNorm uses batch statistics inside withgradient()
// and its running statistics when the test set is scored (Flux's automatic mode).
//
// Usage: digits_lenet [options] [path/to/digits.csv.gz]
//   --epochs N            training epochs (default 15)
//   --device NAME[:i]     e.g. CPU, OpenCL:0, CUDA:1 (default: get_device(), the best available)
//   --min-accuracy A      exit with status 1 when the test accuracy is below A (for CI)
//   --seed N              seed for the split, the initial weights and the shuffling (default 42)
//   --lr X, --batchsize N Adam's learning rate (default 3e-3) and the batch size (default 32)
// Exit status: see examples/example_support.hpp (5: the device is not available).
#include <cstdio>
#include <iostream>

#include "example_models.hpp"
#include "example_support.hpp"

using namespace flux;
using namespace examples;

namespace {

struct Options {
  int epochs = 15;
  double min_accuracy = -1;  // < 0: no check
  std::string device;        // empty: get_device()
  uint64_t seed = 42;
  double lr = 3e-3;
  int64_t batchsize = 32;
  std::string data_path;
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--epochs N] [--device NAME[:i]] [--min-accuracy A] [--seed N] [--lr X] "
               "[--batchsize N] [path/to/digits.csv.gz]\n",
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

int run(const Options& opt) {
  Digits data = load_digits(opt.data_path);

  seed(opt.seed);
  Device dev = pick_device(opt.device);

  // The fixed-seed 80/20 split of digits_mlp (same seed, same splitobs call).
  auto [train, test] = data::splitobs({data.pixels, data.labels}, {.at = 0.8});
  const int64_t ntrain = train[0].shape()[0];
  Tensor Xtrain = train[0].reshape({ntrain, 1, 8, 8}), ytrain = train[1];
  Tensor Xtest = test[0].reshape({data.n - ntrain, 1, 8, 8}), ytest = test[1];
  Tensor Ytrain = onehot(ytrain, 10);

  std::printf("digits: %lld images (1x8x8) from %s, %lld train / %lld test, device %s\n", (long long)data.n,
              data.path.c_str(), (long long)ntrain, (long long)(data.n - ntrain), to_string(dev).c_str());

  auto model = examples::digits_lenet() | dev;
  std::cout << model << "\n";
  std::cout.flush();

  auto loader = DataLoader({Xtrain, Ytrain}, {.batchsize = opt.batchsize, .shuffle = true}) | dev;
  auto opt_state = optimisers::setup(optimisers::Adam(opt.lr), model);

  ProgressBar progress(opt.epochs, loader.size());
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] = withgradient([&](auto& m) { return logitcrossentropy(m(x), y); }, model);
      optimisers::update(opt_state, model, grads);
      epoch_loss += loss.item<float>();
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches));
    }
  }

  double acc = accuracy(model, Xtest, ytest, dev);
  std::printf("test accuracy %.4f (%lld images) after %d epochs, %.1fs on %s\n", acc, (long long)(data.n - ntrain),
              opt.epochs, progress.elapsed(), to_string(dev).c_str());
  std::printf("test accuracy: %.4f\n", acc);
  if (opt.min_accuracy >= 0 && acc < opt.min_accuracy) {
    std::fprintf(stderr, "digits_lenet: test accuracy %.4f is below --min-accuracy %.4f\n", acc, opt.min_accuracy);
    return kExitAccuracy;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("digits_lenet", [&] { return run(parse_args(argc, argv)); },
                  [&] { print_usage(stderr, argv[0]); });
}
