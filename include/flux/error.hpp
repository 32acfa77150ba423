// The one exception type; messages start with "[api]".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace flux {

/// Thrown for every misuse of the public API; what() names the API, the inputs and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <class... Args> [[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}
}  // namespace detail

}  // namespace flux
