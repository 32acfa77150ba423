// relu as a oneDNN post-op that keeps NaN (conv_onednn.cpp, matmul_onednn.cpp). oneDNN's eltwise_relu with slope 0 is
// vmaxps(x, 0), which returns the 0 for a NaN x: a diverging model's NaNs would vanish inside a fused
// Conv/Dense + relu. elu with alpha 0 is x > 0 ? x : 0 * (e^x - 1): x itself for x > 0 and for NaN,
// -0 or +0 otherwise; linear(1, 0) then adds +0, turning -0 into +0. The pair is relu exactly (NaN,
// ±0, ±Inf and subnormals checked in tests/misuse), for one exponential per element in the post-op.
#pragma once
#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

namespace flux::cpu_backend {

inline void append_relu_keeping_nan(dnnl::post_ops& ops) {
  ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_elu, 0.0f, 0.0f);
  ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, 1.0f, 0.0f);
}

}  // namespace flux::cpu_backend
#endif
