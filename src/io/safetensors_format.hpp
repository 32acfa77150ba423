// The safetensors byte format on its own (no tensors, no devices), so that the reader can be fuzzed
// in isolation (tests/fuzz). Spec: https://github.com/huggingface/safetensors#format
//   [0, 8)        N, u64 little-endian
//   [8, 8 + N)    UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//                 "__metadata__": {string: string}}, padded with spaces
//   [8 + N, end)  the data section; offsets are relative to its start, cover it fully, no overlaps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flux/dtype.hpp"

namespace flux::safetensors {

/// The header limit of the reference implementation (100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct Layout {
  uint64_t data_start = 0;        // 8 + N: where the data section begins in the file
  std::vector<Entry> entries;     // ordered by data offset
  std::map<std::string, std::string> metadata;
};

/// Parses and validates the header of a whole file image; every problem throws flux::Error whose
/// message starts with `context` (e.g. "[load] model.safetensors"). Never reads outside [data, data + size).
Layout parse(const uint8_t* data, size_t size, const std::string& context);

/// Assigns data offsets to `entries` (sorted by alignment, largest first, then name, as the reference
/// writer does) and returns the header bytes: the length prefix plus the space-padded JSON.
std::string make_header(std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata,
                        const std::string& context);

/// "F32", "BF16", "BOOL", ...
const char* dtype_code(DType t);
/// Bytes per element of t (the format's own table, independent of libflux).
size_t element_size(DType t);

}  // namespace flux::safetensors
