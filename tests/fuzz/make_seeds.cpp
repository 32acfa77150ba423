// Writes the generated seed corpora of the fuzz targets that need real flux files (committed under
// corpus/<target>/; rerun after a format change): make_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>

#include "flux/flux.hpp"

using namespace flux;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/safetensors_load");
  std::filesystem::create_directories(dir + "/checkpoint");

  // Every dtype, a scalar, an empty tensor and metadata.
  TensorMap all;
  all["f32"] = Tensor(std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f}, Shape{2, 2});
  all["f64"] = Tensor(std::vector<double>{1e-300, -0.0, 7.0}, Shape{3});
  all["f16"] = all["f32"].cast(DType::f16);
  all["bf16"] = all["f32"].cast(DType::bf16);
  all["i32"] = Tensor(std::vector<int32_t>{-1, 2, 3}, Shape{3, 1});
  all["i64"] = Tensor(std::vector<int64_t>{42}, Shape{});
  all["u8"] = Tensor(std::vector<uint8_t>{0, 255}, Shape{2}, DType::u8);
  all["bool"] = Tensor(std::vector<uint8_t>{1, 0, 1}, Shape{3}, DType::boolean);
  all["empty"] = zeros(Shape{0, 4});
  save_state(dir + "/safetensors_load/dtypes.safetensors", all, {{"format", "pt"}, {"note", "seed"}});
  save_state(dir + "/safetensors_load/one.safetensors", {{"w", Tensor(std::vector<float>{1, 2, 3}, Shape{3})}});

  // The fuzz target's model and state (tests/fuzz/fuzz_checkpoint.cpp), after one Adam step.
  auto model = Chain(Dense(2, 3, relu), Dense(3, 1));
  auto state = optimisers::setup(optimisers::OptimiserChain(optimisers::ClipNorm(1.0), optimisers::Adam(1e-3)), model);
  Tensor x = Tensor(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f}, Shape{2, 2});
  Tensor y = Tensor(std::vector<float>{1.0f, -1.0f}, Shape{2, 1});
  auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
  optimisers::update(state, model, grads);
  save_checkpoint(dir + "/checkpoint/adam_step1.safetensors", model, state, {{"epoch", "1"}});
  // Float64 tensors of the same names: load converts them to the model's Float32.
  auto model64 = fmap([](const Tensor& t) { return t.f64(); }, model);
  auto state64 = optimisers::setup(optimisers::OptimiserChain(optimisers::ClipNorm(1.0), optimisers::Adam(1e-3)), model64);
  save_checkpoint(dir + "/checkpoint/f64.safetensors", model64, state64);
  // A model file, not a checkpoint (refused with a clear message).
  save(dir + "/checkpoint/model_only.safetensors", model);
  std::printf("seeds written under %s\n", dir.c_str());
  return 0;
}
