// libFuzzer target for the safetensors reader (src/io/safetensors_format.cpp), built with clang and ASan by
// tests/fuzz/run_fuzz.sh. Every input either throws flux::Error or yields a layout whose tensors all
// lie inside the input; a valid layout must survive a write/parse round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "flux/error.hpp"
#include "src/io/safetensors_format.hpp"

using namespace flux::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Layout layout;
  try {
    layout = parse(data, size, "[fuzz] input");
  } catch (const flux::Error&) {
    return 0;
  }
  // Read every byte the loader would copy (ASan reports any read outside the input).
  uint8_t sink = 0;
  for (const Entry& e : layout.entries)
    for (uint64_t i = e.begin; i < e.end; ++i) sink ^= data[layout.data_start + i];
  if (layout.data_start > size) std::abort();

  // Round trip: write the same entries and metadata, parse again, expect the same tensors.
  std::vector<Entry> entries = layout.entries;
  std::string file = make_header(entries, layout.metadata, "[fuzz] rewrite");
  uint64_t data_bytes = 0;
  for (const Entry& e : entries) data_bytes += e.end - e.begin;
  file.append(data_bytes, char(sink));
  Layout again = parse(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "[fuzz] reparse");
  if (again.entries.size() != layout.entries.size() || again.metadata != layout.metadata) std::abort();
  if ((file.size() - data_bytes) % 8 != 0) std::abort();
  return 0;
}
