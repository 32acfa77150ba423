// Checked size arithmetic (src/checked_size.hpp).
#include "src/checked_size.hpp"

#include <cstddef>
#include <limits>

#include "flux/error.hpp"

namespace flux::detail {

int64_t checked_numel(const char* api, const Shape& shape, DType t) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0) fail("[", api, "] negative dimension in shape ", to_string(shape));
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      fail("[", api, "] shape ", to_string(shape), " has more elements than an int64 can count (over ",
           std::numeric_limits<int64_t>::max(), ")");
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtype_size(t), &bytes) ||
      bytes > static_cast<size_t>(std::numeric_limits<std::ptrdiff_t>::max()))
    fail("[", api, "] shape ", to_string(shape), " has ", n, " elements: their bytes in ", dtype_name(t),
         " exceed the address space");
  return n;
}

int64_t checked_mul(const char* api, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    fail("[", api, "] ", what, " overflows: ", a, " × ", b, " is not a representable size");
  return r;
}

int64_t checked_add(const char* api, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    fail("[", api, "] ", what, " overflows: ", a, " + ", b, " is not a representable size");
  return r;
}

}  // namespace flux::detail
