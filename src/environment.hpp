// Every FLUX_* environment variable flux reads, in one table, and the one reader for them. A value
// outside what the table allows is a flux::Error naming the variable, its value and what is allowed;
// the few variables marked `warns` instead log one warning naming the fallback (see the table for
// which and why). Unset or empty means the default. The README's table is tested against this one
// (tests/test_environment.cpp).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "src/environment_flag.hpp"  // parse_flag()

namespace flux::environment {

struct Variable {
  const char* name;           // "FLUX_ONEDNN_THREADING"
  const char* type;           // "boolean", "choice", "size", "integer", "seconds", "path", "paths", "devices"
  const char* allowed;        // "`pool`, `omp`" as the README writes it
  const char* default_value;  // "`pool`"
  const char* description;    // one line
  bool warns;                 // true: an invalid value warns once and falls back instead of throwing
};

/// The table, sorted by name.
const std::vector<Variable>& variables();

/// The variable's value; nullopt when unset or empty. `name` must be in the table.
std::optional<std::string> value(const char* name);
/// A boolean: 0/1/true/false/on/off in any case; unset: the table's default. Invalid: an error, or
/// (a variable marked `warns`) one warning and the default; the same for choice().
bool flag(const char* name);
/// One of the table's allowed words (as written there, without backquotes); unset: the default.
std::string choice(const char* name);
/// Bytes with an optional K, M or G suffix (powers of 1024); unset: 0.
size_t bytes(const char* name);
/// A positive, finite number; unset: `fallback`.
double positive_number(const char* name, double fallback);

/// "FLUX_X='v' is not allowed: expected <allowed> (default <default>)", for errors and warnings.
std::string invalid_message(const char* name, const std::string& value);
/// Throws flux::Error "[flux] " + invalid_message(name, value).
[[noreturn]] void invalid(const char* name, const std::string& value);

/// FLUX_OPENCL_DEVICES's syntax: comma-separated whole numbers; a negative entry ends the list (as
/// CUDA_VISIBLE_DEVICES). nullopt when an entry is not a whole number.
std::optional<std::vector<int>> parse_device_list(const std::string& text);

}  // namespace flux::environment
