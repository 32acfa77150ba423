// Reductions over the middle axis of an [outer, len, inner] view, on OpenCL devices.
// inner == 1 with a long axis: one work-group per row, tree reduction in local memory (sum, max, min).
// Otherwise: one work-item per output element, a sequential loop (always for argmax/argmin, so the
// first best index wins exactly as on the CPU).
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

using backend::ReduceOp;

namespace {

// op: 0 sum, 1 max, 2 min, 3 argmax, 4 argmin (backend::ReduceOp). Sums accumulate in ACC.
const char* const kReduceSource = R"CLC(
inline T pick(int op, T best, T v) {
#ifdef IS_FLOAT
  if (isnan(best)) return best;
  if (isnan(v)) return v;
#endif
  return op == 1 ? (v > best ? v : best) : (v < best ? v : best);
}
__kernel void reduce_columns(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long outer,
                             long len, long inner, int op) {
  __global const T* s = AT(T, src, src_off);
  GRID_LOOP(r, outer * inner) {
    long o = r / inner, i = r - o * inner;
    __global const T* base = s + o * len * inner + i;
    if (op == 0) {
      ACC acc = 0;
      for (long j = 0; j < len; ++j) acc += (ACC)base[j * inner];
      AT(T, dst, dst_off)[r] = (T)acc;
    } else if (op <= 2) {
      T best = base[0];
      for (long j = 1; j < len; ++j) best = pick(op, best, base[j * inner]);
      AT(T, dst, dst_off)[r] = best;
    } else {
      T best = base[0];
      long at = 0;
      for (long j = 1; j < len; ++j) {
        T v = base[j * inner];
        if (op == 3 ? v > best : v < best) { best = v; at = j; }
      }
      AT(long, dst, dst_off)[r] = at;
    }
  }
}
// One work-group per row of length len (inner == 1); the local size is a power of two <= 256.
__kernel void reduce_rows(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long outer, long len,
                          int op) {
  __local ACC sums[256];
  __local T bests[256];
  __global const T* s = AT(T, src, src_off);
  __global T* d = AT(T, dst, dst_off);
  int lid = get_local_id(0), lsize = get_local_size(0);
  for (long o = get_group_id(0); o < outer; o += get_num_groups(0)) {
    __global const T* row = s + o * len;
    if (op == 0) {
      ACC acc = 0;
      for (long j = lid; j < len; j += lsize) acc += (ACC)row[j];
      sums[lid] = acc;
    } else {
      T best = row[0];
      for (long j = lid; j < len; j += lsize) best = pick(op, best, row[j]);
      bests[lid] = best;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = lsize / 2; w > 0; w /= 2) {
      if (lid < w) {
        if (op == 0) sums[lid] += sums[lid + w];
        else bests[lid] = pick(op, bests[lid], bests[lid + w]);
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) d[o] = op == 0 ? (T)sums[0] : bests[0];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}
)CLC";

}  // namespace

void reduce(int d, ReduceOp op, DType t, backend::Buffer src, backend::Buffer dst, int64_t outer, int64_t len,
            int64_t inner) {
  if (len == 0 && op != ReduceOp::sum) ::flux::detail::fail("[reduce] cannot take max/min/argmax over an empty axis");
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "reduce");
  if (outer * inner == 0) return;
  if (inner == 1 && len >= 512 && (op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::min)) {
    auto& k = kernel(dev, "reduce", kReduceSource, o, "reduce_rows");
    launch(dev, k, outer, true, mem(src), off(src), mem(dst), off(dst), cl_long(outer), cl_long(len), cl_int(op));
    return;
  }
  auto& k = kernel(dev, "reduce", kReduceSource, o, "reduce_columns");
  launch(dev, k, outer * inner, false, mem(src), off(src), mem(dst), off(dst), cl_long(outer), cl_long(len),
         cl_long(inner), cl_int(op));
}

}  // namespace flux::opencl
