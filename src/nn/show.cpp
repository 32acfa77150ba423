// Printing helpers shared by every layer's display (underscored counts, byte sizes, readable names
// of callables).
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

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

namespace {
/// The function symbol covering `offset` (an address less the object's load bias) in the ELF file's
/// .symtab, the full symbol table that an unstripped program keeps even for functions it does not
/// export (dladdr sees only the dynamic one). "" when the file is stripped or unreadable.
std::string symtab_lookup(const char* path, uintptr_t offset) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) map = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return "";
  const auto* base = static_cast<const unsigned char*>(map);
  const size_t size = size_t(st.st_size);
  std::string found;
  auto inside = [&](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (size >= sizeof(Elf64_Ehdr) && std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
      eh->e_shentsize == sizeof(Elf64_Shdr) && inside(eh->e_shoff, uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr))) {
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum && found.empty(); ++i) {
      const Elf64_Shdr& sym = sections[i];
      if (sym.sh_type != SHT_SYMTAB || sym.sh_link >= eh->e_shnum || sym.sh_entsize != sizeof(Elf64_Sym)) continue;
      const Elf64_Shdr& str = sections[sym.sh_link];
      if (!inside(sym.sh_offset, sym.sh_size) || !inside(str.sh_offset, str.sh_size)) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sym.sh_offset);
      const char* names = reinterpret_cast<const char*>(base + str.sh_offset);
      for (size_t k = 0; k < sym.sh_size / sizeof(Elf64_Sym); ++k) {
        const Elf64_Sym& s = syms[k];
        if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0 || s.st_name >= str.sh_size) continue;
        if (offset == s.st_value || (offset > s.st_value && offset < s.st_value + s.st_size)) {
          if (::strnlen(names + s.st_name, str.sh_size - s.st_name) < str.sh_size - s.st_name) found = names + s.st_name;
          break;
        }
      }
    }
  }
  ::munmap(map, size);
  return found;
}
}  // namespace

std::string function_name(const void* address) {
  if (!address) return "";
  Dl_info info{};
  link_map* object = nullptr;
  if (dladdr1(address, &info, reinterpret_cast<void**>(&object), RTLD_DL_LINKMAP) == 0) return "";
  std::string symbol;
  if (info.dli_sname && info.dli_saddr == address) {
    symbol = info.dli_sname;
  } else if (object) {  // not exported: the program's own symbol table (cached per address)
    static std::mutex mutex;
    static std::map<const void*, std::string> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(address);
    if (it == cache.end()) {
      const char* path = object->l_name && *object->l_name ? object->l_name : "/proc/self/exe";
      it = cache.emplace(address, symtab_lookup(path, reinterpret_cast<uintptr_t>(address) - object->l_addr)).first;
    }
    symbol = it->second;
  }
  if (symbol.empty()) return "";
  std::string d = tidy(demangle(symbol.c_str()));
  const size_t paren = d.find('(');
  return paren == std::string::npos ? d : d.substr(0, paren);
}

}  // namespace show

namespace {
std::string with_parameter(const char* name, double value, double default_value) {
  if (value == default_value) return name;
  std::ostringstream os;
  os << name << "(" << value << ")";
  return os.str();
}
}  // namespace
std::string layer_string(const LeakyRelu& f) { return with_parameter(LeakyRelu::name, f.a, 0.01); }
std::string layer_string(const Elu& f) { return with_parameter(Elu::name, f.a, 1.0); }

}  // namespace flux
