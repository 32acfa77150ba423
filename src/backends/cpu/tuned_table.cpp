// The tuned kernel table (tuned_table.hpp). The file is text, one line each, fields split by tabs:
//   flux-kernel-table 1
//   cpu     <cpu_key()>
//   <site>  <threads>  <dims[0]> ... <dims[17]>  <kernel>      one line per query
// with site and kernel spelt as site_name() and kernel_name() spell them; blank lines and lines
// starting with '#' are skipped. A table for another machine, a line that does not parse, a name this
// build does not know or a repeated query make the whole table ignored, with one warning: a table
// half read would mix tuned and ruled choices without saying so.
#include "src/backends/cpu/tuned_table.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>

#include "flux/error.hpp"
#include "flux/version.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/environment.hpp"
#include "src/internal.hpp"

namespace flux::cpu_backend {

namespace {
constexpr const char* kMagic = "flux-kernel-table 1";
constexpr size_t kFields = 2 + 18 + 1;             // site, threads, dims, kernel
constexpr uintmax_t kMaxTableBytes = 16u << 20;    // far above any model's shapes; refuses /dev/zero & co.

bool query_less(const std::pair<Query, Kernel>& a, const std::pair<Query, Kernel>& b) { return a.first < b.first; }

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

bool parse_int(const std::string& s, int64_t& v) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  return !s.empty() && ec == std::errc() && p == end;
}

// The entries of `text` when it is a valid table for this machine; nullopt with `why` otherwise.
std::optional<TunedEntries> parse_table(const std::string& text, std::string& why) {
  if (!text.empty() && text.back() != '\n') {
    why = "the last line is cut short (no newline at its end)";
    return std::nullopt;
  }
  std::istringstream in(text);
  std::string line;
  int number = 0;
  bool magic = false, keyed = false;
  TunedEntries entries;
  auto bad = [&](const std::string& what) {
    why = "line " + std::to_string(number) + ": " + what;
    return std::nullopt;
  };
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!magic) {
      if (line != kMagic) return bad("expected \"" + std::string(kMagic) + "\" (not a flux kernel table)");
      magic = true;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = split_tabs(line);
    if (!keyed) {
      if (f.size() != 2 || f[0] != "cpu") return bad("expected \"cpu<TAB><machine>\"");
      if (f[1] != cpu_key()) {
        why = "it was made on \"" + f[1] + "\", this machine is \"" + cpu_key() + "\"";
        return std::nullopt;
      }
      keyed = true;
      continue;
    }
    if (f.size() != kFields)
      return bad(std::to_string(f.size()) + " fields, expected " + std::to_string(kFields) +
                 " (site, threads, 18 dims, kernel)");
    std::optional<Site> site = site_from_name(f[0]);
    if (!site) return bad("unknown site \"" + f[0] + "\"");
    std::optional<Kernel> kernel = kernel_from_name(f.back());
    if (!kernel) return bad("unknown kernel \"" + f.back() + "\"");
    Query q;
    q.site = *site;
    int64_t threads = 0;
    if (!parse_int(f[1], threads) || threads < 1 || threads > (1 << 20))
      return bad("threads \"" + f[1] + "\" is not a thread count");
    q.threads = int(threads);
    for (size_t d = 0; d < q.dims.size(); ++d)
      if (!parse_int(f[2 + d], q.dims[d])) return bad("dim " + std::to_string(d) + " \"" + f[2 + d] + "\" is not an integer");
    entries.emplace_back(q, *kernel);
  }
  if (!magic) {
    why = "the file is empty";
    return std::nullopt;
  }
  if (!keyed) return bad("no \"cpu<TAB><machine>\" line");
  std::stable_sort(entries.begin(), entries.end(), query_less);
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].first == entries[i - 1].first) {
      why = std::string("a ") + site_name(entries[i].first.site) + " query is listed twice";
      return std::nullopt;
    }
  return entries;
}

// The text of sorted, distinct entries.
std::string table_text(const TunedEntries& entries) {
  std::ostringstream text;
  text << kMagic << "\ncpu\t" << cpu_key() << "\n# site\tthreads\tdims (18, as kernel_choice.hpp lists them per site)\tkernel\n";
  for (const auto& [q, k] : entries) {
    text << site_name(q.site) << '\t' << q.threads;
    for (int64_t d : q.dims) text << '\t' << d;
    text << '\t' << kernel_name(k) << '\n';
  }
  return text.str();
}

// Reads the table at `path`: nullopt with an empty `why` when there is no file, with `why` set when
// there is one that cannot be used.
std::optional<TunedEntries> read_table(const std::string& path, std::string& why) {
  why.clear();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) return std::nullopt;  // no table: the rules, silently
  if (!std::filesystem::is_regular_file(status)) {
    why = std::filesystem::is_directory(status) ? "it is a directory" : "it is not a regular file";
    return std::nullopt;
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxTableBytes) {
    why = ec ? ec.message() : "it is larger than 16 MiB";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    why = "it cannot be read";
    return std::nullopt;
  }
  return parse_table(text, why);
}

// The table this process uses: read on the first choice, then shared read-only. A reload swaps in
// a new one; the old ones stay allocated (a choice in another thread may still be reading one), and
// reachable, for leak checkers.
std::atomic<const TunedEntries*> g_table{nullptr};
std::mutex g_load_mutex;
std::vector<std::unique_ptr<const TunedEntries>>& loaded_tables() {
  static auto* tables = new std::vector<std::unique_ptr<const TunedEntries>>();  // never destroyed
  return *tables;
}

const TunedEntries& table() {
  if (const TunedEntries* t = g_table.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (const TunedEntries* t = g_table.load(std::memory_order_acquire)) return *t;
  const std::string path = tuned_table_path();
  std::string why;
  std::optional<TunedEntries> read = read_table(path, why);
  if (!why.empty())
    detail::log_warning_once("[flux] ignoring the kernel table " + path + ": " + why +
                             ". The built-in rules choose the CPU kernels (flux-tune writes a table for this machine).");
  loaded_tables().push_back(std::make_unique<const TunedEntries>(read ? std::move(*read) : TunedEntries{}));
  const TunedEntries* t = loaded_tables().back().get();
  g_table.store(t, std::memory_order_release);
  return *t;
}

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(colon + 1);
    for (char& c : name)
      if (c == '\t' || c == '\r') c = ' ';
    const size_t first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
    if (first != std::string::npos) return name.substr(first, last - first + 1);
  }
  return "unknown CPU";
}
}  // namespace

std::optional<Kernel> tuned_choice(const Query& q) {
  const TunedEntries& t = table();
  if (t.empty()) return std::nullopt;
  // The table was timed with the kernels at the CPU's full ISA; a run capped below it (force_isa,
  // bench's --max-isa) is another machine in effect, and the rules decide there.
  if (active_isa() != detected_isa()) return std::nullopt;
  auto it = std::lower_bound(t.begin(), t.end(), std::pair<Query, Kernel>(q, Kernel::openblas), query_less);
  if (it == t.end() || !(it->first == q)) return std::nullopt;
  return it->second;
}

std::string cpu_key() {
  static const std::string key =
      read_cpu_model() + " | " + isa_name(detected_isa()) + " | flux " + FLUX_VERSION_STRING;
  return key;
}

std::string tuned_table_path() {
  if (const std::optional<std::string> p = environment::value("FLUX_KERNEL_TABLE")) return *p;
  return (std::filesystem::path(detail::preferences_file()).parent_path() / "flux-kernels.tsv").string();
}

std::optional<TunedEntries> read_tuned_table(const std::string& path, std::string& why) { return read_table(path, why); }

void save_tuned_table(const std::string& path, const TunedEntries& entries) {
  TunedEntries sorted = entries;
  std::stable_sort(sorted.begin(), sorted.end(), query_less);
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first == sorted[i - 1].first)
      detail::fail("[tune_kernels] cannot write the kernel table ", path, ": a ", site_name(sorted[i].first.site),
                   " query is given twice");
  const std::string body = table_text(sorted);

  // Whole file or nothing: a temporary in the same folder, flushed to disk, renamed over the table.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto failed = [&](const std::string& what, int err) {
    std::remove(tmp.c_str());
    detail::fail("[tune_kernels] cannot write the kernel table ", path, ": ", what, " (", std::strerror(err), ")");
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) failed("cannot create " + tmp, errno);
  const bool written = std::fwrite(body.data(), 1, body.size(), f) == body.size() && std::fflush(f) == 0 &&
                       ::fsync(::fileno(f)) == 0;
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) failed("writing " + tmp + " failed", written ? errno : write_errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) failed("cannot rename " + tmp + " over it", errno);
}

void reload_tuned_table() {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  g_table.store(nullptr, std::memory_order_release);
}

}  // namespace flux::cpu_backend
