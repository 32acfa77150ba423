// fill, cast and strided copy on the CPU.
#include <cstring>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/internal.hpp"

namespace flux::cpu {

constexpr int64_t kGrain = 1 << 16;

void fill(DType t, void* dst, int64_t n, double value) {
  if (t == DType::f16 || t == DType::bf16) {
    uint16_t bits = t == DType::f16 ? float_to_half(float(value)) : float_to_bfloat16(float(value));
    auto* p = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) p[i] = bits;
    return;
  }
  if (t == DType::boolean) value = value != 0 ? 1 : 0;
  FLUX_CPU_DISPATCH("fill", t, {
    T v = T(value);
    T* p = static_cast<T*>(dst);
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = v;
    });
  });
}

namespace {
template <class From, class To> void cast_typed(const void* src, void* dst, int64_t n, bool to_bool) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    if (to_bool) {
      for (int64_t i = b; i < e; ++i) d[i] = To(s[i] != From(0));
    } else {
      for (int64_t i = b; i < e; ++i) d[i] = To(s[i]);
    }
  });
}
bool arithmetic(DType t) { return t != DType::f16 && t != DType::bf16; }
}  // namespace

void cast(DType from, const void* src, DType to, void* dst, int64_t n) {
  if (from == to || (dtype_size(from) == 1 && dtype_size(to) == 1 && to != DType::boolean)) {
    std::memcpy(dst, src, size_t(n) * dtype_size(from));
    return;
  }
  if (arithmetic(from) && arithmetic(to)) {
    bool to_bool = to == DType::boolean;
    FLUX_CPU_DISPATCH("cast", from, {
      using From = T;
      FLUX_CPU_DISPATCH("cast", to, { cast_typed<From, T>(src, dst, n, to_bool); });
    });
    return;
  }
  // Half precision on either side: through double, element by element.
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) detail::store_from_double(dst, to, i, detail::load_as_double(src, from, i));
  });
}

void strided_copy(DType t, const void* src, void* dst, const backend::StridedCopy& p) {
  size_t es = dtype_size(t);
  int64_t total = 1;
  for (int i = 0; i < p.ndim; ++i) total *= p.shape[i];
  if (total == 0) return;
  int nd = p.ndim;
  // The innermost axis is copied as a run when both strides are 1.
  int64_t inner = nd ? p.shape[nd - 1] : 1;
  bool runs = nd && p.src_stride[nd - 1] == 1 && p.dst_stride[nd - 1] == 1;
  int64_t outer = total / inner;
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      // decompose o over axes [0, nd-1)
      int64_t rem = o, so = 0, d = 0;
      for (int i = nd - 2; i >= 0; --i) {
        int64_t c = rem % p.shape[i];
        rem /= p.shape[i];
        so += c * p.src_stride[i];
        d += c * p.dst_stride[i];
      }
      const char* s = static_cast<const char*>(src) + so * int64_t(es);
      char* q = static_cast<char*>(dst) + d * int64_t(es);
      if (runs) {
        std::memcpy(q, s, size_t(inner) * es);
      } else {
        int64_t ss = nd ? p.src_stride[nd - 1] : 0, ds = nd ? p.dst_stride[nd - 1] : 0;
        switch (es) {
          case 1: for (int64_t j = 0; j < inner; ++j) q[j * ds] = s[j * ss]; break;
          case 2: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint16_t*>(q)[j * ds] = reinterpret_cast<const uint16_t*>(s)[j * ss]; break;
          case 4: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint32_t*>(q)[j * ds] = reinterpret_cast<const uint32_t*>(s)[j * ss]; break;
          default: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint64_t*>(q)[j * ds] = reinterpret_cast<const uint64_t*>(s)[j * ss]; break;
        }
      }
    }
  };
  parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), body);
}

}  // namespace flux::cpu
