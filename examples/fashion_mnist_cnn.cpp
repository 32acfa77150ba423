// A small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist: 60,000 training and 10,000 test
// images, 28x28 grey, ten kinds of clothing), read from the idx files by flux::data::load_fashion_mnist:
//
//   Conv 3x3, 1 => 16, pad 1  -> BatchNorm(16, relu) -> MaxPool 2x2    (N, 16, 14, 14)
//   Conv 3x3, 16 => 32, pad 1 -> BatchNorm(32, relu) -> MaxPool 2x2    (N, 32, 7, 7)
//   flatten -> Dropout(0.25) -> Dense(1568 => 128, relu) -> Dense(128 => 10)
//
// trained with Adam on logit cross-entropy, a progress bar per epoch (batches, loss, steps/s), scored
// on the test set (BatchNorm's running statistics, no dropout), then saved with save(path, model).
//
// Usage: fashion_mnist_cnn [options] [folder with the idx files]
//   --epochs N            training epochs (default 5)
//   --device NAME[:i]     e.g. CPU, OpenCL:0, CUDA:1 (default: get_device(), the best available)
//   --train-limit N       train on the first N training images only (default: all 60,000)
//   --test-limit N        score the first N test images only (default: all 10,000)
//   --min-accuracy A      exit with status 1 when the test accuracy is below A (for CI)
//   --save PATH           where the trained model goes (default fashion_mnist_cnn.safetensors;
//                         "" skips saving)
//   --seed N, --lr X, --batchsize N   (defaults 42, 2e-3, 128)
// Exit status: see examples/example_support.hpp (3: the data set is missing, 5: the device is not
// available).
#include <cstdio>
#include <optional>
#include <filesystem>
#include <iostream>

#include "example_models.hpp"
#include "example_support.hpp"

using namespace flux;
using namespace examples;

namespace {

struct Options {
  int epochs = 5;
  double min_accuracy = -1;
  std::string device;
  int64_t train_limit = 0;  // 0: all
  int64_t test_limit = 0;
  std::string save_path = "fashion_mnist_cnn.safetensors";
  uint64_t seed = 42;
  double lr = 2e-3;
  int64_t batchsize = 128;
  std::string folder = data::kFashionMnistFolder;
  std::optional<DType> autocast;  // --autocast bf16|f16: mixed-precision training (flux/autocast.hpp)
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--epochs N] [--device NAME[:i]] [--train-limit N] [--test-limit N] "
               "[--min-accuracy A] [--save PATH] [--seed N] [--lr X] [--batchsize N] [--autocast bf16|f16] [idx folder]\n",
               argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool folder_given = false;
  Args args(argc, argv);
  while (args.next()) {
    if (args.arg() == "-h" || args.arg() == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (args.is("--epochs")) {
      o.epochs = int(args.integer(1, 100000));
    } else if (args.is("--train-limit")) {
      o.train_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--test-limit")) {
      o.test_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number();
    } else if (args.is("--device")) {
      o.device = args.value();
      if (o.device.empty()) throw UsageError("--device expects NAME or NAME:i, e.g. CPU or OpenCL:0");
    } else if (args.is("--save")) {
      o.save_path = args.value();
    } else if (args.is("--autocast")) {
      const std::string v = args.value();
      if (v == "bf16") o.autocast = BFloat16;
      else if (v == "f16") o.autocast = Float16;
      else throw UsageError("--autocast expects bf16 or f16; got '" + v + "'");
    } else if (args.is("--seed")) {
      o.seed = uint64_t(args.integer(0, 1LL << 62));
    } else if (args.is("--lr")) {
      o.lr = args.number();
      if (!(o.lr > 0)) throw UsageError("--lr must be positive");
    } else if (args.is("--batchsize")) {
      o.batchsize = args.integer(1, 1 << 20);
    } else if (args.is_flag()) {
      throw UsageError("unknown option '" + args.arg() + "'");
    } else if (!folder_given) {
      o.folder = args.arg();
      folder_given = true;
    } else {
      throw UsageError("more than one data folder given ('" + o.folder + "', '" + args.arg() + "')");
    }
  }
  return o;
}

data::FashionMnist load_data(const std::string& folder) {
  try {
    return data::load_fashion_mnist(folder);
  } catch (const Error& e) {
    throw DataError(e.what());
  }
}

int run(const Options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  data::FashionMnist fm = load_data(opt.folder);
  Tensor Xtrain = fm.train.images, ytrain = fm.train.labels, Xtest = fm.test.images, ytest = fm.test.labels;
  if (opt.train_limit > 0 && opt.train_limit < Xtrain.shape()[0]) {
    Xtrain = Xtrain.slice(0, opt.train_limit);
    ytrain = ytrain.slice(0, opt.train_limit);
  }
  if (opt.test_limit > 0 && opt.test_limit < Xtest.shape()[0]) {
    Xtest = Xtest.slice(0, opt.test_limit);
    ytest = ytest.slice(0, opt.test_limit);
  }
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  seed(opt.seed);
  Device dev = pick_device(opt.device);
  std::printf("fashion-mnist: %lld train / %lld test images (1x28x28) from %s in %.1fs, device %s\n",
              (long long)Xtrain.shape()[0], (long long)Xtest.shape()[0], fm.folder.c_str(), load_s,
              to_string(dev).c_str());

  auto model = examples::fashion_cnn() | dev;
  std::cout << model << "\n";
  std::cout.flush();

  auto loader = DataLoader({Xtrain, onehot(ytrain, 10)}, {.batchsize = opt.batchsize, .shuffle = true}) | dev;
  auto opt_state = optimisers::setup(optimisers::Adam(opt.lr), model);
  // --autocast f16 scales the loss (small gradients would underflow in f16) and skips steps that
  // overflow; bf16 has float32's range and needs no scaling (the scaler is then off: a no-op).
  optimisers::GradScaler scaler({.enabled = opt.autocast == Float16});

  ProgressBar progress(opt.epochs, loader.size());
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x, y] : loader) {
      const double scale = scaler.get_scale();
      auto [loss, grads] = withgradient([&](auto& m) { return scaler.scale(logitcrossentropy(m(x), y)); }, model,
                                        {.autocast = opt.autocast});
      scaler.step(opt_state, model, grads);
      scaler.update();
      epoch_loss += loss.item<double>() / scale;
      ++batches;
      progress.update(epoch, batches, epoch_loss / double(batches));
    }
  }
  double train_s = progress.elapsed();

  double acc = accuracy(model, Xtest, ytest, dev, 500);
  std::printf("test accuracy %.4f (%lld images) after %d epochs on %lld images, training %.1fs on %s\n", acc,
              (long long)Xtest.shape()[0], opt.epochs, (long long)Xtrain.shape()[0], train_s,
              to_string(dev).c_str());
  std::printf("test accuracy: %.4f\n", acc);

  if (!opt.save_path.empty()) {
    save(opt.save_path, model, {{"written_by", "flux-cpp examples/fashion_mnist_cnn"},
                                {"test_accuracy", std::to_string(acc)}});
    std::error_code ec;
    std::filesystem::path where = std::filesystem::absolute(opt.save_path, ec);
    std::printf("saved the model (%zu tensors, %lld parameters) to %s\n", pytorch_state(model).size(),
                (long long)parameter_count(model), (ec ? opt.save_path : where.string()).c_str());
  }

  if (opt.min_accuracy >= 0 && acc < opt.min_accuracy) {
    std::fprintf(stderr, "fashion_mnist_cnn: test accuracy %.4f is below --min-accuracy %.4f\n", acc,
                 opt.min_accuracy);
    return kExitAccuracy;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("fashion_mnist_cnn", [&] { return run(parse_args(argc, argv)); },
                  [&] { print_usage(stderr, argv[0]); });
}
