// Fused row normalisation on OpenCL devices (layernorm over the last axis, groupnorm's groups as rows),
// float32 and float64; formulas in include/flux/backend.hpp, the same arithmetic as
// src/backends/cpu/normalisation.cpp (statistics accumulated in ACC: double where the device has fp64).
// x, y, dy, dx (r, d) row-major; mean, rstd (r,); weight, bias, dweight, dbias (d,).
// Rows: one work-group per row (a power-of-two local size <= 256), tree reductions in local memory.
// dweight/dbias: one work-item per column walking the rows (no atomics, deterministic).
#include "src/backends/opencl/opencl_backend.hpp"

namespace flux::opencl {

namespace {

const char* const kRowNormSource = R"CLC(
// Sum of every work-item's v over the work-group (local size a power of two <= 256), returned to all.
inline ACC group_sum(__local ACC* scratch, ACC v) {
  int lid = get_local_id(0), lsize = get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = lsize / 2; w > 0; w /= 2) {
    if (lid < w) scratch[lid] += scratch[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  ACC total = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
}

__kernel void rownorm_forward(__global uchar* x, ulong x_off, __global uchar* w, ulong w_off, int has_w,
                              __global uchar* b, ulong b_off, int has_b, __global uchar* y, ulong y_off,
                              __global uchar* mean, ulong mean_off, __global uchar* rstd, ulong rstd_off, long r,
                              long d, ACC eps) {
  __local ACC scratch[256];
  const int lid = get_local_id(0), lsize = get_local_size(0);
  __global const T* W = AT(T, w, w_off);
  __global const T* B = AT(T, b, b_off);
  for (long i = get_group_id(0); i < r; i += get_num_groups(0)) {
    __global const T* xi = AT(T, x, x_off) + i * d;
    __global T* yi = AT(T, y, y_off) + i * d;
    ACC acc = 0;
    for (long j = lid; j < d; j += lsize) acc += (ACC)xi[j];
    const ACC mu = group_sum(scratch, acc) / (ACC)d;
    acc = 0;
    for (long j = lid; j < d; j += lsize) {
      ACC c = (ACC)xi[j] - mu;
      acc += c * c;
    }
    const ACC inv = (ACC)1 / sqrt(group_sum(scratch, acc) / (ACC)d + eps);
    if (lid == 0) {
      AT(T, mean, mean_off)[i] = (T)mu;
      AT(T, rstd, rstd_off)[i] = (T)inv;
    }
    const T m = (T)mu, s = (T)inv;
    for (long j = lid; j < d; j += lsize) {
      T v = (xi[j] - m) * s;
      if (has_w) v *= W[j];
      if (has_b) v += B[j];
      yi[j] = v;
    }
  }
}

__kernel void rownorm_backward_x(__global uchar* x, ulong x_off, __global uchar* dy, ulong dy_off, __global uchar* w,
                                 ulong w_off, int has_w, __global uchar* mean, ulong mean_off, __global uchar* rstd,
                                 ulong rstd_off, __global uchar* dx, ulong dx_off, long r, long d) {
  __local ACC scratch[256];
  const int lid = get_local_id(0), lsize = get_local_size(0);
  __global const T* W = AT(T, w, w_off);
  for (long i = get_group_id(0); i < r; i += get_num_groups(0)) {
    __global const T* xi = AT(T, x, x_off) + i * d;
    __global const T* gi = AT(T, dy, dy_off) + i * d;
    __global T* dxi = AT(T, dx, dx_off) + i * d;
    const ACC mu = (ACC)AT(T, mean, mean_off)[i], s = (ACC)AT(T, rstd, rstd_off)[i];
    ACC sg = 0, sgx = 0;
    for (long j = lid; j < d; j += lsize) {
      ACC g = has_w ? (ACC)gi[j] * (ACC)W[j] : (ACC)gi[j];
      sg += g;
      sgx += g * ((ACC)xi[j] - mu) * s;
    }
    const ACC mg = group_sum(scratch, sg) / (ACC)d;
    const ACC mgx = group_sum(scratch, sgx) / (ACC)d;
    for (long j = lid; j < d; j += lsize) {
      ACC g = has_w ? (ACC)gi[j] * (ACC)W[j] : (ACC)gi[j];
      dxi[j] = (T)(s * (g - mg - ((ACC)xi[j] - mu) * s * mgx));
    }
  }
}

__kernel void rownorm_backward_params(__global uchar* x, ulong x_off, __global uchar* dy, ulong dy_off,
                                      __global uchar* mean, ulong mean_off, __global uchar* rstd, ulong rstd_off,
                                      __global uchar* dw, ulong dw_off, int want_w, __global uchar* db, ulong db_off,
                                      int want_b, long r, long d) {
  __global const T* X = AT(T, x, x_off);
  __global const T* G = AT(T, dy, dy_off);
  __global const T* M = AT(T, mean, mean_off);
  __global const T* S = AT(T, rstd, rstd_off);
  GRID_LOOP(j, d) {
    ACC aw = 0, ab = 0;
    for (long i = 0; i < r; ++i) {
      ACC g = (ACC)G[i * d + j];
      aw += g * ((ACC)X[i * d + j] - (ACC)M[i]) * (ACC)S[i];
      ab += g;
    }
    if (want_w) AT(T, dw, dw_off)[j] = (T)aw;
    if (want_b) AT(T, db, db_off)[j] = (T)ab;
  }
}
)CLC";

cl_int has(backend::Buffer b) { return b.handle != nullptr; }

}  // namespace

bool rownorm_forward(int d_, DType t, backend::Buffer x, backend::Buffer w, backend::Buffer b, backend::Buffer y,
                     backend::Buffer mean, backend::Buffer rstd, int64_t r, int64_t d, double eps) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (r * d == 0) return true;
  DeviceState& dev = device(d_);
  auto& k = kernel(dev, "rownorm", kRowNormSource, type_options(dev, t, "layernorm"), "rownorm_forward");
  // eps travels as ACC (double when the device has fp64, as the kernel's statistics).
  const DType acc = dev.fp64 ? DType::f64 : DType::f32;
  launch(dev, k, r, true, mem(x), off(x), mem(w), off(w), has(w), mem(b), off(b), has(b), mem(y), off(y), mem(mean),
         off(mean), mem(rstd), off(rstd), cl_long(r), cl_long(d), scalar_of(acc, eps));
  return true;
}

bool rownorm_backward(int d_, DType t, backend::Buffer x, backend::Buffer dy, backend::Buffer w, backend::Buffer mean,
                      backend::Buffer rstd, backend::Buffer dx, backend::Buffer dw, backend::Buffer db, int64_t r,
                      int64_t d) {
  if (t != DType::f32 && t != DType::f64) return false;
  if (r * d == 0) return true;
  DeviceState& dev = device(d_);
  const std::string options = type_options(dev, t, "layernorm");
  auto& kx = kernel(dev, "rownorm", kRowNormSource, options, "rownorm_backward_x");
  launch(dev, kx, r, true, mem(x), off(x), mem(dy), off(dy), mem(w), off(w), has(w), mem(mean), off(mean), mem(rstd),
         off(rstd), mem(dx), off(dx), cl_long(r), cl_long(d));
  if (has(dw) || has(db)) {
    auto& kp = kernel(dev, "rownorm", kRowNormSource, options, "rownorm_backward_params");
    launch(dev, kp, d, false, mem(x), off(x), mem(dy), off(dy), mem(mean), off(mean), mem(rstd), off(rstd), mem(dw),
           off(dw), has(dw), mem(db), off(db), has(db), cl_long(r), cl_long(d));
  }
  return true;
}

}  // namespace flux::opencl
