// Tensor handles: construction, dtypes, random generators, views, device moves and Julia-style printing.
#include <cmath>
#include <limits>
#include <sstream>

#include <gmock/gmock.h>

#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

namespace {
std::string to_text(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}
}  // namespace

TEST(Tensor, ConstructionFromLists) {
  Tensor v({1, 2, 3});
  EXPECT_EQ(v.shape(), (Shape{3}));
  EXPECT_EQ(v.ndim(), 1);
  EXPECT_EQ(v.dtype(), DType::f32);
  EXPECT_TRUE(v.device().is_cpu());
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor m({{1, 2}, {3, 4}, {5, 6}});
  EXPECT_EQ(m.shape(), (Shape{3, 2}));
  EXPECT_EQ(m.numel(), 6);
  EXPECT_EQ(m.size(0), 3);
  EXPECT_EQ(m.size(-1), 2);
  EXPECT_EQ(m.nbytes(), 24u);
  EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  Tensor d(std::vector<double>{1, 2, 3, 4}, Shape{2, 2});
  EXPECT_EQ(d.dtype(), DType::f64);
  Tensor i32(std::vector<int32_t>{1, 2}, Shape{2});
  EXPECT_EQ(i32.dtype(), DType::i32);
  Tensor i64(std::vector<int64_t>{7}, Shape{});
  EXPECT_EQ(i64.dtype(), DType::i64);
  EXPECT_EQ(i64.ndim(), 0);
  EXPECT_EQ(i64.item<int64_t>(), 7);
  Tensor b(std::vector<uint8_t>{1, 0, 1}, Shape{3}, DType::boolean);
  EXPECT_EQ(b.dtype(), DType::boolean);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_FALSE(Tensor().defined());
  EXPECT_TRUE(v.defined());
}

TEST(Tensor, DtypeNamesSizesAndPromotion) {
  EXPECT_STREQ(dtype_name(DType::f32), "Float32");
  EXPECT_STREQ(dtype_name(DType::bf16), "BFloat16");
  EXPECT_STREQ(dtype_name(DType::boolean), "Bool");
  EXPECT_EQ(to_string(DType::bf16), "BFloat16");  // as to_string(Device) and to_string(Shape)
  EXPECT_EQ(to_string(Float32), std::string(dtype_name(Float32)));
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
  EXPECT_EQ(promote(DType::i64, DType::f32), DType::f32);
  EXPECT_EQ(promote(DType::f32, DType::f64), DType::f64);
  EXPECT_EQ(promote(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote(DType::boolean, DType::i32), DType::i32);
  EXPECT_EQ(dtype_of<float>(), DType::f32);
  EXPECT_EQ(dtype_of<int64_t>(), DType::i64);
}

TEST(Tensor, HalfAndBfloat16RoundTrips) {
  // Exactly representable values survive; others round to nearest even.
  std::vector<float> exact = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* min normal */,
                              5.9604645e-08f /* min subnormal */, 0.099975586f};
  for (float f : exact) EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);   // rounds up to infinity
  EXPECT_EQ(float_to_half(1e-9f), 0x0000);      // underflows to zero
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);  // tie: round to even
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3c02);  // tie: round to even (up)
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(INFINITY))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(3.140625f)), 3.140625f);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.00390625f)), 1.0f);        // tie to even
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.01171875f)), 1.015625f);   // tie to even (up)
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  // through tensors
  Tensor x({0.5, -1.25, 3.0, 1000.0});
  for (DType t : {DType::f16, DType::bf16}) {
    Tensor h = x.cast(t);
    EXPECT_EQ(h.dtype(), t);
    EXPECT_EQ(h.nbytes(), 8u);
    EXPECT_EQ(h.to_vector<float>(), x.to_vector<float>());
    EXPECT_EQ(h.f32().dtype(), DType::f32);
  }
  EXPECT_EQ(Tensor({0.1f}).cast(DType::bf16).item<float>(), bfloat16_to_float(float_to_bfloat16(0.1f)));
  EXPECT_EQ(Tensor({0.1f}).cast(DType::f16).item<float>(), half_to_float(float_to_half(0.1f)));
}

TEST(Tensor, FactoryFunctions) {
  EXPECT_EQ(zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(ones({4}, DType::f64).to_vector<double>(), std::vector<double>(4, 1.0));
  Tensor f = full({2, 2}, 2.5, DType::f16);
  EXPECT_EQ(f.dtype(), DType::f16);
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(4, 2.5f));
  EXPECT_EQ(full({3}, 7, DType::i32).to_vector<int32_t>(), std::vector<int32_t>(3, 7));
  Tensor m({{1, 2}, {3, 4}});
  EXPECT_EQ(zeros_like(m).shape(), m.shape());
  EXPECT_EQ(ones_like(m).to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(full_like(m, -1).to_vector<float>(), std::vector<float>(4, -1.0f));
  EXPECT_EQ(arange(5).dtype(), DType::i64);
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(3, 0, -1).to_vector<float>(), (std::vector<float>{3, 2, 1}));
  EXPECT_EQ(arange(2, 2).numel(), 0);
  EXPECT_EQ(Tensor::scalar(3.5).ndim(), 0);
  EXPECT_EQ(Tensor::scalar(3.5).item<float>(), 3.5f);
  EXPECT_EQ(Tensor::scalar(3, DType::i64).dtype(), DType::i64);
  EXPECT_EQ(Tensor::empty({0, 4}).numel(), 0);
}

TEST(Tensor, RandomGeneratorsAreSeededAndDistributed) {
  seed(123);
  Tensor a = rand({1000}), n1 = randn({2000});
  seed(123);
  Tensor b = rand({1000}), n2 = randn({2000});
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(n1.to_vector<float>(), n2.to_vector<float>());
  EXPECT_NE(rand({1000}).to_vector<float>(), a.to_vector<float>());  // the stream moves on
  auto u = a.to_vector<double>();
  double mean_u = 0;
  for (double x : u) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    mean_u += x / double(u.size());
  }
  EXPECT_NEAR(mean_u, 0.5, 0.05);
  auto g = n1.to_vector<double>();
  double m = 0, v = 0;
  for (double x : g) m += x / double(g.size());
  for (double x : g) v += (x - m) * (x - m) / double(g.size());
  EXPECT_NEAR(m, 0.0, 0.1);
  EXPECT_NEAR(v, 1.0, 0.1);
  EXPECT_EQ(rand({3}, DType::f64).dtype(), DType::f64);
  EXPECT_EQ(randn({3}, DType::bf16).dtype(), DType::bf16);
  seed(7);
  auto p = randperm(50);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  seed(7);
  EXPECT_EQ(randperm(50), p);
}

TEST(Tensor, ItemAndToVectorConvert) {
  Tensor x({2.75});
  EXPECT_EQ(x.item<float>(), 2.75f);
  EXPECT_EQ(x.item<double>(), 2.75);
  EXPECT_EQ(x.item<int64_t>(), 2);
  Tensor m(std::vector<float>{1.5}, Shape{1, 1});  // one element in two dims is fine
  EXPECT_EQ(m.item<float>(), 1.5f);
  EXPECT_EQ(Tensor({1, 2, 3}).to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Tensor(std::vector<int64_t>{1, 0}, Shape{2}).to_vector<bool>(), (std::vector<bool>{true, false}));
}

TEST(Tensor, ReshapeSharesStorage) {
  Tensor x = arange(0, 6, 1);
  Tensor r = x.reshape({2, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_TRUE(r.same_storage(x));
  EXPECT_EQ(x.reshape({-1, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(x.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_EQ(x.reshape({6, 1, 1}).ndim(), 3);
  copy_(r, zeros({2, 3}));
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(6, 0.0f));  // the write shows through x
}

TEST(Tensor, TransposeIsACopyWithSwappedAxes) {
  Tensor m({{1, 2, 3}, {4, 5, 6}});
  Tensor t = m.transpose();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(t.transpose().to_vector<float>(), m.to_vector<float>());
}

TEST(Tensor, SlicingTheFirstAxisSharesStorage) {
  Tensor x = arange(0, 12, 1).reshape({4, 3});
  Tensor s = x.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  Tensor row = x[2];
  EXPECT_EQ(row.shape(), (Shape{3}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{6, 7, 8}));
  EXPECT_EQ(x[-1].to_vector<float>(), (std::vector<float>{9, 10, 11}));
  EXPECT_EQ(x.slice(0, 0).numel(), 0);
  // writes through a view reach the parent
  copy_(s, full({2, 3}, -1));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 1, 2, -1, -1, -1, -1, -1, -1, 9, 10, 11}));
  Tensor r = x[3];
  copy_(r, Tensor({7, 7, 7}));
  EXPECT_EQ(x[3].to_vector<float>(), (std::vector<float>{7, 7, 7}));
  // views of views
  EXPECT_EQ(x.slice(1, 4).slice(1, 2).to_vector<float>(), (std::vector<float>{-1, -1, -1}));
  // ops on views read the right window
  EXPECT_EQ((x.slice(3, 4) + 1.0).to_vector<float>(), (std::vector<float>{8, 8, 8}));
  EXPECT_EQ(x.slice(1, 3).contiguous_copy().same_storage(x.slice(1, 3)), false);
}

TEST(Tensor, MovingToTheSameDeviceIsANoOp) {
  Tensor x({1, 2});
  EXPECT_TRUE(to(x, Device()).same_storage(x));
  EXPECT_EQ(to_string(x.device()), "CPU");
}

class TensorOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(TensorOnDevice, RoundTripKeepsDtypeAndValues) {
  Device d = GetParam();
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = Tensor({1, 0, 3, 4}).cast(t);
    Tensor y = to(x, d);
    EXPECT_EQ(y.device(), d);
    EXPECT_EQ(y.dtype(), t);
    Tensor back = to(y, Device());
    EXPECT_EQ(back.to_vector<double>(), x.to_vector<double>());
  }
  Tensor z = zeros({2, 3}, DType::f32, d), r = rand({5}, DType::f32, d), a = arange(0, 3, 1, DType::f32, d);
  EXPECT_EQ(z.device(), d);
  EXPECT_EQ(r.device(), d);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 1, 2}));
  Tensor big = to(arange(0, 10, 1).reshape({5, 2}), d);
  EXPECT_EQ(big.slice(2, 4).to_vector<float>(), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(big[4].to_vector<float>(), (std::vector<float>{8, 9}));
}
FLUX_DEVICE_SUITE(TensorOnDevice);

TEST(TensorPrinting, MatrixLikeJulia) {
  EXPECT_EQ(to_text(Tensor({{1, 2}, {3, 4}, {5, 6}})),
            "3×2 Tensor{Float32, CPU}:\n"
            " 1.0  2.0\n"
            " 3.0  4.0\n"
            " 5.0  6.0");
  EXPECT_EQ(summary(Tensor({{1, 2}, {3, 4}, {5, 6}})), "3×2 Tensor{Float32, CPU}");
}

TEST(TensorPrinting, VectorsAlignOnTheDecimalPoint) {
  EXPECT_EQ(to_text(Tensor({1.5, -10.25, 3})),
            "3-element Tensor{Float32, CPU}:\n"
            "   1.5\n"
            " -10.25\n"
            "   3.0");
}

TEST(TensorPrinting, DtypesAndScalars) {
  EXPECT_EQ(to_text(Tensor(std::vector<int64_t>{1, -20, 3}, Shape{3})),
            "3-element Tensor{Int64, CPU}:\n"
            "   1\n"
            " -20\n"
            "   3");
  EXPECT_EQ(to_text(Tensor({1, 2}) > 1.5), "2-element Tensor{Bool, CPU}:\n 0\n 1");
  EXPECT_EQ(to_text(Tensor::scalar(2)), "0-dimensional Tensor{Float32, CPU}:\n 2.0");
  EXPECT_EQ(to_text(Tensor(std::vector<double>{0.5, 0.25}, Shape{1, 2})), "1×2 Tensor{Float64, CPU}:\n 0.5  0.25");
  EXPECT_EQ(to_text(Tensor({1e-5f, 1e10f})), "2-element Tensor{Float32, CPU}:\n 1.0f-5\n 1.0f10");
  EXPECT_EQ(to_text(Tensor(std::vector<double>{1.5e-7}, Shape{1})), "1-element Tensor{Float64, CPU}:\n 1.5e-7");
  EXPECT_EQ(to_text(Tensor({NAN, INFINITY, -INFINITY})), "3-element Tensor{Float32, CPU}:\n NaN\n  Inf\n -Inf");
  EXPECT_EQ(to_text(Tensor({1.0f / 3})), "1-element Tensor{Float32, CPU}:\n 0.333333");
  EXPECT_EQ(to_text(zeros({2, 0})), "2×0 Tensor{Float32, CPU}");
  EXPECT_EQ(to_text(Tensor()), "Tensor(undefined)");
  EXPECT_EQ(summary(zeros({2, 3, 4}, DType::f16)), "2×3×4 Tensor{Float16, CPU}");
}

TEST(TensorPrinting, HigherRankPrintsOneMatrixPerLeadingIndex) {
  EXPECT_EQ(to_text(arange(0, 12, 1).reshape({2, 2, 3})),
            "2×2×3 Tensor{Float32, CPU}:\n"
            "[1, :, :] =\n"
            " 0.0  1.0  2.0\n"
            " 3.0  4.0  5.0\n"
            "\n"
            "[2, :, :] =\n"
            " 6.0   7.0   8.0\n"
            " 9.0  10.0  11.0");
  std::string many = to_text(arange(0, 80, 1).reshape({10, 2, 4}));
  EXPECT_THAT(many, HasSubstr("[3, :, :] =\n"));
  EXPECT_THAT(many, HasSubstr("\n\n⋮\n\n[8, :, :] =\n"));
  EXPECT_THAT(many, HasSubstr("[10, :, :] =\n 72.0  73.0  74.0  75.0\n 76.0  77.0  78.0  79.0"));
  EXPECT_THAT(many, ::testing::Not(HasSubstr("[5, :, :]")));
  EXPECT_THAT(to_text(zeros({1, 1, 2, 2})), HasSubstr("[1, 1, :, :] =\n 0.0  0.0\n 0.0  0.0"));
}

TEST(TensorPrinting, LargeTensorsAreElided) {
  std::string s = to_text(arange(0, 300, 1).reshape({30, 10}));
  EXPECT_THAT(s, ::testing::StartsWith("30×10 Tensor{Float32, CPU}:\n"));
  EXPECT_THAT(s, HasSubstr("⋮"));
  EXPECT_THAT(s, HasSubstr("…"));
  EXPECT_THAT(s, HasSubstr("⋱"));
  EXPECT_THAT(s, HasSubstr(" 299.0"));  // last element shown
  EXPECT_THAT(s, HasSubstr("   0.0    1.0"));
  EXPECT_THAT(s, ::testing::Not(HasSubstr("150.0")));  // middle rows elided
  EXPECT_THAT(s, ::testing::Not(HasSubstr(" 5.0")));   // middle columns elided
  int lines = int(std::count(s.begin(), s.end(), '\n'));
  EXPECT_EQ(lines, 11);  // header, 5 rows, ⋮, 5 rows: 12 lines
  std::string v = to_text(arange(0, 1000, 1));
  EXPECT_THAT(v, HasSubstr("⋮"));
  EXPECT_THAT(v, HasSubstr("999.0"));
  EXPECT_LT(v.size(), 200u);
}

// Found by tests/fuzz/fuzz_csv under UBSan: Int64 values were read back through a double, so those
// above 2^53 changed and 2^63 - 1 became 2^63, which no int64_t holds (undefined behaviour).
TEST(Tensor, Int64ValuesReadBackExactly) {
  const std::vector<int64_t> v{INT64_MAX, INT64_MIN, (int64_t(1) << 53) + 1, -(int64_t(1) << 62) - 3, 9223372036854775616};
  Tensor t(v, Shape{int64_t(v.size())});
  EXPECT_EQ(t.to_vector<int64_t>(), v);
  EXPECT_EQ(Tensor(std::vector<int64_t>{INT64_MAX}, Shape{}).item<int64_t>(), INT64_MAX);
  // Out of int32's range: an error (README, the rule for conversions to integers), not a wrapped 7.
  EXPECT_THROW(Tensor(std::vector<int64_t>{(int64_t(1) << 40) + 7}, Shape{}).to_vector<int32_t>(), flux::Error);
  EXPECT_EQ(Tensor(std::vector<int64_t>{-7}, Shape{}).to_vector<int32_t>()[0], int32_t(-7));
}
