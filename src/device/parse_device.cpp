// Device names as users type them: "OpenCL:0" (to_string's form), case-insensitive backend names.
#include <cctype>
#include <string>

#include "flux/device.hpp"
#include "src/device/parse_device.hpp"
#include "flux/error.hpp"

namespace flux {

namespace detail {
std::string canonical_backend(const std::string& name) {
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const std::string& known : supported_devices())
    if (lower(known) == lower(name)) return known;
  return std::string();
}
}  // namespace detail

Device parse_device(const std::string& spec) {
  const std::string expected = "; expected NAME or NAME:i as to_string prints a device (CPU, OpenCL:0, CUDA:1), with NAME one of "
                               "CUDA, AMDGPU, Metal, OpenCL, CPU (any case)";
  auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  std::string backend = detail::canonical_backend(name);
  if (backend.empty()) detail::fail("[parse_device] unknown backend \"", name, "\" in \"", spec, "\"", expected);
  if (colon == std::string::npos) return backend == "CPU" ? Device() : Device(backend, 0);
  std::string digits = spec.substr(colon + 1);
  bool ok = !digits.empty() && digits.size() <= 6;
  for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c));
  if (!ok) detail::fail("[parse_device] \"", spec, "\": the index after ':' must be a non-negative integer", expected);
  int index = std::stoi(digits);
  if (backend == "CPU" && index != 0) detail::fail("[parse_device] \"", spec, "\": CPU has one device (index 0)");
  return backend == "CPU" ? Device() : Device(backend, index);
}

}  // namespace flux
