// Determinism across processes (issue 37): the same program with the same seed, run twice on the same
// machine with the same thread count, gives the same bits. The test runs its own binary twice as child
// processes (this test alone, FLUX_DETERMINISM_HASHES naming the file each child writes); each child
// builds the models from the seed and writes a 64-bit hash of the float bits of: an MLP's inference
// (784-512-512-10, batch 32), ResNet-18 at batch 1 and 8 (32x32 images), an LSTM + Dense inference,
// and one training step of a CNN with BatchNorm (the loss and every gradient). The parent requires
// both files complete and equal. On every device.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "flux/models/resnet.hpp"
#include "test_devices.hpp"

using namespace flux;

namespace {

class Determinism : public ::testing::TestWithParam<Device> {};

/// FNV-1a over the bytes of the values (float32 bits).
uint64_t hash_bits(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string line(const std::string& name, const Tensor& t) {
  std::ostringstream os;
  os << name << ' ' << t.numel() << ' ' << std::hex << hash_bits(t.to_vector<float>()) << '\n';
  return os.str();
}

/// What each child computes, one "name count hash" line per result, every model built from the seed.
std::string hashes(const Device& dev) {
  std::string out;
  seed(3731);
  {
    auto mlp = Chain(Dense(784, 512, relu), Dense(512, 512, relu), Dense(512, 10)) | dev;
    testmode(mlp);
    out += line("mlp", mlp(to(randn(Shape{32, 784}), dev)));
  }
  {
    auto resnet = models::ResNet18(10) | dev;
    testmode(resnet);
    out += line("resnet18_batch1", resnet(to(randn(Shape{1, 3, 32, 32}), dev)));
    out += line("resnet18_batch8", resnet(to(randn(Shape{8, 3, 32, 32}), dev)));
  }
  {
    auto lstm = Chain(LSTM(32, 64), Dense(64, 10)) | dev;
    testmode(lstm);
    out += line("lstm", lstm(to(randn(Shape{4, 16, 32}), dev)));
  }
  {
    auto cnn = Chain(Conv({3, 3}, 3, 16, {.pad = 1}), BatchNorm(16, relu), MaxPool({2, 2}), flatten,
                     Dense(16 * 8 * 8, 10)) |
               dev;
    const Tensor x = to(randn(Shape{8, 3, 16, 16}), dev), y = to(randn(Shape{8, 10}), dev);
    auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, cnn);
    out += line("train_loss", loss);
    int i = 0;
    for (const Tensor& g : params(grads)) out += line("train_grad" + std::to_string(i++), g);
  }
  return out;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_P(Determinism, TwoProcessesGiveTheSameBits) {
  const Device dev = GetParam();
  if (const char* out = std::getenv("FLUX_DETERMINISM_HASHES"); out && *out) {  // a child
    std::ofstream(out) << hashes(dev);
    return;
  }
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string(info->test_suite_name()) + "." + info->name();
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::string files[2];
  for (int run = 0; run < 2; ++run) {
    const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                       ("flux_determinism_" + std::to_string(getpid()) + "_" + std::to_string(run));
    const std::string command = "FLUX_DETERMINISM_HASHES='" + file.string() + "' '" + self.string() +
                                "' --gtest_filter='" + filter + "' > /dev/null 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    files[run] = read_file(file);
    std::filesystem::remove(file);
  }
  // Complete: the 5 results and at least the CNN's 6 gradients (conv, BatchNorm and Dense weights, biases).
  EXPECT_GE(std::count(files[0].begin(), files[0].end(), '\n'), 11) << files[0];
  EXPECT_EQ(files[0], files[1]) << "first process:\n" << files[0] << "second process:\n" << files[1];
}

FLUX_DEVICE_SUITE(Determinism);
