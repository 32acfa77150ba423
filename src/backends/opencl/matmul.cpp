// GEMM on OpenCL devices: CLBlast for Float32/Float64 (row-major, transposes folded into the call,
// batches as a loop of Gemm calls), a plain kernel for integers. Float16/BFloat16 have no kernel here
// (matmul_low_precision declines; the core computes through Float32): CLBlast's half GEMM keeps its
// accumulators in half (its `real` type), short of the float32 accumulation the backend contract
// asks for.
#include "src/backends/opencl/opencl_backend.hpp"

#include <clblast.h>

namespace flux::opencl {

namespace {

// C[p, i, j] = alpha * sum_l op(A)[i, l] op(B)[l, j] + beta * C[p, i, j]; one work-item per element.
const char* const kMatmulSource = R"CLC(
__kernel void gemm(__global uchar* a, ulong a_off, __global uchar* b, ulong b_off, __global uchar* c, ulong c_off,
                   long batch, long m, long n, long k, int trans_a, int trans_b, long stride_a, long stride_b,
                   long stride_c, T alpha, T beta) {
  GRID_LOOP(r, batch * m * n) {
    long p = r / (m * n), ij = r - p * m * n, i = ij / n, j = ij - i * n;
    __global const T* A = AT(T, a, a_off) + p * stride_a;
    __global const T* B = AT(T, b, b_off) + p * stride_b;
    __global T* C = AT(T, c, c_off) + p * stride_c;
    T acc = 0;
    for (long l = 0; l < k; ++l) {
      T x = trans_a ? A[l * m + i] : A[i * k + l];
      T y = trans_b ? B[j * k + l] : B[l * n + j];
      acc += x * y;
    }
    C[i * n + j] = alpha * acc + (beta != 0 ? beta * C[i * n + j] : (T)0);
  }
}
)CLC";

template <class T> void clblast_gemm(DeviceState& dev, backend::Buffer a, backend::Buffer b, backend::Buffer c,
                                     const backend::Gemm& g) {
  using clblast::Transpose;
  const size_t es = sizeof(T);
  if (a.offset % es || b.offset % es || c.offset % es)
    ::flux::detail::fail("[matmul] OpenCL buffer offsets must be multiples of the element size");
  Transpose ta = g.trans_a ? Transpose::kYes : Transpose::kNo, tb = g.trans_b ? Transpose::kYes : Transpose::kNo;
  size_t lda = size_t(g.trans_a ? g.m : g.k), ldb = size_t(g.trans_b ? g.k : g.n), ldc = size_t(g.n);
  cl_command_queue q = dev.queue;
  auto status_check = [&](clblast::StatusCode s, const char* api) {
    if (s != clblast::StatusCode::kSuccess)
      ::flux::detail::fail("[matmul] CLBlast ", api, " failed with status ", int(s), " (", cl_error_name(cl_int(s)),
                           ") for m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch, " on ", dev.name);
  };
  // Batches loop over Gemm: CLBlast's batched kernels are separate programs, each another cold
  // compile on PoCL (seconds), while a Gemm call costs only a launch.
  auto run = [&] {
    for (int64_t p = 0; p < g.batch; ++p)
      status_check(clblast::Gemm<T>(clblast::Layout::kRowMajor, ta, tb, size_t(g.m), size_t(g.n), size_t(g.k),
                                    T(g.alpha), mem(a), a.offset / es + size_t(p * g.stride_a), lda, mem(b),
                                    b.offset / es + size_t(p * g.stride_b), ldb, T(g.beta), mem(c),
                                    c.offset / es + size_t(p * g.stride_c), ldc, &q, nullptr),
                   "Gemm");
  };
  // CLBlast builds and caches its GEMM program and tuning entries on a dtype's first call; before
  // 1.6.1, built as C++14 or later, it throws ("Cache::Store: object already in cache") when two
  // threads do that at once. So the first call runs alone; once it succeeded, calls run in parallel
  // (CLBlast's caches are locked inside, and each call makes its own kernel objects).
  std::atomic<bool>& ready = dev.gemm_ready[sizeof(T) == 8 ? 1 : 0];
  if (ready.load(std::memory_order_acquire)) return run();
  std::lock_guard<std::mutex> lock(dev.gemm_first_mutex);
  if (ready.load(std::memory_order_acquire)) return run();  // another thread's first call finished meanwhile
  {
    CompileWatch watch(dev, std::string("CLBlast's ") + (sizeof(T) == 8 ? "Float64" : "Float32") + " GEMM");
    run();
  }
  ready.store(true, std::memory_order_release);
}

}  // namespace

void matmul(int d, DType t, backend::Buffer a, backend::Buffer b, backend::Buffer c, const backend::Gemm& g) {
  if (t != DType::f32 && t != DType::f64 && t != DType::i32 && t != DType::i64)
    ::flux::detail::fail("[matmul] OpenCL kernel does not support ", dtype_name(t));
  DeviceState& dev = device(d);
  std::string o = type_options(dev, t, "matmul");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) {
    fill(d, t, c, g.batch * g.m * g.n, 0.0);
    return;
  }
  if (t == DType::f32 || t == DType::f64) note_kernel_compile(dev);  // CLBlast builds its GEMM on first use
  switch (t) {
    case DType::f32: clblast_gemm<float>(dev, a, b, c, g); break;
    case DType::f64: clblast_gemm<double>(dev, a, b, c, g); break;
    default: {
      auto& k = kernel(dev, "matmul", kMatmulSource, o, "gemm");
      launch(dev, k, g.batch * g.m * g.n, false, mem(a), off(a), mem(b), off(b), mem(c), off(c), cl_long(g.batch),
             cl_long(g.m), cl_long(g.n), cl_long(g.k), cl_int(g.trans_a), cl_int(g.trans_b), cl_long(g.stride_a),
             cl_long(g.stride_b), cl_long(g.stride_c), scalar_of(t, g.alpha), scalar_of(t, g.beta));
    }
  }
}

}  // namespace flux::opencl
