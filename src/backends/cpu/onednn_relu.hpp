// relu around oneDNN's kernels, keeping NaN. oneDNN's eltwise_relu post-op with slope 0 is vmaxps(x, 0),
// which returns the 0 for a NaN x: a diverging model's NaNs would vanish inside a fused Conv/Dense +
// relu. So a relu that ends a kernel's work runs after it, on the output while it is in cache
// (relu_rows, unary.cpp: matmul_onednn.cpp's pieces, conv_onednn.cpp's chunks). Only a relu between a
// conv and its residual sum stays a post-op: elu with alpha 0 is x > 0 ? x : 0 * (e^x - 1), x itself
// for x > 0 and for NaN, -0 or +0 otherwise; linear(1, 0) then adds +0, turning -0 into +0. The pair
// is relu exactly (NaN, ±0, ±Inf and subnormals checked in tests/misuse), but costs one exponential
// per element: the post-op made the encoder's FFN GEMM (K 256) 20% slower than relu after it.
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
