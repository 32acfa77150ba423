// Counter-based uniform random numbers on OpenCL devices, bit-identical to every other backend
// (formula in include/flux/backend.hpp; CPU counterpart src/backends/cpu/random.cpp):
//   z = splitmix64(seed + (offset + i) * 0x9E3779B97F4A7C15), element i = (z >> 40) * 2^-24 (Float32)
//   or (z >> 11) * 2^-53 (Float64). Both products are exact, so no rounding mode can change them.
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

const char* const kRandomSource = R"CLC(
inline ulong splitmix64(ulong z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
  return z ^ (z >> 31);
}
// bits: 24 for float, 53 for double (the mantissa width), so (z >> (64 - bits)) is exact in T.
__kernel void random_uniform(__global uchar* dst, ulong dst_off, long n, ulong seed, ulong offset, int bits) {
  __global T* d = AT(T, dst, dst_off);
  const T scale = (T)1 / (T)(1UL << bits);
  GRID_LOOP(i, n) {
    ulong z = splitmix64(seed + (offset + (ulong)i) * 0x9E3779B97F4A7C15UL);
    d[i] = (T)(z >> (64 - bits)) * scale;
  }
}
)CLC";

}  // namespace

void random_uniform(int d, DType t, backend::Buffer dst, int64_t n, uint64_t seed, uint64_t offset) {
  if (t != DType::f32 && t != DType::f64)
    ::flux::detail::fail("[random_uniform] OpenCL kernel supports Float32 and Float64; got ", dtype_name(t));
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "random_uniform");
  if (n <= 0) return;
  auto& k = kernel(dev, "random", kRandomSource, o, "random_uniform");
  launch(dev, k, n, false, mem(dst), off(dst), cl_long(n), cl_ulong(seed), cl_ulong(offset),
         cl_int(t == DType::f32 ? 24 : 53));
}

}  // namespace flux::opencl
