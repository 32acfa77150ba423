// libFuzzer target: the preferences file (LocalPreferences.toml) as get_device reads it and as
// gpu_backend rewrites it. parse() never throws; with_backend() throws flux::Error for text that
// parse() rejects and for text it cannot write back, and what it writes parses back to the backend it set.
#include "flux/error.hpp"
#include "src/device/preferences.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  preferences::Preference p = preferences::parse(text, "fuzz.toml");
  const bool malformed = p.malformed;
  flux_fuzz::check(!malformed || p.warning.find("cannot parse fuzz.toml") != std::string::npos, "a malformed file without its warning");
  flux_fuzz::check(p.backend.empty() || p.warning.empty(), "a backend and a warning at once");
  std::string written;
  try {
    written = preferences::with_backend(text, "fuzz.toml", "OpenCL");
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (!malformed)
      flux_fuzz::check(msg.find("[gpu_backend] cannot rewrite fuzz.toml") == 0, "with_backend refused valid text without saying why");
    return 0;
  }
  flux_fuzz::check(!malformed, "with_backend accepted text that parse() refused");
  preferences::Preference again = preferences::parse(written, "written.toml");
  flux_fuzz::check(again.backend == "OpenCL" && again.warning.empty(), "the rewritten file does not name OpenCL");
  return 0;
}
