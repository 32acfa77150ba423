// The preferences file (LocalPreferences.toml, as Preferences.jl writes it) as text, apart from the
// file system and device.cpp's process-wide state, so that the parser can be fuzzed (tests/fuzz).
#pragma once
#include <string>
#include <string_view>

namespace flux::preferences {

/// What a preferences file says: `backend` is empty when it names none (or none valid), and
/// `warning` then says why for a malformed file or an unknown name (empty when there is nothing to say).
struct Preference {
  std::string backend;
  std::string warning;
  bool malformed = false;  // the text is not valid TOML (with_backend refuses it too)
};

/// Reads `[flux] gpu_backend` from `text`, which came from `source` (a path, for messages). Never
/// throws for any text: a malformed file or an unknown backend name gives an empty backend and a warning.
Preference parse(std::string_view text, const std::string& source);

/// `text` (possibly empty) with `[flux] gpu_backend = "<name>"` set and every other key kept, in
/// Preferences.jl's basic-string style. Throws flux::Error "[gpu_backend] cannot parse <source>: ..."
/// when `text` is not valid TOML, and "[gpu_backend] cannot rewrite <source>: ..." when the rewritten
/// text would not parse back to `name` (toml++ cannot write some keys it reads).
std::string with_backend(std::string_view text, const std::string& source, const std::string& name);

}  // namespace flux::preferences
