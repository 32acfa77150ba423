// Op values on every device against a float64 host reference computed here.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using flux::testing::max_rel_error;

namespace {

// ---- a tiny float64 host reference ----
struct Host {
  std::vector<int64_t> shape;
  std::vector<double> v;
  int64_t numel() const { return int64_t(v.size()); }
};

Host random_host(std::vector<int64_t> shape, double lo, double hi, uint64_t s) {
  std::mt19937_64 gen(s);
  std::uniform_real_distribution<double> dist(lo, hi);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Host h{shape, std::vector<double>(static_cast<size_t>(n))};
  for (double& x : h.v) x = dist(gen);
  return h;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = int(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    out[i] = std::max(da, db);
  }
  return out;
}

// Element of `h` at multi-index `idx` of the broadcast shape `out`.
double at_broadcast(const Host& h, const std::vector<int64_t>& idx) {
  size_t off = idx.size() - h.shape.size();
  int64_t flat = 0;
  auto st = strides_of(h.shape);
  for (size_t i = 0; i < h.shape.size(); ++i) flat += (h.shape[i] == 1 ? 0 : idx[i + off]) * st[i];
  return h.v[flat];
}

std::vector<int64_t> unravel(int64_t k, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    idx[i] = k % shape[i];
    k /= shape[i];
  }
  return idx;
}

Host host_binary(const Host& a, const Host& b, const std::function<double(double, double)>& f) {
  Host out{broadcast_shape(a.shape, b.shape), {}};
  int64_t n = 1;
  for (int64_t d : out.shape) n *= d;
  for (int64_t k = 0; k < n; ++k) {
    auto idx = unravel(k, out.shape);
    out.v.push_back(f(at_broadcast(a, idx), at_broadcast(b, idx)));
  }
  return out;
}

Tensor on(const Host& h, Device d, DType t = DType::f32) { return to(Tensor(h.v, Shape(h.shape)).cast(t), d); }

// Reduces axis `axis` of h with f over the values of one fibre.
Host host_reduce(const Host& h, int axis, const std::function<double(const std::vector<double>&)>& f, bool keep) {
  int64_t outer = 1, len = h.shape[axis], inner = 1;
  for (int i = 0; i < axis; ++i) outer *= h.shape[i];
  for (size_t i = axis + 1; i < h.shape.size(); ++i) inner *= h.shape[i];
  Host out;
  for (size_t i = 0; i < h.shape.size(); ++i)
    if (int(i) != axis) out.shape.push_back(h.shape[i]);
    else if (keep) out.shape.push_back(1);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      std::vector<double> fibre;
      for (int64_t l = 0; l < len; ++l) fibre.push_back(h.v[(o * len + l) * inner + in]);
      out.v.push_back(f(fibre));
    }
  return out;
}

double vsum(const std::vector<double>& f) { return std::accumulate(f.begin(), f.end(), 0.0); }
double vmax(const std::vector<double>& f) { return *std::max_element(f.begin(), f.end()); }
double vmin(const std::vector<double>& f) { return *std::min_element(f.begin(), f.end()); }

class Ops : public ::testing::TestWithParam<Device> {};

}  // namespace

TEST_P(Ops, BinaryWithBroadcastingMatchesHost) {
  Device d = GetParam();
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> op;
    std::function<double(double, double)> ref;
    bool positive_b;
  };
  std::vector<Case> cases = {
      {"add", [](auto& a, auto& b) { return a + b; }, [](double a, double b) { return a + b; }, false},
      {"sub", [](auto& a, auto& b) { return a - b; }, [](double a, double b) { return a - b; }, false},
      {"mul", [](auto& a, auto& b) { return a * b; }, [](double a, double b) { return a * b; }, false},
      {"div", [](auto& a, auto& b) { return a / b; }, [](double a, double b) { return a / b; }, true},
      {"pow", [](auto& a, auto& b) { return pow(b, a); }, [](double a, double b) { return std::pow(b, a); }, true},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); }, false},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); }, false},
  };
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{5}, {}}, {{}, {2, 2}}, {{300, 257}, {257}}};
  for (const Case& c : cases)
    for (auto& [sa, sb] : shapes) {
      SCOPED_TRACE(std::string(c.name) + " " + to_string(Shape(sa)) + " " + to_string(Shape(sb)));
      Host a = random_host(sa, -2, 2, 1), b = random_host(sb, c.positive_b ? 0.5 : -2, 2, 2);
      Tensor r = c.op(on(a, d), on(b, d));
      Host want = host_binary(a, b, c.ref);
      EXPECT_EQ(r.shape(), Shape(want.shape));
      EXPECT_EQ(r.device(), d);
      EXPECT_EQ(r.dtype(), DType::f32);
      EXPECT_LE(max_rel_error(r, want.v), 1e-4);
    }
}

TEST_P(Ops, ScalarOperandsAndPromotion) {
  Device d = GetParam();
  Tensor x = to(Tensor({1, 2, 4}), d);
  EXPECT_EQ((x + 1.0).to_vector<float>(), (std::vector<float>{2, 3, 5}));
  EXPECT_EQ((1.0 - x).to_vector<float>(), (std::vector<float>{0, -1, -3}));
  EXPECT_EQ((x * 2.0).to_vector<float>(), (std::vector<float>{2, 4, 8}));
  EXPECT_EQ((8.0 / x).to_vector<float>(), (std::vector<float>{8, 4, 2}));
  EXPECT_EQ((x / 2.0).to_vector<float>(), (std::vector<float>{0.5, 1, 2}));
  EXPECT_EQ(pow(x, 2.0).to_vector<float>(), (std::vector<float>{1, 4, 16}));
  EXPECT_EQ(pow(x, 3.0).to_vector<float>(), (std::vector<float>{1, 8, 64}));
  // integer + float promotes to float; int + int stays int
  Tensor i = to(Tensor(std::vector<int64_t>{1, 2, 3}, Shape{3}), d);
  EXPECT_EQ((i + x).dtype(), DType::f32);
  EXPECT_EQ((i + i).dtype(), DType::i64);
  EXPECT_EQ((i + i).to_vector<int64_t>(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ((i * 0.5).dtype(), DType::f32);
  EXPECT_EQ((i * 0.5).to_vector<float>(), (std::vector<float>{0.5, 1, 1.5}));
  // `/` is true division, as Julia's: integers never truncate
  EXPECT_EQ((i / 4.0).dtype(), DType::f32);
  EXPECT_EQ((i / 4.0).to_vector<float>(), (std::vector<float>{0.25, 0.5, 0.75}));
  EXPECT_EQ((i / i).to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ((1.0 / (i - 1.0)).to_vector<float>(), (std::vector<float>{INFINITY, 1, 0.5}));
  EXPECT_EQ(pow(i, 2.0).dtype(), DType::i64);  // squaring stays integer
  EXPECT_EQ(pow(i, 0.5).dtype(), DType::f32);
  Tensor x64 = to(Tensor(std::vector<double>{1, 2}, Shape{2}), d);
  if (d.is_cpu()) { EXPECT_EQ((x64 + to(Tensor({1, 1}), d)).dtype(), DType::f64); }
  Tensor h = x.cast(DType::f16);
  EXPECT_EQ((h + h).dtype(), DType::f16);
  EXPECT_EQ((h + h).to_vector<float>(), (std::vector<float>{2, 4, 8}));
  EXPECT_EQ((h * x).dtype(), DType::f32);
}

TEST_P(Ops, ComparisonsAndWhere) {
  Device d = GetParam();
  Tensor a = to(Tensor({1, 2, 3, 4}), d), b = to(Tensor({4, 2, 1, 5}), d);
  EXPECT_EQ((a < b).dtype(), DType::boolean);
  EXPECT_EQ((a < b).to_vector<int>(), (std::vector<int>{1, 0, 0, 1}));
  EXPECT_EQ((a <= b).to_vector<int>(), (std::vector<int>{1, 1, 0, 1}));
  EXPECT_EQ((a > b).to_vector<int>(), (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ((a >= b).to_vector<int>(), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ((a == b).to_vector<int>(), (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ((a != b).to_vector<int>(), (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ((a > 2.0).to_vector<int>(), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ((a < 2.0).to_vector<int>(), (std::vector<int>{1, 0, 0, 0}));
  EXPECT_EQ(where(a > b, a, b).to_vector<float>(), (std::vector<float>{4, 2, 3, 5}));
  // broadcasting condition and values
  Tensor cond = to(Tensor({1, 0, 1}), d) > 0.5;
  Tensor m = where(cond, to(ones({2, 3}), d), to(Tensor::scalar(-1), d));
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{1, -1, 1, 1, -1, 1}));
}

TEST_P(Ops, UnaryMatchHost) {
  Device d = GetParam();
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
    double lo, hi;
  };
  std::vector<Case> cases = {
      {"neg", [](auto& x) { return -x; }, [](double x) { return -x; }, -3, 3},
      {"exp", [](auto& x) { return exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](auto& x) { return log(x); }, [](double x) { return std::log(x); }, 0.01, 5},
      {"sqrt", [](auto& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 5},
      {"abs", [](auto& x) { return abs(x); }, [](double x) { return std::abs(x); }, -3, 3},
      {"sign", [](auto& x) { return sign(x); }, [](double x) { return double((x > 0) - (x < 0)); }, -3, 3},
      {"square", [](auto& x) { return square(x); }, [](double x) { return x * x; }, -3, 3},
      {"sin", [](auto& x) { return sin(x); }, [](double x) { return std::sin(x); }, -3, 3},
      {"cos", [](auto& x) { return cos(x); }, [](double x) { return std::cos(x); }, -3, 3},
      {"log1p", [](auto& x) { return log1p(x); }, [](double x) { return std::log1p(x); }, -0.9, 3},
      {"tanh", [](auto& x) { return flux::tanh(x); }, [](double x) { return std::tanh(x); }, -4, 4},
      {"sigmoid", [](auto& x) { return sigmoid(x); }, sig, -30, 30},
      {"relu", [](auto& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, -3, 3},
      {"leakyrelu", [](auto& x) { return leakyrelu(x); }, [](double x) { return x > 0 ? x : 0.01 * x; }, -3, 3},
      {"leakyrelu_0.3", [](auto& x) { return leakyrelu(x, 0.3); }, [](double x) { return x > 0 ? x : 0.3 * x; }, -3, 3},
      {"elu", [](auto& x) { return elu(x); }, [](double x) { return x > 0 ? x : std::expm1(x); }, -3, 3},
      {"elu_2", [](auto& x) { return elu(x, 2.0); }, [](double x) { return x > 0 ? x : 2 * std::expm1(x); }, -3, 3},
      {"gelu",
       [](auto& x) { return gelu(x); },
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, -4, 4},
      {"softplus", [](auto& x) { return softplus(x); }, [](double x) { return std::log1p(std::exp(-std::abs(x))) + std::max(x, 0.0); }, -40, 40},
      {"swish", [&](auto& x) { return swish(x); }, [&](double x) { return x * sig(x); }, -20, 20},
      {"clamp", [](auto& x) { return clamp(x, -1.0, 0.5); }, [](double x) { return std::clamp(x, -1.0, 0.5); }, -3, 3},
      {"identity", [](auto& x) { return identity(x); }, [](double x) { return x; }, -3, 3},
  };
  for (const Case& c : cases)
    for (int64_t n : {int64_t(7), int64_t(100003)}) {  // small, and large enough for the threaded path
      SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n));
      Host x = random_host({n}, c.lo, c.hi, 7);
      std::vector<double> want;
      for (double v : x.v) want.push_back(c.ref(v));
      Tensor r = c.op(on(x, d));
      EXPECT_EQ(r.device(), d);
      EXPECT_LE(max_rel_error(r, want), 1e-4);
      if (d.is_cpu() && n == 7) {  // float64 too
        Tensor r64 = c.op(on(x, d, DType::f64));
        EXPECT_EQ(r64.dtype(), DType::f64);
        EXPECT_LE(max_rel_error(r64, want), 1e-12);
      }
    }
}

TEST_P(Ops, ActivationsAreStableAtExtremes) {
  Device d = GetParam();
  Tensor x = to(Tensor({-1000, -50, 0, 50, 1000}), d);
  EXPECT_EQ(sigmoid(x).to_vector<float>(), (std::vector<float>{0, std::exp(-50.f) / (1 + std::exp(-50.f)), 0.5f, 1, 1}));
  auto sp = softplus(x).to_vector<float>();
  EXPECT_EQ(sp[0], 0.0f);
  EXPECT_FLOAT_EQ(sp[2], std::log(2.0f));
  EXPECT_EQ(sp[4], 1000.0f);
  auto sw = swish(x).to_vector<float>();
  EXPECT_EQ(sw[0], -0.0f);
  EXPECT_EQ(sw[4], 1000.0f);
  for (float v : logsoftmax(to(Tensor({1000, 0, -1000}), d)).to_vector<float>()) EXPECT_FALSE(std::isnan(v));
}

TEST_P(Ops, IntegerUnaryStaysInteger) {
  Device d = GetParam();
  Tensor i = to(Tensor(std::vector<int64_t>{-2, 0, 3}, Shape{3}), d);
  EXPECT_EQ(abs(i).dtype(), DType::i64);
  EXPECT_EQ(abs(i).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ((-i).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, -3}));
  EXPECT_EQ(relu(i).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 3}));
  EXPECT_EQ(exp(i).dtype(), DType::f32);  // transcendental functions promote
  EXPECT_FLOAT_EQ(exp(i).to_vector<float>()[2], std::exp(3.0f));
}

namespace {
// C = op(A) op(B) over the last two axes, with broadcast batch axes.
Host host_matmul(const Host& a, const Host& b, bool ta, bool tb) {
  auto mat = [](const Host& h) { return std::vector<int64_t>(h.shape.end() - 2, h.shape.end()); };
  std::vector<int64_t> ma = mat(a), mb = mat(b);
  int64_t m = ta ? ma[1] : ma[0], k = ta ? ma[0] : ma[1], n = tb ? mb[0] : mb[1];
  std::vector<int64_t> ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  std::vector<int64_t> batch = broadcast_shape(ba, bb);
  int64_t nb = 1;
  for (int64_t x : batch) nb *= x;
  Host out{batch, {}};
  out.shape.push_back(m);
  out.shape.push_back(n);
  Host abatch{ba, {}}, bbatch{bb, {}};
  auto batch_offset = [&](const std::vector<int64_t>& own, const std::vector<int64_t>& idx) {
    size_t off = idx.size() - own.size();
    auto st = strides_of(own);
    int64_t flat = 0;
    for (size_t i = 0; i < own.size(); ++i) flat += (own[i] == 1 ? 0 : idx[i + off]) * st[i];
    return flat;
  };
  for (int64_t p = 0; p < nb; ++p) {
    auto idx = unravel(p, batch);
    int64_t oa = batch_offset(ba, idx) * ma[0] * ma[1], ob = batch_offset(bb, idx) * mb[0] * mb[1];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) {
          double av = ta ? a.v[oa + l * ma[1] + i] : a.v[oa + i * ma[1] + l];
          double bv = tb ? b.v[ob + j * mb[1] + l] : b.v[ob + l * mb[1] + j];
          s += av * bv;
        }
        out.v.push_back(s);
      }
  }
  return out;
}
}  // namespace

TEST_P(Ops, MatmulAllLayoutsMatchHost) {
  Device d = GetParam();
  struct Case {
    std::vector<int64_t> a, b;
    bool ta, tb;
  };
  std::vector<Case> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto lay = [](int64_t r, int64_t c, bool t) { return t ? std::vector<int64_t>{c, r} : std::vector<int64_t>{r, c}; };
      auto with = [](std::vector<int64_t> batch, std::vector<int64_t> m) {
        batch.insert(batch.end(), m.begin(), m.end());
        return batch;
      };
      cases.push_back({lay(5, 7, ta), lay(7, 3, tb), ta, tb});
      cases.push_back({lay(65, 129, ta), lay(129, 33, tb), ta, tb});                      // several GEMM blocks
      cases.push_back({with({2}, lay(5, 7, ta)), with({2}, lay(7, 3, tb)), ta, tb});      // batched
      cases.push_back({with({2, 3}, lay(4, 6, ta)), lay(6, 2, tb), ta, tb});              // batch x matrix
      cases.push_back({lay(4, 6, ta), with({3}, lay(6, 2, tb)), ta, tb});                 // matrix x batch
      cases.push_back({with({2, 1}, lay(4, 6, ta)), with({3, 1, 1}, lay(6, 2, tb)), ta, tb});  // broadcast batch
    }
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(Shape(c.a)) + (c.ta ? "ᵀ" : "") + " x " + to_string(Shape(c.b)) + (c.tb ? "ᵀ" : ""));
    Host a = random_host(c.a, -1, 1, 3), b = random_host(c.b, -1, 1, 4);
    Host want = host_matmul(a, b, c.ta, c.tb);
    Tensor r = matmul(on(a, d), on(b, d), c.ta, c.tb);
    EXPECT_EQ(r.shape(), Shape(want.shape));
    EXPECT_LE(max_rel_error(r, want.v), 1e-4);
    if (d.is_cpu()) { EXPECT_LE(max_rel_error(matmul(on(a, d, DType::f64), on(b, d, DType::f64), c.ta, c.tb), want.v), 1e-12); }
  }
}

TEST_P(Ops, MatmulVectors) {
  Device d = GetParam();
  Tensor v = to(Tensor({1, 2, 3}), d);
  Tensor m = to(Tensor({{1, 2}, {3, 4}, {5, 6}}), d);  // (3, 2)
  Tensor vm = matmul(v, m);
  EXPECT_EQ(vm.shape(), (Shape{2}));
  EXPECT_EQ(vm.to_vector<float>(), (std::vector<float>{22, 28}));
  Tensor mv = matmul(m, to(Tensor({1, -1}), d));
  EXPECT_EQ(mv.shape(), (Shape{3}));
  EXPECT_EQ(mv.to_vector<float>(), (std::vector<float>{-1, -1, -1}));
  Tensor mtv = matmul(m, v, true, false);
  EXPECT_EQ(mtv.to_vector<float>(), (std::vector<float>{22, 28}));
  Tensor dot = matmul(v, v);
  EXPECT_EQ(dot.ndim(), 0);
  EXPECT_EQ(dot.item<float>(), 14.0f);
  Tensor bv = matmul(to(ones({2, 4, 3}), d), v);
  EXPECT_EQ(bv.shape(), (Shape{2, 4}));
  EXPECT_EQ(bv.to_vector<float>(), std::vector<float>(8, 6.0f));
  // integer matmul
  Tensor im = to(Tensor(std::vector<int64_t>{1, 2, 3, 4}, Shape{2, 2}), d);
  if (d.is_cpu()) { EXPECT_EQ(matmul(im, im).to_vector<int64_t>(), (std::vector<int64_t>{7, 10, 15, 22})); }
}

TEST_P(Ops, ReductionsMatchHost) {
  Device d = GetParam();
  for (auto shape : {std::vector<int64_t>{4, 5}, std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{300, 401}}) {
    Host x = random_host(shape, -2, 2, 11);
    Tensor t = on(x, d);
    for (int axis = 0; axis < int(shape.size()); ++axis)
      for (bool keep : {false, true}) {
        SCOPED_TRACE(to_string(Shape(shape)) + " axis " + std::to_string(axis) + (keep ? " keepdims" : ""));
        Host s = host_reduce(x, axis, vsum, keep);
        EXPECT_EQ(sum(t, axis, keep).shape(), Shape(s.shape));
        EXPECT_LE(max_rel_error(sum(t, axis, keep), s.v), 1e-4);
        EXPECT_LE(max_rel_error(sum(t, axis - int(shape.size()), keep), s.v), 1e-4);  // negative axis
        Host mn = host_reduce(x, axis, [](auto& f) { return vsum(f) / double(f.size()); }, keep);
        EXPECT_LE(max_rel_error(mean(t, axis, keep), mn.v), 1e-4);
        EXPECT_LE(max_rel_error(max(t, axis, keep), host_reduce(x, axis, vmax, keep).v), 1e-6);
        EXPECT_LE(max_rel_error(min(t, axis, keep), host_reduce(x, axis, vmin, keep).v), 1e-6);
        auto argref = [](bool is_max) {
          return [is_max](const std::vector<double>& f) {
            auto it = is_max ? std::max_element(f.begin(), f.end()) : std::min_element(f.begin(), f.end());
            return double(it - f.begin());
          };
        };
        Tensor am = argmax(t, axis, keep);
        EXPECT_EQ(am.dtype(), DType::i64);
        EXPECT_EQ(am.to_vector<double>(), host_reduce(x, axis, argref(true), keep).v);
        EXPECT_EQ(argmin(t, axis, keep).to_vector<double>(), host_reduce(x, axis, argref(false), keep).v);
      }
    double total = vsum(x.v);
    EXPECT_EQ(sum(t).ndim(), 0);
    EXPECT_NEAR(sum(t).item<double>(), total, 1e-4 * std::max(1.0, std::abs(total)));
    EXPECT_NEAR(mean(t).item<double>(), total / double(x.numel()), 1e-5);
    EXPECT_FLOAT_EQ(max(t).item<float>(), float(vmax(x.v)));
    EXPECT_FLOAT_EQ(min(t).item<float>(), float(vmin(x.v)));
  }
  // several axes at once
  Host x = random_host({2, 3, 4}, -1, 1, 12);
  Host s02 = host_reduce(host_reduce(x, 2, vsum, false), 0, vsum, false);
  EXPECT_EQ(sum(on(x, d), std::vector<int>{0, 2}).shape(), (Shape{3}));
  EXPECT_LE(max_rel_error(sum(on(x, d), std::vector<int>{0, -1}), s02.v), 1e-5);
  EXPECT_EQ(sum(on(x, d), std::vector<int>{0, 2}, true).shape(), (Shape{1, 3, 1}));
}

TEST_P(Ops, IntegerAndBoolReductions) {
  Device d = GetParam();
  Tensor b = to(Tensor({1, 0, 3, 0}), d) > 0.5;
  EXPECT_EQ(sum(b).dtype(), DType::i64);
  EXPECT_EQ(sum(b).item<int64_t>(), 2);
  EXPECT_FLOAT_EQ(mean(b).item<float>(), 0.5f);
  Tensor i = to(Tensor(std::vector<int32_t>{5, -2, 7}, Shape{3}), d);
  EXPECT_EQ(sum(i).item<int64_t>(), 10);
  EXPECT_EQ(max(i).item<int64_t>(), 7);
  EXPECT_EQ(argmax(i, 0).item<int64_t>(), 2);
  EXPECT_EQ(argmin(i, 0).item<int64_t>(), 1);
}

TEST_P(Ops, SoftmaxFamilyMatchesHost) {
  Device d = GetParam();
  for (auto shape : {std::vector<int64_t>{4, 6}, std::vector<int64_t>{2, 3, 5}, std::vector<int64_t>{64, 1000}})
    for (int axis = 0; axis < int(shape.size()); ++axis) {
      SCOPED_TRACE(to_string(Shape(shape)) + " axis " + std::to_string(axis));
      Host x = random_host(shape, -20, 20, 13);
      Host lse = host_reduce(x, axis, [](auto& f) {
        double m = vmax(f), s = 0;
        for (double v : f) s += std::exp(v - m);
        return m + std::log(s);
      }, true);
      Host sm = x, lsm = x;
      auto st = strides_of(shape);
      for (int64_t k = 0; k < x.numel(); ++k) {
        auto idx = unravel(k, shape);
        idx[axis] = 0;
        double l = at_broadcast(lse, idx);
        lsm.v[k] = x.v[k] - l;
        sm.v[k] = std::exp(lsm.v[k]);
      }
      Tensor t = on(x, d);
      EXPECT_LE(max_rel_error(softmax(t, axis), sm.v), 1e-5);
      EXPECT_LE(max_rel_error(logsoftmax(t, axis), lsm.v), 1e-4);
      EXPECT_LE(max_rel_error(logsumexp(t, axis, true), lse.v), 1e-4);
      EXPECT_EQ(logsumexp(t, axis).ndim(), int(shape.size()) - 1);
      if (axis == int(shape.size()) - 1) { EXPECT_LE(max_rel_error(softmax(t), sm.v), 1e-5); }
    }
  // rows sum to one, even with huge logits
  Tensor big = to(Tensor({{1000, 1001, 999}, {-1000, -1000, -1000}}), d);
  Tensor p = softmax(big);
  EXPECT_LE(max_rel_error(sum(p, 1), {1, 1}), 1e-6);
  EXPECT_LE(max_rel_error(logsumexp(big, 1), {1001 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), -1000 + std::log(3.0)}), 1e-4);
}

TEST_P(Ops, ShapeOpsMatchHost) {
  Device d = GetParam();
  Host x = random_host({2, 3, 4}, -1, 1, 21);
  Tensor t = on(x, d);
  // permute (2, 0, 1): out[i, j, k] = x[j, k, i]
  Tensor p = permute(t, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  std::vector<double> want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) want.push_back(x.v[(j * 3 + k) * 4 + i]);
  EXPECT_LE(max_rel_error(p, want), 1e-6);
  EXPECT_LE(max_rel_error(permute(t, {-1, 0, 1}), want), 1e-6);
  // transpose of a batch swaps the last two axes
  Tensor tt = t.transpose();
  EXPECT_EQ(tt.shape(), (Shape{2, 4, 3}));
  EXPECT_LE(max_rel_error(tt.transpose(), x.v), 1e-6);
  // broadcast_to / sum_to
  Tensor row = to(Tensor({1, 2, 3}), d);
  Tensor b = broadcast_to(row, Shape{2, 3});
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(sum_to(b, Shape{3}).to_vector<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(sum_to(b, Shape{2, 1}).to_vector<float>(), (std::vector<float>{6, 6}));
  EXPECT_EQ(sum_to(b, Shape{}).item<float>(), 12.0f);
  // slice along any axis
  Tensor s = slice(t, 2, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  want.clear();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 1; k < 3; ++k) want.push_back(x.v[(i * 3 + j) * 4 + k]);
  EXPECT_LE(max_rel_error(s, want), 1e-6);
  EXPECT_EQ(slice(t, 1, -2, 3).shape(), (Shape{2, 2, 4}));  // negative start counts from the end
  EXPECT_EQ(slice(t, 0, 1, 1).numel(), 0);
  // concat and stack
  Tensor a2 = to(Tensor({{1, 2}, {3, 4}}), d), b2 = to(Tensor({{5, 6}}), d);
  EXPECT_EQ(concat({a2, b2}).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(concat({a2, b2.transpose()}, 1).to_vector<float>(), (std::vector<float>{1, 2, 5, 3, 4, 6}));
  EXPECT_EQ(concat({a2, b2.transpose()}, -1).shape(), (Shape{2, 3}));
  Tensor st0 = stack({a2, a2 * 10.0});
  EXPECT_EQ(st0.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(st0.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40}));
  Tensor st2 = stack({a2, a2 * 10.0}, 2);
  EXPECT_EQ(st2.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(st2.to_vector<float>(), (std::vector<float>{1, 10, 2, 20, 3, 30, 4, 40}));
  EXPECT_EQ(stack({row, row}, 1).to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 3, 3}));
  // concat promotes dtypes
  Tensor ci = concat({to(Tensor(std::vector<int64_t>{1}, Shape{1}), d), to(Tensor({2.5}), d)});
  EXPECT_EQ(ci.dtype(), DType::f32);
  EXPECT_EQ(ci.to_vector<float>(), (std::vector<float>{1, 2.5}));
}

TEST_P(Ops, IndexingMatchesHost) {
  Device d = GetParam();
  Host x = random_host({4, 3}, -1, 1, 31);
  Tensor t = on(x, d);
  for (DType it : {DType::i64, DType::i32}) {
    Tensor idx = to(Tensor(std::vector<int64_t>{3, 0, 3}, Shape{3}).cast(it), d);
    Tensor r = index_select(t, 0, idx);
    EXPECT_EQ(r.shape(), (Shape{3, 3}));
    std::vector<double> want;
    for (int i : {3, 0, 3})
      for (int j = 0; j < 3; ++j) want.push_back(x.v[i * 3 + j]);
    EXPECT_LE(max_rel_error(r, want), 1e-6);
    EXPECT_LE(max_rel_error(gather(t, 0, idx), want), 1e-6);
  }
  Tensor cols = index_select(t, 1, to(Tensor(std::vector<int64_t>{2, 1}, Shape{2}), d));
  std::vector<double> want;
  for (int i = 0; i < 4; ++i)
    for (int j : {2, 1}) want.push_back(x.v[i * 3 + j]);
  EXPECT_LE(max_rel_error(cols, want), 1e-6);
  EXPECT_EQ(index_select(t, 0, to(Tensor(std::vector<int64_t>{}, Shape{0}), d)).shape(), (Shape{0, 3}));
  // onehot / onecold
  Tensor labels = to(Tensor(std::vector<int64_t>{2, 0, 1}, Shape{3}), d);
  Tensor oh = onehot(labels, 4);
  EXPECT_EQ(oh.shape(), (Shape{3, 4}));
  EXPECT_EQ(oh.dtype(), DType::f32);
  EXPECT_EQ(oh.to_vector<float>(), (std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(onecold(oh).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(onecold(to(Tensor({0.1, 0.7, 0.2}), d)).item<int64_t>(), 1);
}

TEST_P(Ops, CastsRoundTrip) {
  Device d = GetParam();
  Tensor x = to(Tensor({1.5, -2.25, 3, 0}), d);
  for (DType t : {DType::f64, DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor c = x.cast(t);
    EXPECT_EQ(c.dtype(), t);
    EXPECT_EQ(c.device(), d);
    EXPECT_EQ(c.f32().to_vector<float>(), (std::vector<float>{1.5, -2.25, 3, 0}));
  }
  EXPECT_EQ(x.cast(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 0}));
  EXPECT_EQ(x.cast(DType::boolean).to_vector<int>(), (std::vector<int>{1, 1, 1, 0}));
  EXPECT_EQ(x.f64().dtype(), DType::f64);
}

TEST_P(Ops, InPlaceCopyAndSub) {
  Device d = GetParam();
  Tensor dst = to(zeros({3}), d);
  Tensor alias = dst;
  copy_(dst, Tensor(std::vector<double>{1, 2, 3}, Shape{3}));  // converts dtype, moves device
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  sub_(dst, to(Tensor({1, 1, 1}), d));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{0, 1, 2}));
}

TEST_P(Ops, EmptyTensorsFlowThrough) {
  Device d = GetParam();
  Tensor e = to(zeros({0, 3}), d);
  EXPECT_EQ((e + 1.0).shape(), (Shape{0, 3}));
  EXPECT_EQ(exp(e).shape(), (Shape{0, 3}));
  EXPECT_EQ(sum(e, 0).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(sum(e).item<float>(), 0.0f);
  EXPECT_EQ(matmul(e, to(ones({3, 2}), d)).shape(), (Shape{0, 2}));
  EXPECT_EQ(matmul(to(ones({2, 0}), d), to(ones({0, 3}), d)).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(softmax(e).shape(), (Shape{0, 3}));
}

TEST_P(Ops, OpsOnViewsMatchOpsOnCopies) {
  // A slice along the first axis is a view at an offset into its parent's storage; every op must
  // read exactly its window.
  Device d = GetParam();
  seed(1);
  Tensor parent = to(randn({6, 5, 4}), d);
  Tensor view = parent.slice(2, 5), copy = view.contiguous_copy();
  ASSERT_EQ(view.impl()->storage, parent.impl()->storage);
  Tensor idx = to(Tensor(std::vector<int64_t>{1, 0, 2}, Shape{3}), d);
  Tensor w = to(ones({4, 3}), d);
  std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"exp", [](auto& x) { return exp(x); }},
      {"add_self", [](auto& x) { return x + x; }},
      {"broadcast", [&](auto& x) { return x + to(ones({4}), d); }},
      {"matmul", [&](auto& x) { return matmul(x, w); }},
      {"matmul_nt", [](auto& x) { return matmul(x, x, false, true); }},
      {"matmul_rows", [](auto& x) { return matmul(x[0], x[1], true, false); }},
      {"sum0", [](auto& x) { return sum(x, 0); }},
      {"sum2", [](auto& x) { return sum(x, 2); }},
      {"max1", [](auto& x) { return max(x, 1); }},
      {"argmax", [](auto& x) { return argmax(x, 1); }},
      {"softmax", [](auto& x) { return softmax(x, 1); }},
      {"logsoftmax", [](auto& x) { return logsoftmax(x); }},
      {"permute", [](auto& x) { return permute(x, {2, 0, 1}); }},
      {"slice1", [](auto& x) { return slice(x, 1, 1, 3); }},
      {"index_select0", [&](auto& x) { return index_select(x, 0, idx); }},
      {"index_select2", [&](auto& x) { return index_select(x, 2, idx); }},
      {"concat", [](auto& x) { return concat({x, x}, 1); }},
      {"stack", [](auto& x) { return stack({x, x}, 3); }},
      {"where", [](auto& x) { return where(x > 0.0, x, -x); }},
      {"cast", [](auto& x) { return x.cast(DType::f16).f32(); }},
      {"broadcast_to", [](auto& x) { return broadcast_to(x, Shape{2, 3, 5, 4}); }},
      {"mse", [](auto& x) { return mse(x, zeros_like(x)); }},
      {"gradient", [](auto& x) { return gradient([](const Tensor& t) { return sum(softmax(t) * t); }, x); }},
      {"dense", [&](auto& x) { return Dense(to(ones({2, 4}), d), to(ones({2}), d))(x); }},
  };
  for (auto& [name, f] : ops) {
    SCOPED_TRACE(name);
    EXPECT_LE(max_rel_error(f(view), f(copy).to_vector<double>()), 0.0);
  }
}

TEST_P(Ops, InfinitiesAndNaNs) {
  Device d = GetParam();
  EXPECT_EQ(softmax(to(Tensor({-INFINITY, 0.f}), d)).to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(logsumexp(to(Tensor({-INFINITY, -INFINITY}), d), 0).item<float>(), -INFINITY);
  EXPECT_EQ(logsoftmax(to(Tensor({-INFINITY, 0.f}), d)).to_vector<float>(), (std::vector<float>{-INFINITY, 0}));
  EXPECT_TRUE(std::isnan(max(to(Tensor({NAN, 1.f}), d)).item<float>()));
  EXPECT_TRUE(std::isnan(sum(to(Tensor({NAN, 1.f}), d)).item<float>()));
  EXPECT_EQ(exp(to(Tensor({-INFINITY}), d)).item<float>(), 0.0f);
  EXPECT_EQ(relu(to(Tensor({-INFINITY, INFINITY}), d)).to_vector<float>(), (std::vector<float>{0, INFINITY}));
  // ties in max share the gradient
  Tensor g = gradient([](const Tensor& t) { return max(t); }, to(Tensor({1, 3, 3}), d));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 0.5, 0.5}));
}

TEST_P(Ops, LargeTensorsThroughTheThreadedKernels) {
  // Above the backends' parallel thresholds: every element must still be right.
  Device d = GetParam();
  Host x = random_host({300, 301}, -2, 2, 41), y = random_host({300, 301}, -2, 2, 42);
  Tensor tx = on(x, d), ty = on(y, d);
  std::vector<double> want;
  for (size_t k = 0; k < x.v.size(); ++k) want.push_back(x.v[k] > y.v[k] ? x.v[k] : -y.v[k]);
  EXPECT_LE(max_rel_error(where(tx > ty, tx, -ty), want), 1e-6);
  want.clear();
  for (size_t k = 0; k < x.v.size(); ++k) want.push_back(x.v[k] >= y.v[k]);
  EXPECT_LE(max_rel_error(tx >= ty, want), 0.0);
  EXPECT_LE(max_rel_error(tx.cast(DType::f16).f32(), x.v), 1e-3);
  EXPECT_LE(max_rel_error(tx.f64(), x.v), 1e-6);
  want.clear();
  for (int64_t j = 0; j < 301; ++j)
    for (int64_t i = 0; i < 300; ++i) want.push_back(x.v[size_t(i * 301 + j)]);
  EXPECT_LE(max_rel_error(tx.transpose(), want), 1e-6);
  std::vector<int64_t> rows;
  for (int64_t i = 299; i >= 0; i -= 2) rows.push_back(i);
  want.clear();
  for (int64_t i : rows)
    for (int64_t j = 0; j < 301; ++j) want.push_back(x.v[size_t(i * 301 + j)]);
  EXPECT_LE(max_rel_error(index_select(tx, 0, to(Tensor(rows, Shape{int64_t(rows.size())}), d)), want), 1e-6);
  Tensor filled = to(full({300, 301}, 0.25), d);
  EXPECT_LE(max_rel_error(filled, std::vector<double>(x.v.size(), 0.25)), 0.0);
  Tensor g = gradient([](const Tensor& t) { return sum(square(t)); }, tx);
  want.clear();
  for (double v : x.v) want.push_back(2 * v);
  EXPECT_LE(max_rel_error(g, want), 1e-5);
}

FLUX_DEVICE_SUITE(Ops);
