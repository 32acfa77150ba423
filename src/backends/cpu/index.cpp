// gather (index_select) and its adjoint scatter_add over [outer, len, inner], on the CPU.
#include <cstring>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

void gather(DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx) {
  size_t es = dtype_size(t);
  for (int64_t j = 0; j < nidx; ++j)
    if (idx[j] < 0 || idx[j] >= len)
      detail::fail("[gather] index ", idx[j], " is out of range for an axis of length ", len, " (0-based)");
  parallel_for(outer * nidx, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t o = r / nidx, j = r % nidx;
      std::memcpy(static_cast<char*>(dst) + size_t((o * nidx + j) * inner) * es,
                  static_cast<const char*>(src) + size_t((o * len + idx[j]) * inner) * es, size_t(inner) * es);
    }
  });
}

void scatter_add(DType t, const void* src, const int64_t* idx, void* dst, int64_t outer, int64_t len, int64_t inner, int64_t nidx) {
  for (int64_t j = 0; j < nidx; ++j)
    if (idx[j] < 0 || idx[j] >= len)
      detail::fail("[scatter_add] index ", idx[j], " is out of range for an axis of length ", len, " (0-based)");
  FLUX_CPU_DISPATCH("scatter_add", t, {
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    // parallel over outer only: indices may repeat within one outer slice
    parallel_for(outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(nidx * inner, 1)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o)
        for (int64_t j = 0; j < nidx; ++j) {
          const T* from = s + (o * nidx + j) * inner;
          T* into = d + (o * len + idx[j]) * inner;
          for (int64_t i = 0; i < inner; ++i) into[i] = T(into[i] + from[i]);
        }
    });
  });
}

}  // namespace flux::cpu_backend
