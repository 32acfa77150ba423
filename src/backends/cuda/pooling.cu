// Pooling on the GPU (reference: src/backends/cpu/pooling.cpp): pool_forward / pool_backward over
// (N, C, spatial...) with 1 to 3 spatial axes (as Window3's (D, H, W)), float32 and float64.
// Semantics (backend.hpp): a window starts at o * stride - pad_lo and is clipped to the input, so max
// never takes padding; mean divides by the full window size (count_include_pad). Max propagates NaN,
// and its gradient goes to the first position in window order (d, then h, then w) that holds y.
// Every backward is a gather, one thread per dx element adding the outputs that reach it in output
// order: no atomics, the same result on every run.
#include <cmath>

#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::gpu {

namespace {

using backend::PoolOp;

template <class T> __device__ inline T take_max(T m, T v) { return (v > m || v != v) ? v : m; }  // NaN wins, stays
template <class T> __device__ inline bool holds(T v, T y) { return v == y || (v != v && y != y); }

// The clipped window [begin, end) of output position o along axis i.
__device__ inline void clip(const Window3& a, int i, int64_t o, int64_t& begin, int64_t& end) {
  const int64_t start = o * a.stride[i] - a.pad[i];
  begin = start > 0 ? start : 0;
  end = start + a.kernel[i] < a.in[i] ? start + a.kernel[i] : a.in[i];
}

// The outputs [begin, end) along axis i whose windows contain input position p.
__device__ inline void reach(const Window3& a, int i, int64_t p, int64_t& begin, int64_t& end) {
  const int64_t lo = p + a.pad[i] - a.kernel[i] + 1;  // o * stride >= lo
  begin = lo > 0 ? (lo + a.stride[i] - 1) / a.stride[i] : 0;
  const int64_t last = (p + a.pad[i]) / a.stride[i] + 1;  // o * stride <= p + pad
  end = last < a.out[i] ? last : a.out[i];
}

// Splits a flat output index into (plane, od, oh, ow).
__device__ inline int64_t split_out(const Window3& a, int64_t k, int64_t o[3]) {
  o[2] = k % a.out[2];
  k /= a.out[2];
  o[1] = k % a.out[1];
  k /= a.out[1];
  o[0] = k % a.out[0];
  return k / a.out[0];
}

template <class T, PoolOp op> __global__ void forward_kernel(const T* x, T* y, Window3 a, int64_t total) {
  for (int64_t k = thread_index(); k < total; k += thread_stride()) {
    int64_t o[3];
    const int64_t plane = split_out(a, k, o);
    int64_t b[3], e[3];
    for (int i = 0; i < 3; ++i) clip(a, i, o[i], b[i], e[i]);
    const T* xp = x + plane * a.in_size;
    T acc = op == PoolOp::max ? T(-HUGE_VAL) : T(0);
    for (int64_t d = b[0]; d < e[0]; ++d)
      for (int64_t h = b[1]; h < e[1]; ++h) {
        const T* row = xp + (d * a.in[1] + h) * a.in[2];
        for (int64_t w = b[2]; w < e[2]; ++w) acc = op == PoolOp::max ? take_max(acc, row[w]) : acc + row[w];
      }
    y[k] = op == PoolOp::max ? acc : acc / T(a.kernel_size);
  }
}

// Max, first pass: arg[k] = the in-plane index of the first window position holding y[k], or -1.
template <class T> __global__ void argmax_kernel(const T* x, const T* y, int64_t* arg, Window3 a, int64_t total) {
  for (int64_t k = thread_index(); k < total; k += thread_stride()) {
    int64_t o[3];
    const int64_t plane = split_out(a, k, o);
    int64_t b[3], e[3];
    for (int i = 0; i < 3; ++i) clip(a, i, o[i], b[i], e[i]);
    const T* xp = x + plane * a.in_size;
    const T target = y[k];
    int64_t hit = -1;
    for (int64_t d = b[0]; d < e[0] && hit < 0; ++d)
      for (int64_t h = b[1]; h < e[1] && hit < 0; ++h) {
        const int64_t base = (d * a.in[1] + h) * a.in[2];
        for (int64_t w = b[2]; w < e[2]; ++w)
          if (holds(xp[base + w], target)) {
            hit = base + w;
            break;
          }
      }
    arg[k] = hit;
  }
}

// Second pass (max) or the only one (mean): dx[j] += the dy of every output reaching j, in output order.
template <class T, PoolOp op>
__global__ void backward_kernel(const T* dy, const int64_t* arg, T* dx, Window3 a, int64_t total) {
  for (int64_t j = thread_index(); j < total; j += thread_stride()) {
    int64_t p = j % a.in_size;
    const int64_t plane = j / a.in_size;
    const int64_t pos = p;
    int64_t in[3];
    in[2] = p % a.in[2];
    p /= a.in[2];
    in[1] = p % a.in[1];
    in[0] = p / a.in[1];
    int64_t b[3], e[3];
    for (int i = 0; i < 3; ++i) reach(a, i, in[i], b[i], e[i]);
    const T* dyp = dy + plane * a.out_size;
    const int64_t* ap = arg ? arg + plane * a.out_size : nullptr;
    T acc = dx[j];
    for (int64_t d = b[0]; d < e[0]; ++d)
      for (int64_t h = b[1]; h < e[1]; ++h)
        for (int64_t w = b[2]; w < e[2]; ++w) {
          const int64_t o = (d * a.out[1] + h) * a.out[2] + w;
          if constexpr (op == PoolOp::max) {
            if (ap[o] == pos) acc += dyp[o];
          } else {
            acc += dyp[o] / T(a.kernel_size);
          }
        }
    dx[j] = acc;
  }
}

template <class T> void forward_typed(Stream s, PoolOp op, const void* x, void* y, const Window3& a, int64_t total) {
  auto xs = static_cast<const T*>(x);
  auto ys = static_cast<T*>(y);
  if (op == PoolOp::max) forward_kernel<T, PoolOp::max><<<blocks_for(total), kThreads, 0, s>>>(xs, ys, a, total);
  else forward_kernel<T, PoolOp::mean><<<blocks_for(total), kThreads, 0, s>>>(xs, ys, a, total);
}

template <class T>
void backward_typed(Stream s, PoolOp op, const void* x, const void* y, const void* dy, int64_t* arg, void* dx,
                    const Window3& a, int64_t outputs, int64_t inputs) {
  auto dys = static_cast<const T*>(dy);
  auto dxs = static_cast<T*>(dx);
  if (op == PoolOp::max) {
    argmax_kernel<T><<<blocks_for(outputs), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(y), arg,
                                                                a, outputs);
    check_launch("pool backward (argmax) kernel");
    backward_kernel<T, PoolOp::max><<<blocks_for(inputs), kThreads, 0, s>>>(dys, arg, dxs, a, inputs);
  } else {
    backward_kernel<T, PoolOp::mean><<<blocks_for(inputs), kThreads, 0, s>>>(dys, nullptr, dxs, a, inputs);
  }
}

}  // namespace

void pool_forward(Stream s, PoolOp op, DType t, const void* x, void* y, const backend::ConvGeometry& g) {
  check_window("pool", t, g);
  const Window3 a = window3(g);
  const int64_t total = g.batch * g.in_channels * a.out_size;
  if (total <= 0) return;
  if (t == DType::f32) forward_typed<float>(s, op, x, y, a, total);
  else forward_typed<double>(s, op, x, y, a, total);
  check_launch("pool forward kernel");
}

void pool_backward(backend::Backend& be, int device, Stream s, PoolOp op, DType t, const void* x, const void* y,
                   const void* dy, void* dx, const backend::ConvGeometry& g) {
  check_window("pool backward", t, g);
  const Window3 a = window3(g);
  const int64_t planes = g.batch * g.in_channels, outputs = planes * a.out_size, inputs = planes * a.in_size;
  if (outputs <= 0 || inputs <= 0) return;
  Scratch arg(be, device, op == PoolOp::max ? size_t(outputs) * sizeof(int64_t) : 0);
  auto args = static_cast<int64_t*>(arg.get());
  if (t == DType::f32) backward_typed<float>(s, op, x, y, dy, args, dx, a, outputs, inputs);
  else backward_typed<double>(s, op, x, y, dy, args, dx, a, outputs, inputs);
  check_launch("pool backward kernel");
}

}  // namespace flux::gpu
