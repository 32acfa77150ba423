// Elementwise ops on bf16/f16 storage in one pass, float32 arithmetic: each block of a few thousand
// elements is converted up into a thread-local float32 buffer (half_cast.cpp), computed there by the
// float32 kernel (unary.cpp, binary.cpp) and converted down, so the tensor is read and written once
// instead of the three passes (cast up, compute, cast down) and two float32 temporaries the core makes
// otherwise. The values are bitwise those of the three passes: the same conversions and kernels.
// With AVX-512, bf16 relu / step / relu's gradient work on the bits, and bf16 add / sub / mul and
// Float32 ± bf16 widen in registers (below).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/float_mode.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLUX_HALF_EW_X86 1
#define FLUX_TARGET_HALF_EW_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#else
#define FLUX_HALF_EW_X86 0
#endif

namespace flux::cpu_backend {

namespace {

// Elements per block: three float32 blocks (a, b, out) stay in L1/L2 and a block still repays the
// kernels' call overhead.
constexpr int64_t kBlock = 2048;
// Elements per pool task (several blocks).
constexpr int64_t kGrain = 1 << 15;

bool half(DType t) { return t == DType::bf16 || t == DType::f16; }

const uint16_t* at(const void* p, int64_t i) { return static_cast<const uint16_t*>(p) + i; }
uint16_t* at(void* p, int64_t i) { return static_cast<uint16_t*>(p) + i; }

#if FLUX_HALF_EW_X86
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's intrinsics start from _mm512_undefined_*
#endif
// AVX-512 paths on bf16 without the float32 blocks (taken where the bf16 casts run at AVX-512 or
// above), bitwise the convert / float32 kernel / convert composition below:
// relu and step on the bf16 bits, 32 at a time: relu(x) = x <= 0 ? +0 : x, step(x) = x > 0 ? 1 : 0,
// NaN -> the NaN quieted as the cast down quiets it (| 0x40). "Positive": above `not_positive`
// (bf16_largest_not_positive: under denormals-are-zero the float32 comparison sees a subnormal as 0).
FLUX_TARGET_HALF_EW_AVX512 void relu_or_step_bf16(bool step, int16_t not_positive, const uint16_t* s, uint16_t* d,
                                                  int64_t b, int64_t e) {
  const __m512i magnitude = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(0x7f80);
  const __m512i quiet = _mm512_set1_epi16(0x40), one = _mm512_set1_epi16(0x3f80);
  const __m512i largest_not_positive = _mm512_set1_epi16(not_positive);
  for (int64_t i = b; i < e; i += 32) {
    const int64_t left = e - i;
    const __mmask32 m = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1);
    const __m512i h = _mm512_maskz_loadu_epi16(m, s + i);
    const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(h, magnitude), inf);
    const __mmask32 positive = _mm512_cmpgt_epi16_mask(h, largest_not_positive);  // sign clear, above it
    __m512i r = _mm512_maskz_mov_epi16(positive, step ? one : h);
    r = _mm512_mask_mov_epi16(r, nan, _mm512_or_si512(h, quiet));
    _mm512_mask_storeu_epi16(d + i, m, r);
  }
}
// relu's gradient on the bf16 bits, 32 at a time, bitwise the float32 kernel's (unary.cpp) rounded
// down: where x > 0 (as above) g as it is; where x <= 0, g * +0 = g's signed zero, NaN for ±Inf (x86's
// default NaN, 0xffc0 in bf16); where x is NaN (step(x) = x quieted) that NaN, or g's where g is NaN
// too; a NaN g quieted, as the cast down quiets it.
FLUX_TARGET_HALF_EW_AVX512 void relu_backward_bf16(int16_t not_positive, const uint16_t* xs, const uint16_t* gs,
                                                   uint16_t* dx, int64_t b, int64_t e) {
  const __m512i magnitude = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(0x7f80);
  const __m512i sign = _mm512_set1_epi16(int16_t(0x8000)), quiet = _mm512_set1_epi16(0x40);
  const __m512i default_nan = _mm512_set1_epi16(int16_t(0xffc0));
  const __m512i largest_not_positive = _mm512_set1_epi16(not_positive);
  for (int64_t i = b; i < e; i += 32) {
    const int64_t left = e - i;
    const __mmask32 m = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1);
    const __m512i x = _mm512_maskz_loadu_epi16(m, xs + i), g = _mm512_maskz_loadu_epi16(m, gs + i);
    const __m512i gm = _mm512_and_si512(g, magnitude), signed_zero = _mm512_and_si512(g, sign);
    const __mmask32 x_nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(x, magnitude), inf);
    const __mmask32 x_positive = _mm512_cmpgt_epi16_mask(x, largest_not_positive);
    const __mmask32 g_nan = _mm512_cmpgt_epu16_mask(gm, inf), g_inf = _mm512_cmpeq_epi16_mask(gm, inf);
    __m512i r = _mm512_mask_mov_epi16(signed_zero, g_inf, default_nan);  // x <= 0
    r = _mm512_mask_mov_epi16(r, x_positive, g);
    r = _mm512_mask_mov_epi16(r, x_nan, _mm512_or_si512(x, quiet));
    r = _mm512_mask_mov_epi16(r, g_nan, _mm512_or_si512(g, quiet));
    _mm512_mask_storeu_epi16(dx + i, m, r);
  }
}
// out = a op b (add, sub, mul) on dense bf16 operands: widened in registers, the float32 result
// rounded by the cast down (float_to_half_storage) from one block in L1.
FLUX_TARGET_HALF_EW_AVX512 void arith_bf16(backend::BinaryOp op, const uint16_t* a, const uint16_t* b, uint16_t* out,
                                           int64_t len, float* z) {
  for (int64_t k = 0; k < len; k += 16) {
    const int64_t left = len - k;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + k)), 16));
    const __m512 y = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + k)), 16));
    const __m512 r = op == backend::BinaryOp::add   ? _mm512_add_ps(x, y)
                     : op == backend::BinaryOp::sub ? _mm512_sub_ps(x, y)
                                                    : _mm512_mul_ps(x, y);
    _mm512_mask_storeu_ps(z + k, m, r);
  }
  float_to_half_storage(DType::bf16, z, out, len);
}
// out = wide op low, or low op wide (`low_first`), op add or sub (`sub`): the bf16 operand widened in
// registers, one pass; bitwise the Float32 kernel on the operand cast up.
FLUX_TARGET_HALF_EW_AVX512 void mixed_bf16(bool sub, bool low_first, const uint16_t* low, const float* wide, float* out,
                                           int64_t b, int64_t e) {
  for (int64_t i = b; i < e; i += 16) {
    const int64_t left = e - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m512 h = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, low + i)), 16));
    const __m512 w = _mm512_maskz_loadu_ps(m, wide + i);
    const __m512 x = low_first ? h : w, y = low_first ? w : h;
    _mm512_mask_storeu_ps(out + i, m, sub ? _mm512_sub_ps(x, y) : _mm512_add_ps(x, y));
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#if FLUX_HALF_EW_X86
// Whether the bf16 AVX-512 paths above may run now.
bool bf16_avx512(DType t) { return t == DType::bf16 && half_cast_path(t) >= HalfCastPath::avx512; }
#endif

}  // namespace

bool unary_half(backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha) {
  if (!half(t)) return false;
#if FLUX_HALF_EW_X86
  if ((op == backend::UnaryOp::relu || op == backend::UnaryOp::step) && bf16_avx512(t)) {
    const bool step = op == backend::UnaryOp::step;
    const int16_t not_positive = bf16_largest_not_positive();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      relu_or_step_bf16(step, not_positive, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), b, e);
    });
    return true;
  }
#endif
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    alignas(64) float x[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t len = std::min(kBlock, e - i);
      half_storage_to_float(t, at(src, i), x, len);
      unary(op, DType::f32, x, x, len, alpha);
      float_to_half_storage(t, x, at(dst, i), len);
    }
  });
  return true;
}

// The length m when operand k repeats one dense run along the output's flat order (element i is
// operand[i % m]: a bias (m,) over rows (r, m); m = 1 for a single element); 0 otherwise.
int64_t repeat_length(const backend::Broadcast& plan, int k) {
  int64_t m = 1;
  int i = plan.ndim - 1;
  for (; i >= 0 && (plan.shape[i] == 1 || plan.stride[k][i] == m); --i) m *= plan.shape[i];
  for (; i >= 0; --i)
    if (plan.shape[i] != 1 && plan.stride[k][i] != 0) return 0;
  return m;
}

bool binary_half(backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan) {
  if (!half(t)) return false;
  int64_t n = 1;
  for (int i = 0; i < plan.ndim; ++i) n *= plan.shape[i];
  // Dense operands of the output's shape, or one of them repeating a shorter run (x * 2, x + bias
  // scalar, a bias row over the rows of a matrix) and the other dense.
  int64_t a_run = plan.contiguous ? n : repeat_length(plan, 0), b_run = plan.contiguous ? n : repeat_length(plan, 1);
  if (a_run == 0 || b_run == 0 || (a_run < n && b_run < n)) return false;
  const bool a_repeats = a_run < n, b_repeats = b_run < n;
  const bool compare = op >= backend::BinaryOp::eq;  // a Bool output, written directly
#if FLUX_HALF_EW_X86
  if (!a_repeats && !b_repeats && bf16_avx512(t) &&
      (op == backend::BinaryOp::add || op == backend::BinaryOp::sub || op == backend::BinaryOp::mul)) {
    parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
      alignas(64) float z[kBlock];
      for (int64_t i = begin; i < end; i += kBlock)
        arith_bf16(op, at(a, i), at(b, i), at(out, i), std::min(kBlock, end - i), z);
    });
    return true;
  }
#endif
  // The repeated operand in float32, once (a single element or a short row).
  std::vector<float> run(size_t(a_repeats ? a_run : b_repeats ? b_run : 0));
  if (!run.empty()) half_storage_to_float(t, static_cast<const uint16_t*>(a_repeats ? a : b), run.data(), int64_t(run.size()));
  const int64_t m = int64_t(run.size());
  const bool single = m == 1;
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float x[kBlock], y[kBlock], z[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      backend::Broadcast block;
      block.ndim = 1, block.shape[0] = len, block.contiguous = !single;
      block.stride[0][0] = a_repeats && single ? 0 : 1, block.stride[1][0] = b_repeats && single ? 0 : 1, block.stride[2][0] = 1;
      float* repeated = a_repeats ? x : y;
      if (m > 1)  // the run laid out along the block
        for (int64_t k = 0, j = i % m; k < len; ++k, j = j + 1 == m ? 0 : j + 1) repeated[k] = run[size_t(j)];
      const float* xa = a_repeats && single ? run.data() : x;
      const float* yb = b_repeats && single ? run.data() : y;
      if (!a_repeats) half_storage_to_float(t, at(a, i), x, len);
      if (!b_repeats) half_storage_to_float(t, at(b, i), y, len);
      if (compare) {
        binary(op, DType::f32, xa, yb, static_cast<uint8_t*>(out) + i, block);
      } else {
        binary(op, DType::f32, xa, yb, z, block);
        float_to_half_storage(t, z, at(out, i), len);
      }
    }
  });
  return true;
}

bool binary_mixed(backend::BinaryOp op, DType t, bool half_first, const void* a, const void* b, float* out, int64_t n) {
  if (!half(t) || (op != backend::BinaryOp::add && op != backend::BinaryOp::sub)) return false;
  const void* low = half_first ? a : b;
  const float* wide = static_cast<const float*>(half_first ? b : a);
#if FLUX_HALF_EW_X86
  if (bf16_avx512(t)) {
    const bool sub = op == backend::BinaryOp::sub;
    parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
      mixed_bf16(sub, half_first, static_cast<const uint16_t*>(low), wide, out, begin, end);
    });
    return true;
  }
#endif
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float x[kBlock];  // the half operand's block, cast up in L1
    backend::Broadcast block;
    block.ndim = 1, block.contiguous = true;
    block.stride[0][0] = block.stride[1][0] = block.stride[2][0] = 1;
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      block.shape[0] = len;
      half_storage_to_float(t, at(low, i), x, len);
      binary(op, DType::f32, half_first ? x : wide + i, half_first ? wide + i : x, out + i, block);
    }
  });
  return true;
}

// relu's gradient in one pass: bf16 on the bits (AVX-512, above), else blocks of x and g cast up, the
// float32 fused kernel (g where x > 0, g step(x) elsewhere), the result cast down.
bool unary_backward_half(backend::UnaryOp op, DType t, const void* x, const void* g, void* dx, int64_t n) {
  if (!half(t) || op != backend::UnaryOp::relu) return false;
#if FLUX_HALF_EW_X86
  if (bf16_avx512(t)) {
    const int16_t not_positive = bf16_largest_not_positive();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      relu_backward_bf16(not_positive, static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(g),
                         static_cast<uint16_t*>(dx), b, e);
    });
    return true;
  }
#endif
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float xs[kBlock], gs[kBlock], ds[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      half_storage_to_float(t, at(x, i), xs, len);
      half_storage_to_float(t, at(g, i), gs, len);
      unary_backward(op, DType::f32, xs, gs, ds, len);
      float_to_half_storage(t, ds, at(dx, i), len);
    }
  });
  return true;
}

}  // namespace flux::cpu_backend
