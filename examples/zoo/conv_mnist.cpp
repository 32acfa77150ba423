// Flux model-zoo's conv_mnist (LeNet-5) in flux-cpp, in the shape of the Julia program: an Args
// struct of hyper-parameters, LeNet5() built with autosize (no hard-coded flatten width), Flux's
// loss and eval_loss_accuracy, train() per epoch with the Optimisers chain WeightDecay + Adam.
// MNIST digits are not packaged in Debian, so it reads Fashion-MNIST (the same 28x28x1 shape and ten
// classes) from Debian's dataset-fashion-mnist.
//
// Usage: zoo_conv_mnist [--device OpenCL:0] [--epochs N] [--eta X] [--train-limit N] [--test-limit N]
//                       [--min-accuracy A] [idx folder]
// Exit status: 0 ok, 1 test accuracy below --min-accuracy, 2 bad command line, 3 data set missing,
// 4 other error, 5 the device does not exist here.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <flux/flux.hpp>

#include "mnist_models.hpp"

using namespace flux;

struct Args {
  double eta = 3e-4;     // learning rate
  double lambda = 0;     // L2 regulariser
  int64_t batchsize = 128;
  int epochs = 10;
  uint64_t seed = 0;
  std::string device;    // "" = get_device()
  int64_t train_limit = 0, test_limit = 0;  // 0 = all
  double min_accuracy = -1;
  std::string folder = data::kFashionMnistFolder;
};

Tensor loss(const Tensor& yhat, const Tensor& y) { return logitcrossentropy(yhat, y); }

template <class Model, class Loader> std::pair<double, double> eval_loss_accuracy(Loader& loader, Model& model) {
  double l = 0, acc = 0, ntot = 0;
  for (auto [x, y] : loader) {
    Tensor yhat = model(x);
    double n = double(x.size(0));
    l += item<double>(loss(yhat, y)) * n;
    acc += item<double>(sum((onecold(yhat) == onecold(y)).f32()));
    ntot += n;
  }
  return {l / ntot, acc / ntot};
}

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--device") args.device = value();
    else if (a == "--epochs") args.epochs = std::atoi(value().c_str());
    else if (a == "--eta") args.eta = std::atof(value().c_str());
    else if (a == "--train-limit") args.train_limit = std::atoll(value().c_str());
    else if (a == "--test-limit") args.test_limit = std::atoll(value().c_str());
    else if (a == "--min-accuracy") args.min_accuracy = std::atof(value().c_str());
    else if (a.rfind("--", 0) != 0) args.folder = a;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  try {
    seed(args.seed);
    Device device;
    try {
      device = args.device.empty() ? get_device() : get_device(args.device);  // "OpenCL:0", "cpu", ...
    } catch (const Error& e) {
      std::fprintf(stderr, "device error: %s\n", e.what());
      return 5;
    }
    data::FashionMnist fm;
    try {
      fm = data::load_fashion_mnist(args.folder);
    } catch (const Error& e) {
      std::fprintf(stderr, "data error: %s\n", e.what());
      return 3;
    }
    auto rows = [](const Tensor& t, int64_t limit) { return limit > 0 ? slice(t, 0, 0, std::min(limit, t.size(0))) : t; };
    Tensor xtrain = rows(fm.train.images, args.train_limit), ytrain = onehot(rows(fm.train.labels, args.train_limit), 10);
    Tensor xtest = rows(fm.test.images, args.test_limit), ytest = onehot(rows(fm.test.labels, args.test_limit), 10);
    auto train_loader = DataLoader({xtrain, ytrain}, {.batchsize = args.batchsize, .shuffle = true}) | device;
    auto test_loader = DataLoader({xtest, ytest}, {.batchsize = args.batchsize}) | device;

    auto model = zoo::LeNet5() | device;
    std::cout << model << "\n";
    auto opt_state = optimisers::setup(optimisers::OptimiserChain(optimisers::WeightDecay({.lambda = args.lambda}),
                                                                  optimisers::Adam({.eta = args.eta})),
                                       model);
    auto report = [&](int epoch) {
      auto [train_loss, train_acc] = eval_loss_accuracy(train_loader, model);
      auto [test_loss, test_acc] = eval_loss_accuracy(test_loader, model);
      std::printf("Epoch: %d   Train: (loss = %.4f, acc = %.4f)   Test: (loss = %.4f, acc = %.4f)\n", epoch, train_loss,
                  train_acc, test_loss, test_acc);
      return test_acc;
    };
    report(0);
    double acc = 0;
    for (int epoch = 1; epoch <= args.epochs; ++epoch) {
      train([](auto& m, const Tensor& x, const Tensor& y) { return loss(m(x), y); }, model, train_loader, opt_state);
      acc = report(epoch);
    }
    if (args.min_accuracy >= 0 && acc < args.min_accuracy) {
      std::printf("test accuracy %.4f is below --min-accuracy %.4f\n", acc, args.min_accuracy);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 4;
  }
}
