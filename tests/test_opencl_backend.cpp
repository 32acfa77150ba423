// The OpenCL backend's primitives on every OpenCL device, checked against the CPU backend (a float64
// reference for floating-point results; bit-exact for integers, casts, copies and comparisons).
// Buffers carry byte offsets, sizes are odd, and empty inputs are exercised. The OpenCLEnv tests run
// only in the environments tests/opencl.cmake sets up (two PoCL devices, hidden devices, preference).
#include <cmath>
#include <cstdlib>
#include <random>

#include "src/internal.hpp"
#include "test_devices.hpp"

using namespace flux;
using backend::Buffer;

namespace {

backend::Backend& ocl() { return detail::backend_for("OpenCL"); }
backend::Backend& cpu() { return detail::backend_for("CPU"); }

std::vector<int> opencl_indices() {
  std::vector<int> out;
  if (functional("OpenCL"))
    for (int i = 0; i < ocl().device_count(); ++i) out.push_back(i);
  return out;
}

const std::vector<DType> kArith = {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::boolean};
const std::vector<DType> kAll = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                 DType::i32, DType::i64, DType::u8,  DType::boolean};

// Host bytes of dtype t holding `v`.
std::vector<unsigned char> pack(DType t, const std::vector<double>& v) {
  std::vector<unsigned char> b(v.size() * dtype_size(t) + 1);
  for (size_t i = 0; i < v.size(); ++i) detail::store_from_double(b.data(), t, int64_t(i), v[i]);
  b.resize(v.size() * dtype_size(t));
  return b;
}
std::vector<double> unpack(DType t, const std::vector<unsigned char>& b) {
  std::vector<double> v(b.size() / dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = detail::load_as_double(b.data(), t, int64_t(i));
  return v;
}

// Random values suited to dtype t (small integers, positive where `positive`).
std::vector<double> random_values(DType t, size_t n, unsigned seed, bool positive = false) {
  std::mt19937 gen(seed);
  std::vector<double> v(n);
  for (double& x : v) {
    if (t == DType::boolean) x = double(gen() % 2);
    else if (t == DType::u8) x = double(gen() % 12 + (positive ? 1 : 0));
    else if (!is_floating(t)) x = double(int(gen() % 19) - (positive ? -1 : 9));
    else {
      x = std::uniform_real_distribution<double>(positive ? 0.1 : -3.0, 3.0)(gen);
      if (t != DType::f64) x = double(float(x));
    }
  }
  return v;
}

// A device buffer at a non-zero byte offset into a larger allocation.
struct DeviceArray {
  static constexpr size_t kPad = 40;
  int dev;
  size_t bytes;
  Buffer base;
  DeviceArray(int d, size_t n) : dev(d), bytes(n), base(ocl().allocate(d, n + kPad)) {}
  DeviceArray(int d, const std::vector<unsigned char>& data) : DeviceArray(d, data.size()) {
    if (!data.empty()) ocl().copy_from_host(dev, at(), data.data(), data.size());
  }
  ~DeviceArray() { ocl().deallocate(dev, base, bytes + kPad); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  Buffer at() const { return {base.handle, base.offset + kPad}; }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> out(bytes);
    if (bytes) ocl().copy_to_host(dev, out.data(), at(), bytes);
    return out;
  }
};
Buffer host(std::vector<unsigned char>& v) { return {v.data(), 0}; }

// Reference dtype: float32 work is checked against float64 on the CPU.
DType reference_type(DType t) { return t == DType::f32 ? DType::f64 : t; }

void expect_close(DType t, const std::vector<double>& got, const std::vector<double>& want, const std::string& what,
                  double tol32 = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double tol = t == DType::f32 ? tol32 : t == DType::f64 ? 1e-12 : 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i;
      continue;
    }
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
      continue;
    }
    double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    EXPECT_LE(err, tol) << what << " at " << i << ": got " << got[i] << ", want " << want[i];
    if (err > tol) return;  // one failure per case is enough
  }
}

class OpenCLBackend : public ::testing::TestWithParam<int> {
 protected:
  int d() const { return GetParam(); }
};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OpenCLBackend);

std::string name(const ::testing::TestParamInfo<int>& i) { return "OpenCL_" + std::to_string(i.param); }

// ---------------- memory and copies ----------------

TEST_P(OpenCLBackend, HostDeviceRoundTripAtOffsets) {
  for (size_t n : {size_t(1), size_t(3), size_t(1000), size_t(65537)}) {
    std::vector<unsigned char> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>(i * 7 + 1);
    DeviceArray a(d(), data);
    EXPECT_EQ(a.read(), data) << n;
    DeviceArray b(d(), n);
    ocl().copy(d(), b.at(), a.at(), n);
    EXPECT_EQ(b.read(), data) << n;
  }
}

TEST_P(OpenCLBackend, OverlappingCopyWithinOneBufferActsAsMemmove) {
  std::vector<unsigned char> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i);
  DeviceArray a(d(), data);
  Buffer src = a.at(), dst = a.at();
  dst.offset += 10;
  ocl().copy(d(), dst, src, 50);
  std::vector<unsigned char> want = data;
  std::memmove(want.data() + 10, data.data(), 50);
  EXPECT_EQ(a.read(), want);
}

TEST_P(OpenCLBackend, CopyPeerBetweenDevices) {
  int n = ocl().device_count();
  int other = (d() + 1) % n;  // the same device when there is only one
  std::vector<unsigned char> data = pack(DType::f32, random_values(DType::f32, 333, 5));
  DeviceArray a(d(), data);
  std::vector<unsigned char> back(data.size());
  {
    DeviceArray b(other, data.size());
    bool done = ocl().copy_peer(other, b.at(), d(), a.at(), data.size());
    ASSERT_TRUE(done);  // one platform: one context
    ocl().copy_to_host(other, back.data(), b.at(), back.size());
  }
  EXPECT_EQ(back, data);
}

TEST_P(OpenCLBackend, PoolReusesBuffersAndReportsMemory) {
  ocl().synchronize(d());
  ocl().release_cache(d());
  backend::MemoryInfo before = ocl().memory(d());
  EXPECT_GT(before.total, 0u);
  Buffer a = ocl().allocate(d(), 1 << 20);
  backend::MemoryInfo during = ocl().memory(d());
  EXPECT_GE(during.used, before.used + (1 << 20));
  EXPECT_GE(during.reserved, during.used);
  EXPECT_LE(during.free + during.reserved, during.total);
  void* handle = a.handle;
  ocl().deallocate(d(), a, 1 << 20);
  EXPECT_EQ(ocl().memory(d()).used, before.used);
  EXPECT_GE(ocl().memory(d()).reserved, before.reserved + (1 << 20));
  Buffer b = ocl().allocate(d(), (1 << 20) - 100);  // the same size class
  EXPECT_EQ(b.handle, handle);
  ocl().deallocate(d(), b, (1 << 20) - 100);
  ocl().release_cache(d());
  EXPECT_EQ(ocl().memory(d()).reserved, ocl().memory(d()).used);
  Buffer empty = ocl().allocate(d(), 0);
  EXPECT_EQ(empty.handle, nullptr);
  ocl().deallocate(d(), empty, 0);
}

TEST_P(OpenCLBackend, DeviceFacts) {
  EXPECT_STREQ(ocl().name(), "OpenCL");
  EXPECT_FALSE(ocl().device_name(d()).empty());
  EXPECT_NE(ocl().version_info().find("CLBlast"), std::string::npos);
  EXPECT_THROW(ocl().device_name(ocl().device_count()), Error);
}

// ---------------- fill, cast, strided copy ----------------

TEST_P(OpenCLBackend, FillEveryDtype) {
  for (DType t : kAll)
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(257), int64_t(10000)})
      for (double v : {0.0, 1.0, -2.5, 3.0}) {
        if ((t == DType::u8) && v < 0) continue;
        std::vector<unsigned char> want(size_t(n) * dtype_size(t));
        if (n) cpu().fill(0, t, host(want), n, v);
        DeviceArray a(d(), want.size());
        ocl().fill(d(), t, a.at(), n, v);
        EXPECT_EQ(a.read(), want) << dtype_name(t) << " n=" << n << " v=" << v;
      }
}

TEST_P(OpenCLBackend, CastEveryPair) {
  std::vector<double> signed_values = {-2.75, -1, 0, 0.5, 1, 3, 100.25, 7, 65504, 1e-3, -0.0, 2};
  std::vector<double> unsigned_values = {2.75, 1, 0, 0.5, 1, 3, 100.25, 7, 200, 1e-3, 0, 2};
  for (DType from : kAll)
    for (DType to : kAll) {
      bool unsigned_target = to == DType::u8 || from == DType::u8 || from == DType::boolean;
      std::vector<double> v = unsigned_target ? unsigned_values : signed_values;
      if (to == DType::f16 || from == DType::f16)
        for (double& x : v) x = std::min(x, 60000.0);
      std::vector<unsigned char> src = pack(from, v);
      std::vector<unsigned char> want(v.size() * dtype_size(to));
      cpu().cast(0, from, host(src), to, host(want), int64_t(v.size()));
      DeviceArray a(d(), src), b(d(), want.size());
      ocl().cast(d(), from, a.at(), to, b.at(), int64_t(v.size()));
      EXPECT_EQ(unpack(to, b.read()), unpack(to, want)) << dtype_name(from) << " -> " << dtype_name(to);
    }
}

TEST_P(OpenCLBackend, HalfConversionsRoundToNearestEven) {
  std::vector<double> v;
  std::mt19937 gen(3);
  for (int i = 0; i < 2000; ++i) v.push_back(std::ldexp(std::uniform_real_distribution<double>(-1, 1)(gen), int(gen() % 40) - 25));
  v.push_back(std::nan(""));
  v.push_back(INFINITY);
  v.push_back(1e6);  // overflows Float16
  for (DType half : {DType::f16, DType::bf16}) {
    std::vector<unsigned char> src = pack(DType::f32, v);
    std::vector<unsigned char> want(v.size() * 2);
    cpu().cast(0, DType::f32, host(src), half, host(want), int64_t(v.size()));
    DeviceArray a(d(), src), b(d(), want.size());
    ocl().cast(d(), DType::f32, a.at(), half, b.at(), int64_t(v.size()));
    std::vector<unsigned char> got = b.read();
    std::vector<double> g = unpack(half, got), w = unpack(half, want);
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(w[i])) EXPECT_TRUE(std::isnan(g[i]));
      else EXPECT_EQ(g[i], w[i]) << dtype_name(half) << " " << v[i];
    }
  }
}

TEST_P(OpenCLBackend, StridedCopyTransposeAndBroadcast) {
  for (DType t : kAll) {
    size_t es = dtype_size(t);
    // [3, 5, 7] -> permuted (2, 0, 1): dst shape [7, 3, 5]
    std::vector<double> v = random_values(t == DType::f16 || t == DType::bf16 ? DType::i32 : t, 105, 11);
    std::vector<unsigned char> src = pack(t, v);
    backend::StridedCopy p;
    p.ndim = 3;
    int64_t shape[3] = {7, 3, 5}, ss[3] = {1, 35, 7}, ds[3] = {15, 5, 1};
    for (int i = 0; i < 3; ++i) p.shape[i] = shape[i], p.src_stride[i] = ss[i], p.dst_stride[i] = ds[i];
    std::vector<unsigned char> want(105 * es);
    cpu().strided_copy(0, t, host(src), host(want), p);
    DeviceArray a(d(), src), b(d(), want.size());
    ocl().strided_copy(d(), t, a.at(), b.at(), p);
    EXPECT_EQ(b.read(), want) << dtype_name(t);
    // broadcast a [1, 5] row to [4, 1, 5] (stride 0) and a size-1 axis
    backend::StridedCopy q;
    q.ndim = 3;
    int64_t qs[3] = {4, 1, 5}, qss[3] = {0, 0, 1}, qds[3] = {5, 5, 1};
    for (int i = 0; i < 3; ++i) q.shape[i] = qs[i], q.src_stride[i] = qss[i], q.dst_stride[i] = qds[i];
    std::vector<unsigned char> want2(20 * es);
    cpu().strided_copy(0, t, host(src), host(want2), q);
    DeviceArray c(d(), want2.size());
    ocl().strided_copy(d(), t, a.at(), c.at(), q);
    EXPECT_EQ(c.read(), want2) << dtype_name(t);
  }
}

// ---------------- elementwise ----------------

TEST_P(OpenCLBackend, UnaryEveryOpAndDtype) {
  using backend::UnaryOp;
  for (int op = 0; op <= int(UnaryOp::step); ++op) {
    UnaryOp u = UnaryOp(op);
    bool needs_positive = u == UnaryOp::log || u == UnaryOp::sqrt || u == UnaryOp::log1p;
    for (DType t : kArith) {
      const int64_t n = 1001;
      std::vector<double> v = random_values(t, size_t(n), unsigned(op) + 1, needs_positive);
      if (t == DType::f32 || t == DType::f64) v[0] = 0;
      std::vector<unsigned char> src = pack(t, v);
      DeviceArray a(d(), src), b(d(), src.size());
      bool cpu_ok = true;
      DType rt = reference_type(t);
      std::vector<unsigned char> rsrc = pack(rt, v), want(rsrc.size());
      try {
        cpu().unary(0, u, rt, host(rsrc), host(want), n, 0.1);
      } catch (const Error&) {
        cpu_ok = false;
      }
      if (!cpu_ok) {
        EXPECT_THROW(ocl().unary(d(), u, t, a.at(), b.at(), n, 0.1), Error) << op << " " << dtype_name(t);
        continue;
      }
      ocl().unary(d(), u, t, a.at(), b.at(), n, 0.1);
      expect_close(t, unpack(t, b.read()), unpack(rt, want), "unary op " + std::to_string(op) + " " + dtype_name(t),
                   2e-6);
    }
  }
}

struct BroadcastCase {
  std::vector<int64_t> out, a, b;
};

backend::Broadcast plan_for(const BroadcastCase& c) {
  backend::Broadcast p;
  p.ndim = int(c.out.size());
  p.contiguous = c.a == c.out && c.b == c.out;
  const std::vector<int64_t>* ops[2] = {&c.a, &c.b};
  for (int i = 0; i < p.ndim; ++i) p.shape[i] = c.out[size_t(i)];
  for (int k = 0; k < 2; ++k) {
    const auto& s = *ops[k];
    int64_t stride = 1;
    for (int i = p.ndim - 1; i >= 0; --i) {
      int j = i - (p.ndim - int(s.size()));
      int64_t dim = j >= 0 ? s[size_t(j)] : 1;
      p.stride[k][i] = dim == 1 ? 0 : stride;
      stride *= dim;
    }
  }
  return p;
}
int64_t count(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

TEST_P(OpenCLBackend, BinaryEveryOpDtypeAndBroadcast) {
  using backend::BinaryOp;
  std::vector<BroadcastCase> cases = {
      {{1000}, {1000}, {1000}}, {{4, 3, 5}, {4, 1, 5}, {3, 1}}, {{7, 9}, {7, 9}, {}}, {{2, 0, 3}, {2, 0, 3}, {3}},
      {{3, 1, 2, 5}, {1}, {3, 1, 2, 5}}, {{6, 5}, {6, 1}, {1, 5}}};
  for (int op = 0; op <= int(BinaryOp::ge); ++op) {
    BinaryOp bo = BinaryOp(op);
    bool comparison = bo >= BinaryOp::eq;
    for (DType t : kArith) {
      for (const BroadcastCase& c : cases) {
        backend::Broadcast p = plan_for(c);
        int64_t n = count(c.out);
        std::vector<double> av = random_values(t, size_t(count(c.a)), unsigned(op * 7 + 1));
        std::vector<double> bv = random_values(t, size_t(count(c.b)), unsigned(op * 7 + 2),
                                               bo == BinaryOp::div || bo == BinaryOp::pow);
        if (bo == BinaryOp::div && t == DType::boolean)
          for (double& x : bv) x = 1;
        if (bo == BinaryOp::pow && !is_floating(t))
          for (double& x : bv) x = std::fmod(x, 4.0);
        if (bo == BinaryOp::pow && is_floating(t))
          for (double& x : av) x = std::abs(x);
        // Comparisons and integer work are exact in the dtype itself; float arithmetic against float64.
        DType rt = comparison ? t : reference_type(t);
        std::vector<unsigned char> ra = pack(rt, av), rb = pack(rt, bv);
        DType out_t = comparison ? DType::boolean : t, rout_t = comparison ? DType::boolean : rt;
        std::vector<unsigned char> want(size_t(n) * dtype_size(rout_t));
        cpu().binary(0, bo, rt, host(ra), host(rb), host(want), p);
        DeviceArray a(d(), pack(t, av)), b(d(), pack(t, bv)), o(d(), size_t(n) * dtype_size(out_t));
        ocl().binary(d(), bo, t, a.at(), b.at(), o.at(), p);
        expect_close(comparison ? DType::boolean : t, unpack(out_t, o.read()), unpack(rout_t, want),
                     "binary op " + std::to_string(op) + " " + dtype_name(t) + " n=" + std::to_string(n), 2e-6);
      }
    }
  }
}

TEST_P(OpenCLBackend, IntegerDivisionByZeroDoesNotCrash) {
  std::vector<unsigned char> a = pack(DType::i32, {7, -7, 5}), b = pack(DType::i32, {0, 0, -1});
  DeviceArray x(d(), a), y(d(), b), z(d(), a.size());
  backend::Broadcast p = plan_for({{3}, {3}, {3}});
  ocl().binary(d(), backend::BinaryOp::div, DType::i32, x.at(), y.at(), z.at(), p);
  EXPECT_EQ(unpack(DType::i32, z.read()), (std::vector<double>{0, 0, -5}));
}

TEST_P(OpenCLBackend, WhereWithBroadcast) {
  for (DType t : kArith) {
    // cond [4, 1], a [4, 6], b [6] -> out [4, 6]
    backend::Broadcast p;
    p.ndim = 2;
    p.shape[0] = 4, p.shape[1] = 6;
    p.stride[0][0] = 1, p.stride[0][1] = 0;
    p.stride[1][0] = 6, p.stride[1][1] = 1;
    p.stride[2][0] = 0, p.stride[2][1] = 1;
    std::vector<unsigned char> c = pack(DType::boolean, {1, 0, 0, 1});
    std::vector<unsigned char> a = pack(t, random_values(t, 24, 1)), b = pack(t, random_values(t, 6, 2));
    std::vector<unsigned char> want(24 * dtype_size(t));
    cpu().where(0, t, host(c), host(a), host(b), host(want), p);
    DeviceArray dc(d(), c), da(d(), a), db(d(), b), out(d(), want.size());
    ocl().where(d(), t, dc.at(), da.at(), db.at(), out.at(), p);
    EXPECT_EQ(out.read(), want) << dtype_name(t);
  }
}

// ---------------- reductions, softmax ----------------

TEST_P(OpenCLBackend, ReduceEveryOpDtypeAndShape) {
  using backend::ReduceOp;
  struct Case { int64_t outer, len, inner; };
  std::vector<Case> cases = {{1, 1, 1}, {3, 7, 5}, {2, 1000, 1}, {1, 4097, 1}, {2, 100003, 1}, {5, 600, 1}, {4, 3, 1}, {1, 0, 3}, {0, 5, 2}};
  for (int op = 0; op <= int(ReduceOp::argmin); ++op) {
    ReduceOp r = ReduceOp(op);
    bool arg = r == ReduceOp::argmax || r == ReduceOp::argmin;
    for (DType t : kArith) {
      for (const Case& c : cases) {
        if (c.len == 0 && r != ReduceOp::sum) {
          DeviceArray a(d(), 8), o(d(), 8);
          EXPECT_THROW(ocl().reduce(d(), r, t, a.at(), o.at(), c.outer, c.len, c.inner), Error);
          continue;
        }
        int64_t n = c.outer * c.len * c.inner, m = c.outer * c.inner;
        std::vector<double> v = random_values(t, size_t(n), unsigned(op * 13 + 3));
        if (r == ReduceOp::sum && t == DType::u8)
          for (double& x : v) x = std::fmod(x, 2);  // keep sums in range of the dtype
        DType rt = arg ? t : reference_type(t);
        DType out_t = arg ? DType::i64 : t, rout_t = arg ? DType::i64 : rt;
        if (r == ReduceOp::sum && (t == DType::u8 || t == DType::boolean) && c.len > 200) continue;  // would wrap
        std::vector<unsigned char> rs = pack(rt, v), want(size_t(m) * dtype_size(rout_t));
        if (m) cpu().reduce(0, r, rt, host(rs), host(want), c.outer, c.len, c.inner);
        DeviceArray a(d(), pack(t, v)), o(d(), size_t(m) * dtype_size(out_t));
        ocl().reduce(d(), r, t, a.at(), o.at(), c.outer, c.len, c.inner);
        expect_close(arg ? DType::i64 : t, unpack(out_t, o.read()), unpack(rout_t, want),
                     "reduce op " + std::to_string(op) + " " + dtype_name(t) + " [" + std::to_string(c.outer) + ", " +
                         std::to_string(c.len) + ", " + std::to_string(c.inner) + "]");
      }
    }
  }
}

TEST_P(OpenCLBackend, MaxPropagatesNaN) {
  std::vector<double> v(1000, 1.0);
  v[500] = std::nan("");
  DeviceArray a(d(), pack(DType::f32, v)), o(d(), 4);
  ocl().reduce(d(), backend::ReduceOp::max, DType::f32, a.at(), o.at(), 1, 1000, 1);
  EXPECT_TRUE(std::isnan(unpack(DType::f32, o.read())[0]));
}

TEST_P(OpenCLBackend, SoftmaxAndLogSoftmax) {
  struct Case { int64_t outer, len, inner; };
  for (DType t : {DType::f32, DType::f64})
    for (Case c : {Case{2, 10, 3}, Case{5, 600, 1}, Case{1, 1, 1}, Case{3, 4, 1}})
      for (bool log : {false, true}) {
        int64_t n = c.outer * c.len * c.inner;
        std::vector<double> v = random_values(t, size_t(n), 9);
        for (double& x : v) x *= 10;
        if (t == DType::f32) for (double& x : v) x = double(float(x));
        std::vector<unsigned char> rs = pack(DType::f64, v), want(rs.size());
        cpu().softmax(0, DType::f64, host(rs), host(want), c.outer, c.len, c.inner, log);
        DeviceArray a(d(), pack(t, v)), o(d(), size_t(n) * dtype_size(t));
        ocl().softmax(d(), t, a.at(), o.at(), c.outer, c.len, c.inner, log);
        expect_close(t, unpack(t, o.read()), unpack(DType::f64, want), std::string(log ? "log" : "") + "softmax", 1e-5);
      }
  DeviceArray a(d(), 8), o(d(), 8);
  EXPECT_THROW(ocl().softmax(d(), DType::i32, a.at(), o.at(), 1, 2, 1, false), Error);
}

// ---------------- matmul ----------------

TEST_P(OpenCLBackend, MatmulTransposesBatchesAndOffsets) {
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    for (int trans = 0; trans < 4; ++trans) {
      for (int64_t batch : {int64_t(1), int64_t(3)}) {
        backend::Gemm g;
        g.batch = batch, g.m = 7, g.n = 5, g.k = 9;
        g.trans_a = trans & 1, g.trans_b = trans & 2;
        g.stride_a = g.m * g.k, g.stride_b = batch > 1 && trans == 3 ? 0 : g.k * g.n, g.stride_c = g.m * g.n;
        g.alpha = is_floating(t) ? 1.5 : 2.0;
        g.beta = trans == 2 ? 1.0 : 0.0;
        std::vector<double> av = random_values(t, size_t(batch * g.m * g.k), 1);
        std::vector<double> bv = random_values(t, size_t(batch * g.k * g.n), 2);
        std::vector<double> cv = random_values(t, size_t(batch * g.m * g.n), 3);
        DType rt = reference_type(t);
        std::vector<unsigned char> ra = pack(rt, av), rb = pack(rt, bv), want = pack(rt, cv);
        cpu().matmul(0, rt, host(ra), host(rb), host(want), g);
        DeviceArray a(d(), pack(t, av)), b(d(), pack(t, bv)), c(d(), pack(t, cv));
        ocl().matmul(d(), t, a.at(), b.at(), c.at(), g);
        expect_close(t, unpack(t, c.read()), unpack(rt, want),
                     std::string("matmul ") + dtype_name(t) + " trans=" + std::to_string(trans) +
                         " batch=" + std::to_string(batch));
      }
    }
  }
}

TEST_P(OpenCLBackend, MatmulLargerAndEmptyInner) {
  backend::Gemm g;
  g.m = 130, g.n = 67, g.k = 200;
  std::vector<double> av = random_values(DType::f32, size_t(g.m * g.k), 4), bv = random_values(DType::f32, size_t(g.k * g.n), 5);
  std::vector<unsigned char> ra = pack(DType::f64, av), rb = pack(DType::f64, bv), want(size_t(g.m * g.n) * 8);
  cpu().matmul(0, DType::f64, host(ra), host(rb), host(want), g);
  DeviceArray a(d(), pack(DType::f32, av)), b(d(), pack(DType::f32, bv)), c(d(), size_t(g.m * g.n) * 4);
  ocl().matmul(d(), DType::f32, a.at(), b.at(), c.at(), g);
  expect_close(DType::f32, unpack(DType::f32, c.read()), unpack(DType::f64, want), "matmul 130x200x67", 1e-4);
  backend::Gemm e;
  e.m = 3, e.n = 4, e.k = 0;
  DeviceArray z(d(), pack(DType::f32, std::vector<double>(12, 5.0)));
  ocl().matmul(d(), DType::f32, a.at(), b.at(), z.at(), e);
  EXPECT_EQ(unpack(DType::f32, z.read()), std::vector<double>(12, 0.0));
}

// ---------------- indexing, optimiser ----------------

TEST_P(OpenCLBackend, GatherAndScatterAddWithRepeatedIndices) {
  const int64_t outer = 3, len = 5, inner = 4;
  std::vector<double> idx = {4, 0, 4, 4, 2, 0, 1};  // repeats on purpose
  const int64_t nidx = int64_t(idx.size());
  std::vector<unsigned char> ib = pack(DType::i64, idx);
  for (DType t : kAll) {
    bool half = t == DType::f16 || t == DType::bf16;
    std::vector<double> v = random_values(half ? DType::i32 : t, size_t(outer * len * inner), 21);
    std::vector<unsigned char> src = pack(t, v), want(size_t(outer * nidx * inner) * dtype_size(t));
    cpu().gather(0, t, host(src), host(ib), host(want), outer, len, inner, nidx);
    DeviceArray a(d(), src), di(d(), ib), o(d(), want.size());
    ocl().gather(d(), t, a.at(), di.at(), o.at(), outer, len, inner, nidx);
    EXPECT_EQ(o.read(), want) << "gather " << dtype_name(t);
    if (half) continue;
    std::vector<double> g = random_values(t, size_t(outer * nidx * inner), 22), base = random_values(t, size_t(outer * len * inner), 23);
    if (t == DType::boolean || t == DType::u8) for (double& x : base) x = 0;
    if (t == DType::boolean) for (double& x : g) x = 0;
    std::vector<unsigned char> gs = pack(t, g), sum = pack(t, base);
    cpu().scatter_add(0, t, host(gs), host(ib), host(sum), outer, len, inner, nidx);
    DeviceArray dg(d(), gs), ds(d(), pack(t, base));
    ocl().scatter_add(d(), t, dg.at(), di.at(), ds.at(), outer, len, inner, nidx);
    expect_close(t, unpack(t, ds.read()), unpack(t, sum), std::string("scatter_add ") + dtype_name(t), 1e-6);
  }
}

TEST_P(OpenCLBackend, AdamStepMatchesCpu) {
  backend::AdamStep s{1e-3, 0.9, 0.999, 1e-8, 0.01, 1 - 0.9 * 0.9, 1 - 0.999 * 0.999};
  const int64_t n = 777;
  for (DType t : {DType::f32, DType::f64}) {
    std::vector<double> x = random_values(t, n, 1), g = random_values(t, n, 2), m = random_values(t, n, 3),
                        v = random_values(t, n, 4, true);
    std::vector<unsigned char> rx = pack(DType::f64, x), rg = pack(DType::f64, g), rm = pack(DType::f64, m),
                               rv = pack(DType::f64, v);
    cpu().adam_step(0, DType::f64, host(rx), host(rg), host(rm), host(rv), n, s);
    DeviceArray dx(d(), pack(t, x)), dg(d(), pack(t, g)), dm(d(), pack(t, m)), dv(d(), pack(t, v));
    ocl().adam_step(d(), t, dx.at(), dg.at(), dm.at(), dv.at(), n, s);
    expect_close(t, unpack(t, dx.read()), unpack(DType::f64, rx), "adam x", 1e-6);
    expect_close(t, unpack(t, dm.read()), unpack(DType::f64, rm), "adam m", 1e-6);
    expect_close(t, unpack(t, dv.read()), unpack(DType::f64, rv), "adam v", 1e-6);
  }
}

// ---------------- through the public API ----------------

TEST_P(OpenCLBackend, EmptyTensorsAndViewsThroughOps) {
  Device dev("OpenCL", d());
  Tensor e = zeros({0, 3}, DType::f32, dev);
  EXPECT_EQ((e + 1.0f).shape(), Shape({0, 3}));
  EXPECT_EQ(sum(e).item<float>(), 0.0f);
  EXPECT_EQ(matmul(zeros({2, 0}, DType::f32, dev), zeros({0, 3}, DType::f32, dev)).to_vector<float>(),
            std::vector<float>(6, 0.0f));
  Tensor x = to(Tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, Shape{3, 2}), dev);
  Tensor row = x[1];  // a view at a byte offset
  EXPECT_EQ((row * 2.0f).to_vector<float>(), (std::vector<float>{6, 8}));
  EXPECT_EQ(to(row, Device()).to_vector<float>(), (std::vector<float>{3, 4}));
}

INSTANTIATE_TEST_SUITE_P(Devices, OpenCLBackend, ::testing::ValuesIn(opencl_indices()), name);

// ---------------- environments set up by tests/opencl.cmake ----------------

bool in_env(const char* which) {
  const char* e = std::getenv("FLUX_OPENCL_TEST_ENV");
  return e && std::string(e) == which;
}

TEST(OpenCLEnv, TwoPoclDevicesMoveTensors) {
  if (!in_env("two_devices")) GTEST_SKIP() << "runs under POCL_DEVICES=\"pthread pthread\" (ctest opencl_two_devices)";
  ASSERT_TRUE(functional("OpenCL"));
  ASSERT_EQ(ocl().device_count(), 2);
  Device d0 = get_device("OpenCL", 0), d1 = get_device("OpenCL", 1);
  EXPECT_EQ(to_string(d1), "OpenCL:1");
  EXPECT_THROW(get_device("OpenCL", 2), Error);
  Tensor x = Tensor(std::vector<float>{1, 2, 3, 4, 5}, Shape{5});
  Tensor a = to(x, d0);
  Tensor b = to(a * 2.0f, d1);
  EXPECT_EQ(b.device(), d1);
  Tensor c = to(b + 1.0f, Device());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{3, 5, 7, 9, 11}));
  // ops across the two devices are refused
  EXPECT_THROW(a + b, Error);
}

TEST(OpenCLEnv, SelectDevicesByIndex) {
  // FLUX_OPENCL_DEVICES picks and orders devices like CUDA_VISIBLE_DEVICES.
  if (in_env("select_one")) {
    ASSERT_TRUE(functional("OpenCL"));
    EXPECT_EQ(ocl().device_count(), 1);
    EXPECT_THROW(get_device("OpenCL", 1), Error);
  } else if (in_env("select_none")) {
    EXPECT_TRUE(loaded("OpenCL"));
    EXPECT_FALSE(functional("OpenCL"));
    EXPECT_NE(ocl().not_functional_reason().find("selects none"), std::string::npos) << ocl().not_functional_reason();
  } else {
    GTEST_SKIP() << "runs under FLUX_OPENCL_DEVICES=1 / =7 (ctest opencl.select_*)";
  }
}

TEST(OpenCLEnv, HiddenDevicesFallBackToCpu) {
  if (!in_env("hidden")) GTEST_SKIP() << "runs under FLUX_OPENCL_DEVICES=-1 (ctest opencl_hidden)";
  EXPECT_TRUE(loaded("OpenCL"));
  EXPECT_FALSE(functional("OpenCL"));
  EXPECT_NE(ocl().not_functional_reason().find("FLUX_OPENCL_DEVICES"), std::string::npos);
  EXPECT_TRUE(get_device().is_cpu());
  try {
    get_device("OpenCL", 0);
    ADD_FAILURE() << "get_device(\"OpenCL\", 0) should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not functional"), std::string::npos) << e.what();
  }
}

TEST(OpenCLEnv, FirstCompileSaysSoOnce) {
  // ctest opencl.first_compile_note: first with an empty POCL_CACHE_DIR (one info line, however many
  // programs are built), then again on the cache that run filled (no line).
  const bool cold = in_env("cold_cache");
  if (!cold && !in_env("warm_cache")) GTEST_SKIP() << "runs with an empty, then a filled POCL_CACHE_DIR (ctest opencl.first_compile_note)";
  ASSERT_TRUE(functional("OpenCL"));
  Device d = get_device("OpenCL", 0);
  ::testing::internal::CaptureStderr();
  Tensor a = to(Tensor({1, 2, 3}), d);
  std::vector<float> sum = (a + a).to_vector<float>();  // the binary program
  std::vector<float> e = exp(a).to_vector<float>();     // another program: no second line
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sum, (std::vector<float>{2, 4, 6}));
  EXPECT_NEAR(e[2], std::exp(3.0f), 1e-4);
  const std::string line = "is empty, so this first run compiles flux's and CLBlast's kernels (about 11 s, once)";
  size_t n = 0;
  for (size_t p = err.find(line); p != std::string::npos; p = err.find(line, p + 1)) ++n;
  EXPECT_EQ(n, cold ? 1u : 0u) << err;
  if (cold) {
    EXPECT_NE(err.find("[ Info: OpenCL on PoCL ("), std::string::npos) << err;
  } else {
    EXPECT_EQ(err.find("[ Info: OpenCL"), std::string::npos) << err;
  }
}

TEST(OpenCLEnv, PreferenceSelectsOpenCL) {
  if (!in_env("preferred")) GTEST_SKIP() << "runs with a LocalPreferences.toml naming OpenCL (ctest opencl_preferred)";
  EXPECT_EQ(GPU_BACKEND(), "OpenCL");
  Device d = get_device();
  EXPECT_EQ(to_string(d), "OpenCL:0");
  Tensor y = to(Tensor({1, 2, 3}), d) * 3.0f;
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{3, 6, 9}));
}

}  // namespace
