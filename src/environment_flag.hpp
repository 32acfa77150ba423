// How a boolean FLUX_* variable is spelled, header-only (C++17): the CUDA/AMDGPU plugin, built by
// nvcc and hipcc alone and linking nothing from libflux, reads FLUX_DEBUG_BACKENDS with it exactly
// as the core's reader does (src/environment.hpp, whose table lists the variable).
#pragma once
#include <cctype>
#include <optional>
#include <string>

namespace flux::environment {

/// 0/1/true/false/on/off in any case; nullopt for anything else.
inline std::optional<bool> parse_flag(const std::string& text) {
  std::string s = text;
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "on") return true;
  if (s == "0" || s == "false" || s == "off") return false;
  return std::nullopt;
}

}  // namespace flux::environment
