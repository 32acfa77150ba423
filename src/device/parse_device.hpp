// Backend-name canonicalisation shared by get_device, gpu_backend, loaded and functional.
#pragma once
#include <string>

namespace flux::detail {
/// The supported_devices() spelling of `name` compared case-insensitively ("opencl" -> "OpenCL"),
/// or "" when it is none of them.
std::string canonical_backend(const std::string& name);
}  // namespace flux::detail
