// Converting Float64 input for narrower layers, with Flux's warning; see match_eltype.hpp.
#include "src/nn/match_eltype.hpp"

#include <atomic>

#include "src/internal.hpp"

namespace flux::detail {

Tensor convert_f64_input(const char* api, const std::string& layer, const Tensor& weight, const Tensor& x) {
  // Flux's @warn ... maxlog=1: the first such input anywhere in the process, whatever the layer.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log_warning_once(std::string("[") + api + "] Layer with " + dtype_name(weight.dtype()) +
                     " parameters got " + dtype_name(x.dtype()) + " input. The input will be converted, but any earlier layers may be "
                     "very slow.\n│   layer = " + layer + "\n│   summary(x) = " + summary(x) +
                     "\n│   (convert the data once with x.f32(), or build the layer with .dtype = Float64; this warning is shown "
                     "once)");
  return x.cast(weight.dtype());
}

}  // namespace flux::detail
