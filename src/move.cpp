// gpu()/cpu(): the default GPU, chosen once, and the Float64 -> Float32 conversion gpu() applies.
#include <cstdio>

#include "flux/move.hpp"

namespace flux {

namespace detail {
const Device& default_gpu() {
  static const Device d = [] {
    Device dev = get_device();
    if (dev.is_cpu())
      std::fprintf(stderr, "[ Info: The GPU function is being called but no functional GPU backend was found; "
                           "gpu(x) leaves x on the CPU.\n");
    return dev;
  }();
  return d;
}

Tensor to_gpu_tensor(const Tensor& x, const Device& d) {
  if (d.is_cpu()) return x;
  Tensor y = x.dtype() == DType::f64 ? x.cast(DType::f32) : x;
  return to(y, d);
}
}  // namespace detail

}  // namespace flux
