// Numerically stable (log)softmax over the middle axis of [outer, len, inner], on the CPU; bf16/f16
// sources read directly (softmax_half) into a Float32 result.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/vector_math.hpp"

namespace flux::cpu_backend {

namespace {
// Rows of a contiguous [rows, len] view (inner == 1, the common case: softmax over the last axis),
// compiled per ISA level (isa.hpp): max, then e = exp(x - max) written to y and summed (in float64), then
// y *= 1 / sum; logsoftmax writes (x - max) - log(sum). f32 uses vector_math.hpp's exp.
// Without -ffast-math the compiler keeps a reduction's order and will not vectorise it, so the max and
// the sum run in kLanes independent lanes (a fixed-length inner loop it does vectorise), then combine.
constexpr int64_t kLanes = 16;

template <class T> FLUX_CPU_INLINE T row_max(const T* __restrict x, int64_t len) {
  T lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], x[j + l]);
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t l = 0; l < kLanes; ++l) m = std::max(m, lane[l]);
  for (; j < len; ++j) m = std::max(m, x[j]);
  return m;
}

template <class T> FLUX_CPU_INLINE double row_sum(const T* __restrict y, int64_t len) {
  double lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(y[j + l]);
  double total = 0;
  for (int64_t l = 0; l < kLanes; ++l) total += lane[l];
  for (; j < len; ++j) total += double(y[j]);
  return total;
}

template <class T>
FLUX_CPU_INLINE void softmax_rows_body(const T* __restrict s, T* __restrict d, int64_t r0, int64_t r1, int64_t len,
                                       bool log) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = s + r * len;
    T* y = d + r * len;
    T m = row_max(x, len);
    if (m == -std::numeric_limits<T>::infinity()) m = 0;  // a fully masked row: exp(-inf - 0) = 0
    for (int64_t j = 0; j < len; ++j) y[j] = vmath::exp(x[j] - m);
    const double total = row_sum(y, len);
    if (log) {
      // (x - m) - log(total), not x - (m + log(total)): m + log(total) rounds at m's magnitude
      const T log_total = T(std::log(total));
      for (int64_t j = 0; j < len; ++j) y[j] = (x[j] - m) - log_total;
    } else {
      const T inv = T(1.0 / total);
      for (int64_t j = 0; j < len; ++j) y[j] *= inv;
    }
  }
}
FLUX_CPU_VARIANTS(softmax_rows, softmax_rows_body)

// The adjoint over contiguous rows: softmax dx = y (g - Σ g y); logsoftmax dx = g - exp(y) Σ g.
template <class T>
FLUX_CPU_INLINE void softmax_backward_rows_body(const T* __restrict ys, const T* __restrict gs, T* __restrict dxs,
                                                int64_t r0, int64_t r1, int64_t len, bool log) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* y = ys + r * len;
    const T* g = gs + r * len;
    T* dx = dxs + r * len;
    if (log) {
      const T total = T(row_sum(g, len));
      for (int64_t j = 0; j < len; ++j) dx[j] = g[j] - vmath::exp(y[j]) * total;
    } else {
      for (int64_t j = 0; j < len; ++j) dx[j] = g[j] * y[j];
      const T total = T(row_sum(dx, len));
      for (int64_t j = 0; j < len; ++j) dx[j] = y[j] * (g[j] - total);
    }
  }
}
FLUX_CPU_VARIANTS(softmax_backward_rows, softmax_backward_rows_body)

// Columns (inner > 1) of [outer, len, inner]: tasks of (outer index, a block of up to kColumns columns)
// sweep the rows three times (max, sum, result), row by row; load(p, x, n) puts the n source values at
// p into x as T. Per column the arithmetic of one column at a time, in its order (max; Σ exp(x - max) in
// float64; then the result), so the same bits, but the memory read row by row (one column at a time
// reads a cache line per element).
constexpr int64_t kColumns = 512;

template <class T, class Src, class Load>
void softmax_columns(const Src* s, T* d, int64_t outer, int64_t len, int64_t inner, bool log, Load load) {
  const int64_t width = std::min(inner, kColumns), blocks = (inner + width - 1) / width;
  parallel_for(outer * blocks, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len * width, 1)), [&](int64_t tb, int64_t te) {
    T x[kColumns], m[kColumns], scale[kColumns];
    double total[kColumns];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / blocks, i0 = task % blocks * width, n = std::min(width, inner - i0);
      const Src* base = s + o * len * inner + i0;
      T* y = d + o * len * inner + i0;
      std::fill(m, m + n, T(-INFINITY));
      for (int64_t j = 0; j < len; ++j) {
        load(base + j * inner, x, n);
        for (int64_t i = 0; i < n; ++i) m[i] = std::max(m[i], x[i]);
      }
      for (int64_t i = 0; i < n; ++i)
        if (std::isinf(m[i]) && m[i] < 0) m[i] = 0;
      std::fill(total, total + n, 0.0);
      for (int64_t j = 0; j < len; ++j) {
        load(base + j * inner, x, n);
        for (int64_t i = 0; i < n; ++i) total[i] += std::exp(double(x[i] - m[i]));
      }
      // logsoftmax: (x - m) - log(total), not x - (m + log(total)): m + log(total) rounds at m's magnitude.
      for (int64_t i = 0; i < n; ++i) scale[i] = log ? T(std::log(total[i])) : T(1.0 / total[i]);
      for (int64_t j = 0; j < len; ++j) {
        load(base + j * inner, x, n);
        T* yj = y + j * inner;
        if (log)
          for (int64_t i = 0; i < n; ++i) yj[i] = (x[i] - m[i]) - scale[i];
        else
          for (int64_t i = 0; i < n; ++i) yj[i] = std::exp(x[i] - m[i]) * scale[i];
      }
    }
  });
}

template <class T> void softmax_typed(const T* s, T* d, int64_t outer, int64_t len, int64_t inner, bool log) {
  if (inner == 1) {
    parallel_for(outer, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1)),
                 [&](int64_t b, int64_t e) { softmax_rows(s, d, b, e, len, log); });
    return;
  }
  softmax_columns(s, d, outer, len, inner, log, [](const T* p, T* x, int64_t n) { std::copy(p, p + n, x); });
}

// ---- bf16/f16 sources, Float32 result ----
// Rows (inner == 1): each row converted into a per-thread float32 row, then the float32 row kernel.
// Columns (inner > 1): softmax_columns converting each row block as it goes: bitwise the float32
// kernel on the converted values.
void softmax_half_rows(DType t, const uint16_t* s, float* d, int64_t outer, int64_t len, bool log) {
  parallel_for(outer, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
    thread_local std::vector<float> row;
    if (int64_t(row.size()) < len) row.resize(size_t(len));
    for (int64_t r = b; r < e; ++r) {
      half_storage_to_float(t, s + r * len, row.data(), len);
      softmax_rows(static_cast<const float*>(row.data()), d + r * len, int64_t(0), int64_t(1), len, log);
    }
  });
}

void softmax_half_columns(DType t, const uint16_t* s, float* d, int64_t outer, int64_t len, int64_t inner, bool log) {
  softmax_columns(s, d, outer, len, inner, log,
                  [t](const uint16_t* p, float* x, int64_t n) { half_storage_to_float(t, p, x, n); });
}
}  // namespace

bool softmax_half(DType t, const uint16_t* src, float* dst, int64_t outer, int64_t len, int64_t inner, bool log) {
  if (t != DType::bf16 && t != DType::f16) return false;
  if (len == 0 || outer * inner == 0) return true;
  if (inner == 1) softmax_half_rows(t, src, dst, outer, len, log);
  else softmax_half_columns(t, src, dst, outer, len, inner, log);
  return true;
}

void softmax(DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log) {
  switch (t) {
    case DType::f32: softmax_typed(static_cast<const float*>(src), static_cast<float*>(dst), outer, len, inner, log); break;
    case DType::f64: softmax_typed(static_cast<const double*>(src), static_cast<double*>(dst), outer, len, inner, log); break;
    case DType::bf16: case DType::f16:
      softmax_half(t, static_cast<const uint16_t*>(src), static_cast<float*>(dst), outer, len, inner, log); break;
    default: detail::fail("[softmax] needs a floating-point tensor, got ", dtype_name(t));
  }
}

bool softmax_backward(DType t, const void* y, const void* g, void* dx, int64_t outer, int64_t len, int64_t inner,
                      bool log) {
  if (inner != 1 || (t != DType::f32 && t != DType::f64)) return false;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    parallel_for(outer, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
      softmax_backward_rows(static_cast<const T*>(y), static_cast<const T*>(g), static_cast<T*>(dx), b, e, len, log);
    });
  };
  if (t == DType::f32) run(0.0f);
  else run(0.0);
  return true;
}

}  // namespace flux::cpu_backend
