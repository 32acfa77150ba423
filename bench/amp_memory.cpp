// Memory of ResNet-18 training in float32 against autocast (issue 36): one process per precision, so
// that neither inherits the other's allocator state. bench/amp_memory.sh runs each a few times.
//
//   FLUX_NUM_THREADS=1 flux_amp_memory f32|bf16|f16 [--batch N] [--size S] [--steps K] [--native]
//
// Trains models::ResNet18 (1000 classes) on an N x 3 x S x S batch for K Adam steps, under
// withgradient(..., {.autocast = low}) for bf16/f16 with autocast emulation on (the CPU computes in the
// low dtype without bf16 units: storage in bf16/f16, arithmetic through float32, so the tape keeps
// what it keeps on a CPU with units; --native leaves emulation as FLUX_AUTOCAST_EMULATE says). Prints:
//   tape_mb          bytes of tensor storage alive at the end of the last step's forward beyond what was
//                    alive before it (the tape's saved activations, the weights' low casts, the loss)
//   forward_peak_mb, backward_peak_mb
//                    the most tensor storage alive at once in the forward passes, and in the backward
//                    passes with the optimiser's updates (src/storage_stats.hpp); storage_peak_mb both
//   pool_reserved_mb the CPU pool's live plus cached blocks at the end (Device().memory().reserved)
//   peak_rss_mb      the process's peak resident set (getrusage ru_maxrss): the storage, the pool's
//                    cached blocks of other sizes, glibc's free lists, the code and its libraries
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <flux/autocast.hpp>
#include <flux/flux.hpp>
#include <flux/models/resnet.hpp>

#include "bench_common.hpp"
#include "src/storage_stats.hpp"

using namespace flux;

namespace {
double mb(double bytes) { return bytes / (1024.0 * 1024.0); }
[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: flux_amp_memory f32|bf16|f16 [--batch N] [--size S] [--steps K] [--native]\n");
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  const std::string which = argv[1];
  std::optional<DType> low;
  if (which == "bf16") low = DType::bf16;
  else if (which == "f16") low = DType::f16;
  else if (which != "f32") usage();
  int64_t batch = 32, size = 112;
  int steps = 2;
  bool native = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--native") native = true;
    else if (i + 1 < argc && a == "--batch") batch = std::atoll(argv[++i]);
    else if (i + 1 < argc && a == "--size") size = std::atoll(argv[++i]);
    else if (i + 1 < argc && a == "--steps") steps = std::atoi(argv[++i]);
    else usage();
  }
  if (batch < 1 || size < 32 || steps < 1) usage();
  if (low && !native) set_autocast_emulation(true);

  auto model = models::ResNet18();
  Tensor x = rand({batch, 3, size, size});
  std::vector<float> targets(size_t(batch * 1000), 0.f);
  for (int64_t i = 0; i < batch; ++i) targets[size_t(i * 1000 + (i * 7) % 1000)] = 1.f;
  Tensor y(targets, Shape{batch, 1000});
  auto opt = optimisers::setup(optimisers::Adam(1e-3), model);
  std::printf("precision %s\nbatch %lld\nsize %lld\nsteps %d\nsetup_rss_mb %.1f\nsetup_storage_mb %.1f\n", which.c_str(),
              (long long)batch, (long long)size, steps, bench::peak_rss_mb(), mb(double(detail::live_storage_bytes())));
  detail::reset_peak_storage_bytes();

  double tape = 0, loss = 0, forward_peak = 0, backward_peak = 0;
  for (int s = 0; s < steps; ++s) {
    size_t before = 0;
    auto f = [&](auto& m) {
      Tensor l = logitcrossentropy(m(x), y);
      tape = double(detail::live_storage_bytes() - before);
      forward_peak = std::max(forward_peak, double(detail::peak_storage_bytes()));
      detail::reset_peak_storage_bytes();
      return l;
    };
    before = detail::live_storage_bytes();
    detail::reset_peak_storage_bytes();
    auto [l, grads] = withgradient(f, model, GradientOptions{.autocast = low});
    optimisers::update(opt, model, grads);
    backward_peak = std::max(backward_peak, double(detail::peak_storage_bytes()));
    loss = l.item<double>();
  }
  // The peaks: of the forward passes (to the loss), and of the backward passes with the updates.
  std::printf("loss %.6g\ntape_mb %.1f\nforward_peak_mb %.1f\nbackward_peak_mb %.1f\nstorage_peak_mb %.1f\n"
              "pool_reserved_mb %.1f\npeak_rss_mb %.1f\n",
              loss, mb(tape), mb(forward_peak), mb(backward_peak), mb(std::max(forward_peak, backward_peak)),
              mb(double(Device().memory().reserved)), bench::peak_rss_mb());
  return 0;
}
