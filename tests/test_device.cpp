// The device API: names, selection, preferences, plugin loading, reporting.
// Tests named DeviceEnv.* need a prepared environment (a preference file, a fake plugin, hidden
// devices) and the fresh process that reads it; tests/device.cmake runs each as its own ctest entry
// with FLUX_TEST_ENV naming the case. Elsewhere they skip.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_devices.hpp"

using namespace flux;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

#define FLUX_SKIP_UNLESS_ENV(which)                             \
  if (env("FLUX_TEST_ENV") != which)                            \
  GTEST_SKIP() << "runs as its own ctest entry (FLUX_TEST_ENV=" \
               << which << ", see tests/device.cmake)"

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const flux::Error& e) {
    return e.what();
  }
  return "<no flux::Error thrown>";
}

size_t occurrences(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// The oracle for automatic selection: the first non-CPU device of the first functional GPU backend.
Device expected_automatic() {
  for (const char* name : {"CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    if (!functional(name)) continue;
    backend::Backend& b = detail::backend_for(name);
    for (int i = 0; i < b.device_count(); ++i)
      if (!b.device_is_cpu(i)) return Device(name, i);
  }
  return Device();
}

int opencl_count() { return functional("OpenCL") ? detail::backend_for("OpenCL").device_count() : 0; }

bool preference_may_be_set() {
  return !env("FLUX_PREFERENCES").empty() || std::filesystem::exists("LocalPreferences.toml");
}

}  // namespace

// ---------------- names and values ----------------

TEST(DeviceApi, SupportedDevicesInPriorityOrder) {
  EXPECT_EQ(supported_devices(), (std::vector<std::string>{"CUDA", "AMDGPU", "Metal", "OpenCL", "CPU"}));
}

TEST(DeviceApi, ToStringAndEquality) {
  EXPECT_EQ(to_string(Device("OpenCL", 1)), "OpenCL:1");
  EXPECT_EQ(to_string(Device("CUDA", 0)), "CUDA:0");
  EXPECT_EQ(to_string(Device()), "CPU");
  std::ostringstream os;
  os << Device("AMDGPU", 2);
  EXPECT_EQ(os.str(), "AMDGPU:2");
  EXPECT_EQ(Device("OpenCL", 1), Device("OpenCL", 1));
  EXPECT_NE(Device("OpenCL", 1), Device("OpenCL", 0));
  EXPECT_NE(Device("OpenCL", 0), Device("CUDA", 0));
  EXPECT_EQ(Device("OpenCL", 1).backend(), "OpenCL");
  EXPECT_EQ(Device("OpenCL", 1).index(), 1);
  EXPECT_TRUE(Device().is_cpu());
}

TEST(DeviceApi, CpuIsAlwaysLoadedAndFunctional) {
  EXPECT_TRUE(loaded("CPU"));
  EXPECT_TRUE(functional("CPU"));
  EXPECT_FALSE(loaded("Vulkan"));
  EXPECT_FALSE(functional("Vulkan"));
  for (const std::string& name : supported_devices())
    if (functional(name)) { EXPECT_TRUE(loaded(name)) << name; }
  EXPECT_FALSE(Device().name().empty());
}

// ---------------- get_device ----------------

TEST(DeviceApi, GetDeviceCpu) {
  EXPECT_EQ(get_device("CPU"), Device());
  EXPECT_EQ(get_device("CPU", 0), Device());
  std::string msg = error_of([] { get_device("CPU", 1); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "CPU")) << msg;
  EXPECT_TRUE(contains(msg, "1")) << msg;
}

TEST(DeviceApi, GetDeviceUnknownBackend) {
  std::string msg = error_of([] { get_device("Vulkan", 0); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "\"Vulkan\"")) << msg;
  EXPECT_TRUE(contains(msg, "CUDA, AMDGPU, Metal, OpenCL, CPU")) << msg;
}

TEST(DeviceApi, GetDeviceBackendWithoutPlugin) {
  if (loaded("Metal")) GTEST_SKIP() << "a Metal plugin is present";
  std::string msg = error_of([] { get_device("Metal"); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "Metal")) << msg;
  EXPECT_TRUE(contains(msg, "not loaded")) << msg;
  EXPECT_TRUE(contains(msg, "libflux-metal.so")) << msg;
}

TEST(DeviceApi, GetDeviceAutomatic) {
  if (preference_may_be_set()) GTEST_SKIP() << "a preference file may be in effect";
  Device d = get_device();
  EXPECT_EQ(d, expected_automatic());
  EXPECT_EQ(get_device(), d) << "selection is stable";
  if (!d.is_cpu()) { EXPECT_FALSE(detail::backend_for(d).device_is_cpu(d.index())) << to_string(d); }
}

TEST(DeviceApi, GetDeviceNeverPicksACpuOpenCLDevice) {
  if (preference_may_be_set()) GTEST_SKIP() << "a preference file may be in effect";
  Device d = get_device();
  if (d.backend() == "OpenCL") { EXPECT_FALSE(detail::backend_for(d).device_is_cpu(d.index())); }
  bool only_cpu_opencl = true;
  for (int i = 0; i < opencl_count(); ++i)
    if (!detail::backend_for("OpenCL").device_is_cpu(i)) only_cpu_opencl = false;
  if (only_cpu_opencl && !functional("CUDA") && !functional("AMDGPU") && !functional("Metal")) {
    EXPECT_EQ(d, Device()) << "PoCL (a CPU device) must not be selected automatically";
  }
}

TEST(DeviceApi, GetDeviceVerboseExplains) {
  if (preference_may_be_set()) GTEST_SKIP() << "a preference file may be in effect";
  ::testing::internal::CaptureStderr();
  Device d = get_device({.verbose = true});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "automatic device selection")) << err;
  EXPECT_TRUE(contains(err, "Trying backend: CUDA")) << err;
  if (d.is_cpu()) { EXPECT_TRUE(contains(err, "Defaulting to CPU")) << err; }
}

TEST(DeviceApi, GetDeviceOpenCLEveryIndex) {
  int n = opencl_count();
  if (n == 0) GTEST_SKIP() << "OpenCL is not functional here (CI installs PoCL)";
  for (int i = 0; i < n; ++i) {
    Device d = get_device("OpenCL", i);  // CPU-type devices too: naming one takes it
    EXPECT_EQ(d, Device("OpenCL", i));
    EXPECT_FALSE(d.name().empty());
  }
  EXPECT_EQ(get_device("OpenCL"), Device("OpenCL", 0));
  std::string msg = error_of([&] { get_device("OpenCL", n + 2); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "OpenCL")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(n + 2))) << msg << " (names the index)";
  EXPECT_TRUE(contains(msg, "has " + std::to_string(n))) << msg << " (names the count)";
  msg = error_of([] { get_device("OpenCL", -1); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "-1")) << msg;
}

TEST(DeviceApi, TensorsOnNonexistentDevicesAreRefused) {
  std::string msg = error_of([] { zeros({2}, DType::f32, Device("CPU", 1)); });
  EXPECT_TRUE(contains(msg, "CPU")) << msg;
  if (!loaded("Metal")) {
    msg = error_of([] { zeros({2}, DType::f32, Device("Metal", 0)); });
    EXPECT_TRUE(contains(msg, "Metal")) << msg;
  }
  if (int n = opencl_count()) {
    msg = error_of([&] { zeros({2}, DType::f32, Device("OpenCL", n)); });
    EXPECT_TRUE(contains(msg, "OpenCL:" + std::to_string(n))) << msg;
  }
}

// ---------------- reporting ----------------

class DeviceReport : public ::testing::TestWithParam<Device> {};

TEST_P(DeviceReport, NameAndMemoryFigures) {
  Device d = GetParam();
  EXPECT_FALSE(d.name().empty());
  backend::MemoryInfo before = d.memory();
  EXPECT_LE(before.free, before.total);
  EXPECT_LE(before.used, before.reserved);
  Tensor t = zeros({256, 1024}, DType::f32, d);  // 1 MiB
  d.synchronize();
  backend::MemoryInfo during = d.memory();
  EXPECT_GE(during.used, before.used + (size_t(1) << 20));
  t = Tensor();
  EXPECT_LT(d.memory().used, during.used);
}
FLUX_DEVICE_SUITE(DeviceReport);

TEST(DeviceApi, MemoryStatusPrintsALinePerDevice) {
  std::ostringstream os;
  memory_status(os);
  std::vector<std::string> expected{"CPU"};
  for (const char* name : {"CUDA", "AMDGPU", "Metal", "OpenCL"}) {
    if (!loaded(name)) continue;
    for (int i = 0; i < detail::backend_for(name).device_count(); ++i)
      expected.push_back(to_string(Device(name, i)));
  }
  std::istringstream lines(os.str());
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  ASSERT_EQ(got.size(), expected.size()) << os.str();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].rfind(expected[i] + " (", 0), 0u) << got[i];
    EXPECT_TRUE(contains(got[i], "used")) << got[i];
    EXPECT_TRUE(contains(got[i], "free")) << got[i];
  }
}

TEST(DeviceApi, VersionInfoMentionsEveryBackend) {
  std::ostringstream os;
  versioninfo(os);
  std::string s = os.str();
  EXPECT_TRUE(contains(s, "flux-cpp")) << s;
  EXPECT_TRUE(contains(s, "backend ABI " + std::to_string(backend::kBackendAbiVersion))) << s;
  for (const std::string& name : supported_devices()) EXPECT_TRUE(contains(s, "\n" + name + ": ")) << name << "\n" << s;
  EXPECT_TRUE(contains(s, "Preferred GPU backend")) << s;
  // The backend get_device() would actually use, not a name that may not be functional.
  EXPECT_TRUE(contains(s, "get_device() chooses: " + to_string(get_device()))) << s;
  EXPECT_FALSE(contains(s, "GPU_BACKEND() = CUDA")) << s;
  if (!loaded("Metal")) { EXPECT_TRUE(contains(s, "Metal: not loaded")) << s; }
}

TEST(DeviceApi, GpuBackendRejectsUnknownNames) {
  std::string msg = error_of([] { gpu_backend("Vulkan"); });
  EXPECT_TRUE(contains(msg, "[gpu_backend]")) << msg;
  EXPECT_TRUE(contains(msg, "\"Vulkan\"")) << msg;
  EXPECT_TRUE(contains(msg, "CUDA, AMDGPU, Metal, OpenCL, CPU")) << msg;
  msg = error_of([] { gpu_backend("opencl"); });  // names are case-sensitive, as in Flux
  EXPECT_TRUE(contains(msg, "[gpu_backend]")) << msg;
}

// ---------------- preferences (each in its own process) ----------------

TEST(DeviceEnv, PreferenceOpenCL) {
  FLUX_SKIP_UNLESS_ENV("pref_opencl");
  EXPECT_EQ(GPU_BACKEND(), "OpenCL");
  ::testing::internal::CaptureStderr();
  Device d = get_device({.verbose = true});
  std::string err = ::testing::internal::GetCapturedStderr();
  if (functional("OpenCL")) {
    EXPECT_EQ(d, Device("OpenCL", 0)) << "preferred: taken even when it is a CPU device (PoCL)";
    EXPECT_TRUE(contains(err, "Using backend set in preferences: OpenCL")) << err;
    return;
  }
  EXPECT_EQ(d, expected_automatic());
  EXPECT_TRUE(contains(err, "Trying to use backend: OpenCL")) << err;
  GTEST_SKIP() << "OpenCL is not functional here; checked the fallback only";
}

TEST(DeviceEnv, PreferenceCUDAMissing) {
  FLUX_SKIP_UNLESS_ENV("pref_cuda");
  EXPECT_EQ(GPU_BACKEND(), "CUDA");
  if (functional("CUDA")) {
    EXPECT_EQ(get_device(), Device("CUDA", 0));
    GTEST_SKIP() << "CUDA is functional here; the fallback cannot be checked";
  }
  ::testing::internal::CaptureStderr();
  Device d = get_device();
  Device again = get_device();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(d, expected_automatic());
  EXPECT_EQ(again, d);
  EXPECT_EQ(occurrences(err, "Trying to use backend: CUDA"), 1u) << "one warning, once:\n" << err;
  EXPECT_TRUE(contains(err, "Warning")) << err;
  EXPECT_TRUE(contains(err, loaded("CUDA") ? "not functional" : "not loaded")) << err;
  EXPECT_TRUE(contains(err, "Falling back")) << err;
}

TEST(DeviceEnv, PreferenceMalformed) {
  FLUX_SKIP_UNLESS_ENV("pref_malformed");
  ::testing::internal::CaptureStderr();
  std::string pref = GPU_BACKEND();
  Device d = get_device();
  Device again = get_device({.verbose = true});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(pref, "CUDA") << "no preference: Flux's default";
  EXPECT_EQ(d, expected_automatic());
  EXPECT_EQ(again, d);
  EXPECT_EQ(occurrences(err, "cannot parse"), 1u) << err;
  EXPECT_TRUE(contains(err, "LocalPreferences.toml")) << err;
  EXPECT_TRUE(contains(err, "Ignoring the preference")) << err;
  std::ostringstream os;
  versioninfo(os);  // still works
  EXPECT_TRUE(contains(os.str(), "none set")) << os.str();
}

TEST(DeviceEnv, PreferenceCPU) {
  FLUX_SKIP_UNLESS_ENV("pref_cpu");
  EXPECT_EQ(GPU_BACKEND(), "CPU");
  EXPECT_EQ(get_device(), Device());
  EXPECT_EQ(detail::default_gpu(), Device()) << "gpu() follows get_device()";
}

TEST(DeviceEnv, PreferenceUnknownNameInTomlPath) {
  FLUX_SKIP_UNLESS_ENV("pref_unknown");  // FLUX_PREFERENCES names a .toml file, not a folder
  ::testing::internal::CaptureStderr();
  std::string pref = GPU_BACKEND();
  Device d = get_device();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(pref, "CUDA");
  EXPECT_EQ(d, expected_automatic());
  EXPECT_EQ(occurrences(err, "unknown gpu_backend \"Vulkan\""), 1u) << err;
  EXPECT_TRUE(contains(err, "custom.toml")) << err;
}

namespace {
std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}
}  // namespace

// Writes the preference into $FLUX_PREFERENCES (a fresh folder); DeviceEnv.PreferenceWrittenEarlier
// then reads it in the next process.
TEST(DeviceEnv, GpuBackendWritesPreference) {
  FLUX_SKIP_UNLESS_ENV("pref_write");
  const std::filesystem::path dir = env("FLUX_PREFERENCES");
  ASSERT_FALSE(dir.empty());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "LocalPreferences.toml";
  write_file(file, "[flux]\nother_setting = 3\n\n[OtherPackage]\nkey = \"value\"\n");

  ::testing::internal::CaptureStderr();
  gpu_backend("AMDGPU");
  gpu_backend("OpenCL");
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "New GPU backend set: OpenCL")) << err;
  EXPECT_TRUE(contains(err, "Restart")) << "takes effect at the next start:\n" << err;
  EXPECT_EQ(GPU_BACKEND(), "CUDA") << "this process keeps the preference it started with";

  std::string text = read_file(file);
  EXPECT_TRUE(contains(text, "[flux]")) << text;
  EXPECT_TRUE(contains(text, "gpu_backend = \"OpenCL\"")) << text;
  EXPECT_FALSE(contains(text, "AMDGPU")) << text;
  EXPECT_TRUE(contains(text, "other_setting = 3")) << "other keys kept:\n" << text;
  EXPECT_TRUE(contains(text, "[OtherPackage]")) << text;
  EXPECT_TRUE(contains(text, "key = \"value\"")) << text;
  EXPECT_FALSE(std::filesystem::exists(dir / "LocalPreferences.toml.tmp"));

  // Unknown names leave the file alone.
  EXPECT_THROW(gpu_backend("Vulkan"), flux::Error);
  EXPECT_EQ(read_file(file), text);

  // A .toml path is used as is; a malformed one is reported, not overwritten.
  const std::filesystem::path custom = dir / "custom.toml";
  setenv("FLUX_PREFERENCES", custom.c_str(), 1);
  ::testing::internal::CaptureStderr();
  gpu_backend("CPU");
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(read_file(custom), "gpu_backend = \"CPU\"")) << read_file(custom);
  const std::filesystem::path broken = dir / "broken.toml";
  write_file(broken, "[flux\ngpu_backend = \n");
  setenv("FLUX_PREFERENCES", broken.c_str(), 1);
  std::string msg = error_of([] { gpu_backend("OpenCL"); });
  EXPECT_TRUE(contains(msg, "[gpu_backend] cannot parse")) << msg;
  EXPECT_EQ(read_file(broken), "[flux\ngpu_backend = \n");
  setenv("FLUX_PREFERENCES", dir.c_str(), 1);
}

TEST(DeviceEnv, PreferenceWrittenEarlier) {
  FLUX_SKIP_UNLESS_ENV("pref_written");
  EXPECT_EQ(GPU_BACKEND(), "OpenCL") << "written by DeviceEnv.GpuBackendWritesPreference";
  ::testing::internal::CaptureStderr();
  gpu_backend("OpenCL");
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "already set to: OpenCL")) << err;
  if (functional("OpenCL")) { EXPECT_EQ(get_device(), Device("OpenCL", 0)); }
}

// ---------------- hidden devices (FLUX_OPENCL_DEVICES=-1) ----------------

TEST(DeviceEnv, OpenCLHidden) {
  FLUX_SKIP_UNLESS_ENV("opencl_hidden");
  if (!loaded("OpenCL")) GTEST_SKIP() << "the OpenCL plugin is not built here";
  EXPECT_FALSE(functional("OpenCL")) << "FLUX_OPENCL_DEVICES=-1 hides every device";
  std::string msg = error_of([] { get_device("OpenCL", 0); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "OpenCL")) << msg;
  EXPECT_TRUE(contains(msg, "not functional")) << msg;
  EXPECT_EQ(get_device(), expected_automatic());
  std::ostringstream os;
  versioninfo(os);
  EXPECT_TRUE(contains(os.str(), "OpenCL: loaded, not functional")) << os.str();
}

TEST(DeviceEnv, OpenCLHiddenButPreferred) {
  FLUX_SKIP_UNLESS_ENV("opencl_hidden_preferred");
  EXPECT_EQ(GPU_BACKEND(), "OpenCL");
  ::testing::internal::CaptureStderr();
  Device d = get_device();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(d, expected_automatic());
  EXPECT_TRUE(contains(err, "Trying to use backend: OpenCL")) << err;
  EXPECT_TRUE(contains(err, "Falling back")) << err;
  if (!loaded("OpenCL")) GTEST_SKIP() << "the OpenCL plugin is not built here; checked the not-loaded fallback";
  EXPECT_TRUE(contains(err, "not functional")) << err;
}

// ---------------- plugins that must be refused (fakes from tests/plugins) ----------------

namespace {
// Loads the fake "Metal" plugin that FLUX_BACKEND_PATH points at; returns what the user can see.
std::string refused_metal_plugin() {
  ::testing::internal::CaptureStderr();
  bool is_loaded = loaded("Metal");
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(is_loaded);
  EXPECT_FALSE(functional("Metal"));
  std::string msg = error_of([] { get_device("Metal", 0); });
  EXPECT_TRUE(contains(msg, "[get_device]")) << msg;
  EXPECT_TRUE(contains(msg, "Metal")) << msg;
  std::ostringstream os;
  versioninfo(os);
  EXPECT_TRUE(contains(os.str(), "Metal: not loaded")) << os.str();
  EXPECT_EQ(get_device("CPU"), Device()) << "the rest still works";
  Tensor t = Tensor({1, 2}) + Tensor({3, 4});
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{4, 6}));
  return err + "\n" + msg + "\n" + os.str();
}
}  // namespace

TEST(DeviceEnv, PluginForAnotherAbiIsRefused) {
  FLUX_SKIP_UNLESS_ENV("plugin_wrong_abi");
  std::string seen = refused_metal_plugin();
  const std::string theirs = "ABI version " + std::to_string(backend::kBackendAbiVersion + 1);
  const std::string ours = "ABI version " + std::to_string(backend::kBackendAbiVersion);
  EXPECT_TRUE(contains(seen, theirs)) << seen;
  EXPECT_TRUE(contains(seen, ours + "\n") || contains(seen, ours + ")")) << seen;
  EXPECT_TRUE(contains(seen, "libflux-metal.so")) << seen;
}

TEST(DeviceEnv, PluginWithoutEntrySymbolIsRefused) {
  FLUX_SKIP_UNLESS_ENV("plugin_no_entry");
  std::string seen = refused_metal_plugin();
  EXPECT_TRUE(contains(seen, "does not export " FLUX_BACKEND_PLUGIN_SYMBOL)) << seen;
}

TEST(DeviceEnv, CorruptPluginFileIsRefused) {
  FLUX_SKIP_UNLESS_ENV("plugin_corrupt");
  std::string seen = refused_metal_plugin();
  EXPECT_TRUE(contains(seen, "dlopen failed")) << seen;
}

TEST(DeviceEnv, PluginWhoseCreateThrowsIsNotLoaded) {
  FLUX_SKIP_UNLESS_ENV("plugin_create_throws");
  std::string seen = refused_metal_plugin();
  EXPECT_TRUE(contains(seen, "initialisation failed")) << seen;
  EXPECT_TRUE(contains(seen, "no device context")) << seen;
}

TEST(DeviceEnv, DebugBackendsLogsDecisions) {
  FLUX_SKIP_UNLESS_ENV("debug_backends");
  ::testing::internal::CaptureStderr();
  loaded("Metal");
  get_device();
  GPU_BACKEND();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "[flux:backends]")) << err;
  EXPECT_TRUE(contains(err, "[flux:backends] Metal")) << "names each backend it tried:\n" << err;
  EXPECT_TRUE(contains(err, "[flux:backends] preferences")) << err;
}
