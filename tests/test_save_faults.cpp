// Saves stay atomic under faults: a child process saves a large file over and over (save_state, and
// save_checkpoint of a model with Adam state) and is SIGKILLed at random points, many times. After
// every kill the target must load, hold one complete version (every value equals the version its
// metadata names), and no temporary files may pile up next to it.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"

using namespace flux;

namespace {

class FaultDir {
 public:
  FaultDir() {
    std::string pattern = std::string(FLUX_BINARY_DIR) + "/save-faults-XXXXXX";  // a real disk, not tmpfs
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    path_ = ::mkdtemp(buf.data());
  }
  ~FaultDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.push_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }

 private:
  std::string path_;
};

/// What the child tells the parent through a shared page: how many saves it began and finished.
struct Progress {
  std::atomic<int64_t> begun{0}, finished{0};
};

/// Forks a child that runs save(version) for version = 1, 2, ... until killed, kills it after a random
/// delay (within about two saves' time), `kills` times, and after each kill runs check(). Returns how
/// many kills landed inside a save (begun > finished).
template <class Save, class Check>
int kill_repeatedly(int kills, double save_seconds, Save save, Check check) {
  auto* progress = static_cast<Progress*>(
      ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  EXPECT_NE(progress, MAP_FAILED);
  std::mt19937_64 rng(20261204);
  int mid_save = 0;
  for (int k = 0; k < kills; ++k) {
    new (progress) Progress();
    pid_t child = ::fork();
    if (child == 0) {
      // Only the saving thread exists here; the tensors were made before the fork.
      for (int64_t version = 1;; ++version) {
        progress->begun.store(version);
        save(version);
        progress->finished.store(version);
      }
    }
    EXPECT_GT(child, 0);
    // Wait for the first save to begin, then kill at a random point of the next two.
    while (progress->begun.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::uniform_real_distribution<double> delay(0.0, 2.0 * save_seconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay(rng)));
    const bool inside = progress->begun.load() > progress->finished.load();
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "kill " << k;
    mid_save += inside;
    check(k);
  }
  ::munmap(progress, sizeof(Progress));
  return mid_save;
}

/// Seconds one call of f takes (the median of three).
template <class F> double seconds_of(F f) {
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[1];
}

/// Temporary files next to `target` in `dir` (the writer's ".<name>.tmp-<pid>-*").
size_t temps_for(const FaultDir& dir, const std::string& target) {
  size_t n = 0;
  for (const std::string& e : dir.entries())
    if (e.rfind("." + target + ".tmp-", 0) == 0) ++n;
  return n;
}

bool all_equal(const Tensor& t, double value) {
  for (float v : t.to_vector<float>())
    if (v != float(value)) return false;
  return true;
}

constexpr int kKills = 25;

TEST(SaveFaults, KilledSaveStateLeavesACompleteFile) {
  FaultDir dir;
  const std::string name = "big.safetensors", path = dir.file(name);
  // 24 MB in three tensors; the versions differ in every value, so a torn file cannot pass.
  std::vector<TensorMap> versions;
  for (int v = 0; v < 3; ++v)
    versions.push_back({{"a", full({1 << 20, 4}, double(v))}, {"b", full({512, 1024, 2}, double(v))},
                        {"c", full({3}, double(v))}});
  auto save_version = [&](int64_t version) {
    save_state(path, versions[size_t(version % 3)], {{"value", std::to_string(version % 3)}});
  };
  save_version(0);
  const double t = seconds_of([&] { save_version(0); });
  int mid = kill_repeatedly(kKills, t, save_version, [&](int k) {
    TensorMap loaded;
    ASSERT_NO_THROW(loaded = load_state(path)) << "kill " << k << ": the target does not load";
    const double value = std::stod(load_metadata(path).at("value"));
    ASSERT_EQ(loaded.size(), 3u);
    for (const auto& [n, tensor] : loaded)
      ASSERT_TRUE(all_equal(tensor, value)) << "kill " << k << ": tensor " << n << " is not all " << value;
    // The killed writer left at most its own temporary (named only between linkat and rename).
    EXPECT_LE(temps_for(dir, name), 1u) << "kill " << k;
  });
  EXPECT_GE(mid, kKills / 2) << "most kills must land inside a save (one save takes " << t << " s)";
  // The next save removes whatever a killed writer left; only the target remains.
  save_version(1);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{name});
}

TEST(SaveFaults, KilledSaveCheckpointLeavesALoadableCheckpoint) {
  FaultDir dir;
  const std::string name = "train.ckpt", path = dir.file(name);
  auto model = Chain(Dense(1024, 1024, relu), Dense(1024, 512));
  auto state = optimisers::setup(optimisers::Adam(1e-3), model);
  // Every model value equals the version; the Adam buffers too.
  auto set_all = [&](double value) {
    for (Tensor& p : params(model)) copy_(p, full_like(p, value));
    for (auto& leaf : state.leaves) {
      for (Tensor& b : leaf.buffers) copy_(b, full_like(b, value));
      leaf.t = int64_t(value);
    }
  };
  // Versions 0, 1, 2 as separate models made before the fork.
  std::vector<decltype(model)> models;
  std::vector<optimisers::State> states;
  for (int v = 0; v < 3; ++v) {
    set_all(double(v));
    models.push_back(deepcopy(model));
    states.push_back(optimisers::setup(optimisers::Adam(1e-3), models.back()));
    for (auto& leaf : states.back().leaves) {
      for (Tensor& b : leaf.buffers) copy_(b, full_like(b, double(v)));
      leaf.t = v;
    }
  }
  auto save_version = [&](int64_t version) {
    size_t v = size_t(version % 3);
    save_checkpoint(path, models[v], states[v], {{"value", std::to_string(v)}});
  };
  save_version(0);
  const double t = seconds_of([&] { save_version(0); });
  int mid = kill_repeatedly(kKills, t, save_version, [&](int k) {
    auto fresh = Chain(Dense(1024, 1024, relu), Dense(1024, 512));
    auto fresh_state = optimisers::setup(optimisers::Adam(1e-3), fresh);
    Metadata meta;
    ASSERT_NO_THROW(meta = load_checkpoint(path, fresh, fresh_state)) << "kill " << k;
    const double value = std::stod(meta.at("value"));
    for (const Tensor& p : params(fresh)) ASSERT_TRUE(all_equal(p, value)) << "kill " << k;
    for (const auto& leaf : fresh_state.leaves) {
      EXPECT_EQ(leaf.t, int64_t(value)) << "kill " << k;
      for (const Tensor& b : leaf.buffers) ASSERT_TRUE(all_equal(b, value)) << "kill " << k;
    }
    EXPECT_LE(temps_for(dir, name), 1u) << "kill " << k;
  });
  EXPECT_GE(mid, kKills / 2) << "one save takes " << t << " s";
  save_version(1);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{name});
}

TEST(SaveFaults, SaveRemovesTemporariesOfDeadWritersOnly) {
  FaultDir dir;
  const std::string name = "m.safetensors";
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);  // reaped: its pid names no process now
  const std::string stale = "." + name + ".tmp-" + std::to_string(dead) + "-abc123";
  const std::string live = "." + name + ".tmp-" + std::to_string(::getpid()) + "-def456";
  const std::string other = ".other.safetensors.tmp-" + std::to_string(dead) + "-ghi789";
  for (const std::string& f : {stale, live, other}) std::fclose(std::fopen(dir.file(f).c_str(), "w"));
  save_state(dir.file(name), {{"w", full({2}, 1.0)}});
  std::vector<std::string> left = dir.entries();
  std::sort(left.begin(), left.end());
  std::vector<std::string> want{live, other, name};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(left, want) << "only the dead writer's temporary of this target goes";
}

}  // namespace
