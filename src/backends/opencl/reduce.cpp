// Reductions over the middle axis of an [outer, len, inner] view, on OpenCL devices.
// inner == 1 with a long axis: one work-group per row (or per 8192-element chunk of a few very long
// rows, then a second pass over the partials), tree reduction in local memory (sum, max, min).
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
      // NaN is the extreme either way (PyTorch): the first NaN wins (x != x: NaN, for any T).
      for (long j = 1; j < len && best == best; ++j) {
        T v = base[j * inner];
        if (v != v || (op == 3 ? v > best : v < best)) { best = v; at = j; }
      }
      AT(long, dst, dst_off)[r] = at;
    }
  }
}
// One work-group per chunk of a row (inner == 1): group r reduces row r / chunks, elements
// [c * chunk, min(len, (c + 1) * chunk)) with c = r % chunks, into dst[r]. Local size: a power of two <= 256.
__kernel void reduce_rows(__global uchar* src, ulong src_off, __global uchar* dst, ulong dst_off, long outer, long len,
                          long chunk, long chunks, int op) {
  __local ACC sums[256];
  __local T bests[256];
  __global const T* s = AT(T, src, src_off);
  __global T* d = AT(T, dst, dst_off);
  int lid = get_local_id(0), lsize = get_local_size(0);
  for (long r = get_group_id(0); r < outer * chunks; r += get_num_groups(0)) {
    long o = r / chunks, c = r - o * chunks;
    long begin = c * chunk, end = min(len, begin + chunk);
    __global const T* row = s + o * len;
    if (op == 0) {
      ACC acc = 0;
      for (long j = begin + lid; j < end; j += lsize) acc += (ACC)row[j];
      sums[lid] = acc;
    } else {
      T best = row[begin];
      for (long j = begin + lid; j < end; j += lsize) best = pick(op, best, row[j]);
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
    if (lid == 0) d[r] = op == 0 ? (T)sums[0] : bests[0];
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
  bool rows = inner == 1 && len >= 512 && (op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::min);
  if (rows && outer < 64 && len >= (int64_t(1) << 16)) {
    // Few long rows: split each into chunks reduced by separate work-groups, then reduce the partials.
    const int64_t chunk = 8192, chunks = (len + chunk - 1) / chunk;
    size_t bytes = size_t(outer * chunks) * dtype_size(t);
    cl_int err = CL_SUCCESS;
    cl_mem partial = clCreateBuffer(dev.context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    check(err, "clCreateBuffer", " (reduction partials)");
    try {
      auto& k = kernel(dev, "reduce", kReduceSource, o, "reduce_rows");
      launch(dev, k, outer * chunks, true, mem(src), off(src), partial, cl_ulong(0), cl_long(outer), cl_long(len),
             cl_long(chunk), cl_long(chunks), cl_int(op));
      reduce(d, op, t, backend::Buffer{partial, 0}, dst, outer, chunks, 1);
    } catch (...) {
      clReleaseMemObject(partial);
      throw;
    }
    clReleaseMemObject(partial);  // freed by the runtime once the queued kernels are done
    return;
  }
  if (rows) {
    auto& k = kernel(dev, "reduce", kReduceSource, o, "reduce_rows");
    launch(dev, k, outer, true, mem(src), off(src), mem(dst), off(dst), cl_long(outer), cl_long(len), cl_long(len),
           cl_long(1), cl_int(op));
    return;
  }
  auto& k = kernel(dev, "reduce", kReduceSource, o, "reduce_columns");
  launch(dev, k, outer * inner, false, mem(src), off(src), mem(dst), off(dst), cl_long(outer), cl_long(len),
         cl_long(inner), cl_int(op));
}

}  // namespace flux::opencl
