// LocalPreferences.toml parsing and updating with toml++; see src/device/preferences.hpp.
#include "src/device/preferences.hpp"

#include <algorithm>
#include <sstream>
#include <toml++/toml.h>

#include "flux/device.hpp"
#include "flux/error.hpp"

namespace flux::preferences {

Preference parse(std::string_view text, const std::string& source) {
  Preference out;
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    std::ostringstream os;
    os << "[flux] cannot parse " << source << ": " << err.description() << " (line " << err.source().begin.line
       << "). Ignoring the preference.";
    out.warning = os.str();
    out.malformed = true;
    return out;
  }
  auto node = table["flux"]["gpu_backend"];
  if (!node) return out;
  auto value = node.value<std::string>();
  if (!value || !node.is_string()) {
    std::ostringstream os;
    os << "[flux] " << source << ": gpu_backend must be a string such as \"OpenCL\"; got " << node.type()
       << ". Ignoring the preference.";
    out.warning = os.str();
    return out;
  }
  auto names = supported_devices();
  if (std::find(names.begin(), names.end(), *value) == names.end()) {
    out.warning = "[flux] " + source + ": unknown gpu_backend \"" + *value +
                  "\"; supported are CUDA, AMDGPU, Metal, OpenCL, CPU. Ignoring the preference.";
    return out;
  }
  out.backend = *value;
  return out;
}

std::string with_backend(std::string_view text, const std::string& source, const std::string& name) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    detail::fail("[gpu_backend] cannot parse ", source, ": ", err.description(), "; fix or remove the file");
  }
  if (!table.contains("flux") || !table["flux"].is_table()) table.insert_or_assign("flux", toml::table{});
  table["flux"].as_table()->insert_or_assign("gpu_backend", name);
  std::ostringstream out;
  // Basic (double-quoted) strings, as Preferences.jl writes them: gpu_backend = "OpenCL".
  out << toml::toml_formatter(table, toml::toml_formatter::default_flags & ~toml::format_flags::allow_literal_strings)
      << "\n";
  // toml++ writes some keys it read (a quoted key holding a ' is written as a literal key) in a form
  // it cannot read back (found by tests/fuzz/fuzz_preferences): never replace a file with text that
  // would not give the backend at the next start.
  Preference check = parse(out.str(), source);
  if (check.backend != name)
    detail::fail("[gpu_backend] cannot rewrite ", source, ": its other keys would not be written back as valid TOML (",
                 check.warning, "); set [flux] gpu_backend = \"", name, "\" in it by hand");
  return out.str();
}

}  // namespace flux::preferences
