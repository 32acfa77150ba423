// Elementwise functions of two (or three, for where) tensors with broadcasting, on the CPU.
#include <cmath>
#include <type_traits>

#include "flux/error.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"

namespace flux::cpu_backend {

using backend::BinaryOp;

namespace {

template <class T> inline T arith(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::add: return T(x + y);
    case BinaryOp::sub: return T(x - y);
    case BinaryOp::mul: return T(x * y);
    case BinaryOp::div:
      if constexpr (std::is_integral_v<T>) {
        if (y == 0) detail::fail("[div] integer division by zero");
      }
      return T(x / y);
    case BinaryOp::pow:
      if constexpr (std::is_floating_point_v<T>) return std::pow(x, y);
      else return T(std::pow(double(x), double(y)));
    case BinaryOp::maximum: return x > y || x != x ? x : y;  // NaN in either operand gives NaN
    case BinaryOp::minimum: return x < y || x != x ? x : y;
    default: return T(0);
  }
}

template <class T> inline uint8_t compare(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::eq: return x == y;
    case BinaryOp::ne: return x != y;
    case BinaryOp::lt: return x < y;
    case BinaryOp::le: return x <= y;
    case BinaryOp::gt: return x > y;
    case BinaryOp::ge: return x >= y;
    default: return 0;
  }
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }

// Visits the innermost-axis runs o in [b, e) of a broadcast as g(o, offset_0, offset_1, offset_2), the
// operands' element offsets of the run's first element: decomposed once per chunk, then advanced like
// an odometer (no division per run).
template <class G> void for_runs(const backend::Broadcast& p, int operands, int64_t b, int64_t e, G g) {
  const int nd = p.ndim;
  int64_t idx[backend::kMaxDims] = {}, off[3] = {0, 0, 0};
  int64_t rem = b;
  for (int i = nd - 2; i >= 0; --i) {
    idx[i] = rem % p.shape[i];
    rem /= p.shape[i];
    for (int k = 0; k < operands; ++k) off[k] += idx[i] * p.stride[k][i];
  }
  for (int64_t o = b; o < e; ++o) {
    g(o, off[0], off[1], off[2]);
    for (int i = nd - 2; i >= 0; --i) {  // next run
      for (int k = 0; k < operands; ++k) off[k] += p.stride[k][i];
      if (++idx[i] < p.shape[i]) break;
      for (int k = 0; k < operands; ++k) off[k] -= idx[i] * p.stride[k][i];
      idx[i] = 0;
    }
  }
}

// Visits every output element as f(out_index, offset_0, offset_1, offset_2), innermost axis in runs.
template <class F> void for_each_broadcast(const backend::Broadcast& p, int operands, F f) {
  int nd = p.ndim;
  int64_t total = 1;
  for (int i = 0; i < nd; ++i) total *= p.shape[i];
  if (total == 0) return;
  if (p.contiguous || nd == 0) {
    parallel_for(total, 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f(i, i, i, i);
    });
    return;
  }
  int64_t inner = p.shape[nd - 1];
  int64_t s0 = p.stride[0][nd - 1], s1 = p.stride[1][nd - 1], s2 = operands > 2 ? p.stride[2][nd - 1] : 0;
  int64_t outer = total / inner;
  parallel_for(outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for_runs(p, operands, b, e, [&](int64_t o, int64_t off0, int64_t off1, int64_t off2) {
      int64_t base = o * inner;
      for (int64_t j = 0; j < inner; ++j) f(base + j, off0 + j * s0, off1 + j * s1, off2 + j * s2);
    });
  });
}

// z = x op y over [b, e) with x or y possibly one broadcast value (mode 1: y scalar, 2: x scalar);
// compiled per ISA level (isa.hpp), the baseline copy being the reference.
template <class T, BinaryOp Op>
FLUX_CPU_INLINE void arith_range_body(const T* __restrict x, const T* __restrict y, T* __restrict z, int64_t b,
                                      int64_t e, int mode, std::integral_constant<BinaryOp, Op>) {
  if (mode == 1) {
    T yv = y[0];
    for (int64_t i = b; i < e; ++i) z[i] = arith<T>(Op, x[i], yv);
  } else if (mode == 2) {
    T xv = x[0];
    for (int64_t i = b; i < e; ++i) z[i] = arith<T>(Op, xv, y[i]);
  } else {
    for (int64_t i = b; i < e; ++i) z[i] = arith<T>(Op, x[i], y[i]);
  }
}
FLUX_CPU_VARIANTS(arith_range, arith_range_body)

template <class T, BinaryOp Op> void contiguous_arith(const T* x, const T* y, T* z, int64_t n, bool x_scalar, bool y_scalar) {
  int mode = y_scalar ? 1 : (x_scalar ? 2 : 0);
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    arith_range(x, y, z, b, e, mode, std::integral_constant<BinaryOp, Op>{});
  });
}

// Operand k is a single value broadcast everywhere.
bool all_zero(const backend::Broadcast& p, int k) {
  for (int i = 0; i < p.ndim; ++i)
    if (p.stride[k][i] != 0 && p.shape[i] != 1) return false;
  return true;
}
// Operand k is laid out densely in the output's order.
bool dense(const backend::Broadcast& p, int k) {
  int64_t expect = 1;
  for (int i = p.ndim - 1; i >= 0; --i) {
    if (p.shape[i] != 1 && p.stride[k][i] != expect) return false;
    expect *= p.shape[i];
  }
  return true;
}

// A broadcast whose innermost axis is a dense run in one operand and a dense run or one value in the
// other (a bias row, a (T, T) mask over (N, H, T, T)): each run through arith_range.
template <class T, BinaryOp Op> void runs_arith(const T* x, const T* y, T* z, const backend::Broadcast& p) {
  const int nd = p.ndim;
  const int64_t inner = p.shape[nd - 1];
  int64_t outer = 1;
  for (int i = 0; i < nd - 1; ++i) outer *= p.shape[i];
  const int mode = p.stride[1][nd - 1] == 0 ? 1 : p.stride[0][nd - 1] == 0 ? 2 : 0;
  parallel_for(outer, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t b, int64_t e) {
    for_runs(p, 2, b, e, [&](int64_t o, int64_t off0, int64_t off1, int64_t) {
      arith_range(x + off0, y + off1, z + o * inner, int64_t(0), inner, mode, std::integral_constant<BinaryOp, Op>{});
    });
  });
}

template <class T> bool fast_path(BinaryOp op, const T* x, const T* y, T* z, const backend::Broadcast& p) {
  int64_t n = 1;
  for (int i = 0; i < p.ndim; ++i) n *= p.shape[i];
  bool xs = false, ys = false, runs = false;
  if (!p.contiguous) {
    if (all_zero(p, 1) && dense(p, 0)) ys = true;
    else if (all_zero(p, 0) && dense(p, 1)) xs = true;
    else {
      const int last = p.ndim - 1;
      const int64_t s0 = last >= 0 ? p.stride[0][last] : 0, s1 = last >= 0 ? p.stride[1][last] : 0;
      runs = last >= 0 && p.shape[last] >= 8 && (s0 == 0 || s0 == 1) && (s1 == 0 || s1 == 1) && s0 + s1 > 0;
      if (!runs) return false;
    }
  }
  switch (op) {
    case BinaryOp::add: runs ? runs_arith<T, BinaryOp::add>(x, y, z, p) : contiguous_arith<T, BinaryOp::add>(x, y, z, n, xs, ys); return true;
    case BinaryOp::sub: runs ? runs_arith<T, BinaryOp::sub>(x, y, z, p) : contiguous_arith<T, BinaryOp::sub>(x, y, z, n, xs, ys); return true;
    case BinaryOp::mul: runs ? runs_arith<T, BinaryOp::mul>(x, y, z, p) : contiguous_arith<T, BinaryOp::mul>(x, y, z, n, xs, ys); return true;
    case BinaryOp::div: runs ? runs_arith<T, BinaryOp::div>(x, y, z, p) : contiguous_arith<T, BinaryOp::div>(x, y, z, n, xs, ys); return true;
    default: return false;
  }
}

}  // namespace

void binary(BinaryOp op, DType t, const void* a, const void* b, void* out, const backend::Broadcast& p) {
  FLUX_CPU_DISPATCH("binary", t, {
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    if (is_comparison(op)) {
      uint8_t* z = static_cast<uint8_t*>(out);
      for_each_broadcast(p, 2, [&](int64_t i, int64_t i0, int64_t i1, int64_t) { z[i] = compare<T>(op, x[i0], y[i1]); });
    } else {
      T* z = static_cast<T*>(out);
      if (!fast_path<T>(op, x, y, z, p))
        for_each_broadcast(p, 2, [&](int64_t i, int64_t i0, int64_t i1, int64_t) { z[i] = arith<T>(op, x[i0], y[i1]); });
    }
  });
}

void where(DType t, const void* cond, const void* a, const void* b, void* out, const backend::Broadcast& p) {
  const uint8_t* c = static_cast<const uint8_t*>(cond);
  FLUX_CPU_DISPATCH("where", t, {
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* z = static_cast<T*>(out);
    for_each_broadcast(p, 3, [&](int64_t i, int64_t i0, int64_t i1, int64_t i2) { z[i] = c[i0] ? x[i1] : y[i2]; });
  });
}

}  // namespace flux::cpu_backend
