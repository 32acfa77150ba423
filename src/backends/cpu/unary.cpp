// Elementwise functions of one tensor on the CPU.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/float_mode.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/vector_math.hpp"

namespace flux::cpu_backend {

using backend::UnaryOp;

namespace {
template <class T> inline T apply(UnaryOp op, T x, double alpha) {
  using std::abs;
  if constexpr (std::is_floating_point_v<T>) {
    const T a = T(alpha);
    switch (op) {
      case UnaryOp::neg: return -x;
      case UnaryOp::exp: return vmath::exp(x);  // f32: vectorisable (vector_math.hpp); f64: libm
      case UnaryOp::log: return std::log(x);
      case UnaryOp::sqrt: return std::sqrt(x);
      case UnaryOp::abs: return std::abs(x);
      case UnaryOp::tanh: return vmath::tanh(x);
      case UnaryOp::sigmoid: return vmath::sigmoid(x);
      case UnaryOp::relu: return x <= 0 ? T(0) : x;  // NaN stays NaN (x > 0 ? x : 0 would give 0)
      case UnaryOp::leakyrelu: return x > 0 ? x : a * x;
      case UnaryOp::elu: return x > 0 ? x : a * std::expm1(x);
      case UnaryOp::gelu: {  // Flux/NNlib's gelu (tanh approximation), 0.5 x (1 + tanh(u)) = x sigmoid(2u):
        // exact 0 and x in the tails whatever the last ulp of tanh
        const T c2 = T(1.5957691216057308);  // 2 sqrt(2 / pi)
        const T u2 = c2 * x * (T(1) + T(0.044715) * x * x);
        return x * vmath::sigmoid(u2);
      }
      case UnaryOp::softplus: return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
      case UnaryOp::swish: return x * vmath::sigmoid(x);
      case UnaryOp::sign: return x > 0 ? T(1) : (x < 0 ? T(-1) : (x == 0 ? T(0) : x));  // sign(NaN) = NaN
      case UnaryOp::square: return x * x;
      case UnaryOp::reciprocal: return T(1) / x;
      case UnaryOp::sin: return std::sin(x);
      case UnaryOp::cos: return std::cos(x);
      case UnaryOp::log1p: return std::log1p(x);
      case UnaryOp::step: return x > 0 ? T(1) : (x <= 0 ? T(0) : x);  // relu's derivative: NaN at NaN
      case UnaryOp::erf: return std::erf(x);
    }
    return x;
  } else {
    switch (op) {
      case UnaryOp::neg: return T(-x);
      case UnaryOp::abs: if constexpr (std::is_signed_v<T>) return x < 0 ? T(-x) : x; else return x;
      case UnaryOp::sign: return x > 0 ? T(1) : (x < 0 ? T(-1) : T(0));
      case UnaryOp::square: return T(x * x);
      case UnaryOp::relu: return x > 0 ? x : T(0);
      case UnaryOp::step: return x > 0 ? T(1) : T(0);
      default: detail::fail("[unary] this function needs a floating-point tensor");
    }
  }
}

// d = f(s) over [b, e) for the hot activations, compiled per ISA level (isa.hpp).
template <class T, UnaryOp Op>
FLUX_CPU_INLINE void unary_range_body(const T* __restrict s, T* __restrict d, int64_t b, int64_t e, double alpha,
                                      std::integral_constant<UnaryOp, Op>) {
  for (int64_t i = b; i < e; ++i) d[i] = apply<T>(Op, s[i], alpha);
}
FLUX_CPU_VARIANTS(unary_range, unary_range_body)

// relu in place over rows `ld` apart (relu_rows below): float32 as apply's relu; bf16 as the same
// comparison on the bits (32 lanes of 16 bits): kept where the value is above `zero_up_to`
// (bf16_largest_not_positive) or a NaN, else +0.
FLUX_CPU_INLINE void relu_rows_f32_body(float* y, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = y + r * ld;
    for (int64_t j = 0; j < cols; ++j) p[j] = p[j] <= 0.f ? 0.f : p[j];
  }
}
FLUX_CPU_VARIANTS(relu_rows_f32, relu_rows_f32_body)
FLUX_CPU_INLINE void relu_rows_bf16_body(uint16_t* y, int64_t rows, int64_t cols, int64_t ld, int16_t zero_up_to) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* p = y + r * ld;
    for (int64_t j = 0; j < cols; ++j) {
      const uint16_t h = p[j];
      const bool keep = int16_t(h) > zero_up_to || (h & 0x7fff) > 0x7f80;
      p[j] = keep ? h : uint16_t(0);
    }
  }
}
FLUX_CPU_VARIANTS(relu_rows_bf16, relu_rows_bf16_body)

template <class T, UnaryOp Op> void run(const T* s, T* d, int64_t n, double alpha) {
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    unary_range(s, d, b, e, alpha, std::integral_constant<UnaryOp, Op>{});
  });
}
// sigmoid(u) and sigmoid(-u) from one exponential, as vmath::sigmoid computes each (the same values):
// e = e^{-|u|}, r = 1 / (1 + e); sigmoid(u) = r for u >= 0, else e r, and the other way round for -u.
// Both products are formed before the selects: straight-line code the AVX2 variant vectorises too.
template <class T> FLUX_CPU_INLINE void sigmoid_pair(T u, T& s_pos, T& s_neg) {
  const T en = vmath::exp(-std::abs(u));
  const T r = T(1) / (T(1) + en);
  const T er = en * r;
  const bool pos = u >= T(0);
  s_pos = pos ? r : er;
  s_neg = pos ? er : r;
}

// dx = g f'(x) for relu (g step(x): one pass instead of step's and the product's), gelu (tanh form)
// and swish; the formulas of src/ops/elementwise.cpp's backward (sigmoid(-u) rather than 1 - sigmoid(u),
// exact in the tails).
template <class T, UnaryOp Op>
FLUX_CPU_INLINE void unary_backward_body(const T* __restrict x, const T* __restrict g, T* __restrict dx, int64_t b,
                                         int64_t e, std::integral_constant<UnaryOp, Op>) {
  for (int64_t i = b; i < e; ++i) {
    const T v = x[i];
    T s, sn;
    if constexpr (Op == UnaryOp::relu) {
      // g where x > 0 (as it is: never flushed), else g * step(x): ±0, NaN where x is
      dx[i] = v > T(0) ? g[i] : g[i] * apply<T>(UnaryOp::step, v, 0.0);
    } else if constexpr (Op == UnaryOp::gelu) {
      const T c2 = T(1.5957691216057308), k = T(0.044715);
      const T x2 = v * v;
      const T u = v * (T(1) + x2 * k) * c2;
      sigmoid_pair(u, s, sn);
      dx[i] = g[i] * (s + v * s * sn * (T(1) + x2 * (T(3) * k)) * c2);
    } else {
      sigmoid_pair(v, s, sn);
      dx[i] = g[i] * (s + v * s * sn);
    }
  }
}
FLUX_CPU_VARIANTS(unary_backward_range, unary_backward_body)

template <class T, UnaryOp Op> void run_backward(const T* x, const T* g, T* dx, int64_t n) {
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    unary_backward_range(x, g, dx, b, e, std::integral_constant<UnaryOp, Op>{});
  });
}
}  // namespace

void unary(UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha) {
  FLUX_CPU_DISPATCH("unary", t, {
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    // The hot activations get their own loops so the compiler can vectorise them.
    switch (op) {
      case UnaryOp::relu: run<T, UnaryOp::relu>(s, d, n, alpha); return;
      case UnaryOp::neg: run<T, UnaryOp::neg>(s, d, n, alpha); return;
      case UnaryOp::square: run<T, UnaryOp::square>(s, d, n, alpha); return;
      case UnaryOp::step: run<T, UnaryOp::step>(s, d, n, alpha); return;
      case UnaryOp::exp: run<T, UnaryOp::exp>(s, d, n, alpha); return;
      case UnaryOp::tanh: run<T, UnaryOp::tanh>(s, d, n, alpha); return;
      case UnaryOp::sigmoid: run<T, UnaryOp::sigmoid>(s, d, n, alpha); return;
      case UnaryOp::gelu: run<T, UnaryOp::gelu>(s, d, n, alpha); return;
      case UnaryOp::swish: run<T, UnaryOp::swish>(s, d, n, alpha); return;
      default:
        parallel_for(n, 1 << 13, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) d[i] = apply<T>(op, s[i], alpha);
        });
    }
  });
}

bool unary_backward(UnaryOp op, DType t, const void* x, const void* g, void* dx, int64_t n) {
  if ((op != UnaryOp::relu && op != UnaryOp::gelu && op != UnaryOp::swish) || (t != DType::f32 && t != DType::f64))
    return false;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xs = static_cast<const T*>(x);
    const T* gs = static_cast<const T*>(g);
    T* d = static_cast<T*>(dx);
    if (op == UnaryOp::relu) run_backward<T, UnaryOp::relu>(xs, gs, d, n);
    else if (op == UnaryOp::gelu) run_backward<T, UnaryOp::gelu>(xs, gs, d, n);
    else run_backward<T, UnaryOp::swish>(xs, gs, d, n);
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  return true;
}

void relu_rows(DType t, void* y, int64_t rows, int64_t cols, int64_t ld) {
  if (t == DType::bf16)
    relu_rows_bf16(static_cast<uint16_t*>(y), rows, cols, ld, bf16_largest_not_positive());
  else if (t == DType::f32)
    relu_rows_f32(static_cast<float*>(y), rows, cols, ld);
  else
    detail::fail("[relu_rows] takes Float32 or BFloat16; got ", dtype_name(t));
}

}  // namespace flux::cpu_backend
