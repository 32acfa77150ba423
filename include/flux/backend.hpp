// The plugin contract between libflux and a backend (CPU built in; OpenCL, CUDA, AMDGPU as plugins).
// Internal: users never include this. Bump kBackendAbiVersion whenever anything here changes.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "flux/dtype.hpp"
#include "flux/error.hpp"  // detail::fail, used by every backend

namespace flux::backend {

inline constexpr int kBackendAbiVersion = 14;
inline constexpr int kMaxDims = 8;

/// A backend memory handle plus a byte offset into it (cl_mem cannot be offset like a pointer).
struct Buffer {
  void* handle = nullptr;
  size_t offset = 0;
};

struct MemoryInfo {
  size_t used = 0;      // bytes held by live tensors
  size_t reserved = 0;  // bytes held by the caching pool (used + cached)
  size_t free = 0;      // device free memory as the driver reports it
  size_t total = 0;     // device total memory
};

enum class UnaryOp : uint8_t {
  neg, exp, log, sqrt, abs, tanh, sigmoid, relu, leakyrelu, elu, gelu, softplus, swish,
  sign, square, reciprocal, sin, cos, log1p, step,  // step(x) = x > 0 ? 1 : 0
  erf  // the error function (ONNX Erf, PyTorch's exact GELU)
};
enum class BinaryOp : uint8_t { add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge };
enum class ReduceOp : uint8_t { sum, max, min, argmax, argmin };

/// Element strides (0 on broadcast axes) of up to three operands over one output shape.
struct Broadcast {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};  // operand 0, 1, 2 (a, b, c / cond, a, b)
  bool contiguous = false;           // all operands have the output's shape: a flat loop suffices
};

/// Scaled dot-product attention over two leading axes (b0, b1) (N, H): q (b0, b1, tq, d), k (b0, b1, tk, d),
/// v (b0, b1, tk, dv), out (b0, b1, tq, dv) at the element strides below over (b0, b1, row), each row
/// contiguous (a head's columns inside (N, T, H * d) rows, or a contiguous (..., T, d)); dout is laid
/// out as out, dq, dk, dv as q, k, v (in arrays of their own); lse (b0, b1, tq) is contiguous. Key j is
/// visible to query i when mask[b0, b1, i, j] (Bool at mask_stride, 0 on broadcast axes; a null
/// handle: no mask) and, when causal, j <= i + (tk - tq) (causal_mask's alignment).
struct Attention {
  int64_t b0 = 1, b1 = 1, tq = 0, tk = 0, d = 0, dv = 0;
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};  // (b0, b1, row)
  int64_t mask_stride[4] = {};                                                     // (b0, b1, row, column)
  bool causal = false;
  double scale = 1.0;
};

/// Batched row-major C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]; strides in elements (0 broadcasts).
struct Gemm {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
};

/// A general strided copy: dst[i...] = src[i...] over `shape`, strides in elements.
struct StridedCopy {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src_stride[kMaxDims] = {};
  int64_t dst_stride[kMaxDims] = {};
};

/// One fused Adam/AdamW step on n elements: m, v, x updated in place.
struct AdamStep {
  double lr, beta1, beta2, eps, weight_decay;  // weight_decay: decoupled (AdamW), 0 for Adam
  double bias1, bias2;                         // 1 - beta1^t, 1 - beta2^t
};

/// Data a backend derives from a weight tensor's content (e.g. the weights reordered into its kernel's
/// layout): immutable once made, shared by every thread that runs the layer.
struct Prepared {
  virtual ~Prepared() = default;
};
/// The backend's name for one Prepared of a weight tensor (what it is for: kernel, shape, offset...);
/// key[0] >= 0 (negative first entries are the core's own).
using PreparedKey = std::array<int64_t, 40>;
/// The cache the core keeps with each weight tensor's storage for the backends. The core empties it
/// on every write to the storage (the library's in-place ops, optimiser steps, loading, and any call of
/// the public Tensor::buffer()), so an entry found is always of the current content; what to keep and
/// under which key is the backend's own business. Thread-safe; lookups do not wait for each other.
class PreparedCache {
 public:
  virtual std::shared_ptr<const Prepared> find(const PreparedKey& key) = 0;
  /// Keeps `p` under `key` (a few entries per tensor: the oldest goes first).
  virtual void insert(const PreparedKey& key, std::shared_ptr<const Prepared> p) = 0;

 protected:
  ~PreparedCache() = default;
};

/// Geometry of an N-d convolution or pooling window over (N, C, spatial...) activations, N = 1..3
/// spatial axes (row-major: for 2-D, axis 0 is H and axis 1 is W). Unused trailing axes are 1/0.
/// conv: x (batch, in_channels, in...), w (out_channels, in_channels / groups, kernel...),
///       y (batch, out_channels, out...); out = (in + pad_lo + pad_hi - dilation (kernel - 1) - 1) / stride + 1.
/// pool: in_channels == out_channels, groups = 1; padding never counts as a maximum.
struct ConvGeometry {
  int spatial = 2;
  int64_t batch = 0, in_channels = 0, out_channels = 0, groups = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, pad_lo[3] = {0, 0, 0}, pad_hi[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  /// Forward convs: the weights' prepared-data cache (null: none; see PreparedCache).
  PreparedCache* weight_cache = nullptr;
  /// A forward at inference (nothing recorded; the weights do not change between calls): the backend
  /// may choose kernels that repay their weight preparation only over several calls.
  bool inference = false;
};

/// Pooling kinds. mean divides by the full window size, padding included (NNlib's meanpool and
/// PyTorch's count_include_pad = true).
enum class PoolOp : uint8_t { max, mean };

/// Recurrent cells with a fused per-step kernel (PyTorch's gate order and formulas).
enum class RecurrentCell : uint8_t { lstm, gru, rnn_tanh, rnn_relu };

/// Whether a device computes a low-precision dtype (f16/bf16) in hardware units, and which.
struct LowPrecisionSupport {
  bool units = false;   // tensor cores, AVX512-BF16/AMX-BF16/AVX512-FP16, cl_khr_fp16
  std::string detail;   // the units found, or what is missing (autocast's warning, versioninfo)
};

/// Every backend implements this. Arithmetic kernels must support f32, f64, i32, i64, u8 and boolean
/// where meaningful; f16/bf16 only need fill/cast/copy (ops compute them through f32). Low precision
/// in hardware is opt-in per kernel: matmul_low_precision, and the library fast paths below
/// (linear_forward, conv_forward*, conv_backward_*) may be called with t = f16/bf16 (every array of
/// that dtype, float32 accumulation inside) and return false where they have no such kernel; the core
/// then computes through float32 and rounds the result to t. A backend whose reads_half_storage says
/// so is also handed f16/bf16 storage by the kernels that name it below.
/// All calls are asynchronous with respect to the host except copy_to_host and synchronize.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;       // "CPU", "OpenCL", "CUDA", "AMDGPU"
  virtual int device_count() = 0;             // 0 when not functional
  virtual std::string device_name(int device) = 0;
  virtual bool device_is_cpu(int device) = 0; // e.g. PoCL: skipped by automatic selection
  virtual std::string version_info() = 0;     // driver/runtime/library versions, one or more lines
  virtual MemoryInfo memory(int device) = 0;
  virtual std::string not_functional_reason() { return {}; }

  virtual Buffer allocate(int device, size_t bytes) = 0;
  virtual void deallocate(int device, Buffer buffer, size_t bytes) = 0;
  virtual void release_cache(int device) = 0;
  virtual void copy_from_host(int device, Buffer dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(int device, void* dst, Buffer src, size_t bytes) = 0;  // blocking
  virtual void copy(int device, Buffer dst, Buffer src, size_t bytes) = 0;
  /// Device-to-device between two devices of this backend; false = not possible, core stages via host.
  virtual bool copy_peer(int dst_device, Buffer dst, int src_device, Buffer src, size_t bytes) = 0;
  virtual void synchronize(int device) = 0;
  /// Whether this device's reduce and softmax (Float32 output), pool_forward/pool_backward, the
  /// batch/row normalisation and channel_affine kernels and unary_half/binary_half take f16/bf16
  /// storage (Float32 arithmetic, bitwise the Float32 kernel on the input cast up; those returning bool
  /// may still decline a case): the core hands such a backend half tensors as they are, and the others
  /// Float32 copies, without calling their half kernels.
  virtual bool reads_half_storage(int device) {
    (void)device;
    return false;
  }

  virtual void fill(int device, DType t, Buffer dst, int64_t n, double value) = 0;
  virtual void cast(int device, DType from, Buffer src, DType to, Buffer dst, int64_t n) = 0;
  virtual void strided_copy(int device, DType t, Buffer src, Buffer dst, const StridedCopy& plan) = 0;
  virtual void unary(int device, UnaryOp op, DType t, Buffer src, Buffer dst, int64_t n, double alpha) = 0;
  /// out dtype is `t` for arithmetic ops and boolean for comparisons.
  virtual void binary(int device, BinaryOp op, DType t, Buffer a, Buffer b, Buffer out,
                      const Broadcast& plan) = 0;
  /// out = cond ? a : b; cond boolean, a/b/out of dtype t.
  virtual void where(int device, DType t, Buffer cond, Buffer a, Buffer b, Buffer out,
                     const Broadcast& plan) = 0;
  /// Reduce the middle axis of a [outer, len, inner] view; argmax/argmin write int64.
  virtual void reduce(int device, ReduceOp op, DType t, Buffer src, Buffer dst, int64_t outer,
                      int64_t len, int64_t inner) = 0;
  virtual void matmul(int device, DType t, Buffer a, Buffer b, Buffer c, const Gemm& g) = 0;
  /// matmul for t = f16/bf16 (a, b, c of dtype t) with float32 accumulation (cublasGemmEx with
  /// CUBLAS_COMPUTE_32F, oneDNN's bf16 matmul); false: the core computes through float32.
  virtual bool matmul_low_precision(int device, DType t, Buffer a, Buffer b, Buffer c, const Gemm& g) {
    (void)device, (void)t, (void)a, (void)b, (void)c, (void)g;
    return false;
  }
  /// matmul_low_precision with C Float32 (a, b of dtype t = f16/bf16): the float32 accumulation written
  /// as it is, not rounded to t (a weight gradient on its way to a Float32 master weight). false: not
  /// offered (the core computes C in t).
  virtual bool matmul_low_precision_float32(int device, DType t, Buffer a, Buffer b, Buffer c, const Gemm& g) {
    (void)device, (void)t, (void)a, (void)b, (void)c, (void)g;
    return false;
  }
  /// See LowPrecisionSupport. The CPU backend's answer decides autocast there: without units it warns
  /// once and computes in float32 (never silently slower than float32).
  virtual LowPrecisionSupport low_precision_support(int device, DType t) {
    (void)device, (void)t;
    return {false, "no low-precision units known to this backend"};
  }
  /// (log)softmax over the middle axis of [outer, len, inner].
  virtual void softmax(int device, DType t, Buffer src, Buffer dst, int64_t outer, int64_t len,
                       int64_t inner, bool log) = 0;
  /// dst[o, j, i] = src[o, idx[j], i] for [outer, len, inner] src and nidx int64 indices.
  virtual void gather(int device, DType t, Buffer src, Buffer idx, Buffer dst, int64_t outer,
                      int64_t len, int64_t inner, int64_t nidx) = 0;
  /// dst[o, idx[j], i] += src[o, j, i] (dst pre-filled by the caller).
  virtual void scatter_add(int device, DType t, Buffer src, Buffer idx, Buffer dst, int64_t outer,
                           int64_t len, int64_t inner, int64_t nidx) = 0;
  virtual void adam_step(int device, DType t, Buffer x, Buffer grad, Buffer m, Buffer v, int64_t n,
                         const AdamStep& step) = 0;

  // ---- convolution, pooling, random (src/backends/<name>/conv, pooling, random) ----
  /// col (batch, groups, (in_channels / groups) * prod(kernel), prod(out)) from x (batch, in_channels,
  /// in...): col[n, g, (c, k...), (o...)] = x[n, g * C/g + c, o * stride - pad_lo + k * dilation], 0 outside.
  virtual void im2col(int device, DType t, Buffer x, Buffer col, const ConvGeometry& g) = 0;
  /// The adjoint of im2col: dx (pre-filled by the caller) += the columns summed back into place.
  virtual void col2im(int device, DType t, Buffer col, Buffer dx, const ConvGeometry& g) = 0;
  /// y (batch, C, out...) from x (batch, C, in...) over each window. f32/f64 (and f16/bf16 where
  /// reads_half_storage).
  virtual void pool_forward(int device, PoolOp op, DType t, Buffer x, Buffer y, const ConvGeometry& g) = 0;
  /// dx (pre-filled by the caller) += the pooling adjoint of dy; max sends each window's gradient to
  /// the first position (in window order) that holds the maximum y.
  virtual void pool_backward(int device, PoolOp op, DType t, Buffer x, Buffer y, Buffer dy, Buffer dx,
                             const ConvGeometry& g) = 0;
  /// n uniform values in [0, 1) of float dtype t (f32 or f64), counter-based and identical on every
  /// backend: with z = splitmix64(seed + (offset + i) * 0x9E3779B97F4A7C15), element i is
  /// (z >> 40) * 2^-24 for f32 and (z >> 11) * 2^-53 for f64, where splitmix64(z) is
  ///   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^ (z >> 31).
  virtual void random_uniform(int device, DType t, Buffer dst, int64_t n, uint64_t seed, uint64_t offset) = 0;

  // ---- batch normalisation fast paths (src/backends/<name>/normalisation); false = the core composes
  // portable ops. x, y, dy, dx are (n, c, s) row-major of dtype t (f32/f64); per-channel arrays (c,) of
  // dtype t; a weight/bias/dweight/dbias handle of nullptr means none (weight 1, bias 0, not wanted).
  // t = bf16/f16 (autocast): x, y, dy, dx of dtype t and every per-channel array Float32, Float32
  // arithmetic (bitwise the Float32 kernel on x cast up, its result cast down); false where not offered. ----
  /// Training forward: mean[c] and biased var[c] over n and s, then
  /// y = (x - mean) / sqrt(var + eps) * weight + bias.
  virtual bool batchnorm_forward(int device, DType t, Buffer x, Buffer weight, Buffer bias, Buffer y, Buffer mean,
                                 Buffer var, int64_t n, int64_t c, int64_t s, double eps) {
    (void)device, (void)t, (void)x, (void)weight, (void)bias, (void)y, (void)mean, (void)var, (void)n, (void)c,
        (void)s, (void)eps;
    return false;
  }
  /// Its adjoint, overwriting dx, dweight = Σ dy (x - mean) / sqrt(var + eps) and dbias = Σ dy; with
  /// m = n s, inv = 1 / sqrt(var + eps), a = weight inv:
  /// dx = a dy - a Σdy / m - (x - mean) a inv² Σ(dy (x - mean)) / m.
  virtual bool batchnorm_backward(int device, DType t, Buffer x, Buffer dy, Buffer weight, Buffer mean, Buffer var,
                                  Buffer dx, Buffer dweight, Buffer dbias, int64_t n, int64_t c, int64_t s, double eps) {
    (void)device, (void)t, (void)x, (void)dy, (void)weight, (void)mean, (void)var, (void)dx, (void)dweight,
        (void)dbias, (void)n, (void)c, (void)s, (void)eps;
    return false;
  }

  /// Inference (running statistics folded into per-channel scale and shift): y = x * scale + shift.
  virtual bool channel_affine(int device, DType t, Buffer x, Buffer scale, Buffer shift, Buffer y, int64_t n,
                              int64_t c, int64_t s) {
    (void)device, (void)t, (void)x, (void)scale, (void)shift, (void)y, (void)n, (void)c, (void)s;
    return false;
  }

  // ---- row normalisation, fused (layernorm over the last axis; groupnorm's (N * G) groups as rows;
  // src/backends/<name>/normalisation); false = the core composes portable ops. x, y, dy, dx are (r, d)
  // row-major of dtype t (f32/f64); weight, bias, dweight, dbias (d,) of dtype t, a null handle = none
  // (weight 1, bias 0, not wanted); mean, rstd (r,) of dtype t. Statistics are accumulated in float64.
  // t = bf16/f16: x, y, dy, dx of dtype t, the other arrays Float32, as batch normalisation above. ----
  /// mean[i] and rstd[i] = 1 / sqrt(var[i] + eps) of row i (biased var), y = (x - mean) rstd weight + bias.
  virtual bool rownorm_forward(int device, DType t, Buffer x, Buffer weight, Buffer bias, Buffer y, Buffer mean,
                               Buffer rstd, int64_t r, int64_t d, double eps) {
    (void)device, (void)t, (void)x, (void)weight, (void)bias, (void)y, (void)mean, (void)rstd, (void)r, (void)d,
        (void)eps;
    return false;
  }
  /// rownorm_forward for t = Float32 that also writes y rounded to `low` (f16/bf16, as cast rounds it)
  /// into y_low, each block of rows while it is in cache: LayerNorm under autocast, whose next op (a
  /// Dense, attention's projections) reads y in the low dtype. false = not offered (the core casts).
  virtual bool rownorm_forward_cast(int device, Buffer x, Buffer weight, Buffer bias, Buffer y, DType low, Buffer y_low,
                                    Buffer mean, Buffer rstd, int64_t r, int64_t d, double eps) {
    (void)device, (void)x, (void)weight, (void)bias, (void)y, (void)low, (void)y_low, (void)mean, (void)rstd, (void)r,
        (void)d, (void)eps;
    return false;
  }
  /// Its adjoint, with x̂ = (x - mean) rstd and g = dy weight, means over the row's d values:
  /// dx = rstd (g - mean(g) - x̂ mean(g x̂)), overwritten; dweight = Σ_rows dy x̂, dbias = Σ_rows dy.
  virtual bool rownorm_backward(int device, DType t, Buffer x, Buffer dy, Buffer weight, Buffer mean, Buffer rstd,
                                Buffer dx, Buffer dweight, Buffer dbias, int64_t r, int64_t d) {
    (void)device, (void)t, (void)x, (void)dy, (void)weight, (void)mean, (void)rstd, (void)dx, (void)dweight,
        (void)dbias, (void)r, (void)d;
    return false;
  }

  // ---- fused backward passes of elementwise and softmax ops (src/backends/<name>/unary, softmax);
  // false = the core composes portable ops. dtype t is f32 or f64; arrays contiguous. ----
  /// dx = g f'(x) over n elements for op relu (g · step(x), step as UnaryOp::step: NaN where x is NaN),
  /// gelu (tanh form; with u2 = 2 sqrt(2/pi) x (1 + 0.044715 x²), s = σ(u2): s + x s σ(-u2) 2 sqrt(2/pi)
  /// (1 + 3 · 0.044715 x²)) or swish (s = σ(x): s + x s σ(-x)). relu may also get t = bf16/f16: the
  /// product in Float32 rounded once, bitwise the step and product passes it replaces.
  virtual bool unary_backward(int device, UnaryOp op, DType t, Buffer x, Buffer g, Buffer dx, int64_t n) {
    (void)device, (void)op, (void)t, (void)x, (void)g, (void)dx, (void)n;
    return false;
  }
  /// The adjoint of (log)softmax over the middle axis of [outer, len, inner] from its output y and the
  /// output gradient g, overwriting dx: softmax dx = y (g - Σ_j g y); logsoftmax dx = g - exp(y) Σ_j g.
  virtual bool softmax_backward(int device, DType t, Buffer y, Buffer g, Buffer dx, int64_t outer, int64_t len,
                                int64_t inner, bool log) {
    (void)device, (void)t, (void)y, (void)g, (void)dx, (void)outer, (void)len, (void)inner, (void)log;
    return false;
  }

  // ---- recurrent cells, one time step fused (src/backends/<name>/recurrent); false = the core composes
  // portable ops. dtype t is f32 or f64; every array is row-major with n rows (the batch); H = hidden
  // units; G gate columns: LSTM 4H (i, f, g, o), GRU 3H (r, z, n), RNN H. b_hh (G,) may be null (0).
  //   LSTM: [i f g o] = [σ σ tanh σ](xg + hg + b_hh); c = f c_prev + i g; h = o tanh(c);
  //         saved (n, 4H) = [i f g o].
  //   GRU:  [r z] = σ(xg_rz + hg_rz + b_hh_rz); hn = hg_n + b_hh_n; nn = tanh(xg_n + r hn);
  //         h = (1 - z) nn + z h_prev; saved (n, 4H) = [r z nn hn].
  //   RNN:  h = act(xg + hg + b_hh) (tanh or relu); saved, c_prev, c unused (null). ----
  /// Forward of one step: xg (n, G) = x W_ihᵀ + b_ih, hg (n, G) = h_prev W_hhᵀ; writes h (n, H),
  /// c (n, H) (LSTM) and saved.
  virtual bool recurrent_forward(int device, RecurrentCell cell, DType t, Buffer xg, Buffer hg, Buffer b_hh,
                                 Buffer h_prev, Buffer c_prev, Buffer h, Buffer c, Buffer saved, int64_t n,
                                 int64_t hidden) {
    (void)device, (void)cell, (void)t, (void)xg, (void)hg, (void)b_hh, (void)h_prev, (void)c_prev, (void)h, (void)c,
        (void)saved, (void)n, (void)hidden;
    return false;
  }
  /// Backward of one step. The gradient into h is dh = dy + dh_next (both (n, H)); dc (n, H, LSTM)
  /// holds the gradient into c on entry and into c_prev on return. Writes dxg (n, G), the gradient of
  /// the gate pre-activations on the input side; dhg (n, G, GRU only; null otherwise, where it equals
  /// dxg) that on the recurrent side (the n block is dxg_n * r); and overwrites dh_next with the direct
  /// part of the gradient into h_prev (GRU: z dh; LSTM, RNN: 0); the core then adds dhg W_hh.
  /// LSTM reads saved, c_prev, c; GRU saved, h_prev; RNN h.
  virtual bool recurrent_backward(int device, RecurrentCell cell, DType t, Buffer dy, Buffer dh_next, Buffer dc,
                                  Buffer saved, Buffer c_prev, Buffer c, Buffer h_prev, Buffer h, Buffer dxg,
                                  Buffer dhg, int64_t n, int64_t hidden) {
    (void)device, (void)cell, (void)t, (void)dy, (void)dh_next, (void)dc, (void)saved, (void)c_prev, (void)c,
        (void)h_prev, (void)h, (void)dxg, (void)dhg, (void)n, (void)hidden;
    return false;
  }

  // Library fast paths (oneDNN, cuDNN). Each returns false when the backend has none for this case;
  // the core then runs the portable path built from the primitives above (im2col + matmul).
  /// Inference only (never recorded for gradients): y (n, out) = x (n, in) w^T + bias, w (out, in)
  /// row-major, bias (out,) (bias.handle == nullptr: none), then relu when asked. w_cache: w's
  /// prepared-data cache (never null), where the backend may keep w packed for its GEMM kernel. false:
  /// the core runs its GEMM path.
  virtual bool linear_forward(int device, DType t, Buffer x, Buffer w, PreparedCache* w_cache, Buffer bias, Buffer y,
                              int64_t n, int64_t in, int64_t out, bool relu) {
    (void)device, (void)t, (void)x, (void)w, (void)w_cache, (void)bias, (void)y, (void)n, (void)in, (void)out,
        (void)relu;
    return false;
  }
  /// y = conv(x, w) + bias (bias.handle == nullptr: none).
  virtual bool conv_forward(int device, DType t, Buffer x, Buffer w, Buffer bias, Buffer y, const ConvGeometry& g) {
    (void)device, (void)t, (void)x, (void)w, (void)bias, (void)y, (void)g;
    return false;
  }
  /// y = relu(conv(x, w) + bias) in one pass (oneDNN's eltwise post-op). false: the core runs
  /// conv_forward (or the portable path) and then relu.
  virtual bool conv_forward_relu(int device, DType t, Buffer x, Buffer w, Buffer bias, Buffer y,
                                 const ConvGeometry& g) {
    (void)device, (void)t, (void)x, (void)w, (void)bias, (void)y, (void)g;
    return false;
  }
  /// Inference only (never recorded for gradients): a conv followed by a BatchNorm on its running
  /// statistics, its relu and a residual add, in one pass (oneDNN's post-ops):
  ///   z = conv(x, w) * scale[o] + shift[o];  z = relu(z) if relu;  z += residual unless its handle
  ///   is null (residual (batch, out_channels, out...));  y = relu(z) if relu_after.
  /// scale, shift (out_channels,) hold the BatchNorm (and any conv bias) folded per call. false: the
  /// core composes conv_forward and elementwise ops.
  /// Whether conv_forward_affine can ever return true here: the core folds the BatchNorm into
  /// scale/shift (several small kernels) only for a backend that may take them.
  virtual bool has_conv_forward_affine() { return false; }
  virtual bool conv_forward_affine(int device, DType t, Buffer x, Buffer w, Buffer scale, Buffer shift,
                                   Buffer residual, Buffer y, const ConvGeometry& g, bool relu, bool relu_after) {
    (void)device, (void)t, (void)x, (void)w, (void)scale, (void)shift, (void)residual, (void)y, (void)g, (void)relu,
        (void)relu_after;
    return false;
  }
  /// dx = the gradient of conv with respect to x (overwritten, not accumulated).
  virtual bool conv_backward_data(int device, DType t, Buffer dy, Buffer w, Buffer dx, const ConvGeometry& g) {
    (void)device, (void)t, (void)dy, (void)w, (void)dx, (void)g;
    return false;
  }
  /// dw (and dbias unless its handle is null) = the gradients of conv (overwritten).
  virtual bool conv_backward_weight(int device, DType t, Buffer x, Buffer dy, Buffer dw, Buffer dbias,
                                    const ConvGeometry& g) {
    (void)device, (void)t, (void)x, (void)dy, (void)dw, (void)dbias, (void)g;
    return false;
  }
  /// As conv_backward_weight for t = f16/bf16 (x, dy of dtype t), with dw and dbias written in
  /// Float32, never rounded to t: the gradient an autocast weight cast hands on to its Float32 master
  /// weight. false: not offered (the core rounds conv_backward_weight's result or computes in Float32).
  virtual bool conv_backward_weight_float32(int device, DType t, Buffer x, Buffer dy, Buffer dw, Buffer dbias,
                                            const ConvGeometry& g) {
    (void)device, (void)t, (void)x, (void)dy, (void)dw, (void)dbias, (void)g;
    return false;
  }

  // ---- collectives across processes on device memory (NCCL in the CUDA plugin; distributed.hpp).
  // A backend without them keeps the defaults and the core stages its tensors through host memory
  // and MPI. The calls are enqueued on the device's stream; collective_wait completes them. ----
  /// Bytes of the id rank 0 makes with collective_unique_id and every rank passes to
  /// collective_join; 0: no device collectives.
  virtual size_t collective_id_bytes() { return 0; }
  virtual void collective_unique_id(void* id) { (void)id; }
  /// Joins as rank `rank` of `ranks` on `device`; returns the handle the calls below take.
  virtual void* collective_join(int device, const void* id, int ranks, int rank) {
    (void)device, (void)id, (void)ranks, (void)rank;
    return nullptr;
  }
  /// In place: data = the sum over the ranks of data (n elements of dtype t).
  virtual void collective_allreduce_sum(void* comm, int device, DType t, Buffer data, int64_t n) {
    (void)comm, (void)device, (void)t, (void)data, (void)n;
  }
  /// data = root's data (bytes).
  virtual void collective_broadcast(void* comm, int device, Buffer data, size_t bytes, int root) {
    (void)comm, (void)device, (void)data, (void)bytes, (void)root;
  }
  /// recv = every rank's send (bytes each), in rank order.
  virtual void collective_allgather(void* comm, int device, Buffer send, Buffer recv, size_t bytes) {
    (void)comm, (void)device, (void)send, (void)recv, (void)bytes;
  }
  /// True once everything enqueued on the device has completed; false when `timeout` seconds
  /// passed first (the collective is then aborted). Throws on a failed collective.
  virtual bool collective_wait(void* comm, int device, double timeout) {
    (void)comm, (void)timeout;
    synchronize(device);
    return true;
  }

  // ---- elementwise on f16/bf16 storage in one pass (float32 arithmetic; bitwise the cast up, the f32
  // kernel and the cast down); false = the core runs those three passes. src/backends/<name>/unary, binary ----
  /// dst = op(src) over n elements of dtype t (f16/bf16).
  virtual bool unary_half(int device, UnaryOp op, DType t, Buffer src, Buffer dst, int64_t n, double alpha) {
    (void)device, (void)op, (void)t, (void)src, (void)dst, (void)n, (void)alpha;
    return false;
  }
  /// binary for a, b of dtype t (f16/bf16); out of dtype t, Bool for comparisons.
  virtual bool binary_half(int device, BinaryOp op, DType t, Buffer a, Buffer b, Buffer out, const Broadcast& plan) {
    (void)device, (void)op, (void)t, (void)a, (void)b, (void)out, (void)plan;
    return false;
  }
  /// out (Float32, n elements) = a op b for op add or sub, one operand of dtype t (f16/bf16; a when
  /// `half_first`, else b) and the other Float32, both dense of out's n elements: the residual add of a
  /// block run under autocast in one pass, bitwise the cast up and the Float32 kernel.
  virtual bool binary_mixed(int device, BinaryOp op, DType t, bool half_first, Buffer a, Buffer b, Buffer out,
                            int64_t n) {
    (void)device, (void)op, (void)t, (void)half_first, (void)a, (void)b, (void)out, (void)n;
    return false;
  }

  // ---- fused attention (src/backends/<name>/attention): softmax(q kᵀ scale | mask) v without the
  // (tq, tk) scores in memory; false = the core composes matmul, softmax, matmul. t is f32, bf16 or
  // f16 for every array but lse (Float32); scores and softmax in Float32. A row with no visible key
  // gives NaN, as the composition. ----
  /// out and lse[i] = log Σ_j exp(s_ij) over the visible keys (what the backward recomputes p from).
  virtual bool attention_forward(int device, DType t, Buffer q, Buffer k, Buffer v, Buffer mask, Buffer out,
                                 Buffer lse, const Attention& a) {
    (void)device, (void)t, (void)q, (void)k, (void)v, (void)mask, (void)out, (void)lse, (void)a;
    return false;
  }
  /// dq, dk, dv (overwritten) from dout, with p recomputed per tile from q, k and lse:
  /// dv = pᵀ dout, ds = p (dout vᵀ - rowsum(dout out)), dq = ds k scale, dk = dsᵀ q scale.
  virtual bool attention_backward(int device, DType t, Buffer q, Buffer k, Buffer v, Buffer mask, Buffer out,
                                  Buffer dout, Buffer lse, Buffer dq, Buffer dk, Buffer dv, const Attention& a) {
    (void)device, (void)t, (void)q, (void)k, (void)v, (void)mask, (void)out, (void)dout, (void)lse, (void)dq,
        (void)dk, (void)dv, (void)a;
    return false;
  }

  // ---- loss scaling (flux/optimisers/grad_scaler.hpp; src/backends/<name>/optimiser) ----
  /// out = g * inv_scale over n elements of floating dtype t (f16/bf16/f32 multiply in float32, f64 in
  /// float64; the product rounded to t); out may be g. found (one Float32 element) is set to 1 when any
  /// element of out is not finite (inf or NaN) and left as it is otherwise, so one flag collects a
  /// whole model. false: the core composes the same arithmetic from public ops.
  virtual bool unscale_and_check(int device, DType t, Buffer g, Buffer out, int64_t n, double inv_scale,
                                 Buffer found) {
    (void)device, (void)t, (void)g, (void)out, (void)n, (void)inv_scale, (void)found;
    return false;
  }
};

/// What a plugin's one exported symbol returns.
struct PluginInfo {
  int abi_version;
  Backend* (*create)();  // called once; the backend lives until exit
};

}  // namespace flux::backend

/// Every plugin exports exactly this symbol:  extern "C" flux::backend::PluginInfo flux_backend_plugin();
#define FLUX_BACKEND_PLUGIN_SYMBOL "flux_backend_plugin"
