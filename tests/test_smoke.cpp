#include "test_devices.hpp"

using namespace flux;

class Smoke : public ::testing::TestWithParam<Device> {};

TEST_P(Smoke, AddOnDevice) {
  Device d = GetParam();
  Tensor a = to(Tensor({1, 2, 3}), d), b = to(Tensor({10, 20, 30}), d);
  EXPECT_EQ((a + b).to_vector<float>(), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ((a + b).device(), d);
}
FLUX_DEVICE_SUITE(Smoke);
