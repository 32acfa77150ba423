// Numerically stable (log)softmax over the middle axis of [outer, len, inner], on the CPU.
#include <cmath>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu {

namespace {
template <class T> void softmax_typed(const T* s, T* d, int64_t outer, int64_t len, int64_t inner, bool log) {
  parallel_for(outer * inner, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
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

}  // namespace flux::cpu
