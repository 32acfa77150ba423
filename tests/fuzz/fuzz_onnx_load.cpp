// libFuzzer target for the ONNX reader (onnx::load_from_bytes, src/onnx/import.cpp), built with clang
// and ASan by tests/fuzz/run_fuzz.sh: every input either throws flux::Error or gives a model whose
// initialisers all hold the elements their shapes say, and whose summary prints.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flux/error.hpp"
#include "flux/onnx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flux::onnx::Model m;
  try {
    m = flux::onnx::load_from_bytes(std::string(reinterpret_cast<const char*>(data), size), "[fuzz] input");
  } catch (const flux::Error&) {
    return 0;
  }
  // The data of every initialiser came from the input: no tensor can hold more bytes than it.
  size_t bytes = 0;
  for (const auto& [name, t] : m.parameters) bytes += t.nbytes();
  for (const auto& [name, t] : m.buffers) bytes += t.nbytes();
  if (bytes > size) std::abort();
  if (m.summary().empty() || m.output_names().empty()) std::abort();
  return 0;
}
