// fill, cast and strided copy on the CPU.
#include <cstring>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/internal.hpp"

namespace flux::cpu_backend {

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
  // float32 <-> bf16/f16: the vectorised conversions (half_cast.cpp).
  const bool half_from = from == DType::bf16 || from == DType::f16, half_to = to == DType::bf16 || to == DType::f16;
  if (from == DType::f32 && half_to) {
    float_to_half_storage(to, static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    return;
  }
  if (half_from && to == DType::f32) {
    half_storage_to_float(from, static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    return;
  }
  // Half precision on either side otherwise: through double, element by element.
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) detail::store_from_double(dst, to, i, detail::load_as_double(src, from, i));
  });
}

namespace {
// Copies `inner` elements of es bytes with strides ss, ds (elements): a typed loop (short dense runs,
// such as the 16-float head rows of an attention permute, cost less than a memcpy call) or memcpy.
void copy_run(const char* s, char* q, int64_t inner, int64_t ss, int64_t ds, size_t es) {
  if (ss == 1 && ds == 1 && inner * int64_t(es) > 256) {
    std::memcpy(q, s, size_t(inner) * es);
    return;
  }
  switch (es) {
    case 1: for (int64_t j = 0; j < inner; ++j) q[j * ds] = s[j * ss]; break;
    case 2: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint16_t*>(q)[j * ds] = reinterpret_cast<const uint16_t*>(s)[j * ss]; break;
    case 4: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint32_t*>(q)[j * ds] = reinterpret_cast<const uint32_t*>(s)[j * ss]; break;
    default: for (int64_t j = 0; j < inner; ++j) reinterpret_cast<uint64_t*>(q)[j * ds] = reinterpret_cast<const uint64_t*>(s)[j * ss]; break;
  }
}
}  // namespace

void strided_copy(DType t, const void* src, void* dst, const backend::StridedCopy& plan) {
  size_t es = dtype_size(t);
  int64_t total = 1;
  for (int i = 0; i < plan.ndim; ++i) total *= plan.shape[i];
  if (total == 0) return;
  // Merge neighbouring axes that are one run in both source and destination, and drop size-1 axes:
  // fewer, longer runs (a permute that keeps the last two axes together copies them as one).
  backend::StridedCopy p;
  for (int i = 0; i < plan.ndim; ++i) {
    if (plan.shape[i] == 1) continue;
    if (p.ndim > 0 && p.src_stride[p.ndim - 1] == plan.src_stride[i] * plan.shape[i] &&
        p.dst_stride[p.ndim - 1] == plan.dst_stride[i] * plan.shape[i]) {
      p.shape[p.ndim - 1] *= plan.shape[i];
      p.src_stride[p.ndim - 1] = plan.src_stride[i];
      p.dst_stride[p.ndim - 1] = plan.dst_stride[i];
      continue;
    }
    p.shape[p.ndim] = plan.shape[i], p.src_stride[p.ndim] = plan.src_stride[i], p.dst_stride[p.ndim] = plan.dst_stride[i];
    ++p.ndim;
  }
  const int nd = p.ndim;
  const int64_t inner = nd ? p.shape[nd - 1] : 1;
  const int64_t ss = nd ? p.src_stride[nd - 1] : 0, ds = nd ? p.dst_stride[nd - 1] : 0;
  const int64_t outer = total / inner;
  auto body = [&](int64_t b, int64_t e) {
    // The run index o over axes [0, nd - 1), decomposed once, then advanced like an odometer.
    int64_t idx[backend::kMaxDims] = {}, so = 0, d = 0, rem = b;
    for (int i = nd - 2; i >= 0; --i) {
      idx[i] = rem % p.shape[i];
      rem /= p.shape[i];
      so += idx[i] * p.src_stride[i];
      d += idx[i] * p.dst_stride[i];
    }
    for (int64_t o = b; o < e; ++o) {
      copy_run(static_cast<const char*>(src) + so * int64_t(es), static_cast<char*>(dst) + d * int64_t(es), inner, ss,
               ds, es);
      for (int i = nd - 2; i >= 0; --i) {
        so += p.src_stride[i], d += p.dst_stride[i];
        if (++idx[i] < p.shape[i]) break;
        so -= idx[i] * p.src_stride[i], d -= idx[i] * p.dst_stride[i];
        idx[i] = 0;
      }
    }
  };
  parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), body);
}

}  // namespace flux::cpu_backend
