// The FLUX_* environment variables: one table (src/environment.cpp), one reader, and the README's
// table kept equal to it; every getenv of a FLUX_* name in the sources goes through the reader.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>

#include "flux/flux.hpp"
#include "src/environment.hpp"

using namespace flux;
using ::testing::HasSubstr;

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Sets a variable for one scope (the reader does not cache; the switches that cache read it once).
struct Env {
  std::string name;
  Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~Env() { ::unsetenv(name.c_str()); }
};

TEST(Environment, ReadmeTableEqualsTheOneTable) {
  const std::string readme = read_file(std::filesystem::path(FLUX_SOURCE_DIR) / "README.md");
  const size_t start = readme.find("\n### Environment variables\n");
  ASSERT_NE(start, std::string::npos) << "README.md has no \"### Environment variables\" section";
  const size_t stop = readme.find("\n#", start + 5);
  std::stringstream section(readme.substr(start, stop - start));
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(section, line);) {
    if (line.rfind("| `FLUX_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(trim(cell));
    rows.push_back(cells);
  }
  const auto& table = environment::variables();
  ASSERT_EQ(rows.size(), table.size()) << "README rows against src/environment.cpp's table";
  for (size_t i = 0; i < table.size(); ++i) {
    const environment::Variable& v = table[i];
    ASSERT_EQ(rows[i].size(), 5u) << "row " << i << ": | name | type | allowed | default | description |";
    EXPECT_EQ(rows[i][0], "`" + std::string(v.name) + "`");
    EXPECT_EQ(rows[i][1], v.type) << v.name;
    EXPECT_EQ(rows[i][2], v.allowed) << v.name;
    EXPECT_EQ(rows[i][3], v.default_value) << v.name;
    EXPECT_EQ(rows[i][4], v.description) << v.name;
    if (i) {
      EXPECT_LT(std::string(table[i - 1].name), std::string(v.name)) << "the table is sorted by name";
    }
  }
}

// No FLUX_* variable is read around the table: every std::getenv("FLUX_...") in src/, include/ and
// tools/ is a finding. The CUDA/AMDGPU plugin is the one exception: it links nothing from libflux
// (it is built by nvcc and hipcc alone) and reads only FLUX_DEBUG_BACKENDS, for its log lines.
TEST(Environment, EveryFluxVariableIsReadThroughTheTable) {
  std::set<std::string> known;
  for (const auto& v : environment::variables()) known.insert(v.name);
  const std::regex direct(R"re(getenv\("FLUX_[A-Z_]*")re"), named(R"re(environment::[a-z_]+\("(FLUX_[A-Z_]+)")re");
  std::vector<std::string> findings;
  for (const char* dir : {"src", "include", "tools"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::filesystem::path(FLUX_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string path = e.path().string();
      if (path.find("/src/backends/cuda/") != std::string::npos) continue;
      const std::string text = read_file(e.path());
      for (std::sregex_iterator m(text.begin(), text.end(), direct), end; m != end; ++m)
        findings.push_back(path + ": " + m->str());
      for (std::sregex_iterator m(text.begin(), text.end(), named), end; m != end; ++m)
        if (!known.count((*m)[1])) findings.push_back(path + ": " + (*m)[1].str() + " is not in the table");
    }
  EXPECT_TRUE(findings.empty()) << ::testing::PrintToString(findings);
}

TEST(Environment, BooleansChoicesSizesAndNumbers) {
  EXPECT_FALSE(environment::flag("FLUX_AUTOCAST_EMULATE"));  // unset: the default
  for (const char* yes : {"1", "true", "TRUE", "On", "on"}) {
    Env e("FLUX_AUTOCAST_EMULATE", yes);
    EXPECT_TRUE(environment::flag("FLUX_AUTOCAST_EMULATE")) << yes;
  }
  for (const char* no : {"0", "false", "False", "OFF"}) {
    Env e("FLUX_AUTOCAST_EMULATE", no);
    EXPECT_FALSE(environment::flag("FLUX_AUTOCAST_EMULATE")) << no;
  }
  {
    Env e("FLUX_LIBRARY_KERNELS", "banana");
    EXPECT_THAT([] { environment::flag("FLUX_LIBRARY_KERNELS"); },
                ::testing::ThrowsMessage<Error>(HasSubstr(
                    "[flux] FLUX_LIBRARY_KERNELS='banana' is not allowed: expected 0, 1, true, false, on, off (default 1)")));
  }
  {
    Env e("FLUX_ONEDNN_THREADING", "banana");
    EXPECT_THAT([] { environment::choice("FLUX_ONEDNN_THREADING"); },
                ::testing::ThrowsMessage<Error>(HasSubstr("FLUX_ONEDNN_THREADING='banana' is not allowed: expected pool, omp (default pool)")));
  }
  {
    Env e("FLUX_ONEDNN_LAYOUT", "plain-src");
    EXPECT_EQ(environment::choice("FLUX_ONEDNN_LAYOUT"), "plain-src");
  }
  EXPECT_EQ(environment::choice("FLUX_ONEDNN_LAYOUT"), "auto");
  {
    Env e("FLUX_ONEDNN_LAYOUT", "Plain");
    EXPECT_THROW(environment::choice("FLUX_ONEDNN_LAYOUT"), Error);
  }
  for (auto [text, want] : std::vector<std::pair<const char*, size_t>>{{"0", 0}, {"512M", size_t(512) << 20}, {"2k", 2048}, {"7", 7}}) {
    Env e("FLUX_CPU_MEMORY_LIMIT", text);
    EXPECT_EQ(environment::bytes("FLUX_CPU_MEMORY_LIMIT"), want) << text;
  }
  for (const char* bad : {"-1", " 5", "5MB", "lots", "99999999999999999999", "20000000000G"}) {
    Env e("FLUX_CPU_MEMORY_LIMIT", bad);
    EXPECT_THAT([] { environment::bytes("FLUX_CPU_MEMORY_LIMIT"); },
                ::testing::ThrowsMessage<Error>(HasSubstr("FLUX_CPU_MEMORY_LIMIT='" + std::string(bad) + "' is not allowed")))
        << bad;
  }
  EXPECT_EQ(environment::positive_number("FLUX_DISTRIBUTED_TIMEOUT", 60), 60);
  for (const char* bad : {"0", "-5", "nan", "inf", "soon"}) {
    Env e("FLUX_DISTRIBUTED_TIMEOUT", bad);
    EXPECT_THROW(environment::positive_number("FLUX_DISTRIBUTED_TIMEOUT", 60), Error) << bad;
  }
  EXPECT_EQ(environment::parse_device_list("0,2"), std::vector<int>({0, 2}));
  EXPECT_EQ(environment::parse_device_list("-1"), std::vector<int>());
  EXPECT_EQ(environment::parse_device_list("1,-1,2"), std::vector<int>({1}));
  EXPECT_EQ(environment::parse_device_list("banana"), std::nullopt);
  EXPECT_EQ(environment::parse_device_list("0,,1"), std::nullopt);
  EXPECT_THROW(environment::value("FLUX_NOT_A_VARIABLE"), Error);
}

}  // namespace
