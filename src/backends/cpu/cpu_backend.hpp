// The CPU backend, built into libflux. Kernels live one file per family (unary.cpp, binary.cpp, ...),
// mirrored by src/backends/opencl and src/backends/cuda.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "flux/backend.hpp"
#include "src/backends/cpu/kernel_choice.hpp"

namespace flux::cpu_backend {

backend::Backend& instance();

/// Address of a CPU buffer.
inline void* ptr(backend::Buffer b) { return static_cast<char*>(b.handle) + b.offset; }

/// Runs fn(begin, end) over [0, n) on the CPU pool; inline when n < grain (no thread hand-off).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int num_threads();

void fill(DType t, void* dst, int64_t n, double value);
void cast(DType from, const void* src, DType to, void* dst, int64_t n);
/// float32 -> bf16/f16 storage and back (half_cast.cpp, cast's kernels for these pairs): round to
/// nearest even, NaN as src/half_bits.hpp; AVX512-BF16, AVX-512 or AVX2 (+F16C for f16) where the CPU
/// and the active ISA allow, bitwise equal to the scalar references beside them.
void float_to_half_storage(DType to, const float* src, uint16_t* dst, int64_t n);
void half_storage_to_float(DType from, const uint16_t* src, float* dst, int64_t n);
/// `rows` rows of `cols` Float32 (row stride ld) to rows of t (bf16/f16, stride ldd) on this thread, the
/// conversion path chosen once: a kernel's tile of short rows (attention's), each too short to repay a call.
void float_rows_to_half_storage(DType to, const float* src, int64_t ld, uint16_t* dst, int64_t ldd, int64_t rows,
                                int64_t cols);
void float_to_half_storage_reference(DType to, const float* src, uint16_t* dst, int64_t n);
void half_storage_to_float_reference(DType from, const uint16_t* src, float* dst, int64_t n);
/// Tests and benchmarks: whether the vector kernels run for bf16/f16 at the active ISA level.
bool half_cast_vectorised(DType t);
/// The conversion code paths, slowest first (AVX512-BF16 is bf16's float32 -> bf16 only).
enum class HalfCastPath : int { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };
/// The path the conversions of `t` take now; the best this CPU has at the active ISA level.
HalfCastPath half_cast_path(DType t);
HalfCastPath half_cast_best_path(DType t);
/// Tests and benchmarks: the conversions take no path above `cap` (never above the best); returns the old cap.
HalfCastPath cap_half_cast_path(HalfCastPath cap);
const char* half_cast_path_name(HalfCastPath p);
/// unary / binary on bf16/f16 storage in one pass with float32 arithmetic (half_elementwise.cpp): bitwise
/// the cast up, the f32 kernel and the cast down. binary: dense operands of the output's shape, or one
/// of them a single element; comparisons write Bool. false where t is not bf16/f16 or the plan is
/// another broadcast (the caller then runs the three passes).
bool unary_half(backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha);
bool binary_half(backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan);
/// Float32 out = a op b (add, sub) with one dense operand in t (bf16/f16; a when half_first) and the
/// other Float32 (half_elementwise.cpp): bitwise the cast up and the f32 kernel; false for other ops/dtypes.
bool binary_mixed(backend::BinaryOp op, DType t, bool half_first, const void* a, const void* b, float* out, int64_t n);
/// relu's dx = g step(x) on bf16/f16 storage in one pass (half_elementwise.cpp): bitwise the cast up, the
/// f32 unary_backward and the cast down; false for other ops/dtypes.
bool unary_backward_half(backend::UnaryOp op, DType t, const void* x, const void* g, void* dx, int64_t n);
void strided_copy(DType t, const void* src, void* dst, const backend::StridedCopy& plan);
void unary(backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha);
/// relu in place on the calling thread over `rows` rows of `cols` elements `ld` apart, t = f32 or bf16,
/// NaN kept: what a oneDNN matmul or conv output gets after the kernel (onednn_relu.hpp says why).
void relu_rows(DType t, void* y, int64_t rows, int64_t cols, int64_t ld);
void binary(backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan);
void where(DType t, const void* cond, const void* a, const void* b, void* out, const backend::Broadcast& plan);
/// t = bf16/f16 too (reduce_half): the half source is read directly and dst is Float32 (argmax/argmin Int64).
void reduce(backend::ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner);
/// Reductions and (log)softmax over [outer, len, inner] reading bf16/f16 storage directly, blocks
/// converted into float32 in cache (half_cast.cpp's vector code): what CpuBackend::reduce / ::softmax do
/// for t = bf16/f16, which the core asks of the CPU backend alone (backend.hpp asks the others for
/// f32/f64 only). dst is Float32 (argmax/argmin Int64). sum accumulates in float64 (lanes where
/// inner == 1, bitwise the float32 kernel otherwise); max/min/argmax/argmin and (log)softmax are
/// bitwise the float32 kernels on the converted values (max/min of inner == 1 up to the sign of a zero
/// and which NaN). false where t is not bf16/f16.
bool reduce_half(backend::ReduceOp op, DType t, const uint16_t* src, void* dst, int64_t outer, int64_t len,
                 int64_t inner);
bool softmax_half(DType t, const uint16_t* src, float* dst, int64_t outer, int64_t len, int64_t inner, bool log);
void matmul(DType t, const void* a, const void* b, void* c, const backend::Gemm& g);
/// One f32 GEMM C (m, n) = alpha op(A) op(B) + beta C, row-major, on the calling thread by the engine
/// the kernel-choice seam picks for its shape (for kernels that cut their own work over the pool).
void gemm_on_this_thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
/// Fused attention (attention.cpp; backend.hpp's attention_forward/backward): t f32, bf16 or f16,
/// false for other dtypes.
bool attention_forward(DType t, const void* q, const void* k, const void* v, const bool* mask, void* out, float* lse,
                       const backend::Attention& a);
bool attention_backward(DType t, const void* q, const void* k, const void* v, const bool* mask, const void* out,
                        const void* dout, const float* lse, void* dq, void* dk, void* dv, const backend::Attention& a);
/// Backend::matmul_low_precision: bf16 a, b, c through oneDNN's bf16 matmul (float32 accumulation)
/// where bf16_kernels_enabled() (isa.hpp); false where not, or where oneDNN declines (C untouched).
/// float32_c: C is Float32, the accumulation written unrounded (matmul_low_precision_float32).
bool matmul_low_precision(DType t, const void* a, const void* b, void* c, const backend::Gemm& g, bool float32_c = false);
/// Inference y (n, out) = relu?(x (n, in) w^T + bias) with w prepared for the kernel the seam chooses
/// and kept in `cache` (Backend::linear_forward, matmul.cpp); false where the GEMM path runs instead.
/// t = bf16 (every array bf16): oneDNN's bf16 matmul where bf16_kernels_enabled(), else false.
bool linear_forward(DType t, const void* x, const void* w, backend::PreparedCache* cache, const void* bias, void* y,
                    int64_t n, int64_t in, int64_t out, bool relu);
/// Tests and benchmarks: float32 GEMM/GEMV library calls run so far by `engine` (openblas or onednn;
/// linear_forward's prepared-weight kernels not included).
int64_t gemm_engine_calls(Kernel engine);
/// Tests: the kernel linear_forward runs for this call shape at the present thread count.
Kernel linear_kernel(int64_t n, int64_t in, int64_t out, bool bias, bool relu);
/// linear_forward's panel kernel for other kernels (matmul_own.cpp): w (out, in) packed into
/// panel_floats(in, out) floats of 16-output panels; y (n, out) = x (n, in) w^T on the calling thread.
size_t panel_floats(int64_t in, int64_t out);
void panel_pack(const float* w, int64_t in, int64_t out, float* to);
void panel_product(const float* x, int64_t n, int64_t in, const float* panels, int64_t out, float* y);
/// t = bf16/f16 too (softmax_half): dst is Float32.
void softmax(DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log);
/// Fused backward passes (backend.hpp's unary_backward, softmax_backward): f32/f64 (softmax: inner == 1
/// rows; unary_backward_half: relu on bf16/f16), false otherwise.
bool unary_backward(backend::UnaryOp op, DType t, const void* x, const void* g, void* dx, int64_t n);
bool softmax_backward(DType t, const void* y, const void* g, void* dx, int64_t outer, int64_t len, int64_t inner,
                      bool log);
void gather(DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void scatter_add(DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx);
void adam_step(DType t, void* x, const void* g, void* m, void* v, int64_t n, const backend::AdamStep& s);
/// Loss scaling (optimiser.cpp, Backend::unscale_and_check): out = g * inv_scale; *found = 1 when a
/// result is not finite. f16/bf16/f32/f64.
bool unscale_and_check(DType t, const void* g, void* out, int64_t n, double inv_scale, float* found);
/// n counter-based uniforms in [0, 1) (random.cpp), exactly backend.hpp's formula; f32 or f64.
void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset);
/// Fused batch normalisation over (n, c, s) (normalisation.cpp); null weight/bias/dweight/dbias: none.
bool batchnorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* var,
                       int64_t n, int64_t c, int64_t s, double eps);
bool batchnorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* var,
                        void* dx, void* dweight, void* dbias, int64_t n, int64_t c, int64_t s, double eps);
bool channel_affine(DType t, const void* x, const void* scale, const void* shift, void* y, int64_t n, int64_t c,
                    int64_t s);
/// batchnorm_bf16.cpp: the bf16 training forward / backward (s > 1) read and written as bf16 with AVX-512,
/// bitwise the float32 kernel on the widened values; available where the bf16 casts run at AVX-512 or above.
bool batchnorm_bf16_avx512_available();
void batchnorm_forward_bf16_avx512(const uint16_t* x, const float* weight, const float* bias, uint16_t* y, float* mean,
                                   float* var, int64_t n, int64_t c, int64_t s, double eps);
void batchnorm_backward_bf16_avx512(const uint16_t* x, const uint16_t* dy, const float* weight, const float* mean,
                                    const float* var, uint16_t* dx, float* dweight, float* dbias, int64_t n, int64_t c,
                                    int64_t s, double eps);
// Convolution. conv_reference.cpp: the portable path's primitives.
void im2col(DType t, const void* x, void* col, const backend::ConvGeometry& g);
void col2im(DType t, const void* col, void* dx, const backend::ConvGeometry& g);
// conv.cpp: the library kernels, chosen per geometry (false: none takes the case; the core's portable
// path runs). y = relu?(conv(x, w) + bias); null bias: none. t = bf16 (every array bf16): oneDNN's
// bf16 kernels where bf16_kernels_enabled() (isa.hpp), else false.
bool conv_forward(DType t, void* x, void* w, void* bias, void* y, const backend::ConvGeometry& g, bool relu = false);
/// Inference: y = relu_after?(relu?(conv(x, w) * scale + shift) + residual) (Backend::conv_forward_affine).
bool conv_forward_affine(DType t, void* x, void* w, void* scale, void* shift, void* residual, void* y,
                         const backend::ConvGeometry& g, bool relu, bool relu_after);
bool conv_backward_data(DType t, void* dy, void* w, void* dx, const backend::ConvGeometry& g);
/// float32_grads (t = f16/bf16): dw and dbias are Float32 arrays (Backend::conv_backward_weight_float32).
bool conv_backward_weight(DType t, void* x, void* dy, void* dw, void* dbias, const backend::ConvGeometry& g,
                          bool float32_grads = false);
/// Tests: the kernel a forward of g runs (affine: conv_forward_affine's); Kernel(-1) where none takes it.
Kernel conv_forward_kernel(const backend::ConvGeometry& g, bool affine);

/// What a conv call computes: forward (y = conv(x, w) then its epilogue), forward_relu (the same with
/// relu(conv + bias) in one oneDNN post-op), forward_affine (the fused inference conv + BatchNorm
/// (+ residual) of conv_forward_affine), backward_data, backward_weight.
enum class ConvKind : int64_t { forward, forward_relu, forward_affine, backward_data, backward_weight };
/// The arrays of one conv call, by name (null: not part of the call): forwards read x, w and write y;
/// backward_data reads dy, w and writes dx; backward_weight reads x, dy and writes dw and dbias
/// (null: no bias). A forward's other arrays are its epilogue's.
struct ConvArrays {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* dy = nullptr;
  void* dx = nullptr;
  void* dw = nullptr;
  void* dbias = nullptr;
  bool float32_grads = false;  // backward_weight at f16/bf16: dw, dbias are Float32 (not rounded to t)
};
/// What a forward does to conv(x, w) before y is written, the one description every forward kernel
/// reads: y = relu_after?(relu?(conv(x, w) * scale + shift) + residual).
///   scale (O,) float32, null: 1 (forward_affine: the folded BatchNorm's scale);
///   shift (O,), null: none: the conv's bias (the activations' dtype) or forward_affine's shift (float32);
///   residual (y's shape and dtype), null: none. relu, residual and relu_after: forward_affine only;
///   forward_relu sets relu.
struct ConvEpilogue {
  const void* scale = nullptr;
  const void* shift = nullptr;
  bool relu = false;
  const void* residual = nullptr;
  bool relu_after = false;
};
/// oneDNN's convolution (conv_onednn.cpp); false where oneDNN declines the case or is not built in.
/// dt f32, or bf16 (activations, weights, bias and gradients bf16; a forward_affine's scale and shift
/// float32), float32 accumulation.
bool onednn_conv(ConvKind kind, const backend::ConvGeometry& g, const ConvArrays& a, const ConvEpilogue& ep = {},
                 DType dt = DType::f32);
/// flux's few-pixel forward (conv_own.cpp), float32: dense, C / G * prod(kernel) >= 64, at most 32
/// output pixels over the batch.
bool few_pixel_fits(const backend::ConvGeometry& g);
void few_pixel_forward(const float* x, const float* w, const backend::ConvGeometry& g, const ConvEpilogue& ep,
                       float* y);
/// Winograd F(2x2, 3x3) forwards (winograd.cpp), float32: 2-D, 3x3, stride 1, no dilation or groups,
/// channels multiples of 8 (16 and up). The transformed weights are kept in g.weight_cache (null: made
/// for the call).
bool winograd_fits(const backend::ConvGeometry& g);
void winograd_forward(const float* x, const float* w, const backend::ConvGeometry& g, const ConvEpilogue& ep,
                      float* y);
/// Pooling over (N, C, spatial...) (pooling.cpp): y from x; dx (pre-filled) += the adjoint of dy.
void pool_forward(backend::PoolOp op, DType t, const void* x, void* y, const backend::ConvGeometry& g);
void pool_backward(backend::PoolOp op, DType t, const void* x, const void* y, const void* dy, void* dx,
                   const backend::ConvGeometry& g);

/// Fused row normalisation (normalisation.cpp), formulas in backend.hpp; f32/f64, false otherwise.
bool rownorm_forward(DType t, const void* x, const void* weight, const void* bias, void* y, void* mean, void* rstd,
                     int64_t r, int64_t d, double eps);
/// rownorm_forward in Float32 that also rounds each block of y's rows to `low` (bf16/f16) into y_low.
bool rownorm_forward_cast(const void* x, const void* weight, const void* bias, void* y, DType low, void* y_low,
                          void* mean, void* rstd, int64_t r, int64_t d, double eps);
bool rownorm_backward(DType t, const void* x, const void* dy, const void* weight, const void* mean, const void* rstd,
                      void* dx, void* dweight, void* dbias, int64_t r, int64_t d);
/// One fused recurrent step (recurrent.cpp), formulas in backend.hpp; f32/f64, false otherwise.
bool recurrent_forward(backend::RecurrentCell cell, DType t, const void* xg, const void* hg, const void* b_hh,
                       const void* h_prev, const void* c_prev, void* h, void* c, void* saved, int64_t n, int64_t hidden);
bool recurrent_backward(backend::RecurrentCell cell, DType t, const void* dy, void* dh_next, void* dc, const void* saved,
                        const void* c_prev, const void* c, const void* h_prev, const void* h, void* dxg, void* dhg,
                        int64_t n, int64_t hidden);

}  // namespace flux::cpu_backend

// Calls BODY with `using T = <C++ type>` for the arithmetic dtypes; errors for others.
#define FLUX_CPU_DISPATCH(api, dtype, ...)                                                   \
  switch (dtype) {                                                                          \
    case ::flux::DType::f32: { using T = float; __VA_ARGS__; } break;                       \
    case ::flux::DType::f64: { using T = double; __VA_ARGS__; } break;                      \
    case ::flux::DType::i32: { using T = int32_t; __VA_ARGS__; } break;                     \
    case ::flux::DType::i64: { using T = int64_t; __VA_ARGS__; } break;                     \
    case ::flux::DType::u8: case ::flux::DType::boolean: { using T = uint8_t; __VA_ARGS__; } break; \
    default: ::flux::detail::fail("[", api, "] CPU kernel does not support ", ::flux::dtype_name(dtype)); \
  }
