// Printing helpers shared by every layer's display (underscored counts, byte sizes, readable names
// of callables).
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

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

namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

void erase_all(std::string& s, const std::string& what) {
  for (size_t p; (p = s.find(what)) != std::string::npos;) s.erase(p, what.size());
}

/// "flux::Tensor" -> "Tensor", "(anonymous namespace)::f" -> "f".
std::string tidy(std::string s) {
  erase_all(s, "(anonymous namespace)::");
  erase_all(s, "flux::");
  return s;
}

}  // namespace

std::string type_name(const std::type_info& type) {
  std::string d = tidy(demangle(type.name()));
  // A closure: "scope::{lambda(Tensor const&)#1}" -> "lambda(Tensor const&)#1 in scope".
  const size_t open = d.rfind("{lambda(");
  if (open != std::string::npos) {
    const size_t close = d.find('}', open);
    std::string lambda = d.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
    std::string scope = d.substr(0, open);
    if (scope.size() >= 2 && scope.compare(scope.size() - 2, 2, "::") == 0) scope.resize(scope.size() - 2);
    return scope.empty() ? lambda : lambda + " in " + scope;
  }
  return d;
}

std::string function_name(const void* address) {
  Dl_info info{};
  if (!address || dladdr(address, &info) == 0 || !info.dli_sname || info.dli_saddr != address) return "";
  std::string d = tidy(demangle(info.dli_sname));
  const size_t paren = d.find('(');
  return paren == std::string::npos ? d : d.substr(0, paren);
}

}  // namespace show

}  // namespace flux
