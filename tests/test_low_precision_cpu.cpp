// The CPU backend's low-precision kernels: the float32 <-> bf16/f16 casts (vector code against the
// scalar reference of src/half_bits.hpp, bitwise, over every 16-bit pattern, ties, NaNs, infinities
// and subnormals), and the bf16 library kernels (oneDNN; backend.hpp's matmul_low_precision,
// linear_forward, conv_forward*, conv_backward_*) against a float64 reference within bf16 tolerance
// wherever they run, and declining cleanly (false, nothing thrown) where oneDNN has no bf16 kernel.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

// Not flux/flux.hpp: its flux::cpu (the mover) would hide the backend namespace flux::cpu_backend.
#include "flux/backend.hpp"
#include "src/backends/cpu/cpu_backend.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/prepared.hpp"
#include "src/half_bits.hpp"

namespace {

using namespace flux;
using flux::cpu_backend::Isa;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct IsaGuard {
  Isa old = cpu_backend::active_isa();
  ~IsaGuard() { cpu_backend::force_isa(old); }
};

using cpu_backend::HalfCastPath;
struct PathGuard {
  HalfCastPath old = cpu_backend::cap_half_cast_path(HalfCastPath::avx512_bf16);
  ~PathGuard() { cpu_backend::cap_half_cast_path(old); }
};
// The calling thread's subnormal mode (x86 MXCSR: DAZ 0x0040, FTZ 0x8000) set to `flush` for a
// scope; the pool's workers take the caller's. A no-op elsewhere.
struct MxcsrMode {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned old = _mm_getcsr();
  explicit MxcsrMode(unsigned flush) { _mm_setcsr((old & ~0x8040u) | flush); }
  ~MxcsrMode() { _mm_setcsr(old); }
#else
  explicit MxcsrMode(unsigned) {}
#endif
  MxcsrMode(const MxcsrMode&) = delete;
  MxcsrMode& operator=(const MxcsrMode&) = delete;
};
// Every conversion path this CPU can run for t (the best and all below it), each taken in turn by
// capping; the paths above the CPU are named on stdout as skipped.
std::vector<HalfCastPath> runnable_paths(DType t) {
  std::vector<HalfCastPath> paths;
  const HalfCastPath best = cpu_backend::half_cast_best_path(t);
  for (HalfCastPath p : {HalfCastPath::scalar, HalfCastPath::avx2, HalfCastPath::avx512, HalfCastPath::avx512_bf16}) {
    if (p == HalfCastPath::avx512_bf16 && t != DType::bf16) continue;
    if (int(p) <= int(best)) paths.push_back(p);
    else std::printf("[ skipped  ] %s conversion path %s: this CPU lacks it\n", dtype_name(t), cpu_backend::half_cast_path_name(p));
  }
  return paths;
}

// Floats that probe every rounding case of a 16-bit format whose values are the floats with the low
// `drop` bits zero (bf16: 16; f16 is handled through its own values below): specials, every
// representable value, its float neighbours, the exact midpoints (ties) and their neighbours.
std::vector<float> probe_floats(DType t) {
  std::vector<uint32_t> u = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                             0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0xffffffffu, 0x7fa00000u,
                             0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00800000u, 0x7f7fffffu,
                             0xff7fffffu, 0x477ff000u, 0x477fefffu, 0x477ff001u, 0x33000000u, 0x33000001u,
                             0x32ffffffu, 0x337fffffu, 0x387fc000u, 0x387fe000u, 0x38800000u};
  for (uint32_t h = 0; h < 65536; ++h) {
    float value = t == DType::bf16 ? half_bits::bfloat16_to_float(uint16_t(h)) : half_bits::to_float(uint16_t(h));
    uint32_t v = bits_of(value);
    float next = t == DType::bf16 ? half_bits::bfloat16_to_float(uint16_t(h + 1)) : half_bits::to_float(uint16_t(h + 1));
    uint32_t mid = bits_of(float((double(value) + double(next)) / 2));  // exact: one more bit than the format
    for (uint32_t w : {v - 1, v, v + 1, mid - 1, mid, mid + 1}) u.push_back(w);
  }
  std::mt19937 gen(36);
  for (int i = 0; i < 200000; ++i) u.push_back(gen());
  std::vector<float> f;
  for (uint32_t w : u) f.push_back(float_of(w));
  return f;
}

class HalfCast : public ::testing::TestWithParam<DType> {};

TEST_P(HalfCast, EveryPatternToFloatMatchesReferenceBitwise) {
  const DType t = GetParam();
  IsaGuard guard;
  // Odd lengths and offsets: the vector loop's tails and unaligned starts.
  std::vector<uint16_t> h(65536 + 7);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i);
  std::vector<float> ref(h.size()), got(h.size());
  cpu_backend::half_storage_to_float_reference(t, h.data() + 3, ref.data(), int64_t(h.size() - 3));
  PathGuard paths;
  for (HalfCastPath path : runnable_paths(t)) {
    cpu_backend::cap_half_cast_path(path);
    ASSERT_EQ(cpu_backend::half_cast_path(t), path);
    std::fill(got.begin(), got.end(), 0.f);
    cpu_backend::half_storage_to_float(t, h.data() + 3, got.data(), int64_t(h.size() - 3));
    for (size_t i = 0; i + 3 < h.size(); ++i)
      ASSERT_EQ(bits_of(got[i]), bits_of(ref[i])) << dtype_name(t) << " pattern 0x" << std::hex << h[i + 3] << " on "
                                                  << cpu_backend::half_cast_path_name(path);
  }
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {  // the ISA level caps the path too
    if (int(isa) > int(cpu_backend::detected_isa())) continue;
    cpu_backend::force_isa(isa);
    std::fill(got.begin(), got.end(), 0.f);
    cpu_backend::half_storage_to_float(t, h.data() + 3, got.data(), int64_t(h.size() - 3));
    ASSERT_EQ(std::memcmp(got.data(), ref.data(), (h.size() - 3) * 4), 0) << cpu_backend::isa_name(isa);
  }
  // The reference against the format's definition: sign, exponent and mantissa of every pattern.
  for (uint32_t p = 0; p < 65536; ++p) {
    const double v = t == DType::bf16 ? half_bits::bfloat16_to_float(uint16_t(p)) : half_bits::to_float(uint16_t(p));
    const int sign = p >> 15 ? -1 : 1;
    const uint32_t e = t == DType::bf16 ? (p >> 7 & 0xff) : (p >> 10 & 0x1f), m = t == DType::bf16 ? p & 0x7f : p & 0x3ff;
    const int mbits = t == DType::bf16 ? 7 : 10, bias = t == DType::bf16 ? 127 : 15;
    const uint32_t emax = t == DType::bf16 ? 0xff : 0x1f;
    if (e == emax) {
      ASSERT_TRUE(m ? std::isnan(v) : v == sign * INFINITY) << p;
      continue;
    }
    const double expect = e ? sign * std::ldexp(1.0 + std::ldexp(double(m), -mbits), int(e) - bias)
                            : sign * std::ldexp(double(m), 1 - bias - mbits);
    ASSERT_EQ(v, expect) << std::hex << p;
  }
}

TEST_P(HalfCast, FromFloatMatchesReferenceBitwiseWithTiesNaNAndSubnormals) {
  const DType t = GetParam();
  IsaGuard guard;
  const std::vector<float> f = probe_floats(t);
  std::vector<uint16_t> ref(f.size()), got(f.size());
  cpu_backend::float_to_half_storage_reference(t, f.data(), ref.data(), int64_t(f.size()));
  PathGuard paths;
  for (HalfCastPath path : runnable_paths(t)) {
    cpu_backend::cap_half_cast_path(path);
    ASSERT_EQ(cpu_backend::half_cast_path(t), path);
    for (size_t start : {size_t(0), size_t(5)}) {  // an unaligned start and a tail
      std::fill(got.begin(), got.end(), uint16_t(0xdead));
      cpu_backend::float_to_half_storage(t, f.data() + start, got.data() + start, int64_t(f.size() - start - 3));
      for (size_t i = start; i + 3 < f.size(); ++i)
        ASSERT_EQ(got[i], ref[i]) << dtype_name(t) << " from float bits 0x" << std::hex << bits_of(f[i]) << " on "
                                  << cpu_backend::half_cast_path_name(path);
      ASSERT_EQ(got[f.size() - 3], uint16_t(0xdead)) << "wrote past the end on " << cpu_backend::half_cast_path_name(path);
    }
    // Blocks of 16 with one subnormal among normal values (AVX512-BF16's fix-up lanes), every lane.
    std::vector<float> block(16 * 17, 1.5f);
    for (int k = 0; k < 16; ++k) block[size_t(16 * k + k)] = float_of(k & 1 ? 0x80000041u + uint32_t(k) : 0x00008000u + uint32_t(k));
    std::vector<uint16_t> bref(block.size()), bgot(block.size());
    cpu_backend::float_to_half_storage_reference(t, block.data(), bref.data(), int64_t(block.size()));
    cpu_backend::float_to_half_storage(t, block.data(), bgot.data(), int64_t(block.size()));
    ASSERT_EQ(bgot, bref) << cpu_backend::half_cast_path_name(path);
  }
  // The reference against double arithmetic: round to nearest, ties to even, NaN quiet with its sign.
  for (size_t i = 0; i < f.size(); ++i) {
    const float x = f[i];
    const uint16_t r = ref[i];
    const double back = t == DType::bf16 ? half_bits::bfloat16_to_float(r) : half_bits::to_float(r);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(back));
      ASSERT_EQ(r >> 15, bits_of(x) >> 31);
      continue;
    }
    if (std::isinf(x)) {
      ASSERT_EQ(back, double(x));
      continue;
    }
    if (std::isinf(back)) {  // overflow: only beyond the largest finite value's half ulp
      const double largest = t == DType::bf16 ? half_bits::bfloat16_to_float(0x7f7f) : 65504.0;
      const double half_ulp = t == DType::bf16 ? std::ldexp(1.0, 127 - 8) : 16.0;
      ASSERT_GE(std::fabs(double(x)), largest + half_ulp) << std::hex << bits_of(x);
      continue;
    }
    const uint16_t up = uint16_t(r + 1), down = uint16_t(r - 1);
    for (uint16_t other : {up, down}) {
      const double o = t == DType::bf16 ? half_bits::bfloat16_to_float(other) : half_bits::to_float(other);
      if (std::isnan(o) || (std::signbit(o) != std::signbit(back) && o != 0)) continue;
      const double err = std::fabs(double(x) - back), oerr = std::fabs(double(x) - o);
      ASSERT_TRUE(err < oerr || (err == oerr && (r & 1) == 0)) << std::hex << bits_of(x);
    }
  }
}

TEST_P(HalfCast, DenormalModeDoesNotChangeTheBits) {
  // cast keeps the caller's floating-point mode; the conversions must not depend on it (F16C's
  // conversions ignore DAZ/FTZ; the bf16 path is integer arithmetic).
#if defined(__x86_64__)
  const DType t = GetParam();
  std::vector<uint16_t> h(65536);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i);
  std::vector<float> ref(h.size()), got(h.size());
  cpu_backend::half_storage_to_float_reference(t, h.data(), ref.data(), int64_t(h.size()));
  std::vector<uint16_t> back_ref(h.size()), back(h.size());
  cpu_backend::float_to_half_storage_reference(t, ref.data(), back_ref.data(), int64_t(h.size()));
  PathGuard paths;
  for (HalfCastPath path : runnable_paths(t)) {
    cpu_backend::cap_half_cast_path(path);
    const unsigned saved = __builtin_ia32_stmxcsr();
    __builtin_ia32_ldmxcsr(saved | 0x8040u);  // FTZ and DAZ
    cpu_backend::half_storage_to_float(t, h.data(), got.data(), int64_t(h.size()));
    cpu_backend::float_to_half_storage(t, ref.data(), back.data(), int64_t(h.size()));
    __builtin_ia32_ldmxcsr(saved);
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(bits_of(got[i]), bits_of(ref[i])) << std::hex << i << " on " << cpu_backend::half_cast_path_name(path);
      ASSERT_EQ(back[i], back_ref[i]) << std::hex << i << " on " << cpu_backend::half_cast_path_name(path);
    }
  }
#else
  GTEST_SKIP() << "x86-64 only (MXCSR)";
#endif
}

TEST_P(HalfCast, VectorCodeRunsWhereTheCpuHasIt) {
  // On x86-64 with AVX2 (every CI machine) the vector kernels are the ones cast runs; below AVX2 or
  // with the level forced to baseline, the reference.
  IsaGuard guard;
  const DType t = GetParam();
  cpu_backend::force_isa(Isa::baseline);
  EXPECT_FALSE(cpu_backend::half_cast_vectorised(t));
  EXPECT_EQ(cpu_backend::half_cast_path(t), HalfCastPath::scalar);
  cpu_backend::force_isa(cpu_backend::detected_isa());
#if defined(__x86_64__) && defined(__GNUC__)
  if (int(cpu_backend::detected_isa()) >= int(Isa::avx2) && (t == DType::bf16 || cpu_backend::has_f16c())) {
    EXPECT_TRUE(cpu_backend::half_cast_vectorised(t));
  }
  // The best path follows CPUID: AVX512-BF16's vcvtneps2bf16 wherever the CPU has it (bf16 only).
  const HalfCastPath want = cpu_backend::detected_isa() == Isa::avx512
                                ? (t == DType::bf16 && cpu_backend::has_avx512_bf16_instructions() ? HalfCastPath::avx512_bf16
                                                                                                   : HalfCastPath::avx512)
                                : cpu_backend::detected_isa() == Isa::avx2 && (t == DType::bf16 || cpu_backend::has_f16c())
                                      ? HalfCastPath::avx2
                                      : HalfCastPath::scalar;
  EXPECT_EQ(cpu_backend::half_cast_path(t), want) << cpu_backend::half_cast_path_name(cpu_backend::half_cast_path(t));
  std::printf("%s conversions on this CPU: %s\n", dtype_name(t), cpu_backend::half_cast_path_name(want));
#endif
}

TEST_P(HalfCast, BackendCastUsesTheKernelsBothWaysAndOverThePool) {
  const DType t = GetParam();
  backend::Backend& b = cpu_backend::instance();
  const int64_t n = (1 << 18) + 13;  // several pool chunks and a tail
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.f, 100.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(gen);
  x[17] = NAN, x[1000] = INFINITY, x[2000] = -0.f, x[3000] = 1e-41f;
  std::vector<uint16_t> h(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
  std::vector<float> back(static_cast<size_t>(n)), back_ref(static_cast<size_t>(n));
  b.cast(0, DType::f32, {x.data(), 0}, t, {h.data(), 0}, n);
  cpu_backend::float_to_half_storage_reference(t, x.data(), ref.data(), n);
  ASSERT_EQ(h, ref);
  b.cast(0, t, {h.data(), 0}, DType::f32, {back.data(), 0}, n);
  cpu_backend::half_storage_to_float_reference(t, ref.data(), back_ref.data(), n);
  ASSERT_EQ(std::memcmp(back.data(), back_ref.data(), size_t(n) * 4), 0);
  // Round trip within half an ulp of the format (relative 2^-8 for bf16, 2^-11 for f16, normal range).
  const double rel = t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(x[size_t(i)]) && std::fabs(x[size_t(i)]) > 1e-3f && std::fabs(x[size_t(i)]) < 6e4f) {
      ASSERT_LE(std::fabs(double(back[size_t(i)]) - x[size_t(i)]), rel * std::fabs(x[size_t(i)])) << i;
    }
  }
}

// One pass on half storage (half_elementwise.cpp) against the three passes it replaces, bitwise.
TEST_P(HalfCast, OnePassElementwiseIsBitwiseTheThreePasses) {
  const DType t = GetParam();
  const int64_t n = 70001;  // several blocks and pool tasks, and a tail
  std::mt19937 gen(9);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> fa(static_cast<size_t>(n)), fb(static_cast<size_t>(n));
  for (float& v : fa) v = d(gen);
  for (float& v : fb) v = d(gen);
  fa[5] = NAN, fa[6] = INFINITY, fb[7] = 0.f, fa[8] = 0.f, fb[8] = 0.f, fa[9] = fb[9];
  std::vector<uint16_t> a(fa.size()), b(fb.size());
  cpu_backend::float_to_half_storage_reference(t, fa.data(), a.data(), n);
  cpu_backend::float_to_half_storage_reference(t, fb.data(), b.data(), n);
  std::vector<float> ua(fa.size()), ub(fb.size()), r(fa.size());
  cpu_backend::half_storage_to_float_reference(t, a.data(), ua.data(), n);
  cpu_backend::half_storage_to_float_reference(t, b.data(), ub.data(), n);
  std::vector<uint16_t> want(a.size()), got(a.size());
  using backend::UnaryOp;
  for (UnaryOp op : {UnaryOp::exp, UnaryOp::tanh, UnaryOp::gelu, UnaryOp::relu, UnaryOp::sigmoid, UnaryOp::leakyrelu}) {
    cpu_backend::unary(op, DType::f32, ua.data(), r.data(), n, 0.01);
    cpu_backend::float_to_half_storage_reference(t, r.data(), want.data(), n);
    ASSERT_TRUE(cpu_backend::unary_half(op, t, a.data(), got.data(), n, 0.01));
    ASSERT_EQ(got, want) << "unary op " << int(op);
  }
  using backend::BinaryOp;
  backend::Broadcast dense;
  dense.ndim = 1, dense.shape[0] = n, dense.contiguous = true;
  dense.stride[0][0] = dense.stride[1][0] = dense.stride[2][0] = 1;
  backend::Broadcast scalar_b = dense, scalar_a = dense;
  scalar_b.contiguous = scalar_a.contiguous = false;
  scalar_b.stride[1][0] = 0, scalar_a.stride[0][0] = 0;
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum, BinaryOp::pow}) {
    for (const backend::Broadcast* plan : {&dense, &scalar_b, &scalar_a}) {
      cpu_backend::binary(op, DType::f32, ua.data(), ub.data(), r.data(), *plan);
      cpu_backend::float_to_half_storage_reference(t, r.data(), want.data(), n);
      std::fill(got.begin(), got.end(), uint16_t(0));
      ASSERT_TRUE(cpu_backend::binary_half(op, t, a.data(), b.data(), got.data(), *plan));
      ASSERT_EQ(got, want) << "binary op " << int(op) << (plan == &dense ? " dense" : plan == &scalar_b ? " b scalar" : " a scalar");
    }
  }
  std::vector<uint8_t> want_cmp(a.size()), got_cmp(a.size());
  for (BinaryOp op : {BinaryOp::eq, BinaryOp::lt, BinaryOp::ge}) {
    cpu_backend::binary(op, DType::f32, ua.data(), ub.data(), want_cmp.data(), dense);
    ASSERT_TRUE(cpu_backend::binary_half(op, t, a.data(), b.data(), got_cmp.data(), dense));
    ASSERT_EQ(got_cmp, want_cmp) << "comparison " << int(op);
  }
  // A row repeated over the rows of a matrix (a bias), on either side: one pass, the same bits.
  backend::Broadcast rows;
  rows.ndim = 2, rows.shape[0] = 7000, rows.shape[1] = 10;  // several blocks, which start mid-row
  rows.stride[0][0] = 10, rows.stride[0][1] = 1, rows.stride[1][0] = 0, rows.stride[1][1] = 1, rows.stride[2][0] = 10,
  rows.stride[2][1] = 1;
  backend::Broadcast rows_a = rows;
  rows_a.stride[0][0] = 0, rows_a.stride[1][0] = 10;
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul}) {
    for (const backend::Broadcast* plan : {&rows, &rows_a}) {
      cpu_backend::binary(op, DType::f32, ua.data(), ub.data(), r.data(), *plan);
      cpu_backend::float_to_half_storage_reference(t, r.data(), want.data(), 70000);
      std::fill(got.begin(), got.end(), uint16_t(0));
      ASSERT_TRUE(cpu_backend::binary_half(op, t, a.data(), b.data(), got.data(), *plan));
      ASSERT_TRUE(std::equal(want.begin(), want.begin() + 70000, got.begin())) << "row broadcast, op " << int(op);
    }
  }
  // Another broadcast (a column against a matrix) or another dtype: declined, nothing written.
  backend::Broadcast columns = rows;
  columns.stride[1][0] = 1, columns.stride[1][1] = 0;
  std::fill(got.begin(), got.end(), uint16_t(0x1234));
  EXPECT_FALSE(cpu_backend::binary_half(BinaryOp::add, t, a.data(), b.data(), got.data(), columns));
  EXPECT_FALSE(cpu_backend::unary_half(UnaryOp::exp, DType::f32, fa.data(), r.data(), n, 0));
  EXPECT_EQ(got[0], 0x1234);
}

// relu's gradient on half storage in one pass against the step pass and the product pass it replaces,
// at every conversion path this CPU runs and in each subnormal mode: bitwise, except that where both g
// and step(x) are NaN either payload may come out (as for the product alone), and that where x > 0 g
// passes as it is, as in the float32 kernel, where the product would flush a subnormal g. Special values in both operands: ±0, ±Inf, NaN, subnormals; a length with a tail.
// Other ops and Float32 are declined.
TEST_P(HalfCast, ReluBackwardIsBitwiseTheStepAndProductPasses) {
  const DType t = GetParam();
  const int64_t n = 70001;
  std::mt19937 gen(11);
  std::vector<uint16_t> x(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, t == DType::bf16 ? uint16_t(0x7f80) : uint16_t(0x7c00),
                               t == DType::bf16 ? uint16_t(0xff80) : uint16_t(0xfc00),
                               t == DType::bf16 ? uint16_t(0x7fc1) : uint16_t(0x7e01)};
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = uint16_t(gen()), g[size_t(i)] = uint16_t(gen());
    if (i % 7 == 0) x[size_t(i)] = specials[gen() % 7];
    if (i % 11 == 0) g[size_t(i)] = specials[gen() % 7];
  }
  backend::Broadcast dense;
  dense.ndim = 1, dense.shape[0] = n, dense.contiguous = true;
  dense.stride[0][0] = dense.stride[1][0] = dense.stride[2][0] = 1;
  auto nan = [t](uint16_t v) { return t == DType::bf16 ? (v & 0x7fff) > 0x7f80 : (v & 0x7fff) > 0x7c00; };
  PathGuard guard;
  for (HalfCastPath path : runnable_paths(t))
    for (const unsigned mode : {0u, 0x0040u, 0x8000u, 0x8040u}) {  // MXCSR's DAZ and FTZ bits
      const MxcsrMode scope(mode);
      cpu_backend::cap_half_cast_path(path);
      std::vector<uint16_t> step(x.size()), want(x.size()), got(x.size(), 0x1234);
      ASSERT_TRUE(cpu_backend::unary_half(backend::UnaryOp::step, t, x.data(), step.data(), n, 0.0));
      ASSERT_TRUE(cpu_backend::binary_half(backend::BinaryOp::mul, t, g.data(), step.data(), want.data(), dense));
      ASSERT_TRUE(cpu_backend::unary_backward_half(backend::UnaryOp::relu, t, x.data(), g.data(), got.data(), n));
      const uint16_t one = t == DType::bf16 ? 0x3f80 : 0x3c00;
      int passed = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (step[i] == one && !nan(g[i]) && want[i] != g[i]) {
          want[i] = g[i];
          ++passed;
        }
      if (mode == 0) {
        EXPECT_EQ(passed, 0) << "without flushing, g * 1 is g";
      }
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && !(nan(g[i]) && nan(step[i]) && nan(got[i]) && nan(want[i])))
          FAIL() << std::hex << "x 0x" << x[i] << ", g 0x" << g[i] << ": 0x" << got[i] << ", the two passes 0x"
                 << want[i] << ", MXCSR flush bits 0x" << mode << std::dec << " (entry " << i << ", path "
                 << cpu_backend::half_cast_path_name(path) << ")";
    }
  std::vector<uint16_t> out(4, 0x1234);
  EXPECT_FALSE(cpu_backend::unary_backward_half(backend::UnaryOp::gelu, t, x.data(), g.data(), out.data(), 4));
  EXPECT_FALSE(cpu_backend::unary_backward_half(backend::UnaryOp::relu, DType::f32, x.data(), g.data(), out.data(), 2));
  EXPECT_EQ(out[0], 0x1234);
}

// ---- kernels on half activations (normalisation.cpp, pooling.cpp): bitwise the float32 kernel on
// the values cast up, its result cast down (what the core ran before, with full-tensor copies) ----

// n values of a normal draw (mean mu, deviation sd) rounded to t: the storage and its float32 values.
struct HalfData {
  std::vector<uint16_t> h;
  std::vector<float> f;
};
HalfData half_data(DType t, size_t n, unsigned seed, float mu = 0.f, float sd = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(mu, sd);
  std::vector<float> x(n);
  for (float& v : x) v = d(gen);
  HalfData out{std::vector<uint16_t>(n), std::vector<float>(n)};
  cpu_backend::float_to_half_storage_reference(t, x.data(), out.h.data(), int64_t(n));
  cpu_backend::half_storage_to_float_reference(t, out.h.data(), out.f.data(), int64_t(n));
  return out;
}
std::vector<uint16_t> rounded(DType t, const std::vector<float>& f) {
  std::vector<uint16_t> h(f.size());
  cpu_backend::float_to_half_storage_reference(t, f.data(), h.data(), int64_t(f.size()));
  return h;
}

// A channel of n s values converted once when it fits the kernel's per-thread buffers, else row by row
// on each pass: both ways (the second shape holds more than 2^17 values per channel).
struct BatchNormShape {
  int64_t n, c, s;
};
class HalfBatchNorm : public ::testing::TestWithParam<std::tuple<DType, BatchNormShape>> {};

TEST_P(HalfBatchNorm, OnHalfActivationsIsBitwiseTheFloat32Kernel) {
  const DType t = std::get<0>(GetParam());
  const auto [n, c, s] = std::get<1>(GetParam());
  const size_t len = size_t(n * c * s);
  const HalfData x = half_data(t, len, 1, 50.f, 4.f), dy = half_data(t, len, 2);
  const HalfData w = half_data(DType::bf16, size_t(c), 3), b = half_data(DType::bf16, size_t(c), 4);
  std::vector<float> y32(len), mean32(static_cast<size_t>(c)), var32(static_cast<size_t>(c)), mean(static_cast<size_t>(c)), var(static_cast<size_t>(c));
  std::vector<uint16_t> y(len);
  ASSERT_TRUE(cpu_backend::batchnorm_forward(DType::f32, x.f.data(), w.f.data(), b.f.data(), y32.data(), mean32.data(),
                                             var32.data(), n, c, s, 1e-5));
  ASSERT_TRUE(cpu_backend::batchnorm_forward(t, x.h.data(), w.f.data(), b.f.data(), y.data(), mean.data(), var.data(), n,
                                             c, s, 1e-5));
  EXPECT_EQ(y, rounded(t, y32));
  EXPECT_EQ(mean, mean32);
  EXPECT_EQ(var, var32);
  std::vector<float> dx32(len), dw32(static_cast<size_t>(c)), db32(static_cast<size_t>(c)), dw(static_cast<size_t>(c)), db(static_cast<size_t>(c));
  std::vector<uint16_t> dx(len);
  ASSERT_TRUE(cpu_backend::batchnorm_backward(DType::f32, x.f.data(), dy.f.data(), w.f.data(), mean.data(), var.data(),
                                              dx32.data(), dw32.data(), db32.data(), n, c, s, 1e-5));
  ASSERT_TRUE(cpu_backend::batchnorm_backward(t, x.h.data(), dy.h.data(), w.f.data(), mean.data(), var.data(), dx.data(),
                                              dw.data(), db.data(), n, c, s, 1e-5));
  EXPECT_EQ(dx, rounded(t, dx32));
  EXPECT_EQ(dw, dw32);
  EXPECT_EQ(db, db32);
  // Inference: y = x * scale + shift per channel.
  ASSERT_TRUE(cpu_backend::channel_affine(DType::f32, x.f.data(), w.f.data(), b.f.data(), y32.data(), n, c, s));
  ASSERT_TRUE(cpu_backend::channel_affine(t, x.h.data(), w.f.data(), b.f.data(), y.data(), n, c, s));
  EXPECT_EQ(y, rounded(t, y32));
  // Against float64: the normalised output within the rounding of the half input and output.
  for (int64_t ch = 0; ch < c; ++ch) {
    double mu = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) mu += x.f[size_t((i * c + ch) * s + k)];
    mu /= double(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) sq += std::pow(x.f[size_t((i * c + ch) * s + k)] - mu, 2);
    EXPECT_NEAR(mean[size_t(ch)], mu, 1e-5 * std::fabs(mu));
    EXPECT_NEAR(var[size_t(ch)], sq / double(n * s), 1e-5 * sq / double(n * s));
  }
  // (n, c) input (s == 1): declined, the core goes through float32.
  EXPECT_FALSE(cpu_backend::batchnorm_forward(t, x.h.data(), w.f.data(), b.f.data(), y.data(), mean.data(), var.data(), 15,
                                              c, 1, 1e-5));
}
INSTANTIATE_TEST_SUITE_P(Cpu, HalfBatchNorm,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(BatchNormShape{3, 5, 37}, BatchNormShape{2, 3, 70001})),
                         [](const auto& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) +
                                  (std::get<1>(i.param).s > 1000 ? "_RowByRow" : "_WholeChannel");
                         });

// batchnorm_bf16.cpp's AVX-512 kernels (bf16 read and widened in registers) against the portable
// kernels (the ISA forced to baseline: forward_half / backward_half in normalisation.cpp), bitwise, on
// row lengths that exercise their 8-lane sums' tails and 1024-float rounding chunks; and the gradient
// against float64 BatchNorm, itself checked by central differences of a float64 loss.
TEST(CpuBf16BatchNorm, Avx512KernelIsBitwiseThePortableKernelAndMatchesFloat64) {
  if (!cpu_backend::batchnorm_bf16_avx512_available()) {
    std::printf("[ skipped  ] the AVX-512 bf16 BatchNorm kernel: this CPU (or ISA cap) has no AVX-512\n");
    return;
  }
  IsaGuard guard;
  for (const auto& [n, c, s] : {BatchNormShape{2, 3, 7}, BatchNormShape{3, 2, 9}, BatchNormShape{2, 4, 16},
                                BatchNormShape{4, 3, 2049}, BatchNormShape{2, 2, 3136}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " c " + std::to_string(c) + " s " + std::to_string(s));
    const size_t len = size_t(n * c * s), cs = size_t(c);
    const HalfData x = half_data(DType::bf16, len, 11, 3.f, 2.f), dy = half_data(DType::bf16, len, 12);
    const HalfData w = half_data(DType::bf16, cs, 13, 1.f, 0.5f), b = half_data(DType::bf16, cs, 14);
    struct Out {
      std::vector<uint16_t> y, dx;
      std::vector<float> mean, var, dw, db;
    };
    auto run = [&](Isa isa) {
      cpu_backend::force_isa(isa);
      Out o{std::vector<uint16_t>(len), std::vector<uint16_t>(len), std::vector<float>(cs), std::vector<float>(cs),
            std::vector<float>(cs), std::vector<float>(cs)};
      EXPECT_TRUE(cpu_backend::batchnorm_forward(DType::bf16, x.h.data(), w.f.data(), b.f.data(), o.y.data(),
                                                 o.mean.data(), o.var.data(), n, c, s, 1e-5));
      EXPECT_TRUE(cpu_backend::batchnorm_backward(DType::bf16, x.h.data(), dy.h.data(), w.f.data(), o.mean.data(),
                                                  o.var.data(), o.dx.data(), o.dw.data(), o.db.data(), n, c, s, 1e-5));
      return o;
    };
    const Out fast = run(Isa::avx512);
    ASSERT_TRUE(cpu_backend::batchnorm_bf16_avx512_available());
    const Out portable = run(Isa::baseline);
    ASSERT_FALSE(cpu_backend::batchnorm_bf16_avx512_available());  // the baseline run took the portable kernel
    cpu_backend::force_isa(cpu_backend::detected_isa());
    EXPECT_EQ(fast.y, portable.y);
    EXPECT_EQ(fast.mean, portable.mean);
    EXPECT_EQ(fast.var, portable.var);
    EXPECT_EQ(fast.dx, portable.dx);
    EXPECT_EQ(fast.dw, portable.dw);
    EXPECT_EQ(fast.db, portable.db);

    // Float64 on the same (bf16-exact) values; loss = sum(y * dy).
    std::vector<double> x64(x.f.begin(), x.f.end()), dy64(dy.f.begin(), dy.f.end()), w64(w.f.begin(), w.f.end()),
        b64(b.f.begin(), b.f.end());
    auto forward64 = [&](const std::vector<double>& xs, std::vector<double>& y, std::vector<double>& mean,
                         std::vector<double>& var) {
      y.assign(len, 0), mean.assign(cs, 0), var.assign(cs, 0);
      EXPECT_TRUE(cpu_backend::batchnorm_forward(DType::f64, xs.data(), w64.data(), b64.data(), y.data(), mean.data(),
                                                 var.data(), n, c, s, 1e-5));
    };
    std::vector<double> y64, mean64, var64, dx64(len), dw64(cs), db64(cs);
    forward64(x64, y64, mean64, var64);
    ASSERT_TRUE(cpu_backend::batchnorm_backward(DType::f64, x64.data(), dy64.data(), w64.data(), mean64.data(),
                                                var64.data(), dx64.data(), dw64.data(), db64.data(), n, c, s, 1e-5));
    auto loss = [&](const std::vector<double>& xs) {
      std::vector<double> y, m, v;
      forward64(xs, y, m, v);
      double l = 0;
      for (size_t i = 0; i < len; ++i) l += y[i] * dy64[i];
      return l;
    };
    for (size_t i = 0; i < len; i += std::max<size_t>(1, len / 17)) {  // central differences on a few elements
      std::vector<double> xp = x64, xm = x64;
      const double h = 1e-4;
      xp[i] += h, xm[i] -= h;
      EXPECT_NEAR(dx64[i], (loss(xp) - loss(xm)) / (2 * h), 1e-5 * (1 + std::fabs(dx64[i]))) << "element " << i;
    }
    double scale = 0;
    for (double v : dx64) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < len; ++i) {
      const double got = half_bits::bfloat16_to_float(fast.dx[i]);
      ASSERT_NEAR(got, dx64[i], 0x1p-8 * std::fabs(dx64[i]) + 1e-4 * scale) << "dx element " << i;
      ASSERT_NEAR(half_bits::bfloat16_to_float(fast.y[i]), y64[i], 0x1p-8 * std::fabs(y64[i]) + 1e-4) << "y element " << i;
    }
    for (size_t ch = 0; ch < cs; ++ch) {
      EXPECT_NEAR(fast.mean[ch], mean64[ch], 1e-6 * (1 + std::fabs(mean64[ch])));
      EXPECT_NEAR(fast.var[ch], var64[ch], 1e-6 * var64[ch]);
      EXPECT_NEAR(fast.dw[ch], dw64[ch], 1e-5 * (1 + std::fabs(dw64[ch])));
      EXPECT_NEAR(fast.db[ch], db64[ch], 1e-5 * (1 + std::fabs(db64[ch])));
    }
  }
}

// pooling.cpp's AVX-512 blocks of the 3x3 stride-2 max forward and backward (ResNet's stem pool)
// against the scalar loops (the ISA forced to baseline), bitwise, float32 and bf16: inputs with many ties (the
// gradient goes to the first maximum in window order), zeros of both signs, NaNs in x and dy, widths
// that leave blocks of 16 windows and scalar rests, and a dx that already holds values (accumulated).
TEST(CpuBf16MaxPool, Avx512ForwardAndBackwardAreBitwiseTheScalarLoops) {
  if (cpu_backend::detected_isa() != Isa::avx512) {
    std::printf("[ skipped  ] the AVX-512 max-pool backward: this CPU has no AVX-512\n");
    return;
  }
  IsaGuard guard;
  std::mt19937 gen(45);
  for (const int64_t w : {int64_t(56), int64_t(37), int64_t(70), int64_t(112)}) {
    for (const int64_t pad : {int64_t(1), int64_t(0)}) {
      backend::ConvGeometry g;
      g.spatial = 2, g.batch = 2, g.in_channels = g.out_channels = 3;
      g.in[0] = w - 3, g.in[1] = w;
      g.kernel[0] = g.kernel[1] = 3, g.stride[0] = g.stride[1] = 2;
      g.pad_lo[0] = g.pad_lo[1] = g.pad_hi[0] = g.pad_hi[1] = pad;
      for (int i = 0; i < 2; ++i) g.out[i] = (g.in[i] + 2 * pad - 3) / 2 + 1;
      const size_t in_len = size_t(g.batch * 3 * g.in[0] * g.in[1]), out_len = size_t(g.batch * 3 * g.out[0] * g.out[1]);
      std::vector<float> x(in_len), dy(out_len), dx0(in_len);
      std::uniform_int_distribution<int> pick(0, 9);
      std::normal_distribution<float> normal;
      for (float& v : x) {  // relu-like: ties of zeros and of a few repeated values
        const int k = pick(gen);
        v = k < 4 ? 0.f : k == 4 ? -0.f : k < 7 ? float(k) : normal(gen);
      }
      x[7] = std::nanf(""), x[in_len / 2] = std::nanf("");
      for (float& v : dy) v = pick(gen) == 0 ? -0.f : normal(gen);
      dy[3] = std::nanf("");
      for (float& v : dx0) v = pick(gen) < 3 ? -0.f : pick(gen) < 5 ? 0.f : normal(gen);
      for (const DType t : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " width " + std::to_string(w) + " pad " + std::to_string(pad));
        const size_t es = t == DType::f32 ? 4 : 2;
        std::vector<uint8_t> xs(in_len * es), dys(out_len * es), ys(out_len * es), base(in_len * es);
        if (t == DType::f32) {
          std::memcpy(xs.data(), x.data(), in_len * 4), std::memcpy(dys.data(), dy.data(), out_len * 4);
          std::memcpy(base.data(), dx0.data(), in_len * 4);
        } else {
          auto to16 = [&](const std::vector<float>& f, std::vector<uint8_t>& out) {
            cpu_backend::float_to_half_storage_reference(t, f.data(), reinterpret_cast<uint16_t*>(out.data()),
                                                         int64_t(f.size()));
          };
          to16(x, xs), to16(dy, dys), to16(dx0, base);
        }
        cpu_backend::pool_forward(backend::PoolOp::max, t, xs.data(), ys.data(), g);
        {  // the forward's AVX-512 blocks against its scalar loop
          std::vector<uint8_t> ys_scalar(ys.size());
          cpu_backend::force_isa(Isa::baseline);
          cpu_backend::pool_forward(backend::PoolOp::max, t, xs.data(), ys_scalar.data(), g);
          cpu_backend::force_isa(cpu_backend::detected_isa());
          ASSERT_EQ(ys, ys_scalar);
        }
        std::vector<std::vector<uint8_t>> got;
        for (const Isa isa : {Isa::avx512, Isa::baseline}) {
          cpu_backend::force_isa(isa);
          std::vector<uint8_t> dx = base;
          cpu_backend::pool_backward(backend::PoolOp::max, t, xs.data(), ys.data(), dys.data(), dx.data(), g);
          got.push_back(std::move(dx));
        }
        cpu_backend::force_isa(cpu_backend::detected_isa());
        ASSERT_EQ(got[0], got[1]);
        // And against the definition, float32: dx = dx0 + dy at each window's first maximum.
        if (t == DType::f32) {
          std::vector<float> want = dx0, ys32(out_len);
          std::memcpy(ys32.data(), ys.data(), out_len * 4);
          for (int64_t p = 0; p < g.batch * 3; ++p)
            for (int64_t oh = 0; oh < g.out[0]; ++oh)
              for (int64_t ow = 0; ow < g.out[1]; ++ow) {
                const size_t o = size_t((p * g.out[0] + oh) * g.out[1] + ow);
                bool done = false;
                for (int64_t r = 0; r < 3 && !done; ++r)
                  for (int64_t c = 0; c < 3 && !done; ++c) {
                    const int64_t h = oh * 2 - pad + r, col = ow * 2 - pad + c;
                    if (h < 0 || h >= g.in[0] || col < 0 || col >= g.in[1]) continue;
                    const size_t i = size_t((p * g.in[0] + h) * g.in[1] + col);
                    if (x[i] == ys32[o] || (std::isnan(x[i]) && std::isnan(ys32[o]))) want[i] += dy[o], done = true;
                  }
              }
          std::vector<float> have(in_len);
          std::memcpy(have.data(), got[0].data(), in_len * 4);
          for (size_t i = 0; i < in_len; ++i)
            ASSERT_TRUE(have[i] == want[i] || (std::isnan(have[i]) && std::isnan(want[i]))) << "element " << i;
        }
      }
    }
  }
}

// half_elementwise.cpp's bf16 AVX-512 paths (relu / step on the bits; add / sub / mul and Float32 ±
// bf16 widened in registers) against the convert / float32 kernel / convert composition (the ISA forced to baseline),
// bitwise: every bf16 pattern for relu and step, random and special pairs (NaNs, infinities,
// subnormals, signed zeros) for the arithmetic, lengths with tails; and relu under denormals-are-zero,
// where the float32 comparison sees a positive subnormal as zero.
TEST(CpuBf16Elementwise, Avx512PathsAreBitwiseTheFloat32Composition) {
  if (cpu_backend::half_cast_best_path(DType::bf16) < HalfCastPath::avx512) {
    std::printf("[ skipped  ] the bf16 AVX-512 elementwise paths: this CPU has no AVX-512\n");
    return;
  }
  IsaGuard guard;
  const int64_t n = 65536 + 37;
  std::vector<uint16_t> h(static_cast<size_t>(n)), other(static_cast<size_t>(n));
  std::mt19937 gen(7);
  for (int64_t i = 0; i < n; ++i) h[size_t(i)] = uint16_t(i), other[size_t(i)] = uint16_t(gen());
  for (int64_t i = 0; i < n; i += 5) other[size_t(i)] = uint16_t(gen() % 4 == 0 ? 0x8000 : gen() % 3 == 0 ? 0x3f80 : 0);
  auto run = [&](Isa isa, auto&& fn) {
    cpu_backend::force_isa(isa);
    std::vector<uint16_t> out(static_cast<size_t>(n), 0x1234);
    fn(out);
    cpu_backend::force_isa(cpu_backend::detected_isa());
    return out;
  };
  // relu and step in each subnormal mode (the backend runs its kernels flushing: FTZ | DAZ).
  for (const unsigned mode : {0u, 0x0040u, 0x8000u, 0x8040u}) {
    const MxcsrMode scope(mode);
    for (const auto op : {backend::UnaryOp::relu, backend::UnaryOp::step}) {
      for (const int64_t len : {n, int64_t(45), int64_t(3)}) {
        auto fn = [&](std::vector<uint16_t>& out) {
          ASSERT_TRUE(cpu_backend::unary_half(op, DType::bf16, h.data() + 1, out.data(), len - 1, 0.0));
        };
        EXPECT_EQ(run(Isa::avx512, fn), run(Isa::baseline, fn))
            << "unary op " << int(op) << " length " << len << " MXCSR flush bits 0x" << std::hex << mode;
      }
    }
  }
  for (const auto op : {backend::BinaryOp::add, backend::BinaryOp::sub, backend::BinaryOp::mul}) {
    for (const int64_t len : {n, int64_t(2049), int64_t(13)}) {
      backend::Broadcast plan;
      plan.ndim = 1, plan.shape[0] = len, plan.contiguous = true;
      plan.stride[0][0] = plan.stride[1][0] = plan.stride[2][0] = 1;
      auto fn = [&](std::vector<uint16_t>& out) {
        ASSERT_TRUE(cpu_backend::binary_half(op, DType::bf16, h.data(), other.data(), out.data(), plan));
      };
      // Bitwise, except that with two NaN operands either payload may come out (IEEE 754 leaves it
      // open; the compiled float32 kernels differ in operand order between ISA levels).
      const std::vector<uint16_t> fast = run(Isa::avx512, fn), slow = run(Isa::baseline, fn);
      auto nan = [](uint16_t v) { return (v & 0x7fff) > 0x7f80; };
      for (size_t i = 0; i < fast.size(); ++i)
        if (fast[i] != slow[i] && !(nan(h[i]) && nan(other[i]) && nan(fast[i]) && nan(slow[i])))
          FAIL() << std::hex << "binary op " << int(op) << ": a 0x" << h[i] << ", b 0x" << other[i] << " gave 0x"
                 << fast[i] << ", the float32 composition 0x" << slow[i] << std::dec << " (length " << len << ")";
    }
  }
  // Float32 ± bf16 (binary_mixed: the residual add under autocast), the bf16 operand on either side,
  // in each subnormal mode: every bf16 pattern against Float32 values with NaNs, infinities,
  // subnormals and signed zeros; bitwise but for the payload of two NaNs.
  std::vector<float> wide(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = uint32_t(gen());
    float v;
    std::memcpy(&v, &bits, sizeof v);
    wide[size_t(i)] = i % 7 == 0 ? v : std::ldexp(float(int(gen() % 2001) - 1000), -int(gen() % 140));
  }
  for (const unsigned mode : {0u, 0x0040u, 0x8000u, 0x8040u})
    for (const auto op : {backend::BinaryOp::add, backend::BinaryOp::sub})
      for (const bool low_first : {false, true})
        for (const int64_t len : {n, int64_t(2049), int64_t(13)}) {
          const MxcsrMode scope(mode);
          auto mixed = [&](Isa isa) {
            cpu_backend::force_isa(isa);
            std::vector<float> out(static_cast<size_t>(n), 7.f);
            const void* a = low_first ? static_cast<const void*>(h.data()) : wide.data();
            const void* b = low_first ? static_cast<const void*>(wide.data()) : h.data();
            EXPECT_TRUE(cpu_backend::binary_mixed(op, DType::bf16, low_first, a, b, out.data(), len));
            cpu_backend::force_isa(cpu_backend::detected_isa());
            return out;
          };
          const std::vector<float> fast = mixed(Isa::avx512), slow = mixed(Isa::baseline);
          for (size_t i = 0; i < fast.size(); ++i) {
            uint32_t fb, sb;
            std::memcpy(&fb, &fast[i], 4), std::memcpy(&sb, &slow[i], 4);
            const bool low_nan = (h[i] & 0x7fff) > 0x7f80;
            if (fb != sb && !(low_nan && std::isnan(wide[i]) && std::isnan(fast[i]) && std::isnan(slow[i])))
              FAIL() << std::hex << "mixed op " << int(op) << (low_first ? " bf16 first" : " Float32 first") << ": bf16 0x"
                     << h[i] << ", Float32 bits 0x" << std::bit_cast<uint32_t>(wide[i]) << " gave 0x" << fb
                     << ", the composition 0x" << sb << ", MXCSR flush bits 0x" << mode << std::dec << " (length "
                     << len << ")";
          }
        }
#if defined(__x86_64__) && defined(__GNUC__)
  // Denormals-are-zero (MXCSR bit 6): relu of the positive subnormal 0x0001 is +0, as in float32.
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x0040);
  const uint16_t sub = 0x0001;
  uint16_t got = 0x1234;
  EXPECT_TRUE(cpu_backend::unary_half(backend::UnaryOp::relu, DType::bf16, &sub, &got, 1, 0.0));
  _mm_setcsr(csr);
  EXPECT_EQ(got, 0x0000);
#endif
}

TEST_P(HalfCast, RowNormOnHalfActivationsIsBitwiseTheFloat32Kernel) {
  const DType t = GetParam();
  const int64_t r = 45, d = 67;
  const size_t len = size_t(r * d);
  const HalfData x = half_data(t, len, 5, 3.f, 2.f), dy = half_data(t, len, 6);
  const HalfData w = half_data(DType::bf16, size_t(d), 7), b = half_data(DType::bf16, size_t(d), 8);
  for (bool affine : {true, false}) {
    const float* wp = affine ? w.f.data() : nullptr;
    const float* bp = affine ? b.f.data() : nullptr;
    std::vector<float> y32(len), mean32(static_cast<size_t>(r)), rstd32(static_cast<size_t>(r)), mean(static_cast<size_t>(r)), rstd(static_cast<size_t>(r));
    std::vector<uint16_t> y(len);
    ASSERT_TRUE(cpu_backend::rownorm_forward(DType::f32, x.f.data(), wp, bp, y32.data(), mean32.data(), rstd32.data(), r, d, 1e-5));
    ASSERT_TRUE(cpu_backend::rownorm_forward(t, x.h.data(), wp, bp, y.data(), mean.data(), rstd.data(), r, d, 1e-5));
    EXPECT_EQ(y, rounded(t, y32));
    EXPECT_EQ(mean, mean32);
    EXPECT_EQ(rstd, rstd32);
    std::vector<float> dx32(len), dw32(static_cast<size_t>(d)), db32(static_cast<size_t>(d)), dw(static_cast<size_t>(d)), db(static_cast<size_t>(d));
    std::vector<uint16_t> dx(len);
    ASSERT_TRUE(cpu_backend::rownorm_backward(DType::f32, x.f.data(), dy.f.data(), wp, mean.data(), rstd.data(), dx32.data(),
                                              affine ? dw32.data() : nullptr, affine ? db32.data() : nullptr, r, d));
    ASSERT_TRUE(cpu_backend::rownorm_backward(t, x.h.data(), dy.h.data(), wp, mean.data(), rstd.data(), dx.data(),
                                              affine ? dw.data() : nullptr, affine ? db.data() : nullptr, r, d));
    EXPECT_EQ(dx, rounded(t, dx32));
    if (affine) {
      EXPECT_EQ(dw, dw32);
      EXPECT_EQ(db, db32);
    }
    // Against float64: row 0's normalised values within one rounding of the output.
    double mu = 0, sq = 0;
    for (int64_t j = 0; j < d; ++j) mu += x.f[size_t(j)];
    mu /= double(d);
    for (int64_t j = 0; j < d; ++j) sq += std::pow(x.f[size_t(j)] - mu, 2);
    const double inv = 1 / std::sqrt(sq / double(d) + 1e-5);
    for (int64_t j = 0; j < d; ++j) {
      const double want = (x.f[size_t(j)] - mu) * inv * (affine ? w.f[size_t(j)] : 1.0) + (affine ? b.f[size_t(j)] : 0.0);
      const double got = t == DType::bf16 ? half_bits::bfloat16_to_float(y[size_t(j)]) : half_bits::to_float(y[size_t(j)]);
      EXPECT_NEAR(got, want, 1e-5 + std::fabs(want) * (t == DType::bf16 ? 0x1p-8 : 0x1p-11)) << j;
    }
  }
}

TEST_P(HalfCast, PoolingOnHalfActivationsIsBitwiseTheFloat32Kernel) {
  const DType t = GetParam();
  struct Window {
    int64_t k, stride, pad, in;
  };
  // ResNet's 3x3 stride 2 pad 1 and 2x2 stride 2 (the fixed kernels), a 3x3 stride 1 (the reference loop)
  // and a global window (AdaptiveMeanPool((1, 1)) on 7x7).
  for (Window win : {Window{3, 2, 1, 15}, Window{2, 2, 0, 12}, Window{3, 1, 1, 9}, Window{7, 7, 0, 7}}) {
    backend::ConvGeometry g;
    g.spatial = 2, g.batch = 2, g.in_channels = g.out_channels = 3;
    for (int i = 0; i < 2; ++i) {
      g.in[i] = win.in, g.kernel[i] = win.k, g.stride[i] = win.stride, g.pad_lo[i] = g.pad_hi[i] = win.pad;
      g.out[i] = (win.in + 2 * win.pad - win.k) / win.stride + 1;
    }
    const size_t in_len = size_t(g.batch * g.in_channels * g.in[0] * g.in[1]);
    const size_t out_len = size_t(g.batch * g.in_channels * g.out[0] * g.out[1]);
    HalfData x = half_data(t, in_len, 9);
    x.h[3] = x.h[4];  // a tie inside a window: the gradient goes to the first
    cpu_backend::half_storage_to_float_reference(t, x.h.data(), x.f.data(), int64_t(in_len));
    const HalfData dy = half_data(t, out_len, 10);
    for (backend::PoolOp op : {backend::PoolOp::max, backend::PoolOp::mean}) {
      SCOPED_TRACE("window " + std::to_string(win.k) + " stride " + std::to_string(win.stride) +
                   (op == backend::PoolOp::max ? " max" : " mean"));
      std::vector<float> y32(out_len), yf(out_len);
      std::vector<uint16_t> y(out_len);
      cpu_backend::pool_forward(op, DType::f32, x.f.data(), y32.data(), g);
      cpu_backend::pool_forward(op, t, x.h.data(), y.data(), g);
      ASSERT_EQ(y, rounded(t, y32));
      cpu_backend::half_storage_to_float_reference(t, y.data(), yf.data(), int64_t(out_len));
      // dx is accumulated into: start both from the same non-zero values.
      const HalfData dx0 = half_data(t, in_len, 11);
      std::vector<float> dx32 = dx0.f;
      std::vector<uint16_t> dx = dx0.h;
      cpu_backend::pool_backward(op, DType::f32, x.f.data(), yf.data(), dy.f.data(), dx32.data(), g);
      cpu_backend::pool_backward(op, t, x.h.data(), y.data(), dy.h.data(), dx.data(), g);
      ASSERT_EQ(dx, rounded(t, dx32));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, HalfCast, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace

// ---- bf16 library kernels (oneDNN) ----
namespace {

using flux::backend::Buffer;
using flux::backend::ConvGeometry;
using flux::backend::Gemm;

// Bypasses the bf16-units check for its scope (cpu_backend::bypass_bf16_units_check).
struct Bf16Bypass {
  bool old;
  explicit Bf16Bypass(bool on) : old(cpu_backend::bypass_bf16_units_check(on)) {}
  ~Bf16Bypass() { cpu_backend::bypass_bf16_units_check(old); }
};

bool cpu_has_bf16_units() { return cpu_backend::instance().low_precision_support(0, DType::bf16).units; }

// A site's kernel forced for a scope (nullopt: the seam chooses).
struct KernelForced {
  cpu_backend::Site site;
  std::optional<cpu_backend::Kernel> old;
  KernelForced(cpu_backend::Site s, std::optional<cpu_backend::Kernel> k) : site(s), old(cpu_backend::force_kernel(s, k)) {}
  ~KernelForced() { cpu_backend::force_kernel(site, old); }
  KernelForced(const KernelForced&) = delete;
  KernelForced& operator=(const KernelForced&) = delete;
};

// Below AVX-512 oneDNN 2.6 has no bf16 kernel at all: asked anyway, every call must decline.
bool onednn_can_run_bf16() { return cpu_backend::detected_isa() == Isa::avx512; }

// bf16 values (random, already rounded) and their float64 values.
struct Bf16Array {
  std::vector<uint16_t> bits;
  std::vector<double> value;
  Bf16Array(size_t n, unsigned seed, double lo = -1, double hi = 1) : bits(n), value(n) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> d{float(lo), float(hi)};
    for (size_t i = 0; i < n; ++i) {
      bits[i] = half_bits::bfloat16_from_float(d(gen));
      value[i] = half_bits::bfloat16_to_float(bits[i]);
    }
  }
  Buffer buffer() { return {bits.data(), 0}; }
  double at(size_t i) const { return half_bits::bfloat16_to_float(bits[i]); }
};

// |got - want| within bf16's rounding of the result (2^-8 relative, twice its half ulp) and float32
// accumulation (1e-4 of the sum of the terms' magnitudes).
void expect_close(const Bf16Array& got, const std::vector<double>& want, const std::vector<double>& magnitude,
                  const char* what) {
  ASSERT_EQ(got.bits.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = std::ldexp(std::fabs(want[i]), -8) + 1e-4 * magnitude[i] + 1e-30;
    ASSERT_NEAR(got.at(i), want[i], tol) << what << " element " << i;
  }
}

// Runs `call` (returns whether the kernel ran) without and with the units check bypassed: where it
// runs the result must match; where the CPU cannot run bf16 it must decline and leave the output
// untouched (`unchanged` says so).
template <class Call, class Check, class Unchanged>
void run_both_ways(const char* what, Call&& call, Check&& check, Unchanged&& unchanged) {
  for (bool bypass : {false, true}) {
    SCOPED_TRACE(std::string(what) + (bypass ? " (units check bypassed)" : ""));
    Bf16Bypass scope(bypass);
    bool ran = false;
    ASSERT_NO_THROW(ran = call());
    if (!bypass && !cpu_has_bf16_units()) {
      EXPECT_FALSE(ran) << "bf16 kernel ran on a CPU without bf16 units";
    }
    if (!onednn_can_run_bf16()) {
      EXPECT_FALSE(ran) << "oneDNN has no bf16 kernels below AVX-512";
    }
    if (ran) check();
    else unchanged();
  }
}

// matmul_low_precision with C bf16, and with C Float32 (matmul_low_precision_float32: the accumulation
// unrounded, as a weight gradient reaches its Float32 master).
TEST(CpuBf16, MatmulLowPrecisionMatchesFloat64OrDeclines) {
  backend::Backend& b = cpu_backend::instance();
  struct Case {
    int64_t batch, m, n, k;
    bool ta, tb;
    bool broadcast_b;
    double alpha, beta;
  };
  const Case cases[] = {{1, 7, 5, 3, false, false, false, 1, 0},   {1, 64, 96, 200, false, true, false, 1, 0},
                        {3, 17, 33, 40, true, false, true, 0.5, 0}, {2, 24, 16, 31, true, true, false, 1, 1},
                        {1, 1, 300, 64, false, true, false, 2, 0.5}, {5, 40, 1, 64, false, false, false, 1, 0},
                        // Enough work to cut over the pool: along m with a ragged tail (a transposed A's
                        // rows copied first, as a weight gradient's), and along n where m is one block;
                        // transposed pieces too large to copy, strided along m and along n.
                        {1, 100, 72, 160, true, false, false, 1, 0},  {1, 100, 72, 160, true, true, false, 0.5, 1},
                        {1, 96, 80, 200, false, false, false, 1, 1},  {1, 16, 512, 160, false, true, false, 1, 0},
                        {1, 200, 40, 1400, true, false, false, 1, 0}, {1, 128, 160, 2100, true, true, false, 1, 1}};
  unsigned seed = 1;
  int64_t unrounded = 0;
  for (const Case& c : cases) {
    Gemm g;
    g.batch = c.batch, g.m = c.m, g.n = c.n, g.k = c.k, g.trans_a = c.ta, g.trans_b = c.tb;
    g.stride_a = c.m * c.k, g.stride_b = c.broadcast_b ? 0 : c.k * c.n, g.stride_c = c.m * c.n;
    g.alpha = c.alpha, g.beta = c.beta;
    Bf16Array a(size_t(c.batch * c.m * c.k), seed++), bm(size_t((c.broadcast_b ? 1 : c.batch) * c.k * c.n), seed++);
    const Bf16Array c0(size_t(c.batch * c.m * c.n), seed++);
    std::vector<double> want(c0.bits.size()), magnitude(c0.bits.size());
    for (int64_t p = 0; p < c.batch; ++p)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double acc = 0, mag = 0;
          for (int64_t l = 0; l < c.k; ++l) {
            const double x = a.value[size_t(p * g.stride_a + (c.ta ? l * c.m + i : i * c.k + l))];
            const double y = bm.value[size_t(p * g.stride_b + (c.tb ? j * c.k + l : l * c.n + j))];
            acc += x * y, mag += std::fabs(x * y);
          }
          const size_t o = size_t(p * g.stride_c + i * c.n + j);
          want[o] = c.alpha * acc + c.beta * c0.value[o];
          magnitude[o] = std::fabs(c.alpha) * mag + std::fabs(c.beta * c0.value[o]);
        }
    // A transposed A cut over the pool: the seam's cut (Site::bf16_transposed_a), then each forced.
    std::vector<std::optional<cpu_backend::Kernel>> cuts{std::nullopt};
    if (c.ta) cuts.insert(cuts.end(), {cpu_backend::Kernel::copied, cpu_backend::Kernel::strided});
    for (std::optional<cpu_backend::Kernel> cut : cuts) {
    SCOPED_TRACE(std::string("cut ") + (cut ? cpu_backend::kernel_name(*cut) : "chosen"));
    KernelForced forced(cpu_backend::Site::bf16_transposed_a, cut);
    Bf16Array out = c0;
    run_both_ways(
        "matmul_low_precision",
        [&] {
          out = c0;
          return b.matmul_low_precision(0, DType::bf16, a.buffer(), bm.buffer(), out.buffer(), g);
        },
        [&] { expect_close(out, want, magnitude, "matmul"); }, [&] { EXPECT_EQ(out.bits, c0.bits); });
    // C Float32 (matmul_low_precision_float32): the float32 accumulation, not rounded to bf16.
    std::vector<float> c32(c0.value.begin(), c0.value.end()), out32;
    run_both_ways(
        "matmul_low_precision_float32",
        [&] {
          out32 = c32;
          return b.matmul_low_precision_float32(0, DType::bf16, a.buffer(), bm.buffer(), {out32.data(), 0}, g);
        },
        [&] {
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(out32[i], want[i], std::ldexp(magnitude[i], -23) * double(c.k + 2) + 1e-30) << "element " << i;
            if (std::fabs(want[i]) > 1e-3 * magnitude[i] && (bits_of(out32[i]) & 0xffffu) != 0) ++unrounded;
          }
        },
        [&] { EXPECT_EQ(out32, c32); });
    }
  }
  if (onednn_can_run_bf16()) {
    EXPECT_GT(unrounded, 1000) << "Float32 results with bits below bf16's";
  }
  // Not bf16: never this kernel.
  Bf16Bypass scope(true);
  std::vector<float> x(4, 1.f), y(4, 1.f), z(4, 0.f);
  Gemm g;
  g.m = g.n = g.k = 2;
  EXPECT_FALSE(b.matmul_low_precision(0, DType::f16, {x.data(), 0}, {y.data(), 0}, {z.data(), 0}, g));
  EXPECT_FALSE(b.matmul_low_precision(0, DType::f32, {x.data(), 0}, {y.data(), 0}, {z.data(), 0}, g));
  EXPECT_FALSE(b.matmul_low_precision_float32(0, DType::f16, {x.data(), 0}, {y.data(), 0}, {z.data(), 0}, g));
}

// With a cache (inference: weights prepared once and kept) and without (training: as the seam says,
// Site::linear_weights, and with each way forced: the kernel reads w as it is, or each piece packs its
// weights into the call's scratch); small and cut over the pool along the outputs.
TEST(CpuBf16, LinearForwardMatchesFloat64OrDeclines) {
  backend::Backend& b = cpu_backend::instance();
  struct Size {
    int64_t n, in, out;
  };
  using Weights = std::optional<cpu_backend::Kernel>;
  const Weights chosen, in_place = cpu_backend::Kernel::in_place, packed = cpu_backend::Kernel::packed;
  for (Size s : {Size{1, 72, 40}, Size{16, 72, 40}, Size{33, 72, 40}, Size{64, 256, 100}, Size{300, 72, 40}})
    for (auto [keep, weights] : {std::pair{true, chosen}, std::pair{false, chosen}, std::pair{false, in_place},
                                 std::pair{false, packed}})
      for (bool bias : {false, true})
        for (bool relu : {false, true}) {
          const int64_t n = s.n, in = s.in, out = s.out;
          SCOPED_TRACE("n " + std::to_string(n) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                       (keep ? " kept weights" : " no cache, weights ") +
                       (keep ? "" : weights ? cpu_backend::kernel_name(*weights) : "chosen"));
          KernelForced forced(cpu_backend::Site::linear_weights, weights);
          Bf16Array x(size_t(n * in), 11), w(size_t(out * in), 12), bv(size_t(out), 13);
          std::vector<double> want(size_t(n * out)), magnitude(size_t(n * out));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t o = 0; o < out; ++o) {
              double acc = bias ? bv.value[size_t(o)] : 0, mag = std::fabs(acc);
              for (int64_t l = 0; l < in; ++l) {
                const double t = x.value[size_t(i * in + l)] * w.value[size_t(o * in + l)];
                acc += t, mag += std::fabs(t);
              }
              want[size_t(i * out + o)] = relu && acc < 0 ? 0 : acc;
              magnitude[size_t(i * out + o)] = mag;
            }
          const Bf16Array y0(size_t(n * out), 14);
          Bf16Array y = y0;
          cpu_backend::LocalPreparedCache local;
          backend::PreparedCache* cache = keep ? &local : nullptr;
          run_both_ways(
              "linear_forward",
              [&] {
                y = y0;
                const bool first = b.linear_forward(0, DType::bf16, x.buffer(), w.buffer(), cache,
                                                    bias ? bv.buffer() : Buffer{}, y.buffer(), n, in, out, relu);
                if (!first) return false;
                // Again (on the weights prepared by the first call where kept): the same bits.
                const Bf16Array once = y;
                EXPECT_TRUE(b.linear_forward(0, DType::bf16, x.buffer(), w.buffer(), cache,
                                             bias ? bv.buffer() : Buffer{}, y.buffer(), n, in, out, relu));
                EXPECT_EQ(y.bits, once.bits);
                return true;
              },
              [&] { expect_close(y, want, magnitude, "linear"); }, [&] { EXPECT_EQ(y.bits, y0.bits); });
        }
}

// How a training Dense reaches its weights and how a bf16 weight gradient's transposed operand is cut
// are kernel-choice sites (Site::linear_weights, Site::bf16_transposed_a): the rules are the measured
// limits (256 rows read in place; 256 KiB pieces copied), the calls ask the seam (so a tuned table made
// by flux-tune replaces the limits on another CPU), and the tuner's timers time both ways.
TEST(CpuBf16, TrainingDenseWeightsAndTransposedCutsAreSeamChoices) {
  using cpu_backend::Kernel;
  using cpu_backend::bit;
  const cpu_backend::Candidates weights = bit(Kernel::in_place) | bit(Kernel::packed);
  const cpu_backend::Candidates cuts = bit(Kernel::copied) | bit(Kernel::strided);
  const int64_t bf16 = int64_t(DType::bf16);
  auto dense = [&](int64_t n) { return cpu_backend::LinearWeightsQuery{n, 256, 64, true, false, bf16}.query(2); };
  EXPECT_EQ(cpu_backend::rule(dense(256), weights), Kernel::in_place);
  EXPECT_EQ(cpu_backend::rule(dense(257), weights), Kernel::packed);
  EXPECT_EQ(cpu_backend::rule(dense(16), bit(Kernel::packed)), Kernel::packed) << "no in-place kernel: packed";
  auto gradient = [](int64_t k) { return cpu_backend::TransposedAQuery{512, 256, k, 128, false, true}.query(2); };
  EXPECT_EQ(cpu_backend::rule(gradient(1024), cuts), Kernel::copied) << "128 x 1024 bf16: 256 KiB";
  EXPECT_EQ(cpu_backend::rule(gradient(1025), cuts), Kernel::strided);

  backend::Backend& b = cpu_backend::instance();
  const bool units = cpu_backend::bf16_kernels_enabled();
  // A training Dense (no cache) and a weight gradient dY^T x large enough to cut over the pool.
  const int64_t n = 64, in = 256, out = 100, m = 100, cols = 72, k = 160;
  Bf16Array x(size_t(n * in), 31), w(size_t(out * in), 32), y(size_t(n * out), 33);
  Bf16Array a(size_t(k * m), 34), bm(size_t(k * cols), 35);
  std::vector<float> c(size_t(m * cols));
  Gemm g;
  g.m = m, g.n = cols, g.k = k, g.trans_a = true;
  g.stride_a = m * k, g.stride_b = k * cols, g.stride_c = m * cols;
  cpu_backend::record_queries(true);
  const bool dense_ran = b.linear_forward(0, DType::bf16, x.buffer(), w.buffer(), nullptr, Buffer{}, y.buffer(), n, in,
                                          out, false);
  const bool gradient_ran = b.matmul_low_precision_float32(0, DType::bf16, a.buffer(), bm.buffer(), {c.data(), 0}, g);
  cpu_backend::record_queries(false);
  EXPECT_EQ(dense_ran, units);
  EXPECT_EQ(gradient_ran, units);
  int dense_queries = 0, gradient_queries = 0;
  for (const auto& [q, candidates] : cpu_backend::recorded_queries()) {
    if (q.site == cpu_backend::Site::linear_weights) {
      const auto d = cpu_backend::LinearWeightsQuery::from(q);
      EXPECT_EQ(d.n, n);
      EXPECT_EQ(d.in, in);
      EXPECT_EQ(d.dtype, bf16);
      EXPECT_EQ(candidates & bit(Kernel::packed), bit(Kernel::packed));
      ++dense_queries;
    } else if (q.site == cpu_backend::Site::bf16_transposed_a) {
      const auto t = cpu_backend::TransposedAQuery::from(q);
      EXPECT_EQ(t.m, m);
      EXPECT_EQ(t.n, cols);
      EXPECT_EQ(t.k, k);
      EXPECT_TRUE(t.float32_c);
      EXPECT_EQ(candidates, cuts);
      ++gradient_queries;
    }
  }
  if (units && cpu_backend::num_threads() > 1) {
    EXPECT_GE(dense_queries, 1) << "the training Dense asked the seam for each piece's weights";
    EXPECT_EQ(gradient_queries, 1) << "the transposed A's cut was asked once";
  }
  if (!units) {
    EXPECT_EQ(dense_queries + gradient_queries, 0) << "no bf16 kernel, no question";
  }
  // The timers run both ways where the CPU has bf16 kernels, and answer +infinity where it has not or
  // for a dtype the site does not run.
  const cpu_backend::Timer dense_timer = cpu_backend::timer_of(cpu_backend::Site::linear_weights);
  const cpu_backend::Timer gradient_timer = cpu_backend::timer_of(cpu_backend::Site::bf16_transposed_a);
  if (!dense_timer || !gradient_timer) GTEST_SKIP() << "built without oneDNN: no timers";
  for (Kernel kernel : {Kernel::in_place, Kernel::packed}) {
    const double seconds = dense_timer(dense(n), kernel, 2);
    if (units) {
      EXPECT_TRUE(std::isfinite(seconds) && seconds > 0) << cpu_backend::kernel_name(kernel) << ": " << seconds;
    } else {
      EXPECT_TRUE(std::isinf(seconds)) << cpu_backend::kernel_name(kernel);
    }
  }
  EXPECT_TRUE(std::isinf(dense_timer(cpu_backend::LinearWeightsQuery{n, in, 64, true, false, int64_t(DType::f16)}.query(1),
                                     Kernel::packed, 1)));
  for (Kernel kernel : {Kernel::copied, Kernel::strided}) {
    const double seconds = gradient_timer(cpu_backend::TransposedAQuery{m, cols, k, 48, false, true}.query(2), kernel, 2);
    if (units) {
      EXPECT_TRUE(std::isfinite(seconds) && seconds > 0) << cpu_backend::kernel_name(kernel) << ": " << seconds;
    } else {
      EXPECT_TRUE(std::isinf(seconds)) << cpu_backend::kernel_name(kernel);
    }
  }
}

// A 2-D conv geometry: groups `groups`, 3x3 kernel, padding 1.
ConvGeometry geometry(int64_t c, int64_t o, int64_t groups, int64_t stride, int64_t size, int64_t batch = 2) {
  ConvGeometry g;
  g.spatial = 2, g.batch = batch, g.in_channels = c, g.out_channels = o, g.groups = groups;
  for (int i = 0; i < 2; ++i) {
    g.in[i] = size, g.kernel[i] = 3, g.stride[i] = stride, g.pad_lo[i] = g.pad_hi[i] = 1;
    g.out[i] = (size + 2 - 3) / stride + 1;
  }
  return g;
}

// fn(n, o, oy, ox, ci, cw, ky, kx, iy, ix) for every term of conv(x, w) of g, where ci is x's channel,
// cw the weight's input channel (within the group), and (iy, ix) inside the input.
template <class Fn> void each_term(const ConvGeometry& g, Fn&& fn) {
  const int64_t cg = g.in_channels / g.groups, og = g.out_channels / g.groups;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t oy = 0; oy < g.out[0]; ++oy)
        for (int64_t ox = 0; ox < g.out[1]; ++ox)
          for (int64_t cw = 0; cw < cg; ++cw)
            for (int64_t ky = 0; ky < g.kernel[0]; ++ky)
              for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
                const int64_t iy = oy * g.stride[0] - g.pad_lo[0] + ky, ix = ox * g.stride[1] - g.pad_lo[1] + kx;
                if (iy < 0 || ix < 0 || iy >= g.in[0] || ix >= g.in[1]) continue;
                fn(n, o, oy, ox, (o / og) * cg + cw, cw, ky, kx, iy, ix);
              }
}

struct ConvCase {
  ConvGeometry g;
  size_t xs, ws, ys;
  size_t xi(int64_t n, int64_t c, int64_t y, int64_t x) const {
    return size_t(((n * g.in_channels + c) * g.in[0] + y) * g.in[1] + x);
  }
  size_t yi(int64_t n, int64_t o, int64_t y, int64_t x) const {
    return size_t(((n * g.out_channels + o) * g.out[0] + y) * g.out[1] + x);
  }
  size_t wi(int64_t o, int64_t c, int64_t ky, int64_t kx) const {
    return size_t(((o * (g.in_channels / g.groups) + c) * g.kernel[0] + ky) * g.kernel[1] + kx);
  }
  explicit ConvCase(const ConvGeometry& geo) : g(geo) {
    xs = size_t(g.batch * g.in_channels * g.in[0] * g.in[1]);
    ys = size_t(g.batch * g.out_channels * g.out[0] * g.out[1]);
    ws = size_t(g.out_channels * (g.in_channels / g.groups) * 9);
  }
};

class CpuBf16Conv : public ::testing::TestWithParam<int> {
 protected:
  static ConvGeometry param_geometry(int i) {
    switch (i) {
      case 0: return geometry(16, 32, 1, 1, 8);
      case 1: return geometry(32, 32, 2, 2, 9);
      case 2: return geometry(3, 16, 1, 1, 10);  // a first layer: few input channels
      // Enough work to split over the pool: one image by output channels, four by samples (the weight
      // gradients of the chunks summed in float32).
      case 3: return geometry(32, 64, 1, 1, 12, 1);
      default: return geometry(32, 32, 1, 1, 12, 4);
    }
  }
};

TEST_P(CpuBf16Conv, ForwardReluAndAffineMatchFloat64OrDecline) {
  backend::Backend& b = cpu_backend::instance();
  const ConvCase cc(param_geometry(GetParam()));
  const ConvGeometry& g = cc.g;
  Bf16Array x(cc.xs, 21), w(cc.ws, 22, -0.3, 0.3), bias(size_t(g.out_channels), 23), scale(size_t(g.out_channels), 24, 0.5, 1.5),
      shift(size_t(g.out_channels), 25), residual(cc.ys, 26);
  std::vector<double> conv(cc.ys, 0.0), magnitude(cc.ys, 0.0);
  each_term(g, [&](int64_t n, int64_t o, int64_t oy, int64_t ox, int64_t ci, int64_t cw, int64_t ky, int64_t kx,
                   int64_t iy, int64_t ix) {
    const double t = x.value[cc.xi(n, ci, iy, ix)] * w.value[cc.wi(o, cw, ky, kx)];
    conv[cc.yi(n, o, oy, ox)] += t, magnitude[cc.yi(n, o, oy, ox)] += std::fabs(t);
  });
  const int64_t per_channel = g.out[0] * g.out[1];
  auto channel = [&](size_t i) { return size_t(int64_t(i) / per_channel % g.out_channels); };
  const Bf16Array y0(cc.ys, 27);
  for (int kind = 0; kind < 4; ++kind) {
    // 0: conv + bias, 1: relu(conv + bias), 2: conv without bias, 3: relu(relu(conv * scale + shift) + residual)
    std::vector<double> want(cc.ys), mag(cc.ys);
    for (size_t i = 0; i < cc.ys; ++i) {
      const size_t o = channel(i);
      double v = conv[i];
      mag[i] = magnitude[i];
      if (kind == 0 || kind == 1) v += bias.value[o], mag[i] += std::fabs(bias.value[o]);
      if (kind == 1) v = std::max(v, 0.0);
      if (kind == 3) {
        v = std::max(v * scale.value[o] + shift.value[o], 0.0) + residual.value[i];
        v = std::max(v, 0.0);
        // The kernel folds the scale into its bf16 weights (one more bf16 rounding of each term):
        // 2^-8 of the terms' magnitudes on top, written as 40x the 1e-4 allowance of expect_close.
        mag[i] = 40 * mag[i] * scale.value[o] + std::fabs(shift.value[o]) + std::fabs(residual.value[i]);
      }
      want[i] = v;
    }
    Bf16Array y = y0;
    cpu_backend::LocalPreparedCache cache;
    ConvGeometry gc = g;
    gc.weight_cache = kind == 3 ? &cache : nullptr;  // the affine form is the inference one: prepared weights
    gc.inference = kind == 3;
    run_both_ways(
        kind == 0 ? "conv_forward" : kind == 1 ? "conv_forward_relu" : kind == 2 ? "conv_forward (no bias)" : "conv_forward_affine",
        [&] {
          y = y0;
          switch (kind) {
            case 0: return b.conv_forward(0, DType::bf16, x.buffer(), w.buffer(), bias.buffer(), y.buffer(), gc);
            case 1: return b.conv_forward_relu(0, DType::bf16, x.buffer(), w.buffer(), bias.buffer(), y.buffer(), gc);
            case 2: return b.conv_forward(0, DType::bf16, x.buffer(), w.buffer(), Buffer{}, y.buffer(), gc);
            default:
              return b.conv_forward_affine(0, DType::bf16, x.buffer(), w.buffer(), scale.buffer(), shift.buffer(),
                                           residual.buffer(), y.buffer(), gc, true, true);
          }
        },
        [&] { expect_close(y, want, mag, "conv forward"); }, [&] { EXPECT_EQ(y.bits, y0.bits); });
  }
}

TEST_P(CpuBf16Conv, BackwardDataAndWeightMatchFloat64OrDecline) {
  backend::Backend& b = cpu_backend::instance();
  const ConvCase cc(param_geometry(GetParam()));
  const ConvGeometry& g = cc.g;
  Bf16Array x(cc.xs, 31), w(cc.ws, 32, -0.3, 0.3), dy(cc.ys, 33);
  std::vector<double> dx(cc.xs, 0.0), dx_mag(cc.xs, 0.0), dw(cc.ws, 0.0), dw_mag(cc.ws, 0.0);
  std::vector<double> db(size_t(g.out_channels), 0.0), db_mag(size_t(g.out_channels), 0.0);
  each_term(g, [&](int64_t n, int64_t o, int64_t oy, int64_t ox, int64_t ci, int64_t cw, int64_t ky, int64_t kx,
                   int64_t iy, int64_t ix) {
    const double d = dy.value[cc.yi(n, o, oy, ox)];
    const double tx = d * w.value[cc.wi(o, cw, ky, kx)], tw = d * x.value[cc.xi(n, ci, iy, ix)];
    dx[cc.xi(n, ci, iy, ix)] += tx, dx_mag[cc.xi(n, ci, iy, ix)] += std::fabs(tx);
    dw[cc.wi(o, cw, ky, kx)] += tw, dw_mag[cc.wi(o, cw, ky, kx)] += std::fabs(tw);
  });
  for (size_t i = 0; i < cc.ys; ++i) {
    const size_t o = size_t(int64_t(i) / (g.out[0] * g.out[1]) % g.out_channels);
    db[o] += dy.value[i], db_mag[o] += std::fabs(dy.value[i]);
  }
  const Bf16Array dx0(cc.xs, 34), dw0(cc.ws, 35), db0(size_t(g.out_channels), 36);
  Bf16Array got_dx = dx0, got_dw = dw0, got_db = db0;
  run_both_ways(
      "conv_backward_data",
      [&] {
        got_dx = dx0;
        return b.conv_backward_data(0, DType::bf16, dy.buffer(), w.buffer(), got_dx.buffer(), g);
      },
      [&] { expect_close(got_dx, dx, dx_mag, "dx"); }, [&] { EXPECT_EQ(got_dx.bits, dx0.bits); });
  for (bool with_bias : {true, false}) {
    run_both_ways(
        with_bias ? "conv_backward_weight (+bias)" : "conv_backward_weight",
        [&] {
          got_dw = dw0, got_db = db0;
          return b.conv_backward_weight(0, DType::bf16, x.buffer(), dy.buffer(), got_dw.buffer(),
                                        with_bias ? got_db.buffer() : Buffer{}, g);
        },
        [&] {
          expect_close(got_dw, dw, dw_mag, "dw");
          if (with_bias) expect_close(got_db, db, db_mag, "dbias");
          else EXPECT_EQ(got_db.bits, db0.bits);
        },
        [&] {
          EXPECT_EQ(got_dw.bits, dw0.bits);
          EXPECT_EQ(got_db.bits, db0.bits);
        });
  }
  // conv_backward_weight_float32: the same gradients in Float32 arrays, never rounded to bf16: within
  // Float32 accumulation alone (sample chunks summed in Float32 where the pool splits the batch).
  auto expect_float_close = [](const std::vector<float>& got, const std::vector<double>& want,
                               const std::vector<double>& magnitude, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * magnitude[i] + 1e-30) << what << " element " << i;
  };
  const std::vector<float> fdw0(cc.ws, 7.f), fdb0(size_t(g.out_channels), 7.f);
  std::vector<float> fdw = fdw0, fdb = fdb0;
  for (bool with_bias : {true, false}) {
    run_both_ways(
        with_bias ? "conv_backward_weight_float32 (+bias)" : "conv_backward_weight_float32",
        [&] {
          fdw = fdw0, fdb = fdb0;
          return b.conv_backward_weight_float32(0, DType::bf16, x.buffer(), dy.buffer(), Buffer{fdw.data(), 0},
                                                with_bias ? Buffer{fdb.data(), 0} : Buffer{}, g);
        },
        [&] {
          expect_float_close(fdw, dw, dw_mag, "dw (Float32)");
          if (with_bias) expect_float_close(fdb, db, db_mag, "dbias (Float32)");
          else EXPECT_EQ(fdb, fdb0);
        },
        [&] {
          EXPECT_EQ(fdw, fdw0);
          EXPECT_EQ(fdb, fdb0);
        });
  }
  EXPECT_FALSE(b.conv_backward_weight_float32(0, DType::f32, x.buffer(), dy.buffer(), Buffer{fdw.data(), 0}, Buffer{}, g))
      << "Float32 operands have conv_backward_weight";
}

std::string conv_case_name(const ::testing::TestParamInfo<int>& i) {
  static const char* const names[] = {"Dense3x3", "Grouped3x3Stride2", "FewChannels", "OneImageSplitByChannels",
                                      "FourImagesSplitBySamples"};
  return names[i.param];
}
INSTANTIATE_TEST_SUITE_P(Cpu, CpuBf16Conv, ::testing::Values(0, 1, 2, 3, 4), conv_case_name);

TEST(CpuBf16, SupportAnswerFollowsTheActiveIsaLevel) {
  // Made once per ISA level and dtype, picked by the active level: at each level force_isa allows,
  // the answer is the rule applied to the units at that level, the same on every call.
  IsaGuard guard;
  backend::Backend& b = cpu_backend::instance();
  for (int level = 0; level <= int(cpu_backend::detected_isa()); ++level) {
    cpu_backend::force_isa(Isa(level));
    const cpu_backend::LowPrecisionUnits u = cpu_backend::low_precision_units();
    const std::string found = cpu_backend::low_precision_units_text(u);
    SCOPED_TRACE(std::string(cpu_backend::isa_name(cpu_backend::active_isa())) + ", units: " + found);
    const backend::LowPrecisionSupport bf16 = b.low_precision_support(0, DType::bf16);
    const bool units = u.avx512_bf16 || u.amx_bf16;
    EXPECT_EQ(bf16.units, units && FLUX_TEST_HAVE_ONEDNN);
    EXPECT_NE(bf16.detail.find(found), std::string::npos) << bf16.detail;
    if (!units) {
      EXPECT_NE(bf16.detail.find("this CPU has no bf16 units"), std::string::npos) << bf16.detail;
    }
    if (level < int(Isa::avx512)) {
      EXPECT_FALSE(bf16.units);
    }
    const backend::LowPrecisionSupport f16 = b.low_precision_support(0, DType::f16);
    EXPECT_FALSE(f16.units);
    EXPECT_NE(f16.detail.find("no f16 compute kernels on the CPU"), std::string::npos) << f16.detail;
    EXPECT_NE(f16.detail.find(found), std::string::npos) << f16.detail;
    for (int again = 0; again < 3; ++again) {
      const backend::LowPrecisionSupport s = b.low_precision_support(0, DType::bf16);
      EXPECT_EQ(s.units, bf16.units);
      EXPECT_EQ(s.detail, bf16.detail);
    }
  }
  const backend::LowPrecisionSupport f32 = b.low_precision_support(0, DType::f32);
  EXPECT_FALSE(f32.units);
  EXPECT_EQ(f32.detail, "Float32 is not a low-precision dtype");
}

TEST(CpuBf16, KernelsOnlyRunWithUnitsOrTheTestBypass) {
  // The gate itself: without units (and without the bypass) every bf16 kernel declines before
  // oneDNN is asked; f16 has no CPU kernel at all.
  Bf16Bypass scope(false);
  EXPECT_EQ(cpu_backend::bf16_kernels_enabled(), cpu_has_bf16_units());
  const backend::LowPrecisionSupport f16 = cpu_backend::instance().low_precision_support(0, DType::f16);
  EXPECT_FALSE(f16.units);
  backend::Backend& b = cpu_backend::instance();
  const ConvGeometry g = geometry(4, 4, 1, 1, 4);
  std::vector<uint16_t> x(2 * 4 * 16, 0x3f80), w(4 * 4 * 9, 0x3f80), y(2 * 4 * 16, 0);
  EXPECT_FALSE(b.conv_forward(0, DType::f16, {x.data(), 0}, {w.data(), 0}, {}, {y.data(), 0}, g));
  EXPECT_FALSE(b.conv_backward_data(0, DType::f16, {y.data(), 0}, {w.data(), 0}, {x.data(), 0}, g));
}

}  // namespace
