// Reductions over the middle axis of an [outer, len, inner] view, on the CPU; bf16/f16 sources read
// directly (reduce_half): blocks of a row (inner == 1) or of a row's columns converted into float32 in
// cache, then the float32 arithmetic, so the tensor is read once and no float32 copy is made.
#include <algorithm>
#include <limits>
#include <vector>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

using backend::ReduceOp;

namespace {
// d[i] = sum over j of base[j * inner + i], accumulated in acc (inner entries, zeroed), compiled per
// ISA level (isa.hpp): the bias gradient of a Dense layer is this sum over the batch.
template <class T, class Acc>
FLUX_CPU_INLINE void sum_rows_body(const T* __restrict base, Acc* __restrict acc, T* __restrict d, int64_t len,
                                   int64_t inner) {
  for (int64_t j = 0; j < len; ++j)
    for (int64_t i = 0; i < inner; ++i) acc[i] += Acc(base[j * inner + i]);
  for (int64_t i = 0; i < inner; ++i) d[i] = T(acc[i]);
}
FLUX_CPU_VARIANTS(sum_rows, sum_rows_body)

template <class T, class Acc> void reduce_typed(ReduceOp op, const T* s, void* dst, int64_t outer, int64_t len, int64_t inner) {
  int64_t work = outer * inner;
  parallel_for(outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(len * inner, 1)), [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      const T* base = s + o * len * inner;
      if (op == ReduceOp::sum) {
        T* d = static_cast<T*>(dst) + o * inner;
        if (inner == 1) {
          Acc acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += Acc(base[j]);
          d[0] = T(acc);
        } else {
          // One accumulator row per thread, reused across calls (no heap allocation per reduction).
          thread_local std::vector<Acc> acc;
          acc.assign(size_t(inner), Acc(0));
          sum_rows(base, acc.data(), d, len, inner);
        }
      } else if (op == ReduceOp::max || op == ReduceOp::min) {
        T* d = static_cast<T*>(dst) + o * inner;
        bool is_max = op == ReduceOp::max;
        for (int64_t i = 0; i < inner; ++i) {
          T best = base[i];
          for (int64_t j = 1; j < len; ++j) {
            T v = base[j * inner + i];
            if constexpr (std::is_floating_point_v<T>) {
              if (v != v) { best = v; break; }  // NaN propagates
            }
            if (is_max ? v > best : v < best) best = v;
          }
          d[i] = best;
        }
      } else {
        int64_t* d = static_cast<int64_t*>(dst) + o * inner;
        bool is_max = op == ReduceOp::argmax;
        for (int64_t i = 0; i < inner; ++i) {
          T best = base[i];
          int64_t at = 0;
          // NaN is the extreme either way (PyTorch): the first NaN wins.
          for (int64_t j = 1; j < len && best == best; ++j) {
            T v = base[j * inner + i];
            if (v != v || (is_max ? v > best : v < best)) best = v, at = j;
          }
          d[i] = at;
        }
      }
    }
  });
  (void)work;
}
}  // namespace

// ---- bf16/f16 sources ----
namespace {
constexpr int64_t kHalfBlock = 2048;  // floats converted at a time: they and the state stay in L1/L2
constexpr int64_t kLanes = 16;        // independent accumulators of a contiguous row (vectorised)

// lanes[j mod kLanes] += x[j]: a sum the compiler vectorises (a single accumulator keeps its order).
template <class T> FLUX_CPU_INLINE void sum_lanes_body(const T* __restrict x, int64_t n, double* __restrict lanes) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += double(x[j + l]);
  for (; j < n; ++j) lanes[j % kLanes] += double(x[j]);
}
FLUX_CPU_VARIANTS(sum_lanes, sum_lanes_body)

// acc[i] += x[i]: one row of a column sum, in the float32 kernel's order per column.
template <class T> FLUX_CPU_INLINE void sum_row_body(const T* __restrict x, int64_t n, double* __restrict acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] += double(x[i]);
}
FLUX_CPU_VARIANTS(sum_row, sum_row_body)

// best[i] = the extreme so far of column i with the float32 kernel's rule: a NaN, once met, stays.
template <class T, bool Max> FLUX_CPU_INLINE void extreme_row_body(const T* __restrict x, int64_t n, T* __restrict best) {
  for (int64_t i = 0; i < n; ++i) {
    const T b = best[i], v = x[i];
    const T next = (v != v || (Max ? v > b : v < b)) ? v : b;
    best[i] = b != b ? b : next;
  }
}
template <class T> FLUX_CPU_INLINE void max_row_body(const T* x, int64_t n, T* best) { extreme_row_body<T, true>(x, n, best); }
template <class T> FLUX_CPU_INLINE void min_row_body(const T* x, int64_t n, T* best) { extreme_row_body<T, false>(x, n, best); }
FLUX_CPU_VARIANTS(max_row, max_row_body)
FLUX_CPU_VARIANTS(min_row, min_row_body)

void extreme_row(bool is_max, const float* x, int64_t n, float* best) {
  if (is_max) max_row(x, n, best);
  else min_row(x, n, best);
}

// Contiguous rows (inner == 1): row o's blocks converted in turn.
void reduce_half_rows(ReduceOp op, DType t, const uint16_t* src, void* dst, int64_t outer, int64_t len) {
  parallel_for(outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(len, 1)), [&](int64_t ob, int64_t oe) {
    alignas(64) float x[kHalfBlock];
    for (int64_t o = ob; o < oe; ++o) {
      const uint16_t* row = src + o * len;
      if (op == ReduceOp::sum) {
        double lanes[kLanes] = {};
        for (int64_t j = 0; j < len; j += kHalfBlock) {
          const int64_t n = std::min(kHalfBlock, len - j);
          half_storage_to_float(t, row + j, x, n);
          sum_lanes(static_cast<const float*>(x), n, static_cast<double*>(lanes));
        }
        double total = 0;
        for (double l : lanes) total += l;
        static_cast<float*>(dst)[o] = float(total);
      } else if (op == ReduceOp::max || op == ReduceOp::min) {
        // Lanes of kLanes columns (a [len / kLanes, kLanes] view), all starting from x[0], then combined.
        const bool is_max = op == ReduceOp::max;
        float lanes[kLanes];
        for (int64_t j = 0; j < len; j += kHalfBlock) {
          const int64_t n = std::min(kHalfBlock, len - j);
          half_storage_to_float(t, row + j, x, n);
          if (j == 0) std::fill(lanes, lanes + kLanes, x[0]);
          int64_t k = 0;
          for (; k + kLanes <= n; k += kLanes) extreme_row(is_max, x + k, kLanes, lanes);
          for (; k < n; ++k) extreme_row(is_max, x + k, 1, lanes);
        }
        float best = lanes[0];
        for (int64_t l = 1; l < kLanes; ++l) extreme_row(is_max, lanes + l, 1, &best);
        static_cast<float*>(dst)[o] = best;
      } else {
        const bool is_max = op == ReduceOp::argmax;
        float best = 0;
        int64_t at = 0;
        for (int64_t j = 0; j < len && best == best; j += kHalfBlock) {
          const int64_t n = std::min(kHalfBlock, len - j);
          half_storage_to_float(t, row + j, x, n);
          if (j == 0) best = x[0];
          for (int64_t k = j == 0 ? 1 : 0; k < n && best == best; ++k) {
            const float v = x[k];
            if (v != v || (is_max ? v > best : v < best)) best = v, at = j + k;
          }
        }
        static_cast<int64_t*>(dst)[o] = at;
      }
    }
  });
}

// Columns (inner > 1): tasks of (outer index, a block of columns), the rows of the block converted in turn.
void reduce_half_columns(ReduceOp op, DType t, const uint16_t* src, void* dst, int64_t outer, int64_t len,
                         int64_t inner) {
  const int64_t width = std::min(inner, kHalfBlock), blocks = (inner + width - 1) / width;
  parallel_for(outer * blocks, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(len * width, 1)), [&](int64_t tb, int64_t te) {
    alignas(64) float x[kHalfBlock], best[kHalfBlock];
    alignas(64) double acc[kHalfBlock];
    int64_t at[kHalfBlock];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / blocks, i0 = task % blocks * width, n = std::min(width, inner - i0);
      const uint16_t* base = src + o * len * inner + i0;
      const int64_t out = o * inner + i0;
      if (op == ReduceOp::sum) {
        std::fill(acc, acc + n, 0.0);
        for (int64_t j = 0; j < len; ++j) {
          half_storage_to_float(t, base + j * inner, x, n);
          sum_row(static_cast<const float*>(x), n, static_cast<double*>(acc));
        }
        for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[out + i] = float(acc[i]);
      } else if (op == ReduceOp::max || op == ReduceOp::min) {
        half_storage_to_float(t, base, best, n);
        for (int64_t j = 1; j < len; ++j) {
          half_storage_to_float(t, base + j * inner, x, n);
          extreme_row(op == ReduceOp::max, x, n, best);
        }
        std::copy(best, best + n, static_cast<float*>(dst) + out);
      } else {
        const bool is_max = op == ReduceOp::argmax;
        half_storage_to_float(t, base, best, n);
        std::fill(at, at + n, int64_t(0));
        for (int64_t j = 1; j < len; ++j) {
          half_storage_to_float(t, base + j * inner, x, n);
          for (int64_t i = 0; i < n; ++i) {
            const float b = best[i], v = x[i];
            if (b == b && (v != v || (is_max ? v > b : v < b))) best[i] = v, at[i] = j;
          }
        }
        std::copy(at, at + n, static_cast<int64_t*>(dst) + out);
      }
    }
  });
}
}  // namespace

bool reduce_half(ReduceOp op, DType t, const uint16_t* src, void* dst, int64_t outer, int64_t len, int64_t inner) {
  if (t != DType::bf16 && t != DType::f16) return false;
  if (len == 0 && op != ReduceOp::sum) detail::fail("[reduce] cannot take max/min/argmax over an empty axis");
  if (len == 0) {
    std::fill(static_cast<float*>(dst), static_cast<float*>(dst) + outer * inner, 0.f);
    return true;
  }
  if (inner == 1) reduce_half_rows(op, t, src, dst, outer, len);
  else reduce_half_columns(op, t, src, dst, outer, len, inner);
  return true;
}

void reduce(ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner) {
  if (len == 0 && op != ReduceOp::sum) detail::fail("[reduce] cannot take max/min/argmax over an empty axis");
  switch (t) {
    case DType::f32: reduce_typed<float, double>(op, static_cast<const float*>(src), dst, outer, len, inner); break;
    case DType::f64: reduce_typed<double, double>(op, static_cast<const double*>(src), dst, outer, len, inner); break;
    case DType::i32: reduce_typed<int32_t, int64_t>(op, static_cast<const int32_t*>(src), dst, outer, len, inner); break;
    case DType::i64: reduce_typed<int64_t, int64_t>(op, static_cast<const int64_t*>(src), dst, outer, len, inner); break;
    case DType::u8: case DType::boolean:
      reduce_typed<uint8_t, int64_t>(op, static_cast<const uint8_t*>(src), dst, outer, len, inner); break;
    case DType::bf16: case DType::f16:
      reduce_half(op, t, static_cast<const uint16_t*>(src), dst, outer, len, inner); break;
    default: detail::fail("[reduce] CPU kernel does not support ", dtype_name(t));
  }
}

}  // namespace flux::cpu_backend
