// Flux's _match_eltype: a layer with Float32 (or Float16/BFloat16) parameters given Float64 input
// converts the input to its own dtype and warns once per process, as Flux does:
//   ┌ Warning: [Dense] Layer with Float32 parameters got Float64 input. The input will be converted,
//   │ but any earlier layers may be very slow ...
#pragma once
#include <string>

#include "flux/tensor.hpp"
#include "src/autocast.hpp"

namespace flux::detail {

/// x cast to `weight`'s dtype, with the warning (the first time in the process) naming `layer`.
Tensor convert_f64_input(const char* api, const std::string& layer, const Tensor& weight, const Tensor& x);

/// x itself, or x cast to `weight`'s dtype (with the one warning) when both are floating and differ
/// (Float64 data into a Float32 model, Float32 data into a bf16(model)); under autocast only Float64
/// input is converted (autocast decides the rest). layer_string(layer) names the layer in the warning.
template <class L> Tensor match_eltype(const char* api, const L& layer, const Tensor& weight, const Tensor& x) {
  if (!x.defined() || !weight.defined() || x.dtype() == weight.dtype() || !is_floating(weight.dtype()) ||
      !is_floating(x.dtype()))
    return x;
  if (autocast_active() && x.dtype() != DType::f64) return x;
  return convert_f64_input(api, layer_string(layer), weight, x);
}

}  // namespace flux::detail
