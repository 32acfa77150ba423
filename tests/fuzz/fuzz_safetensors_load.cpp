// libFuzzer target: load_state / load_metadata on an arbitrary file (the data path: mapping, each
// tensor copied onto the CPU). Every input either throws flux::Error or loads tensors whose bytes
// survive save_state + load_state unchanged.
#include "flux/flux.hpp"
#define FLUX_FUZZ_WITH_TENSORS
#include "flux/backend.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = flux_fuzz::input_path(data, size);
  TensorMap tensors;
  Metadata meta;
  try {
    meta = load_metadata(path);
    tensors = load_state(path);
  } catch (const Error&) {
    return 0;
  }
  size_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  flux_fuzz::check(total <= size, "loaded tensors hold more bytes than the file");
  const std::string out = flux_fuzz::scratch_dir() + "/roundtrip.safetensors";
  save_state(out, tensors, meta);
  TensorMap again = load_state(out);
  flux_fuzz::check(again.size() == tensors.size() && load_metadata(out) == meta, "round trip changed names or metadata");
  for (const auto& [name, t] : tensors) {
    const Tensor& u = again.at(name);
    flux_fuzz::check(u.shape() == t.shape() && u.dtype() == t.dtype(), "round trip changed a shape or dtype");
    flux_fuzz::check(flux_fuzz::raw_bytes(t) == flux_fuzz::raw_bytes(u), "round trip changed a tensor's bytes");
  }
  return 0;
}
