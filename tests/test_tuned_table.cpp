// The tuned kernel table (src/backends/cpu/tuned_table.hpp) and the tuner (flux/tune.hpp): a saved
// table is read back and overrides the rules for its queries; a table for another machine or one
// that does not parse is ignored with one warning; a missing one silently; a failed save leaves the
// old table whole; tune_kernels saves what the sites' timers measure and the process uses it at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "flux/flux.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/tuned_table.hpp"

namespace fs = std::filesystem;
using namespace flux;
using namespace flux::cpu_backend;

namespace {

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// A Dense-inference query; both of its kernels are candidates, so the table can name the one the
// rules do not pick (on any CPU).
Query linear_query(int64_t n, int threads = 1) {
  Query q;
  q.site = Site::linear;
  q.threads = threads;
  q.dims = {n, 784, 512, 1, 1};
  return q;
}
constexpr Candidates kLinear = bit(Kernel::onednn) | bit(Kernel::panels);
Kernel other_than(Kernel k) { return k == Kernel::onednn ? Kernel::panels : Kernel::onednn; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Sets an environment variable for one test and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& v) {
    if (v)
      setenv(name_, v->c_str(), 1);
    else
      unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

// Each test: its own folder, $FLUX_KERNEL_TABLE in it, no forced kernel, and the process reading the
// table afresh; everything put back afterwards.
class TunedTable : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / ("flux-tuned-table-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "flux-kernels.tsv").string();
    env_.emplace("FLUX_KERNEL_TABLE", path_);
    for (int s = 0; s < kSites; ++s) forced_[s] = force_kernel(Site(s), std::nullopt);
    reload_tuned_table();
  }
  void TearDown() override {
    for (int s = 0; s < kSites; ++s) force_kernel(Site(s), forced_[s]);
    env_.reset();
    reload_tuned_table();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }

  // A valid table for this machine: the query of batch 7 runs the kernel the rules do not pick.
  std::string valid_table() {
    save_tuned_table(path_, {{linear_query(7), other_than(rule(linear_query(7), kLinear))}});
    return read_file(path_);
  }

  // Reads the table afresh, makes a few choices and returns what they printed on stderr; `got` is the
  // choice for batch 7.
  std::string choose_capturing(Kernel& got) {
    reload_tuned_table();
    ::testing::internal::CaptureStderr();
    got = choose(linear_query(7), kLinear);
    const Kernel again = choose(linear_query(7), kLinear);
    (void)choose(linear_query(9), kLinear);
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(again, got);
    return err;
  }

  // The table is ignored: batch 7 runs the rules' kernel, after exactly one warning naming the file
  // and `why`; reading the same table again does not warn again.
  void expect_ignored(const std::string& label, const std::string& why) {
    SCOPED_TRACE(label);
    Kernel got{};
    const std::string err = choose_capturing(got);
    EXPECT_EQ(got, rule(linear_query(7), kLinear));
    EXPECT_EQ(occurrences(err, "┌ Warning:"), 1u) << err;
    EXPECT_NE(err.find("ignoring the kernel table " + path_), std::string::npos) << err;
    EXPECT_NE(err.find(why), std::string::npos) << err;
    Kernel again{};
    const std::string second = choose_capturing(again);
    EXPECT_EQ(again, got);
    EXPECT_EQ(occurrences(second, "┌ Warning:"), 0u) << "printed once per process:\n" << second;
  }

  fs::path dir_;
  std::string path_;
  std::optional<ScopedEnv> env_;
  std::optional<Kernel> forced_[kSites];
};

TEST_F(TunedTable, SavedTableIsReadBackAndOverridesTheRules) {
  const Query q = linear_query(7);
  const Kernel ruled = rule(q, kLinear);
  const Kernel tuned = other_than(ruled);
  EXPECT_EQ(tuned_table_path(), path_);
  EXPECT_EQ(kernel_table_path(), path_);
  EXPECT_EQ(choose(q, kLinear), ruled) << "no table yet";

  save_tuned_table(path_, {{q, tuned}, {linear_query(7, 2), ruled}});
  const std::string text = read_file(path_);
  EXPECT_EQ(text.rfind("flux-kernel-table 1\ncpu\t" + cpu_key() + "\n", 0), 0u) << text;
  std::string why;
  std::optional<TunedEntries> back = read_tuned_table(path_, why);
  ASSERT_TRUE(back) << why;
  ASSERT_EQ(back->size(), 2u);
  EXPECT_TRUE((*back)[0].first == q && (*back)[0].second == tuned);
  EXPECT_TRUE((*back)[1].first == linear_query(7, 2) && (*back)[1].second == ruled);

  Kernel got{};
  const std::string err = choose_capturing(got);
  EXPECT_EQ(err, "");
  EXPECT_EQ(got, tuned) << "the table overrides the rules";
  EXPECT_EQ(choose(linear_query(7, 2), kLinear), ruled) << "threads are part of the key";
  EXPECT_EQ(choose(linear_query(8), kLinear), rule(linear_query(8), kLinear)) << "a shape not in the table: the rules";
  EXPECT_EQ(choose(q, bit(ruled)), ruled) << "a tuned kernel that is not a candidate is not taken";
  std::ostringstream info;
  versioninfo(info);  // flux-info says which table is in use
  EXPECT_NE(info.str().find("CPU kernel table: 2 tuned shape(s) [" + path_ + "]"), std::string::npos) << info.str();
  // A forced kernel comes first.
  force_kernel(Site::linear, ruled);
  EXPECT_EQ(choose(q, kLinear), ruled);
  force_kernel(Site::linear, std::nullopt);
  EXPECT_EQ(choose(q, kLinear), tuned);
  // Kernels capped below the CPU's ISA: the table (timed at the full ISA) does not apply.
  if (detected_isa() != Isa::baseline) {
    const Isa old = force_isa(Isa::baseline);
    const Kernel capped = choose(q, kLinear);
    const Kernel capped_rule = rule(q, kLinear);
    force_isa(old);
    EXPECT_EQ(capped, capped_rule);
  }
}

TEST_F(TunedTable, TableForAnotherMachineIsIgnoredWithOneWarning) {
  const std::string valid = valid_table();
  const std::string key = cpu_key();
  auto with_key = [&](const std::string& other) {
    std::string text = valid;
    text.replace(text.find(key), key.size(), other);
    return text;
  };
  write(with_key("Some Other CPU @ 1.00GHz | AVX2+FMA | flux " FLUX_VERSION_STRING));
  expect_ignored("another CPU", "made on \"Some Other CPU @ 1.00GHz");
  std::ostringstream info;
  versioninfo(info);
  EXPECT_NE(info.str().find("CPU kernel table: ignored (it was made on \"Some Other CPU"), std::string::npos)
      << info.str();
  const std::string older = key.substr(0, key.rfind("flux ")) + "flux 0.0.1";
  write(with_key(older));
  expect_ignored("another flux version", "flux 0.0.1");
  // The valid table is used again once it is back.
  write(valid);
  Kernel got{};
  EXPECT_EQ(choose_capturing(got), "");
  EXPECT_EQ(got, other_than(rule(linear_query(7), kLinear)));
}

TEST_F(TunedTable, CorruptTableIsIgnoredWithOneWarning) {
  const std::string valid = valid_table();
  const std::string entry = valid.substr(valid.rfind("linear\t"));  // the last line, with its newline
  const std::string head = valid.substr(0, valid.size() - entry.size());
  std::string wrong_kernel = valid;
  wrong_kernel.replace(wrong_kernel.rfind('\t') + 1, std::string::npos, "fastest\n");

  write("\x7f" "ELF\x02\x01 not a table at all\n");
  expect_ignored("garbage", "line 1: expected \"flux-kernel-table 1\"");
  write(valid.substr(0, valid.size() - 9));
  expect_ignored("truncated", "cut short");
  write(head + entry.substr(0, entry.find("\t784")) + "\n");
  expect_ignored("a line with too few fields", "3 fields, expected 21");
  write(wrong_kernel);
  expect_ignored("an unknown kernel", "unknown kernel \"fastest\"");
  write(head + "matmul" + entry.substr(entry.find('\t')));
  expect_ignored("an unknown site", "unknown site \"matmul\"");
  std::string not_number = entry;
  not_number.replace(not_number.find("\t784\t"), 5, "\t78x4\t");
  write(head + not_number);
  expect_ignored("a dim that is not a number", "is not an integer");
  write(valid + entry);
  expect_ignored("a query listed twice", "listed twice");
  write("");
  expect_ignored("an empty file", "empty");
  write("flux-kernel-table 1\n" + entry);
  expect_ignored("no cpu line", "expected \"cpu<TAB><machine>\"");
  fs::remove(path_);
  fs::create_directory(path_);
  expect_ignored("a directory", "it is a directory");
}

TEST_F(TunedTable, MissingTableIsSilentAndLivesBesideThePreferences) {
  Kernel got{};
  EXPECT_EQ(choose_capturing(got), "");
  EXPECT_EQ(got, rule(linear_query(7), kLinear));
  std::ostringstream info;
  versioninfo(info);
  EXPECT_NE(info.str().find("CPU kernel table: none (the built-in rules choose) [" + path_ + "]"), std::string::npos)
      << info.str();
  ScopedEnv no_table("FLUX_KERNEL_TABLE", std::nullopt);
  {
    ScopedEnv prefs("FLUX_PREFERENCES", dir_.string());
    EXPECT_EQ(tuned_table_path(), (dir_ / "flux-kernels.tsv").string());
  }
  {
    ScopedEnv prefs("FLUX_PREFERENCES", (dir_ / "sub" / "Prefs.toml").string());
    EXPECT_EQ(tuned_table_path(), (dir_ / "sub" / "flux-kernels.tsv").string());
  }
  ScopedEnv prefs("FLUX_PREFERENCES", std::nullopt);
  EXPECT_EQ(tuned_table_path(), (fs::current_path() / "flux-kernels.tsv").string());
}

TEST_F(TunedTable, FailedSaveLeavesTheOldTableWhole) {
  const std::string valid = valid_table();
  // The temporary cannot be made (a folder has its name): the save fails, naming the table.
  fs::create_directory(path_ + ".tmp." + std::to_string(::getpid()));
  try {
    save_tuned_table(path_, {{linear_query(7), rule(linear_query(7), kLinear)}, {linear_query(8), Kernel::panels}});
    ADD_FAILURE() << "saving should have failed";
  } catch (const flux::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[tune_kernels] cannot write the kernel table " + path_), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_file(path_), valid);
  Kernel got{};
  EXPECT_EQ(choose_capturing(got), "");
  EXPECT_EQ(got, other_than(rule(linear_query(7), kLinear))) << "the old table is still used";

  // A folder that cannot hold files (a regular file stands in its place).
  const std::string blocked = (dir_ / "flux-kernels.tsv" / "table.tsv").string();
  try {
    save_tuned_table(blocked, {});
    ADD_FAILURE() << "saving should have failed";
  } catch (const flux::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write the kernel table " + blocked), std::string::npos) << e.what();
  }
}

TEST_F(TunedTable, ChoicesFromManyThreadsWhileTheTableIsReloaded) {
  // Lookups are lock-free after the first read; a reload swaps the table while other threads read it
  // (the ThreadSanitizer build runs this). The file does not change, so every choice is the tuned one.
  valid_table();
  const Kernel tuned = other_than(rule(linear_query(7), kLinear));
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, started{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      bool first = true;
      while (!stop.load()) {
        if (choose(linear_query(7), kLinear) != tuned) wrong.fetch_add(1);
        if (first) started.fetch_add(1), first = false;
      }
    });
  while (started.load() < 4) std::this_thread::yield();  // every caller is choosing
  for (int i = 0; i < 200; ++i) {
    reload_tuned_table();
    std::this_thread::yield();
  }
  stop.store(true);
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(choose(linear_query(7), kLinear), tuned);
}

// ---- the tuner, with fake timers registered for the sites ----

class TuneKernels : public TunedTable {
 protected:
  void SetUp() override {
    TunedTable::SetUp();
    for (int s = 0; s < kSites; ++s) timers_[s] = timer_of(Site(s));
  }
  void TearDown() override {
    for (int s = 0; s < kSites; ++s) register_timer(Site(s), timers_[s]);
    TunedTable::TearDown();
  }
  Timer timers_[kSites];
};

TEST_F(TuneKernels, SavesTheKernelTheTimerFindsFastest) {
  // A Dense query the other kernel runs 2x faster, one it runs only 2% faster (within the margin:
  // the rules' kernel stays), a one-candidate query, and a conv query with no timer.
  const Query fast = linear_query(5), close = linear_query(6), single = linear_query(4);
  Query conv;
  conv.site = Site::conv_forward;
  conv.dims = {2, 1, 64, 64, 1, 56, 56, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0};
  const Candidates conv_candidates = bit(Kernel::onednn) | bit(Kernel::winograd);
  int calls = 0;
  register_timer(Site::linear, [&](const Query& q, Kernel k, int reps) {
    ++calls;
    EXPECT_EQ(reps, 3);
    const bool ruled = k == rule(q, kLinear);
    return ruled ? 1e-3 : (q == close ? 0.98e-3 : 0.5e-3);
  });
  register_timer(Site::conv_forward, Timer());
  // An entry from an earlier tuning stays in the table.
  const Query earlier = linear_query(11);
  save_tuned_table(path_, {{earlier, Kernel::panels}});

  TuneReport report = tune_kernels(
      [&] {
        (void)choose(fast, kLinear);
        (void)choose(close, kLinear);
        (void)choose(fast, kLinear);
        (void)choose(single, bit(Kernel::panels));
        (void)choose(conv, conv_candidates);
      },
      {.reps = 3});
  EXPECT_EQ(calls, 4) << "two candidates for each of two queries";
  ASSERT_EQ(report.entries.size(), 4u);
  // In the order of site, threads, dims: linear n 4, 5, 6, then the conv.
  const TuneEntry& e_single = report.entries[0];
  const TuneEntry& e_fast = report.entries[1];
  const TuneEntry& e_close = report.entries[2];
  const TuneEntry& e_conv = report.entries[3];
  const std::string ruled_fast = kernel_name(rule(fast, kLinear));
  EXPECT_EQ(e_fast.shape, "n 5 in 784 out 512 bias relu");
  EXPECT_EQ(e_fast.rule, ruled_fast);
  EXPECT_EQ(e_fast.chosen, kernel_name(other_than(rule(fast, kLinear))));
  ASSERT_EQ(e_fast.timings.size(), 2u);
  EXPECT_EQ(e_close.chosen, e_close.rule) << "2% is within the 5% margin";
  EXPECT_EQ(e_single.skipped, "one candidate");
  EXPECT_EQ(e_conv.site, "conv_forward");
  EXPECT_EQ(e_conv.skipped, "no timer registered for this site");
  EXPECT_EQ(report.path, path_);
  EXPECT_EQ(report.table_entries, 3u) << "fast, close and the earlier entry";

  // The file is read back, and this process uses it at once.
  std::string why;
  std::optional<TunedEntries> back = read_tuned_table(path_, why);
  ASSERT_TRUE(back) << why;
  ASSERT_EQ(back->size(), 3u);
  EXPECT_TRUE((*back)[0].first == fast && (*back)[0].second == other_than(rule(fast, kLinear)));
  EXPECT_TRUE((*back)[1].first == close && (*back)[1].second == rule(close, kLinear));
  EXPECT_TRUE((*back)[2].first == earlier && (*back)[2].second == Kernel::panels);
  EXPECT_EQ(choose(fast, kLinear), other_than(rule(fast, kLinear)));
  EXPECT_EQ(choose(earlier, kLinear), Kernel::panels);

  std::ostringstream printed;
  printed << report;
  EXPECT_NE(printed.str().find("Saved 3 shape(s) to " + path_), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("skipped: no timer registered"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find(ruled_fast + " 1.0000"), std::string::npos) << printed.str();
}

TEST_F(TuneKernels, WorkloadErrorsStopRecordingAndSaveNothing) {
  register_timer(Site::linear, [](const Query&, Kernel, int) { return 1e-3; });
  EXPECT_THROW(tune_kernels([] {
                 (void)choose(linear_query(5), kLinear);
                 throw std::runtime_error("the model failed");
               }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(path_));
  // Recording is off again: a later choice is not recorded.
  (void)choose(linear_query(12), kLinear);
  for (const auto& [q, c] : recorded_queries()) EXPECT_FALSE(q == linear_query(12));

  // A table that cannot be saved fails before the workload runs.
  const std::string nowhere = (dir_ / "missing" / "flux-kernels.tsv").string();
  bool ran = false;
  try {
    tune_kernels([&] { ran = true; }, {.path = nowhere});
    ADD_FAILURE() << "tuning into a missing folder should fail";
  } catch (const flux::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[tune_kernels] cannot write the kernel table " + nowhere), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(ran);
  EXPECT_THROW(tune_kernels([] {}, {.reps = 0}), flux::Error);
  EXPECT_THROW(tune_kernels({}), flux::Error);
  // save = false: measured and reported, nothing written.
  TuneReport report = tune_kernels([] { (void)choose(linear_query(5), kLinear); }, {.save = false});
  ASSERT_EQ(report.entries.size(), 1u);
  EXPECT_EQ(report.entries[0].chosen, report.entries[0].rule) << "equal times: the rules' kernel";
  EXPECT_EQ(report.path, "");
  EXPECT_FALSE(fs::exists(path_));
}

}  // namespace
