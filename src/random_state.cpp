#include "flux/random_state.hpp"

#include <sstream>

#include "flux/error.hpp"
#include "src/internal.hpp"

namespace flux {

namespace {
constexpr const char* kTag = "flux-random/1";
}

RandomState random_state() {
  RandomState s;
  s.host = detail::host_generator();
  auto [seed, counter] = detail::random_stream();
  s.device_seed = seed;
  s.device_counter = counter;
  return s;
}

void set_random_state(const RandomState& state) {
  detail::set_host_generator(state.host);
  detail::set_random_stream(state.device_seed, state.device_counter);
}

// "flux-random/1 <device seed> <device counter> <the host engine's own text form (312 words and its index)>"
std::string to_string(const RandomState& state) {
  std::ostringstream os;
  os << kTag << ' ' << state.device_seed << ' ' << state.device_counter << ' ' << state.host;
  return os.str();
}

RandomState parse_random_state(const std::string& text) {
  std::istringstream is(text);
  std::string tag;
  RandomState s;
  is >> tag;
  if (tag != kTag)
    detail::fail("[parse_random_state] expected text starting with '", kTag, "' (to_string(RandomState)); got '",
                 text.substr(0, 40), text.size() > 40 ? "...'" : "'");
  if (!(is >> s.device_seed >> s.device_counter))
    detail::fail("[parse_random_state] the device seed and counter after '", kTag, "' are not two unsigned integers");
  is >> s.host;
  if (is.fail()) detail::fail("[parse_random_state] the host generator's state is truncated or not numeric");
  is >> std::ws;
  if (!is.eof()) detail::fail("[parse_random_state] unexpected text after the host generator's state");
  return s;
}

}  // namespace flux
