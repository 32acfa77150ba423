// Reductions over the middle axis of an [outer, len, inner] view, on the CPU.
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

void reduce(ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner) {
  if (len == 0 && op != ReduceOp::sum) detail::fail("[reduce] cannot take max/min/argmax over an empty axis");
  switch (t) {
    case DType::f32: reduce_typed<float, double>(op, static_cast<const float*>(src), dst, outer, len, inner); break;
    case DType::f64: reduce_typed<double, double>(op, static_cast<const double*>(src), dst, outer, len, inner); break;
    case DType::i32: reduce_typed<int32_t, int64_t>(op, static_cast<const int32_t*>(src), dst, outer, len, inner); break;
    case DType::i64: reduce_typed<int64_t, int64_t>(op, static_cast<const int64_t*>(src), dst, outer, len, inner); break;
    case DType::u8: case DType::boolean:
      reduce_typed<uint8_t, int64_t>(op, static_cast<const uint8_t*>(src), dst, outer, len, inner); break;
    default: detail::fail("[reduce] CPU kernel does not support ", dtype_name(t));
  }
}

}  // namespace flux::cpu_backend
