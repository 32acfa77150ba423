// Checked size arithmetic: every element count, byte count and window size the library computes from
// user input goes through these, so an overflowing or negative size is a flux::Error naming the API
// and the values instead of a wrapped count (an object without storage, then a crash).
#pragma once
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "flux/dtype.hpp"
#include "flux/out_of_memory.hpp"
#include "flux/tensor.hpp"

namespace flux::detail {

/// The element count of `shape` for the public API `api`: every dimension >= 0, the count within
/// int64 and its bytes in dtype t within the address space; otherwise a flux::Error naming api and
/// the shape. What is representable but too large for memory fails later, at allocation, as OutOfMemory.
int64_t checked_numel(const char* api, const Shape& shape, DType t = DType::f32);
/// a * b and a + b for the sizes named in `what` (e.g. "the padded input"), or a flux::Error naming
/// api, what and both operands.
int64_t checked_mul(const char* api, const char* what, int64_t a, int64_t b);
int64_t checked_add(const char* api, const char* what, int64_t a, int64_t b);

/// A host buffer of n values for `api`: std::bad_alloc / std::length_error become flux::OutOfMemory
/// (host memory), so a huge request is never a std exception.
template <class T> std::vector<T> host_vector(const char* api, int64_t n) {
  try {
    return std::vector<T>(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  throw OutOfMemory("CPU", static_cast<size_t>(n) * sizeof(T), 0, 0, 0,
                    std::string("host memory for [") + api + "]");
}

}  // namespace flux::detail
