// Data-parallel training on Fashion-MNIST (Debian's dataset-fashion-mnist, 28x28 grey images):
//   mpirun --allow-run-as-root -np 2 build/bin/distributed_mnist --epochs 1
// Every rank holds the data, trains on its own shard of each batch (DataLoader .shard = comm) and
// averages gradients with the others during backward (distributed::withgradient); the model starts
// equal everywhere (distributed::broadcast). Rank 0 prints progress, scores the test set and saves
// the checkpoint. Without mpirun it is one process training on whole batches.
//
//   MLP (default, "wide"): flatten -> Dense(784 => 1024, relu) -> Dense(1024 => 1024, relu) -> Dense(1024 => 10)
//   CNN (--model cnn):     Conv 3x3 1=>16 pad 1, relu, MaxPool 2 -> Conv 3x3 16=>32 pad 1, relu, MaxPool 2
//                          -> flatten -> Dense(1568 => 128, relu) -> Dense(128 => 10)
//
// Usage: distributed_mnist [options] [folder with the idx files]
//   --epochs N          (default 2)          --batchsize N   per rank (default 64)
//   --device NAME[:i]   default CPU; "CUDA" or "OpenCL" alone picks device local_rank
//   --train-limit N, --test-limit N          use the first N images only
//   --model mlp|cnn     (default mlp)        --lr X (default 1e-3), --seed N (default 42)
//   --save PATH         checkpoint written by rank 0 (default distributed_mnist.safetensors; "" skips)
//   --min-accuracy A    exit status 1 when rank 0's test accuracy is below A
//   --steps N           stop after N steps and print the time per step (for measurements)
//   --no-overlap        reduce the gradients after backward instead of during it
//   --bucket-mb X       gradient bucket size in MiB (default 25)
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "example_models.hpp"
#include "example_support.hpp"

using namespace flux;
using namespace examples;

namespace {

struct Options {
  int epochs = 2;
  int64_t batchsize = 64;
  std::string device = "CPU";
  int64_t train_limit = 0, test_limit = 0;
  std::string model = "mlp";
  double lr = 1e-3;
  uint64_t seed = 42;
  std::string save_path = "distributed_mnist.safetensors";
  double min_accuracy = -1;
  int64_t steps = 0;
  bool overlap = true;
  double bucket_mb = 25;
  std::string folder = data::kFashionMnistFolder;
};

void print_usage(std::FILE* to, const char* argv0) {
  std::fprintf(to,
               "usage: %s [--epochs N] [--batchsize N] [--device NAME[:i]] [--train-limit N] [--test-limit N] "
               "[--model mlp|cnn] [--lr X] [--seed N] [--save PATH] [--min-accuracy A] [--steps N] "
               "[--no-overlap] [--bucket-mb X] [idx folder]\n",
               argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  Args args(argc, argv);
  bool folder_given = false;
  while (args.next()) {
    if (args.arg() == "-h" || args.arg() == "--help") {
      print_usage(stdout, argv[0]);
      std::exit(0);
    } else if (args.is("--epochs")) {
      o.epochs = int(args.integer(1, 100000));
    } else if (args.is("--batchsize")) {
      o.batchsize = args.integer(1, 1 << 20);
    } else if (args.is("--device")) {
      o.device = args.value();
    } else if (args.is("--train-limit")) {
      o.train_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--test-limit")) {
      o.test_limit = args.integer(1, 1LL << 40);
    } else if (args.is("--model")) {
      o.model = args.value();
      if (o.model != "mlp" && o.model != "cnn") throw UsageError("--model must be mlp or cnn, got '" + o.model + "'");
    } else if (args.is("--lr")) {
      o.lr = args.number();
    } else if (args.is("--seed")) {
      o.seed = uint64_t(args.integer(0, 1LL << 62));
    } else if (args.is("--save")) {
      o.save_path = args.value();
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number();
    } else if (args.is("--steps")) {
      o.steps = args.integer(1, 1LL << 40);
    } else if (args.arg() == "--no-overlap") {
      o.overlap = false;
    } else if (args.is("--bucket-mb")) {
      o.bucket_mb = args.number();
      if (!(o.bucket_mb > 0)) throw UsageError("--bucket-mb must be positive");
    } else if (args.is_flag()) {
      throw UsageError("unknown option '" + args.arg() + "'");
    } else if (!folder_given) {
      o.folder = args.arg();
      folder_given = true;
    } else {
      throw UsageError("more than one data folder given");
    }
  }
  return o;
}

// "CUDA" / "OpenCL" without an index: this rank's local device.
Device rank_device(const std::string& spec, const distributed::Communicator& comm) {
  if (spec.find(':') == std::string::npos && !parse_device(spec).is_cpu())
    return pick_device(spec + ":" + std::to_string(comm.local_rank()));
  return pick_device(spec);
}

template <class Model> int train(const Options& opt, const distributed::Communicator& comm, Model init,
                                 const Tensor& Xtrain, const Tensor& ytrain, const Tensor& Xtest, const Tensor& ytest) {
  const bool root = comm.rank() == 0;
  Device dev = rank_device(opt.device, comm);
  auto model = distributed::broadcast(comm, init | dev, 0);  // every rank starts from rank 0's model
  if (root) {
    std::cout << model << "\n";
    std::cout.flush();
  }
  auto loader = DataLoader({Xtrain, onehot(ytrain, 10)}, {.batchsize = opt.batchsize, .shuffle = true, .shard = comm}) | dev;
  auto opt_state = optimisers::setup(optimisers::Adam(opt.lr), model);
  distributed::GradientOptions gopt{.bucket_bytes = int64_t(opt.bucket_mb * (1 << 20)), .overlap = opt.overlap};

  ProgressBar progress(opt.epochs, loader.size());
  int64_t steps = 0;
  double wait_s = 0, backward_s = 0;
  int buckets = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int epoch = 1; epoch <= opt.epochs && !(opt.steps && steps >= opt.steps); ++epoch) {
    progress.start_epoch();
    double epoch_loss = 0;
    int64_t batches = 0;
    for (auto [x, y] : loader) {
      auto [loss, grads] =
          distributed::withgradient(comm, [&](auto& m) { return logitcrossentropy(m(x), y); }, model, gopt);
      optimisers::update(opt_state, model, grads);
      auto stats = distributed::last_gradient_stats();
      wait_s += stats.wait_seconds;
      backward_s += stats.backward_seconds;
      buckets = stats.buckets;
      epoch_loss += loss.template item<float>();
      ++batches;
      ++steps;
      if (root && !opt.steps) progress.update(epoch, batches, epoch_loss / double(batches));
      if (opt.steps && steps >= opt.steps) break;
    }
    // The epoch's mean loss over all ranks.
    Tensor mean = distributed::allreduce(comm, Tensor::scalar(epoch_loss / double(batches), DType::f64),
                                         distributed::ReduceOp::mean);
    if (root && !opt.steps) std::printf("epoch %d: mean loss over %d ranks %.4f\n", epoch, comm.size(), mean.item<double>());
  }
  double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root)
    std::printf("%d ranks, %s, %lld steps of %lld images per rank: %.2f ms/step (forward+backward %.2f, "
                "allreduce wait after backward %.2f, %d buckets, %s)\n",
                comm.size(), opt.model.c_str(), (long long)steps, (long long)opt.batchsize, 1e3 * train_s / double(steps),
                1e3 * backward_s / double(steps), 1e3 * wait_s / double(steps), buckets,
                opt.overlap ? "overlapped" : "after backward");
  if (opt.steps) return 0;

  int status = 0;
  if (root) {
    double acc = accuracy(model, Xtest, ytest, dev, 500);
    std::printf("test accuracy: %.4f (%lld images), training %.1fs on %d ranks\n", acc, (long long)Xtest.shape()[0],
                train_s, comm.size());
    if (!opt.save_path.empty()) {
      save(opt.save_path, model, {{"written_by", "flux-cpp examples/distributed_mnist"}});
      std::printf("saved the model to %s\n", opt.save_path.c_str());
    }
    if (opt.min_accuracy >= 0 && acc < opt.min_accuracy) {
      std::fprintf(stderr, "distributed_mnist: test accuracy %.4f is below --min-accuracy %.4f\n", acc, opt.min_accuracy);
      status = kExitAccuracy;
    }
  }
  distributed::barrier(comm);
  return status;
}

int run(const Options& opt) {
  auto comm = distributed::initialize();
  data::FashionMnist fm;
  try {
    fm = data::load_fashion_mnist(opt.folder);
  } catch (const Error& e) {
    throw DataError(e.what());
  }
  Tensor Xtrain = fm.train.images, ytrain = fm.train.labels, Xtest = fm.test.images, ytest = fm.test.labels;
  if (opt.train_limit > 0 && opt.train_limit < Xtrain.shape()[0]) {
    Xtrain = Xtrain.slice(0, opt.train_limit);
    ytrain = ytrain.slice(0, opt.train_limit);
  }
  if (opt.test_limit > 0 && opt.test_limit < Xtest.shape()[0]) {
    Xtest = Xtest.slice(0, opt.test_limit);
    ytest = ytest.slice(0, opt.test_limit);
  }
  if (comm.rank() == 0)
    std::printf("distributed_mnist: %d rank(s) (%s), %lld training images, batches of %lld per rank\n", comm.size(),
                comm.backend().c_str(), (long long)Xtrain.shape()[0], (long long)opt.batchsize);
  seed(opt.seed);
  if (opt.model == "cnn")
    return train(opt, comm, examples::distributed_cnn(), Xtrain, ytrain, Xtest, ytest);
  return train(opt, comm, examples::distributed_mlp(), Xtrain, ytrain, Xtest, ytest);
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("distributed_mnist", [&] { return run(parse_args(argc, argv)); },
                  [&] { print_usage(stderr, argv[0]); });
}
