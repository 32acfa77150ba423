// Flux model-zoo's dcgan_mnist (Radford et al.'s DCGAN) in flux-cpp, in the shape of the Julia
// program: Generator and Discriminator Chains (the discriminator's Dense sized by autosize), the
// losses with a number as the target (logitbinarycrossentropy(output, 1)), two Adam states, and the
// zoo's train_discriminator! / train_generator! steps. Images are scaled to [-1, 1]. It reads
// Fashion-MNIST (MNIST digits are not packaged in Debian) from dataset-fashion-mnist.
//
// Usage: zoo_dcgan_mnist [--device OpenCL:0] [--epochs N] [--train-limit N] [--batch-size N]
//                        [--max-dscr-loss L] [idx folder]
// Prints both losses every --verbose-freq steps and at the end. Exit status 1 when the
// discriminator's mean loss over the last epoch is above --max-dscr-loss (it starts at 2 log 2 =
// 1.386: a discriminator that learns goes below) or a loss is not finite; 3 data missing, 5 no device.
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <flux/flux.hpp>

#include "mnist_models.hpp"

using namespace flux;

struct HyperParams {
  int64_t batch_size = 128;
  int64_t latent_dim = 100;
  int epochs = 20;
  int64_t verbose_freq = 1000;
  double lr_dscr = 0.0002;
  double lr_gen = 0.0002;
  std::string device;
  int64_t train_limit = 0;  // 0 = all 60,000
  double max_dscr_loss = -1;
  std::string folder = data::kFashionMnistFolder;
};

Tensor discriminator_loss(const Tensor& real_output, const Tensor& fake_output) {
  return logitbinarycrossentropy(real_output, 1) + logitbinarycrossentropy(fake_output, 0);
}
Tensor generator_loss(const Tensor& fake_output) { return logitbinarycrossentropy(fake_output, 1); }

template <class D, class G>
double train_discriminator(D& dscr, const G& gen, optimisers::State& opt_dscr, const Tensor& real_img, const Tensor& noise) {
  Tensor fake_img = gen(noise);  // outside the gradient: the generator is not trained here
  auto [loss, grads] = withgradient([&](auto& d) { return discriminator_loss(d(real_img), d(fake_img)); }, dscr);
  optimisers::update(opt_dscr, dscr, grads);
  return item<double>(loss);
}

template <class D, class G>
double train_generator(const D& dscr, G& gen, optimisers::State& opt_gen, const Tensor& noise) {
  auto [loss, grads] = withgradient([&](auto& g) { return generator_loss(dscr(g(noise))); }, gen);
  optimisers::update(opt_gen, gen, grads);
  return item<double>(loss);
}

int main(int argc, char** argv) {
  HyperParams hparams;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--device") hparams.device = value();
    else if (a == "--epochs") hparams.epochs = std::atoi(value().c_str());
    else if (a == "--train-limit") hparams.train_limit = std::atoll(value().c_str());
    else if (a == "--batch-size") hparams.batch_size = std::atoll(value().c_str());
    else if (a == "--verbose-freq") hparams.verbose_freq = std::atoll(value().c_str());
    else if (a == "--max-dscr-loss") hparams.max_dscr_loss = std::atof(value().c_str());
    else if (a.rfind("--", 0) != 0) hparams.folder = a;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  try {
    seed(1);
    Device device;
    try {
      device = hparams.device.empty() ? get_device() : get_device(hparams.device);
    } catch (const Error& e) {
      std::fprintf(stderr, "device error: %s\n", e.what());
      return 5;
    }
    data::FashionMnist fm;
    try {
      fm = data::load_fashion_mnist(hparams.folder);
    } catch (const Error& e) {
      std::fprintf(stderr, "data error: %s\n", e.what());
      return 3;
    }
    Tensor images = fm.train.images;
    if (hparams.train_limit > 0) images = slice(images, 0, 0, std::min(hparams.train_limit, images.size(0)));
    images = 2.0 * images - 1.0;  // [-1, 1], the range of the generator's tanh
    auto dataloader = DataLoader({images}, {.batchsize = hparams.batch_size, .shuffle = true}) | device;

    auto dscr = zoo::Discriminator() | device;
    auto gen = zoo::Generator(hparams.latent_dim) | device;
    std::cout << dscr << "\n" << gen << "\n";
    auto opt_dscr = optimisers::setup(optimisers::Adam({.eta = hparams.lr_dscr}), dscr);
    auto opt_gen = optimisers::setup(optimisers::Adam({.eta = hparams.lr_gen}), gen);

    int64_t train_steps = 0;
    double epoch_dscr = 0, epoch_gen = 0;
    for (int ep = 1; ep <= hparams.epochs; ++ep) {
      std::printf("Epoch %d\n", ep);
      epoch_dscr = epoch_gen = 0;
      int64_t batches = 0;
      for (auto [x] : dataloader) {
        Tensor noise = randn_like(zeros({x.size(0), hparams.latent_dim}, DType::f32, device));
        double loss_dscr = train_discriminator(dscr, gen, opt_dscr, x, noise);
        double loss_gen = train_generator(dscr, gen, opt_gen, noise);
        if (!std::isfinite(loss_dscr) || !std::isfinite(loss_gen)) {
          std::printf("a loss is not finite at step %lld\n", (long long)train_steps);
          return 1;
        }
        epoch_dscr += loss_dscr, epoch_gen += loss_gen, ++batches;
        if (train_steps % hparams.verbose_freq == 0)
          std::printf("Train step %lld, Discriminator loss = %.4f, Generator loss = %.4f\n", (long long)train_steps,
                      loss_dscr, loss_gen);
        ++train_steps;
      }
      epoch_dscr /= double(batches), epoch_gen /= double(batches);
      std::printf("Epoch %d: mean discriminator loss %.4f, mean generator loss %.4f\n", ep, epoch_dscr, epoch_gen);
    }
    // The zoo saves a grid of generated images; here, their shape and range.
    testmode(gen);
    Tensor fake = gen(to(randn({36, hparams.latent_dim}), device));
    std::printf("generated (%lld, %lld, %lld, %lld) images in [%.3f, %.3f]\n", (long long)fake.size(0),
                (long long)fake.size(1), (long long)fake.size(2), (long long)fake.size(3), min(fake).item<double>(),
                max(fake).item<double>());
    if (hparams.max_dscr_loss >= 0 && !(epoch_dscr <= hparams.max_dscr_loss)) {
      std::printf("the discriminator's mean loss %.4f is above --max-dscr-loss %.4f\n", epoch_dscr, hparams.max_dscr_loss);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 4;
  }
}
