// Resuming a killed run (issue 49): a training run on one device is checkpointed mid-epoch, killed
// with SIGKILL a few steps later, and resumed in a new process written the natural way (seed once,
// build, load_checkpoint, train from opt_state.steps); its final parameters must equal an
// uninterrupted run's bit for bit. Shuffling, dropout (device stream) and Adam's state all take part.
//
//   resume_run <device>            the test: runs the three modes below as child processes
//   resume_run <device> full <out> / kill <ckpt> / resume <ckpt> <out>
// Exit 0: equal; 1: a difference or an error; 77: the device is not available (ctest: skipped).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "flux/flux.hpp"

extern char** environ;

namespace {
using namespace flux;

constexpr int64_t kCheckpointStep = 7;  // saved after this many steps: epoch 2, batch 3 of 5
constexpr int64_t kKillStep = 9;        // the process kills itself during this step (0-based)

Device device_named(const std::string& name) {
  if (name == "CPU") return Device();
  if (!functional(name)) return Device("none", -1);
  return Device(name, 0);
}

// The same program in every mode, as a user writes it: seed, model, data, optimiser, train.
struct Run {
  Device d;
  decltype(Chain(Dense(6, 16, relu), Dropout(0.3), Dense(16, 3))) model =
      Chain(Dense(6, 16, relu), Dropout(0.3), Dense(16, 3));
  DataLoader<2> loader;
  optimisers::State opt;
  explicit Run(const Device& dev) : d(dev), loader(make_data(dev), {.batchsize = 5, .shuffle = true}) {
    model = model | d;
    opt = optimisers::setup(optimisers::Adam(1e-2), model);
  }
  static std::array<Tensor, 2> make_data(const Device& dev) {
    Tensor x = randn({23, 6});
    Tensor y = randn({23, 3});
    return {to(x, dev), to(y, dev)};
  }
  void train_from(int64_t start, const std::function<void(const TrainEvent&)>& callback) {
    auto loss = [](auto& m, const Tensor& x, const Tensor& y) { return mse(m(x), y); };
    train(loss, model, loader, opt,
          {.epochs = 3, .progress = false, .callback = callback, .start_step = start});
  }
};

int child(const std::string& dev_name, const std::vector<std::string>& args) {
  const Device d = device_named(dev_name);
  seed(2024);
  Run run(d);
  const std::string& mode = args[0];
  if (mode == "full") {
    run.train_from(0, nullptr);
    save(args[1], run.model);
  } else if (mode == "kill") {
    run.train_from(0, [&](const TrainEvent& e) {
      if (e.step + 1 == kCheckpointStep) save_checkpoint(args[1], run.model, run.opt);
      if (e.step + 1 == kKillStep) raise(SIGKILL);  // mid-epoch, after the checkpoint
    });
    std::cerr << "resume_run: the kill mode was not killed\n";
    return 1;
  } else if (mode == "resume") {
    load_checkpoint(args[1], run.model, run.opt);
    if (run.opt.steps != kCheckpointStep) {
      std::cerr << "resume_run: the checkpoint's step is " << run.opt.steps << ", expected " << kCheckpointStep << "\n";
      return 1;
    }
    run.train_from(run.opt.steps, nullptr);
    save(args[2], run.model);
  }
  return 0;
}

// Runs this program with `args`; returns its wait status.
int spawn_self(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string self = "/proc/self/exe";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

bool exited_ok(int status, const char* what) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::cerr << "resume_run: the " << what << " run failed (wait status " << status << ")\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: resume_run <CPU|OpenCL|CUDA> [mode args]\n";
    return 1;
  }
  const std::string dev = argv[1];
  try {
    if (argc > 2) return child(dev, std::vector<std::string>(argv + 2, argv + argc));
    if (device_named(dev).backend() == "none") {
      std::cout << "SKIPPED: no functional " << dev << " backend\n";
      return 77;
    }
    const std::string dir = "resume-" + dev + "-" + std::to_string(getpid());
    const std::string full = dir + ".full.safetensors", ckpt = dir + ".ckpt.safetensors",
                      resumed = dir + ".resumed.safetensors";
    if (!exited_ok(spawn_self({dev, "full", full}), "uninterrupted")) return 1;
    const int killed = spawn_self({dev, "kill", ckpt});
    if (!(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL)) {
      std::cerr << "resume_run: the run to kill ended with wait status " << killed << ", not SIGKILL\n";
      return 1;
    }
    if (!exited_ok(spawn_self({dev, "resume", ckpt, resumed}), "resumed")) return 1;
    TensorMap a = load_state(full), b = load_state(resumed);
    int differ = 0;
    for (const auto& [name, t] : a) {
      const Tensor& u = b.at(name);
      const std::vector<float> x = t.to_vector<float>(), y = u.to_vector<float>();
      const bool same = t.shape() == u.shape() && x.size() == y.size() &&
                        std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
      std::cout << name << ": " << (same ? "equal" : "DIFFERENT") << "\n";
      differ += !same;
    }
    for (const std::string& f : {full, ckpt, resumed}) std::remove(f.c_str());
    std::cout << (differ ? "FAILED: " : "ok: ") << a.size() - size_t(differ) << " of " << a.size()
              << " tensors equal bit for bit on " << dev << "\n";
    return differ ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "resume_run: " << e.what() << "\n";
    return 1;
  }
}
