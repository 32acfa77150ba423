// Flux model-zoo's vae_mnist (a variational autoencoder, Kingma & Welling) in flux-cpp, in the shape
// of the Julia program: an Encoder layer returning (μ, logσ), a Decoder Chain with `tanh` by its
// plain name (beside <cmath>), the reparametrisation with randn_like, Flux's model_loss (KL term,
// logitbinarycrossentropy with agg = sum, an L2 penalty on the decoder), Adam and train().
// It reads Fashion-MNIST (MNIST digits are not packaged in Debian) from dataset-fashion-mnist.
//
// Usage: zoo_vae_mnist [--device OpenCL:0] [--epochs N] [--eta X] [--train-limit N] [--max-loss L] [idx folder]
// Prints the mean loss (the negative ELBO per image, in nats, plus the penalty) of every epoch;
// exit status 1 when the last epoch's mean loss is above --max-loss, 3 data missing, 5 no such device.
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include <flux/flux.hpp>

#include "mnist_models.hpp"

using namespace flux;

struct Args {
  double eta = 1e-3;          // learning rate
  double lambda = 0.01;       // regularisation parameter
  int64_t batch_size = 128;
  int epochs = 20;
  uint64_t seed = 42;
  int64_t input_dim = 28 * 28;
  int64_t latent_dim = 2;
  int64_t hidden_dim = 500;
  std::string device;
  int64_t train_limit = 0;    // 0 = all 60,000
  double max_loss = -1;
  std::string folder = data::kFashionMnistFolder;
};

// μ, logσ and the decoder's logits for z = μ + ε exp(logσ), ε ~ N(0, 1).
std::tuple<Tensor, Tensor, Tensor> reconstruct(const zoo::VAE& m, const Tensor& x) {
  auto [mu, logsigma] = m.encoder(x);
  Tensor z = mu + randn_like(logsigma) * exp(logsigma);
  return {mu, logsigma, m.decoder(z)};
}

Tensor model_loss(const zoo::VAE& m, double lambda, const Tensor& x) {
  auto [mu, logsigma, decoder_z] = reconstruct(m, x);
  double len = double(x.size(0));
  // KL-divergence
  Tensor kl_q_p = 0.5 * sum(exp(2.0 * logsigma) + square(mu) - 1.0 - 2.0 * logsigma) / len;
  Tensor logp_x_z = -logitbinarycrossentropy(decoder_z, x, {.agg = Agg::sum}) / len;
  // regularisation
  Tensor reg = zeros({}, DType::f32, x.device());
  for (const Tensor& p : params(m.decoder)) reg = reg + sum(square(p));
  return -logp_x_z + kl_q_p + lambda * reg;
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
    else if (a == "--max-loss") args.max_loss = std::atof(value().c_str());
    else if (a.rfind("--", 0) != 0) args.folder = a;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  try {
    seed(args.seed);
    Device device;
    try {
      device = args.device.empty() ? get_device() : get_device(args.device);
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
    Tensor x = fm.train.images;
    if (args.train_limit > 0) x = slice(x, 0, 0, std::min(args.train_limit, x.size(0)));
    x = flatten(x);  // (N, 784) in [0, 1]
    auto loader = DataLoader({x}, {.batchsize = args.batch_size, .shuffle = true}) | device;

    zoo::VAE model{zoo::Encoder(args.input_dim, args.latent_dim, args.hidden_dim),
                   zoo::Decoder(args.input_dim, args.latent_dim, args.hidden_dim)};
    model = model | device;
    std::cout << model.encoder << "\n" << model.decoder << "\n";
    auto opt_state = optimisers::setup(optimisers::Adam({.eta = args.eta}), model);
    TrainResult r = train([&](const zoo::VAE& m, const Tensor& xb) { return model_loss(m, args.lambda, xb); }, model,
                          loader, opt_state, {.epochs = args.epochs});
    for (size_t e = 0; e < r.epoch_loss.size(); ++e) std::printf("Epoch %zu: mean loss %.2f\n", e + 1, r.epoch_loss[e]);
    // A few decoded samples of the latent space, as the zoo's image grid: the range of their pixels.
    Tensor z = to(randn({10, args.latent_dim}), device);
    Tensor samples = sigmoid(model.decoder(z));
    std::printf("decoded samples: (%lld, %lld), pixels in [%.3f, %.3f]\n", (long long)samples.size(0),
                (long long)samples.size(1), min(samples).item<double>(), max(samples).item<double>());
    if (args.max_loss >= 0 && !(r.epoch_loss.back() <= args.max_loss)) {
      std::printf("last epoch's mean loss %.2f is above --max-loss %.2f\n", r.epoch_loss.back(), args.max_loss);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 4;
  }
}
