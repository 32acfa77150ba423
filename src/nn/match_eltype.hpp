// Flux's _match_eltype: a layer with Float32 (or Float16/BFloat16) parameters given Float64 input
// converts the input to its own dtype and warns once per process, as Flux does:
//   ┌ Warning: [Dense] Layer with Float32 parameters got Float64 input. The input will be converted,
//   │ but any earlier layers may be very slow ...
#pragma once
#include <string>

#include "flux/tensor.hpp"

namespace flux::detail {

/// x cast to `weight`'s dtype, with the warning (the first time in the process) naming `layer`.
Tensor convert_f64_input(const char* api, const std::string& layer, const Tensor& weight, const Tensor& x);

/// x itself, or x cast to `weight`'s dtype (with the one warning) when x is Float64 and the layer's
/// parameters are a narrower float type; layer_string(layer) names the layer in the warning.
template <class L> Tensor match_eltype(const char* api, const L& layer, const Tensor& weight, const Tensor& x) {
  if (!x.defined() || !weight.defined() || x.dtype() != DType::f64 || weight.dtype() == DType::f64 ||
      !is_floating(weight.dtype()))
    return x;
  return convert_f64_input(api, layer_string(layer), weight, x);
}

}  // namespace flux::detail
