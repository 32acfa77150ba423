// The preferences file as text (src/device/preferences.cpp): what get_device reads and what
// gpu_backend writes, including the inputs tests/fuzz/fuzz_preferences found.
#include <gtest/gtest.h>

#include "flux/error.hpp"
#include "src/device/preferences.hpp"

using namespace flux;

namespace {

TEST(Preferences, ReadsTheBackendAndWarnsAboutBadFiles) {
  EXPECT_EQ(preferences::parse("[flux]\ngpu_backend = \"OpenCL\"\n", "p.toml").backend, "OpenCL");
  EXPECT_EQ(preferences::parse("flux.gpu_backend = 'CPU'\n", "p.toml").backend, "CPU");
  auto none = preferences::parse("[other]\nx = 1\n", "p.toml");
  EXPECT_TRUE(none.backend.empty() && none.warning.empty() && !none.malformed);
  auto unknown = preferences::parse("[flux]\ngpu_backend = \"Vulkan\"\n", "p.toml");
  EXPECT_TRUE(unknown.backend.empty() && !unknown.malformed);
  EXPECT_NE(unknown.warning.find("p.toml: unknown gpu_backend \"Vulkan\""), std::string::npos) << unknown.warning;
  auto bad = preferences::parse("[flux\n", "p.toml");
  EXPECT_TRUE(bad.backend.empty() && bad.malformed);
  EXPECT_NE(bad.warning.find("cannot parse p.toml"), std::string::npos) << bad.warning;
  // A value that merely contains the words is not a malformed file (the fuzzer's first false alarm).
  auto words = preferences::parse("[flux]\ngpu_backend = \"cannot parse\"\n", "p.toml");
  EXPECT_FALSE(words.malformed);
}

TEST(Preferences, RewriteKeepsOtherKeysAndParsesBack) {
  std::string text = preferences::with_backend("# mine\n[flux]\ngpu_backend = \"CUDA\"\nother = 3\n[CUDA_Runtime_jll]\nversion = \"12.2\"\n",
                                               "p.toml", "OpenCL");
  EXPECT_EQ(preferences::parse(text, "p.toml").backend, "OpenCL");
  EXPECT_NE(text.find("other = 3"), std::string::npos) << text;
  EXPECT_NE(text.find("version = \"12.2\""), std::string::npos) << text;
  EXPECT_EQ(preferences::parse(preferences::with_backend("", "p.toml", "CPU"), "p.toml").backend, "CPU");
  try {
    preferences::with_backend("[flux\n", "p.toml", "CPU");
    ADD_FAILURE() << "rewrote a malformed file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gpu_backend] cannot parse p.toml"), std::string::npos) << e.what();
  }
}

TEST(Preferences, RewriteRefusesTextItWouldWriteUnreadably) {
  // Found by fuzz_preferences: toml++ writes the quoted key "q'x" back as a literal key 'q'x', which
  // no TOML reader accepts; gpu_backend would have replaced a valid file with a broken one.
  const std::string text = "flux.gpu_backend = \"CPU\"\n\"q'x\" = \"\"\"mune\"\"\"\n";
  ASSERT_EQ(preferences::parse(text, "p.toml").backend, "CPU");
  try {
    std::string out = preferences::with_backend(text, "p.toml", "OpenCL");
    EXPECT_EQ(preferences::parse(out, "p.toml").backend, "OpenCL") << out;  // fine if toml++ gets it right
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[gpu_backend] cannot rewrite p.toml: ", 0), 0u) << e.what();
  }
}

}  // namespace
