// Hints for the mistakes users make on day two (issue 18): integer labels given to a one-hot loss
// name onehot(y, n); a Float64 input to a Float32 layer is converted with Flux's warning, once per
// process, on stderr.
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "flux/flux.hpp"
#include "test_devices.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

TEST(ErrorHints, IntegerLabelsToAOneHotLossSuggestOnehot) {
  Tensor logits = zeros({4, 10});
  Tensor labels(std::vector<int64_t>{1, 2, 3, 9}, Shape{4});
  const std::string hint =
      "; the target looks like class labels (Int64 of shape (4,)), and this loss takes one-hot targets: pass "
      "onehot(y, 10), of shape (4, 10)";
  EXPECT_FLUX_ERROR(logitcrossentropy(logits, labels),
                    "[logitcrossentropy] prediction shape (4, 10) and target shape (4,) differ" + hint);
  EXPECT_FLUX_ERROR(crossentropy(softmax(logits), labels), "[crossentropy] prediction shape (4, 10) and target shape (4,) differ" + hint);
  EXPECT_FLUX_ERROR(kldivergence(softmax(logits), labels), "pass onehot(y, 10)");
  // (N, 1) labels and labels stored as floats get the reshape / cast too.
  EXPECT_FLUX_ERROR(logitcrossentropy(logits, labels.reshape({4, 1})),
                    "(Int64 of shape (4, 1)), and this loss takes one-hot targets: pass onehot(y, 10) on y.reshape({-1})");
  EXPECT_FLUX_ERROR(logitcrossentropy(logits, labels.f32()),
                    "pass onehot(y, 10) (after y.cast(Int64) for labels stored as floats), of shape (4, 10)");
  // The hint's advice works.
  EXPECT_NO_THROW(logitcrossentropy(logits, onehot(labels, 10)));
  // Shapes that are not labels get the plain message; other losses no hint.
  EXPECT_THAT([&] { (void)logitcrossentropy(logits, zeros({4, 3})); },
              ::testing::ThrowsMessage<Error>(::testing::Not(HasSubstr("onehot"))));
  EXPECT_THAT([&] { (void)mse(logits, labels); }, ::testing::ThrowsMessage<Error>(::testing::Not(HasSubstr("onehot"))));
}

namespace {
const char* const kWarning = "Layer with Float32 parameters got Float64 input. The input will be converted";

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

// Each EXPECT_EXIT runs in a fresh process (the threadsafe style re-executes the test binary), so
// "once per process" starts from nothing there; the child exits with the number of warnings seen.
TEST(ErrorHintsDeathTest, Float64InputToAFloat32LayerWarnsOncePerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // In the child: two layers, several calls; one warning in all, naming the first layer and the input.
  EXPECT_EXIT(
      {
        seed(1);
        Dense d(3, 2);
        Conv c({1, 1}, 3, 2);
        Tensor x64 = rand({4, 3}, DType::f64);
        ::testing::internal::CaptureStderr();
        Tensor y = d(x64);
        Tensor y2 = d(x64);
        Tensor z = c(rand({1, 3, 2, 2}, DType::f64));
        std::string err = ::testing::internal::GetCapturedStderr();
        // Converted, as Flux does: the result is Float32 and equals the layer applied to x64.f32().
        const bool converted = y.dtype() == DType::f32 && z.dtype() == DType::f32 &&
                               y.to_vector<float>() == d(x64.f32()).to_vector<float>();
        const bool names = err.find("[Dense] Layer with Float32") != std::string::npos &&
                           err.find("layer = Dense(3 => 2)") != std::string::npos &&
                           err.find("summary(x) = 4×3 Tensor{Float64, CPU}") != std::string::npos &&
                           err.find("┌ Warning: ") != std::string::npos;
        std::exit(converted && names ? count(err, kWarning) : 100);
      },
      ::testing::ExitedWithCode(1), "");
  // Float32 input, and a Float64 model given Float64 input: no warning.
  EXPECT_EXIT(
      {
        seed(1);
        ::testing::internal::CaptureStderr();
        Dense d(3, 2);
        (void)d(rand({4, 3}));
        (void)Dense(3, 2, DenseOptions{.dtype = DType::f64})(rand({4, 3}, DType::f64));
        std::exit(count(::testing::internal::GetCapturedStderr(), "Warning"));
      },
      ::testing::ExitedWithCode(0), "");
}

class ErrorHintsOnDevice : public ::testing::TestWithParam<Device> {};

TEST_P(ErrorHintsOnDevice, Float64InputIsConvertedOnTheDevice) {
  const Device dev = GetParam();
  seed(2);
  Dense d = Dense(3, 2, relu) | dev;
  Tensor x = to(rand({5, 3}, DType::f64), dev);
  Tensor y = d(x);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.device(), dev);
  // float64 reference on the CPU from the converted input.
  std::vector<double> xv = x.f32().to_vector<double>(), w = d.weight.to_vector<double>(), b = d.bias.to_vector<double>();
  std::vector<double> want;
  for (int i = 0; i < 5; ++i)
    for (int o = 0; o < 2; ++o) {
      double s = b[size_t(o)];
      for (int k = 0; k < 3; ++k) s += xv[size_t(3 * i + k)] * w[size_t(3 * o + k)];
      want.push_back(std::max(0.0, s));
    }
  EXPECT_LT(flux::testing::max_rel_error(y, want), 1e-6);
  // Gradients flow back to the Float64 input's dtype.
  Tensor g = gradient([&](const Tensor& xx) { return sum(d(xx)); }, x);
  EXPECT_EQ(g.dtype(), DType::f64);
  EXPECT_EQ(g.shape(), x.shape());
}

FLUX_DEVICE_SUITE(ErrorHintsOnDevice);
