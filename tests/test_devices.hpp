// The devices every device-facing test runs on: the CPU, every OpenCL device (PoCL included) and
// every CUDA/AMDGPU device present. FLUX_TEST_DEVICES=CPU,OpenCL:0 restricts the list.
#pragma once
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"

namespace flux::testing {

/// What f throws as a flux::Error, or "no error".
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const flux::Error& e) {
    return e.what();
  }
  return "no error";
}

inline std::vector<Device> all_test_devices() {
  std::vector<Device> out{Device()};
  for (const char* name : {"CUDA", "AMDGPU", "OpenCL"}) {
    if (!functional(name)) continue;
    int n = detail::backend_for(name).device_count();
    for (int i = 0; i < n; ++i) out.emplace_back(name, i);
  }
  if (const char* only = std::getenv("FLUX_TEST_DEVICES"); only && *only) {
    std::vector<Device> kept;
    std::stringstream ss(only);
    std::string item;
    std::vector<std::string> wanted;
    while (std::getline(ss, item, ',')) wanted.push_back(item);
    for (const Device& d : out)
      for (const std::string& w : wanted)
        if (to_string(d) == w || d.backend() == w) kept.push_back(d);
    return kept;
  }
  return out;
}

inline const std::vector<Device>& test_devices() {
  static const std::vector<Device> devices = all_test_devices();
  return devices;
}

/// For INSTANTIATE_TEST_SUITE_P: names like "CPU", "OpenCL_0".
inline std::string device_test_name(const ::testing::TestParamInfo<Device>& info) {
  std::string s = to_string(info.param);
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
}

/// Max relative error of `got` (any device, any float dtype) against a float64 reference vector.
inline double max_rel_error(const Tensor& got, const std::vector<double>& want) {
  std::vector<double> g = got.to_vector<double>();
  if (g.size() != want.size()) return 1e300;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double denom = std::max(1.0, std::abs(want[i]));
    worst = std::max(worst, std::abs(g[i] - want[i]) / denom);
  }
  return worst;
}

}  // namespace flux::testing

/// Instantiates a TEST_P suite over test_devices().
#define FLUX_DEVICE_SUITE(Suite) \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite, ::testing::ValuesIn(::flux::testing::test_devices()), ::flux::testing::device_test_name)
