// Elementwise ops on bf16/f16 storage in one pass, float32 arithmetic: each block of a few thousand
// elements is converted up into a thread-local float32 buffer (half_cast.cpp), computed there by the
// float32 kernel (unary.cpp, binary.cpp) and converted down, so the tensor is read and written once
// instead of the three passes (cast up, compute, cast down) and two float32 temporaries the core makes
// otherwise. The values are bitwise those of the three passes: the same conversions and kernels.
#include <algorithm>
#include <cstdint>

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

bool binary_half(backend::BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& plan) {
  if (!half(t)) return false;
  // Dense operands of the output's shape, or one of them a single element (x * 2, x + bias scalar).
  auto single = [&](int k) {
    for (int i = 0; i < plan.ndim; ++i)
      if (plan.shape[i] != 1 && plan.stride[k][i] != 0) return false;
    return true;
  };
  const bool a_single = !plan.contiguous && single(0), b_single = !plan.contiguous && single(1);
  if (!plan.contiguous && !(a_single != b_single)) return false;
  if (!plan.contiguous) {  // the other operand must be dense in the output's order
    int64_t stride = 1;
    for (int i = plan.ndim - 1; i >= 0; --i) {
      if (plan.shape[i] != 1 && plan.stride[a_single ? 1 : 0][i] != stride) return false;
      stride *= plan.shape[i];
    }
  }
  int64_t n = 1;
  for (int i = 0; i < plan.ndim; ++i) n *= plan.shape[i];
  const bool compare = op >= backend::BinaryOp::eq;  // a Bool output, written directly
  float scalar = 0.f;
  if (a_single || b_single) half_storage_to_float(t, static_cast<const uint16_t*>(a_single ? a : b), &scalar, 1);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float x[kBlock], y[kBlock], z[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      backend::Broadcast block;
      block.ndim = 1, block.shape[0] = len, block.contiguous = !a_single && !b_single;
      block.stride[0][0] = a_single ? 0 : 1, block.stride[1][0] = b_single ? 0 : 1, block.stride[2][0] = 1;
      const float* xa = a_single ? &scalar : x;
      const float* yb = b_single ? &scalar : y;
      if (!a_single) half_storage_to_float(t, at(a, i), x, len);
      if (!b_single) half_storage_to_float(t, at(b, i), y, len);
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
