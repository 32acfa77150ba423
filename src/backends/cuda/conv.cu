// Convolution on the GPU (reference: src/backends/cpu/conv_reference.cpp and conv.cpp).
//   im2col / col2im: the primitives of the core's portable path (im2col + batched GEMM), f32 and f64,
//     over Window3's three spatial axes (1-D and 2-D have leading length-1 axes). col is
//     (N, G, C/G * K, P) = (N * C, K, P) row blocks: channel c of sample n owns rows (n * C + c) * K...
//     im2col runs one thread per column element; col2im one thread per dx element gathering its
//     columns in kernel order (no atomics: the same sums on every run, in the CPU loop's order).
//   cuDNN fast paths (CUDA plugin built with FLUX_CUDNN): the legacy convolution API (NCHW, groups,
//     dilation, 1-D as 2-D with H = 1, 3-D), f32, f64, f16 and bf16. Descriptors and the algorithm
//     are chosen once per (device, dtype, direction, geometry) and cached; float32 runs FMA kernels
//     only (no TF32), as cuBLAS does here, so results stay within float32 rounding of the float64
//     reference. f16 / bf16 (backend.cpp calls these only on GPUs with such tensor cores) keep every
//     array in 16 bits and compute in float32 (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations)
//     with tensor-op math; their bias and bias gradient are our kernels below (float32 sums, one
//     block per channel: deterministic), not cudnnAddTensor / cudnnConvolutionBackwardBias, whose
//     bf16 support is not documented.
//     Each host thread runs on a cuDNN handle of its own per device (handle_pool.hpp), taken on its
//     first call (cudnnCreate fails without a GPU: the plugin must still load), and a workspace of
//     its own per call; the plans are shared read-only. No thread waits for another's conv call (the
//     device's one stream still orders the work on the GPU).
//     Anything cuDNN cannot do (asymmetric padding, 2^31 elements, no algorithm) returns false and
//     the core takes the portable path. The AMDGPU build has no MIOpen (Debian 12): always false.
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "src/backends/cuda/cuda_backend.hpp"
#include "src/backends/cuda/handle_pool.hpp"
#include "src/environment_flag.hpp"

#if defined(FLUX_CUDNN) && !defined(FLUX_HIP)
#include <cudnn.h>
#define FLUX_HAVE_CUDNN 1
#endif

namespace flux::cuda_backend {

namespace {

// One thread per element of col (im2col) or of dx (col2im); the index math is in window.hpp.
template <class T> __global__ void im2col_kernel(const T* x, T* col, Window3 a, int64_t total) {
  for (int64_t k = thread_index(); k < total; k += thread_stride()) col[k] = im2col_value(x, a, k);
}

template <class T> __global__ void col2im_kernel(const T* col, T* dx, Window3 a, int64_t total) {
  for (int64_t j = thread_index(); j < total; j += thread_stride()) dx[j] = col2im_value(col, dx, a, j);
}

}  // namespace

void im2col(Stream s, DType t, const void* x, void* col, const backend::ConvGeometry& g) {
  check_window("im2col", t, g);
  const Window3 a = window3(g);
  const int64_t total = g.batch * g.in_channels * a.kernel_size * a.out_size;
  if (total <= 0) return;
  if (t == DType::f32)
    im2col_kernel<float><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const float*>(x), static_cast<float*>(col), a, total);
  else
    im2col_kernel<double><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const double*>(x), static_cast<double*>(col), a, total);
  check_launch("im2col kernel");
}

void col2im(Stream s, DType t, const void* col, void* dx, const backend::ConvGeometry& g) {
  check_window("col2im", t, g);
  const Window3 a = window3(g);
  const int64_t total = g.batch * g.in_channels * a.in_size;
  if (total <= 0 || a.out_size <= 0) return;
  if (t == DType::f32)
    col2im_kernel<float><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const float*>(col), static_cast<float*>(dx), a, total);
  else
    col2im_kernel<double><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const double*>(col), static_cast<double*>(dx), a, total);
  check_launch("col2im kernel");
}

#ifdef FLUX_HAVE_CUDNN

namespace {

// f16 / bf16 elements as their bits, converted through float (gpu_runtime.hpp).
template <bool BF16> __device__ inline float load16(uint16_t v) {
  return BF16 ? bfloat16_bits_to_float(v) : half_bits_to_float(v);
}
template <bool BF16> __device__ inline uint16_t store16(float v) {
  return BF16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
}

// y[n, c, p] += bias[c] over (batch * channels) rows of `plane` elements, added in float32.
template <bool BF16> __global__ void bias_add16(uint16_t* y, const uint16_t* bias, int64_t channels, int64_t plane,
                                                int64_t total) {
  for (int64_t i = thread_index(); i < total; i += thread_stride())
    y[i] = store16<BF16>(load16<BF16>(y[i]) + load16<BF16>(bias[(i / plane) % channels]));
}

// db[c] = the sum of dy[n, c, p] over n and p: block c sums in float32 and rounds once.
template <bool BF16> __global__ void __launch_bounds__(kThreads)
bias_grad16(const uint16_t* dy, uint16_t* db, int64_t batch, int64_t channels, int64_t plane) {
  __shared__ float part[kThreads];
  const int64_t c = blockIdx.x;
  float acc = 0.f;
  for (int64_t n = 0; n < batch; ++n) {
    const uint16_t* row = dy + (n * channels + c) * plane;
    for (int64_t p = threadIdx.x; p < plane; p += kThreads) acc += load16<BF16>(row[p]);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (int(threadIdx.x) < width) part[threadIdx.x] += part[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = store16<BF16>(part[0]);
}

int64_t plane_of(const backend::ConvGeometry& g) {
  int64_t p = 1;
  for (int i = 0; i < g.spatial; ++i) p *= g.out[i];
  return p;
}

void bias_add_low(Stream s, DType t, void* y, const void* bias, const backend::ConvGeometry& g) {
  const int64_t plane = plane_of(g), total = g.batch * g.out_channels * plane;
  if (total <= 0) return;
  auto* yp = static_cast<uint16_t*>(y);
  auto* bp = static_cast<const uint16_t*>(bias);
  if (t == DType::bf16)
    bias_add16<true><<<blocks_for(total), kThreads, 0, s>>>(yp, bp, g.out_channels, plane, total);
  else
    bias_add16<false><<<blocks_for(total), kThreads, 0, s>>>(yp, bp, g.out_channels, plane, total);
  check_launch("conv bias (f16/bf16) kernel");
}

void bias_grad_low(Stream s, DType t, const void* dy, void* db, const backend::ConvGeometry& g) {
  if (g.out_channels <= 0) return;
  if (g.out_channels > INT_MAX) detail::fail("[conv] ", g.out_channels, " output channels exceed the grid");
  auto* dyp = static_cast<const uint16_t*>(dy);
  auto* dbp = static_cast<uint16_t*>(db);
  const unsigned blocks = unsigned(g.out_channels);
  if (t == DType::bf16)
    bias_grad16<true><<<blocks, kThreads, 0, s>>>(dyp, dbp, g.batch, g.out_channels, plane_of(g));
  else
    bias_grad16<false><<<blocks, kThreads, 0, s>>>(dyp, dbp, g.batch, g.out_channels, plane_of(g));
  check_launch("conv bias gradient (f16/bf16) kernel");
}

bool low_precision(DType t) { return t == DType::f16 || t == DType::bf16; }

enum class Kind : int64_t { forward, backward_data, backward_weight };

constexpr size_t kMaxWorkspace = size_t(1) << 30;  // algorithms wanting more are passed over

using Key = std::array<int64_t, 32>;

Key make_key(int device, DType t, Kind kind, const backend::ConvGeometry& g) {
  Key k{};
  size_t i = 0;
  k[i++] = device, k[i++] = int64_t(t), k[i++] = int64_t(kind), k[i++] = g.spatial, k[i++] = g.batch;
  k[i++] = g.in_channels, k[i++] = g.out_channels, k[i++] = g.groups;
  for (int a = 0; a < g.spatial && a < 3; ++a) {
    k[i++] = g.in[a], k[i++] = g.out[a], k[i++] = g.kernel[a], k[i++] = g.stride[a];
    k[i++] = g.pad_lo[a], k[i++] = g.pad_hi[a], k[i++] = g.dilation[a];
  }
  return k;
}

/// The descriptors and algorithm of one convolution; ok == false: cuDNN cannot do it. Immutable once
/// built and shared by every thread that runs the case; the descriptors go with the last holder.
struct Plan {
  bool ok = false;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;  // bias: (1, O, 1...) for bias / dbias
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() { release(); }
  void release() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    x = y = bias = nullptr, w = nullptr, conv = nullptr;
  }
};

/// Every plan built, by key: lookups share the lock, an insert or a drop takes it alone; no cuDNN
/// call runs under it.
struct Plans {
  std::shared_mutex mutex;
  std::map<Key, std::shared_ptr<const Plan>> by_key;
};

Plans& plans() {
  static Plans* p = new Plans();  // never destroyed, as the backend
  return *p;
}

// Spelled as the core reads it (src/environment_flag.hpp); a value the core warns about is off here.
bool debug() {
  const char* v = std::getenv("FLUX_DEBUG_BACKENDS");
  return v && ::flux::environment::parse_flag(v).value_or(false);
}

/// cuDNN's side of the per-thread handles (handle_pool.hpp): created on first use with the device
/// current; cudnnCreate fails without a GPU (the plugin must still load): the portable path there.
struct CudnnLibrary {
  using Handle = cudnnHandle_t;
  using Stream = cuda_backend::Stream;
  static Handle create(int device) {
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = cudnnCreate(&h);
    if (st == CUDNN_STATUS_SUCCESS) return h;
    if (debug())
      std::fprintf(stderr, "[flux:backends] CUDA: cudnnCreate on device %d failed (%s): convolutions take the "
                           "im2col path\n", device, cudnnGetErrorString(st));
    return nullptr;
  }
  static void bind(Handle h, Stream s, int device) {
    if (cudnnSetStream(h, s) != CUDNN_STATUS_SUCCESS) detail::fail("[conv] cudnnSetStream failed on CUDA:", device);
  }
};
using Handles = HandlePool<CudnnLibrary>;

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// (N, C, spatial...) as cuDNN dimensions: at least two spatial axes (1-D gets H = 1 in front).
std::vector<int> activation_dims(const backend::ConvGeometry& g, int64_t channels, const int64_t* sizes, bool& ok) {
  std::vector<int64_t> d{g.batch, channels};
  if (g.spatial == 1) d.push_back(1);
  for (int i = 0; i < g.spatial; ++i) d.push_back(sizes[i]);
  std::vector<int> out;
  int64_t numel = 1;
  for (int64_t v : d) {
    ok = ok && fits_int(v);
    numel *= v;
    out.push_back(int(v));
  }
  ok = ok && numel < (int64_t(1) << 31);  // the legacy API's tensor limit
  return out;
}

bool tensor_desc(cudnnTensorDescriptor_t& desc, cudnnDataType_t type, const std::vector<int>& dims) {
  std::vector<int> strides(dims.size());
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = int(s);
    s *= dims[i];
  }
  return cudnnCreateTensorDescriptor(&desc) == CUDNN_STATUS_SUCCESS &&
         cudnnSetTensorNdDescriptor(desc, type, int(dims.size()), dims.data(), strides.data()) == CUDNN_STATUS_SUCCESS;
}

// Picks the first heuristic result that succeeded, is FMA-only where asked (float32: no TF32), fits
// the workspace cap, preferring deterministic algorithms; -1 if none.
template <class Perf> int choose(const Perf* perf, int n, bool fma_only, cudnnMathType_t& math) {
  int pick = -1;
  for (int pass = 0; pass < 2 && pick < 0; ++pass)
    for (int i = 0; i < n; ++i) {
      const Perf& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
      if (fma_only && p.mathType != CUDNN_FMA_MATH) continue;
      if (pass == 0 && p.determinism != CUDNN_DETERMINISTIC) continue;
      pick = i;
      break;
    }
  if (pick >= 0) math = perf[pick].mathType;
  return pick < 0 ? -1 : int(perf[pick].algo);
}

// cuDNN's types for t: the arrays' `data`, the convolution's `compute` (float32 for f16 / bf16) and
// the math it may use (FMA only for float32: no TF32; tensor ops for f16 / bf16); false: no cuDNN path.
bool dnn_types(DType t, cudnnDataType_t& data, cudnnDataType_t& compute, cudnnMathType_t& math) {
  switch (t) {
    case DType::f32: data = compute = CUDNN_DATA_FLOAT, math = CUDNN_FMA_MATH; return true;
    case DType::f64: data = compute = CUDNN_DATA_DOUBLE, math = CUDNN_DEFAULT_MATH; return true;
    case DType::f16: data = CUDNN_DATA_HALF, compute = CUDNN_DATA_FLOAT, math = CUDNN_TENSOR_OP_MATH; return true;
    case DType::bf16: data = CUDNN_DATA_BFLOAT16, compute = CUDNN_DATA_FLOAT, math = CUDNN_TENSOR_OP_MATH; return true;
    default: return false;
  }
}

// Fills `p` for the convolution; false (p released) where cuDNN cannot do it.
bool build_plan(Plan& p, cudnnHandle_t h, DType t, Kind kind, const backend::ConvGeometry& g) {
  cudnnDataType_t type, compute;
  cudnnMathType_t math;
  if (!dnn_types(t, type, compute, math)) return false;
  if (g.spatial < 1 || g.spatial > 3 || g.groups < 1 || g.in_channels % g.groups || g.out_channels % g.groups) return false;
  const bool fma_only = t == DType::f32;
  bool ok = fits_int(g.groups);
  std::vector<int> xd = activation_dims(g, g.in_channels, g.in, ok);
  std::vector<int> yd = activation_dims(g, g.out_channels, g.out, ok);
  std::vector<int> wd{int(g.out_channels), int(g.in_channels / g.groups)};
  std::vector<int> pad, stride, dilation;
  if (g.spatial == 1) wd.push_back(1), pad.push_back(0), stride.push_back(1), dilation.push_back(1);
  int64_t wnumel = g.out_channels * (g.in_channels / g.groups);
  for (int i = 0; i < g.spatial; ++i) {
    for (int64_t v : {g.kernel[i], g.pad_lo[i], g.stride[i], g.dilation[i]}) ok = ok && fits_int(v);
    wd.push_back(int(g.kernel[i]));
    pad.push_back(int(g.pad_lo[i]));
    stride.push_back(int(g.stride[i]));
    dilation.push_back(int(g.dilation[i]));
    wnumel *= g.kernel[i];
  }
  ok = ok && wnumel < (int64_t(1) << 31);
  if (!ok) return false;
  std::vector<int> bd(xd.size(), 1);
  bd[1] = int(g.out_channels);

  const int nb = int(xd.size());
  ok = tensor_desc(p.x, type, xd) && tensor_desc(p.y, type, yd) && tensor_desc(p.bias, type, bd) &&
       cudnnCreateFilterDescriptor(&p.w) == CUDNN_STATUS_SUCCESS &&
       cudnnSetFilterNdDescriptor(p.w, type, CUDNN_TENSOR_NCHW, nb, wd.data()) == CUDNN_STATUS_SUCCESS &&
       cudnnCreateConvolutionDescriptor(&p.conv) == CUDNN_STATUS_SUCCESS &&
       cudnnSetConvolutionNdDescriptor(p.conv, nb - 2, pad.data(), stride.data(), dilation.data(),
                                       CUDNN_CROSS_CORRELATION, compute) == CUDNN_STATUS_SUCCESS &&
       cudnnSetConvolutionGroupCount(p.conv, int(g.groups)) == CUDNN_STATUS_SUCCESS &&
       cudnnSetConvolutionMathType(p.conv, math) == CUDNN_STATUS_SUCCESS;
  // cuDNN pads both sides by pad_lo: usable only when that gives our output size (pad_hi may differ
  // where the extra cells are never read).
  std::vector<int> got(size_t(nb), 0);
  ok = ok && cudnnGetConvolutionNdForwardOutputDim(p.conv, p.x, p.w, nb, got.data()) == CUDNN_STATUS_SUCCESS && got == yd;
  if (!ok) {
    p.release();
    return false;
  }

  int algo = -1, n = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (kind == Kind::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    st = cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf);
    if (st == CUDNN_STATUS_SUCCESS) algo = choose(perf, n, fma_only, math);
    if (algo < 0) algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  } else if (kind == Kind::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n,
                                                     perf);
    if (st == CUDNN_STATUS_SUCCESS) algo = choose(perf, n, fma_only, math);
    if (algo < 0) algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                       &n, perf);
    if (st == CUDNN_STATUS_SUCCESS) algo = choose(perf, n, fma_only, math);
    if (algo < 0) algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  }
  // The workspace size query doubles as the check that the algorithm supports this case.
  size_t bytes = 0;
  ok = cudnnSetConvolutionMathType(p.conv, math) == CUDNN_STATUS_SUCCESS;
  if (kind == Kind::forward)
    ok = ok && cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, cudnnConvolutionFwdAlgo_t(algo),
                                                       &bytes) == CUDNN_STATUS_SUCCESS;
  else if (kind == Kind::backward_data)
    ok = ok && cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, cudnnConvolutionBwdDataAlgo_t(algo),
                                                            &bytes) == CUDNN_STATUS_SUCCESS;
  else
    ok = ok && cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w,
                                                              cudnnConvolutionBwdFilterAlgo_t(algo),
                                                              &bytes) == CUDNN_STATUS_SUCCESS;
  if (!ok || bytes > kMaxWorkspace) {
    p.release();
    return false;
  }
  p.algo = algo;
  p.workspace = bytes;
  p.ok = true;
  if (debug())
    std::fprintf(stderr, "[flux:backends] CUDA: cuDNN %s %dD %s: algorithm %d (%s math), workspace %zu bytes\n",
                 kind == Kind::forward ? "forward" : kind == Kind::backward_data ? "backward data" : "backward filter",
                 g.spatial, dtype_name(t), algo, math == CUDNN_TENSOR_OP_MATH ? "tensor-op" : "FMA", bytes);
  return true;
}

// The plan for `key` (built on first use with this thread's handle), or null when cuDNN cannot do the
// case. Two threads may build the same plan at once; the first one kept is used by both.
std::shared_ptr<const Plan> plan_for(cudnnHandle_t h, const Key& key, DType t, Kind kind,
                                     const backend::ConvGeometry& g) {
  Plans& c = plans();
  {
    std::shared_lock<std::shared_mutex> lock(c.mutex);
    auto found = c.by_key.find(key);
    if (found != c.by_key.end()) return found->second->ok ? found->second : nullptr;
  }
  auto built = std::make_shared<Plan>();
  build_plan(*built, h, t, kind, g);
  std::shared_ptr<const Plan> kept;
  {
    std::unique_lock<std::shared_mutex> lock(c.mutex);
    kept = c.by_key.emplace(key, std::move(built)).first->second;
  }
  return kept->ok ? kept : nullptr;
}

/// 1 and 0 as cuDNN's scaling factors: double for double data, float otherwise.
struct Scale {
  float f1 = 1.f, f0 = 0.f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scale(DType t) : dbl(t == DType::f64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
};

// true: done; false: cuDNN reports this case unsupported at run time (the key's plan is replaced by
// a failed one, so later calls take the portable path at once; threads running the old plan keep
// it until they finish); any other failure throws.
bool ran(cudnnStatus_t st, const Key& key, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  if (st == CUDNN_STATUS_NOT_SUPPORTED) {
    Plans& c = plans();
    std::unique_lock<std::shared_mutex> lock(c.mutex);
    c.by_key[key] = std::make_shared<const Plan>();
    return false;
  }
  detail::fail("[conv] ", what, " failed: ", cudnnGetErrorString(st));
}

}  // namespace

// Each call runs on this thread's handle and a workspace of its own from the caching allocator, so
// calls from several threads do not wait for each other (handle_pool.hpp).
bool conv_forward(backend::Backend& be, int device, Stream s, DType t, const void* x, const void* w, const void* bias,
                  void* y, const backend::ConvGeometry& g) {
  cudnnHandle_t h = Handles::get(device, s);
  if (!h) return false;
  const Key key = make_key(device, t, Kind::forward, g);
  const std::shared_ptr<const Plan> p = plan_for(h, key, t, Kind::forward, g);
  if (!p) return false;
  Scratch ws(be, device, p->workspace);
  Scale k(t);
  if (!ran(cudnnConvolutionForward(h, k.one(), p->x, x, p->w, w, p->conv, cudnnConvolutionFwdAlgo_t(p->algo), ws.get(),
                                   ws.size(), k.zero(), p->y, y),
           key, "cudnnConvolutionForward"))
    return false;
  if (bias && low_precision(t)) {
    bias_add_low(s, t, y, bias, g);
  } else if (bias) {
    cudnnStatus_t st = cudnnAddTensor(h, k.one(), p->bias, bias, k.one(), p->y, y);
    if (st != CUDNN_STATUS_SUCCESS) detail::fail("[conv] cudnnAddTensor (bias) failed: ", cudnnGetErrorString(st));
  }
  return true;
}

bool conv_backward_data(backend::Backend& be, int device, Stream s, DType t, const void* dy, const void* w, void* dx,
                        const backend::ConvGeometry& g) {
  cudnnHandle_t h = Handles::get(device, s);
  if (!h) return false;
  const Key key = make_key(device, t, Kind::backward_data, g);
  const std::shared_ptr<const Plan> p = plan_for(h, key, t, Kind::backward_data, g);
  if (!p) return false;
  Scratch ws(be, device, p->workspace);
  Scale k(t);
  return ran(cudnnConvolutionBackwardData(h, k.one(), p->w, w, p->y, dy, p->conv, cudnnConvolutionBwdDataAlgo_t(p->algo),
                                          ws.get(), ws.size(), k.zero(), p->x, dx),
             key, "cudnnConvolutionBackwardData");
}

bool conv_backward_weight(backend::Backend& be, int device, Stream s, DType t, const void* x, const void* dy, void* dw,
                          void* dbias, const backend::ConvGeometry& g) {
  cudnnHandle_t h = Handles::get(device, s);
  if (!h) return false;
  const Key key = make_key(device, t, Kind::backward_weight, g);
  const std::shared_ptr<const Plan> p = plan_for(h, key, t, Kind::backward_weight, g);
  if (!p) return false;
  Scratch ws(be, device, p->workspace);
  Scale k(t);
  if (!ran(cudnnConvolutionBackwardFilter(h, k.one(), p->x, x, p->y, dy, p->conv,
                                          cudnnConvolutionBwdFilterAlgo_t(p->algo), ws.get(), ws.size(), k.zero(), p->w,
                                          dw),
           key, "cudnnConvolutionBackwardFilter"))
    return false;
  if (dbias && low_precision(t)) {
    bias_grad_low(s, t, dy, dbias, g);
  } else if (dbias) {
    cudnnStatus_t st = cudnnConvolutionBackwardBias(h, k.one(), p->y, dy, k.zero(), p->bias, dbias);
    if (st != CUDNN_STATUS_SUCCESS)
      detail::fail("[conv] cudnnConvolutionBackwardBias failed: ", cudnnGetErrorString(st));
  }
  return true;
}
std::string dnn_version() {
  const size_t v = cudnnGetVersion();
  auto text = [](size_t n) {
    return std::to_string(n / 10000) + "." + std::to_string(n / 100 % 100) + "." + std::to_string(n % 100);
  };
  std::string s = "cuDNN " + text(v);
  if (v != size_t(CUDNN_VERSION)) s += " (built against " + text(CUDNN_VERSION) + ")";
  return s + " for conv (legacy API: float32 without TF32; Float16/BFloat16 on tensor cores, float32 compute)";
}

#else  // no cuDNN: the core's im2col + matmul path everywhere

bool conv_forward(backend::Backend&, int, Stream, DType, const void*, const void*, const void*, void*,
                  const backend::ConvGeometry&) {
  return false;
}
bool conv_backward_data(backend::Backend&, int, Stream, DType, const void*, const void*, void*,
                        const backend::ConvGeometry&) {
  return false;
}
bool conv_backward_weight(backend::Backend&, int, Stream, DType, const void*, const void*, void*, void*,
                          const backend::ConvGeometry&) {
  return false;
}

std::string dnn_version() {
#ifdef FLUX_HIP
  return "none (no MIOpen in Debian 12): conv through im2col + GEMM";
#else
  return "none (built without cuDNN): conv through im2col + GEMM";
#endif
}

#endif

}  // namespace flux::cuda_backend
