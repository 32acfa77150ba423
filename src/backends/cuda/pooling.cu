// Pooling on the GPU (reference: src/backends/cpu/pooling.cpp): pool_forward / pool_backward over
// (N, C, spatial...) with 1 to 3 spatial axes (as Window3's (D, H, W)), float32 and float64.
// Semantics (backend.hpp): a window starts at o * stride - pad_lo and is clipped to the input, so max
// never takes padding; mean divides by the full window size (count_include_pad). Max propagates NaN,
// and its gradient goes to the first position in window order (d, then h, then w) that holds y.
// Every backward is a gather, one thread per dx element adding the outputs that reach it in output
// order: no atomics, the same result on every run.
#include "src/backends/cuda/cuda_backend.hpp"

namespace flux::cuda_backend {

namespace {

using backend::PoolOp;

// One thread per output (forward, first maximum) or per dx element (gather); math in window.hpp.
template <class T, PoolOp op> __global__ void forward_kernel(const T* x, T* y, Window3 a, int64_t total) {
  for (int64_t k = thread_index(); k < total; k += thread_stride()) y[k] = pool_value<T, op>(x, a, k);
}

// Max, first pass: arg[k] = the in-plane index of the first window position holding y[k], or -1.
template <class T> __global__ void argmax_kernel(const T* x, const T* y, int64_t* arg, Window3 a, int64_t total) {
  for (int64_t k = thread_index(); k < total; k += thread_stride()) arg[k] = pool_first_max(x, y, a, k);
}

// Second pass (max) or the only one (mean): dx[j] += the dy of every output reaching j, in output order.
template <class T, PoolOp op>
__global__ void backward_kernel(const T* dy, const int64_t* arg, T* dx, Window3 a, int64_t total) {
  for (int64_t j = thread_index(); j < total; j += thread_stride()) dx[j] = pool_gather<T, op>(dy, arg, dx, a, j);
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

}  // namespace flux::cuda_backend
