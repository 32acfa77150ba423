// Printing helpers shared by every layer's display (underscored counts, byte sizes).
#include <cstdio>

#include "flux/nn/show.hpp"

namespace flux {

namespace show {
std::string underscorise(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count && count % 3 == 0) out.insert(out.begin(), '_');
    out.insert(out.begin(), *it);
    ++count;
  }
  return n < 0 ? "-" + out : out;
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"byte", "KiB", "MiB", "GiB", "TiB"};
  double b = double(bytes);
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu byte%s", bytes, bytes == 1 ? "" : "s");
  else std::snprintf(buf, sizeof buf, "%.3f %s", b, units[u]);
  return buf;
}
}  // namespace show

}  // namespace flux
