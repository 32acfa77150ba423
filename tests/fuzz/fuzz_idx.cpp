// libFuzzer target: data::read_idx on an arbitrary file (plain or gzip). Every input either throws
// flux::Error or gives a CPU tensor whose shape is the file's dimensions and whose element count
// matches the data it holds; the Float32 conversion gives the same shape.
#include "flux/flux.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = flux_fuzz::input_path(data, size);
  Tensor t;
  try {
    t = data::read_idx(path);
  } catch (const Error&) {
    return 0;
  }
  flux_fuzz::check(t.defined() && t.device() == Device(), "read_idx gave no CPU tensor");
  Tensor f = data::read_idx(path, DType::f32);
  flux_fuzz::check(f.shape() == t.shape() && f.dtype() == DType::f32, "read_idx(path, Float32) changed the shape");
  if (t.numel() > 0 && t.numel() < 4096) {
    auto a = t.to_vector<double>(), b = f.to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i)
      flux_fuzz::check(a[i] == a[i] ? float(a[i]) == float(b[i]) : b[i] != b[i], "Float32 conversion changed a value");
  }
  return 0;
}
