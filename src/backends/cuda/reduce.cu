// Reductions over the middle axis of an [outer, len, inner] view, on the GPU
// (reference: src/backends/cpu/reduce.cpp: float sums accumulate in double, NaN propagates through
// max/min, argmax/argmin give the first extreme index and write int64).
//   inner == 1: one block per row, a tree in shared memory;  inner > 1: one thread per output.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

using backend::ReduceOp;

namespace {

template <class T> __device__ inline bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// A reducer: P partial (plain aggregate, fits __shared__), empty(), take(v, j), combine(a, b), store.
template <class T, class Acc> struct Sum {
  struct P { Acc v; };
  bool is_max;
  __device__ P empty() const { return {Acc(0)}; }
  __device__ P take(T v, int64_t) const { return {Acc(v)}; }
  __device__ P combine(P a, P b) const { return {a.v + b.v}; }
  __device__ void store(void* dst, int64_t k, P p) const { static_cast<T*>(dst)[k] = T(p.v); }
};

template <class T> struct Extreme {  // max / min; state 0 empty, 1 value, 2 NaN
  struct P { T v; int state; };
  bool is_max;
  __device__ P empty() const { return {T(0), 0}; }
  __device__ P take(T v, int64_t) const { return {v, is_nan(v) ? 2 : 1}; }
  __device__ P combine(P a, P b) const {
    if (a.state == 0 || b.state == 2) return b;
    if (b.state == 0 || a.state == 2) return a;
    return (is_max ? b.v > a.v : b.v < a.v) ? b : a;
  }
  __device__ void store(void* dst, int64_t k, P p) const { static_cast<T*>(dst)[k] = p.v; }
};

// argmax / argmin. As the CPU's sequential scan: NaN is the extreme either way (PyTorch), so the
// first NaN wins; otherwise ties go to the smaller index.
template <class T> struct Arg {
  struct P { T v; int64_t idx; };  // idx -1: empty
  bool is_max;
  __device__ P empty() const { return {T(0), -1}; }
  __device__ P take(T v, int64_t j) const { return {v, j}; }
  __device__ P combine(P a, P b) const {
    if (a.idx < 0) return b;
    if (b.idx < 0) return a;
    const bool na = is_nan(a.v), nb = is_nan(b.v);
    if (na && nb) return b.idx < a.idx ? b : a;
    if (na) return a;
    if (nb) return b;
    bool b_better = is_max ? (b.v > a.v || (b.v == a.v && b.idx < a.idx)) : (b.v < a.v || (b.v == a.v && b.idx < a.idx));
    return b_better ? b : a;
  }
  __device__ void store(void* dst, int64_t k, P p) const { static_cast<int64_t*>(dst)[k] = p.idx < 0 ? 0 : p.idx; }
};

// inner == 1: block b reduces rows b, b + gridDim.x, ...
template <class T, class R> __global__ void reduce_rows(R r, const T* src, void* dst, int64_t outer, int64_t len) {
  using P = typename R::P;
  __shared__ P partial[kThreads];
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    const T* x = src + row * len;
    P p = r.empty();
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) p = r.combine(p, r.take(x[j], j));
    partial[threadIdx.x] = p;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (int(threadIdx.x) < half) partial[threadIdx.x] = r.combine(partial[threadIdx.x], partial[threadIdx.x + half]);
      __syncthreads();
    }
    if (threadIdx.x == 0) r.store(dst, row, partial[0]);
    __syncthreads();
  }
}

// inner > 1: thread per (o, i), reading column i of slice o (coalesced across i).
template <class T, class R> __global__ void reduce_columns(R r, const T* src, void* dst, int64_t outer, int64_t len,
                                                           int64_t inner) {
  for (int64_t k = thread_index(); k < outer * inner; k += thread_stride()) {
    int64_t o = k / inner, i = k % inner;
    const T* x = src + o * len * inner + i;
    typename R::P p = r.empty();
    for (int64_t j = 0; j < len; ++j) p = r.combine(p, r.take(x[j * inner], j));
    r.store(dst, k, p);
  }
}

template <class T, class R> void launch(Stream s, R r, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner) {
  const T* x = static_cast<const T*>(src);
  if (inner == 1) {
    unsigned blocks = unsigned(outer < 65536 ? outer : 65536);
    reduce_rows<T, R><<<blocks, kThreads, 0, s>>>(r, x, dst, outer, len);
  } else {
    reduce_columns<T, R><<<blocks_for(outer * inner), kThreads, 0, s>>>(r, x, dst, outer, len, inner);
  }
}

template <class T, class Acc> void reduce_typed(Stream s, ReduceOp op, const void* src, void* dst, int64_t outer,
                                                int64_t len, int64_t inner) {
  switch (op) {
    case ReduceOp::sum: launch<T>(s, Sum<T, Acc>{false}, src, dst, outer, len, inner); break;
    case ReduceOp::max: launch<T>(s, Extreme<T>{true}, src, dst, outer, len, inner); break;
    case ReduceOp::min: launch<T>(s, Extreme<T>{false}, src, dst, outer, len, inner); break;
    case ReduceOp::argmax: launch<T>(s, Arg<T>{true}, src, dst, outer, len, inner); break;
    case ReduceOp::argmin: launch<T>(s, Arg<T>{false}, src, dst, outer, len, inner); break;
  }
}

}  // namespace

void reduce(Stream s, ReduceOp op, DType t, const void* src, void* dst, int64_t outer, int64_t len, int64_t inner) {
  if (len == 0 && op != ReduceOp::sum) detail::fail("[reduce] cannot take max/min/argmax over an empty axis");
  if (outer * inner == 0) return;
  switch (t) {
    case DType::f32: reduce_typed<float, double>(s, op, src, dst, outer, len, inner); break;
    case DType::f64: reduce_typed<double, double>(s, op, src, dst, outer, len, inner); break;
    case DType::i32: reduce_typed<int32_t, int64_t>(s, op, src, dst, outer, len, inner); break;
    case DType::i64: reduce_typed<int64_t, int64_t>(s, op, src, dst, outer, len, inner); break;
    case DType::u8: case DType::boolean: reduce_typed<uint8_t, int64_t>(s, op, src, dst, outer, len, inner); break;
    default: detail::fail("[reduce] " FLUX_GPU_BACKEND_NAME " kernel does not support ", dtype_name(t));
  }
  check_launch("reduce kernel");
}

}  // namespace flux::cuda_backend
