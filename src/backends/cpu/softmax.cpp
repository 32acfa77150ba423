// Numerically stable (log)softmax over the middle axis of [outer, len, inner], on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>

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

template <class T> void softmax_typed(const T* s, T* d, int64_t outer, int64_t len, int64_t inner, bool log) {
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1));
  if (inner == 1) {
    parallel_for(outer, grain, [&](int64_t b, int64_t e) { softmax_rows(s, d, b, e, len, log); });
    return;
  }
  parallel_for(outer * inner, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t o = r / inner, i = r % inner;
      const T* x = s + o * len * inner + i;
      T* y = d + o * len * inner + i;
      T m = -INFINITY;
      for (int64_t j = 0; j < len; ++j) m = std::max(m, x[j * inner]);
      if (std::isinf(m) && m < 0) m = 0;
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(double(x[j * inner] - m));
      if (log) {
        // (x - m) - log(total), not x - (m + log(total)): m + log(total) rounds at m's magnitude
        T log_total = T(std::log(total));
        for (int64_t j = 0; j < len; ++j) y[j * inner] = (x[j * inner] - m) - log_total;
      } else {
        T inv = T(1.0 / total);
        for (int64_t j = 0; j < len; ++j) y[j * inner] = std::exp(x[j * inner] - m) * inv;
      }
    }
  });
}
}  // namespace

void softmax(DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner, bool log) {
  switch (t) {
    case DType::f32: softmax_typed(static_cast<const float*>(src), static_cast<float*>(dst), outer, len, inner, log); break;
    case DType::f64: softmax_typed(static_cast<const double*>(src), static_cast<double*>(dst), outer, len, inner, log); break;
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
