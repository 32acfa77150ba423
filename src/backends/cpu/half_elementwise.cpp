// Elementwise ops on bf16/f16 storage in one pass, float32 arithmetic: each block of a few thousand
// elements is converted up into a thread-local float32 buffer (half_cast.cpp), computed there by the
// float32 kernel (unary.cpp, binary.cpp) and converted down, so the tensor is read and written once
// instead of the three passes (cast up, compute, cast down) and two float32 temporaries the core makes
// otherwise. The values are bitwise those of the three passes: the same conversions and kernels.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

namespace {

// Elements per block: three float32 blocks (a, b, out) stay in L1/L2 and a block still repays the
// kernels' call overhead.
constexpr int64_t kBlock = 2048;
// Elements per pool task (several blocks).
constexpr int64_t kGrain = 1 << 15;

bool half(DType t) { return t == DType::bf16 || t == DType::f16; }

const uint16_t* at(const void* p, int64_t i) { return static_cast<const uint16_t*>(p) + i; }
uint16_t* at(void* p, int64_t i) { return static_cast<uint16_t*>(p) + i; }

}  // namespace

bool unary_half(backend::UnaryOp op, DType t, const void* src, void* dst, int64_t n, double alpha) {
  if (!half(t)) return false;
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    alignas(64) float x[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t len = std::min(kBlock, e - i);
      half_storage_to_float(t, at(src, i), x, len);
      unary(op, DType::f32, x, x, len, alpha);
      float_to_half_storage(t, x, at(dst, i), len);
    }
  });
  return true;
}

// The length m when operand k repeats one dense run along the output's flat order (element i is
// operand[i % m]: a bias (m,) over rows (r, m); m = 1 for a single element); 0 otherwise.
int64_t repeat_length(const backend::Broadcast& plan, int k) {
  int64_t m = 1;
  int i = plan.ndim - 1;
  for (; i >= 0 && (plan.shape[i] == 1 || plan.stride[k][i] == m); --i) m *= plan.shape[i];
  for (; i >= 0; --i)
    if (plan.shape[i] != 1 && plan.stride[k][i] != 0) return 0;
  return m;
}

bool binary_half(backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan) {
  if (!half(t)) return false;
  int64_t n = 1;
  for (int i = 0; i < plan.ndim; ++i) n *= plan.shape[i];
  // Dense operands of the output's shape, or one of them repeating a shorter run (x * 2, x + bias
  // scalar, a bias row over the rows of a matrix) and the other dense.
  int64_t a_run = plan.contiguous ? n : repeat_length(plan, 0), b_run = plan.contiguous ? n : repeat_length(plan, 1);
  if (a_run == 0 || b_run == 0 || (a_run < n && b_run < n)) return false;
  const bool a_repeats = a_run < n, b_repeats = b_run < n;
  const bool compare = op >= backend::BinaryOp::eq;  // a Bool output, written directly
  // The repeated operand in float32, once (a single element or a short row).
  std::vector<float> run(size_t(a_repeats ? a_run : b_repeats ? b_run : 0));
  if (!run.empty()) half_storage_to_float(t, static_cast<const uint16_t*>(a_repeats ? a : b), run.data(), int64_t(run.size()));
  const int64_t m = int64_t(run.size());
  const bool single = m == 1;
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float x[kBlock], y[kBlock], z[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      backend::Broadcast block;
      block.ndim = 1, block.shape[0] = len, block.contiguous = !single;
      block.stride[0][0] = a_repeats && single ? 0 : 1, block.stride[1][0] = b_repeats && single ? 0 : 1, block.stride[2][0] = 1;
      float* repeated = a_repeats ? x : y;
      if (m > 1)  // the run laid out along the block
        for (int64_t k = 0, j = i % m; k < len; ++k, j = j + 1 == m ? 0 : j + 1) repeated[k] = run[size_t(j)];
      const float* xa = a_repeats && single ? run.data() : x;
      const float* yb = b_repeats && single ? run.data() : y;
      if (!a_repeats) half_storage_to_float(t, at(a, i), x, len);
      if (!b_repeats) half_storage_to_float(t, at(b, i), y, len);
      if (compare) {
        binary(op, DType::f32, xa, yb, static_cast<uint8_t*>(out) + i, block);
      } else {
        binary(op, DType::f32, xa, yb, z, block);
        float_to_half_storage(t, z, at(out, i), len);
      }
    }
  });
  return true;
}

}  // namespace flux::cpu_backend
