// tune_kernels (include/flux/tune.hpp), the CPU backend's tuner: records the kernel choices a workload
// makes, times each candidate with the site's registered Timer (kernel_choice.hpp), and saves the
// winners as the tuned table (tuned_table.hpp).
#include "flux/tune.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>

#include "flux/error.hpp"
#include "src/backends/cpu/conv_query.hpp"
#include "src/backends/cpu/isa.hpp"
#include "src/backends/cpu/kernel_choice.hpp"
#include "src/backends/cpu/matmul_query.hpp"
#include "src/backends/cpu/tuned_table.hpp"

namespace flux {

namespace {
using cpu_backend::Kernel;
using cpu_backend::Query;
using cpu_backend::Site;

// A query's fields as words, per site (matmul_query.hpp, conv_query.hpp).
std::string describe(const Query& q) {
  std::ostringstream os;
  switch (q.site) {
    case Site::gemm: {
      const cpu_backend::GemmQuery g = cpu_backend::GemmQuery::from(q);
      os << "m " << g.m << " n " << g.n << " k " << g.k << (g.trans_a ? " a^T" : "") << (g.trans_b ? " b^T" : "")
         << " ld " << g.lda << "," << g.ldb << "," << g.ldc << (g.accumulate ? " +C" : "");
      break;
    }
    case Site::linear: {
      const cpu_backend::LinearQuery l = cpu_backend::LinearQuery::from(q);
      os << "n " << l.n << " in " << l.in << " out " << l.out << (l.bias ? " bias" : "") << (l.relu ? " relu" : "");
      break;
    }
    case Site::linear_weights: {
      const cpu_backend::LinearWeightsQuery l = cpu_backend::LinearWeightsQuery::from(q);
      os << dtype_name(DType(l.dtype)) << " n " << l.n << " in " << l.in << " cols " << l.cols << (l.bias ? " bias" : "")
         << (l.relu ? " relu" : "");
      break;
    }
    case Site::bf16_transposed_a: {
      const cpu_backend::TransposedAQuery t = cpu_backend::TransposedAQuery::from(q);
      os << "m " << t.m << " n " << t.n << " k " << t.k << " a^T" << (t.trans_b ? " b^T" : "") << " pieces of "
         << t.piece_rows << " rows" << (t.float32_c ? " C Float32" : "");
      break;
    }
    case Site::conv_forward: {
      const cpu_backend::ConvQuery c = cpu_backend::ConvQuery::from(q);
      const int64_t spatial = std::clamp<int64_t>(c.spatial, 1, 3);
      auto axes = [&](const std::array<int64_t, 3>& v) {
        std::string s;
        for (int64_t i = 0; i < spatial; ++i) {
          if (i) s += 'x';
          s += std::to_string(v[size_t(i)]);
        }
        return s;
      };
      os << c.spatial << "d N " << c.batch << " C " << c.in_channels << " O " << c.out_channels << " in " << axes(c.in)
         << " k " << axes(c.kernel) << " s " << axes(c.stride) << " d " << axes(c.dilation);
      if (c.groups != 1) os << " groups " << c.groups;
      if (c.affine) os << " affine";
      break;
    }
  }
  return os.str();
}

// Turns recording off however the workload ends.
struct Recording {
  Recording() { cpu_backend::record_queries(true); }
  ~Recording() { cpu_backend::record_queries(false); }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
};

// One query timed: the entry for the report and, when timed, the kernel for the table.
TuneEntry tune_one(const Query& q, cpu_backend::Candidates candidates, const TuneOptions& options,
                   std::optional<Kernel>& chosen) {
  TuneEntry e;
  e.site = cpu_backend::site_name(q.site);
  e.shape = describe(q);
  e.threads = q.threads;
  const Kernel rule = cpu_backend::rule(q, candidates);
  e.rule = e.chosen = cpu_backend::kernel_name(rule);
  chosen.reset();
  if ((candidates & (candidates - 1)) == 0) {
    e.skipped = "one candidate";
    return e;
  }
  cpu_backend::Timer timer = cpu_backend::timer_of(q.site);
  if (!timer) {
    e.skipped = "no timer registered for this site";
    return e;
  }
  double best = std::numeric_limits<double>::infinity(), rule_time = best;
  Kernel fastest = rule;
  for (int k = 0; k < cpu_backend::kKernels; ++k) {
    if (!(candidates & cpu_backend::bit(Kernel(k)))) continue;
    TuneTiming t;
    t.kernel = cpu_backend::kernel_name(Kernel(k));
    try {
      t.seconds = timer(q, Kernel(k), options.reps);
      if (!(t.seconds >= 0) || !std::isfinite(t.seconds)) t.error = "the timer gave no time";
    } catch (const std::exception& ex) {
      t.error = ex.what();
    }
    if (t.error.empty()) {
      if (Kernel(k) == rule) rule_time = t.seconds;
      if (t.seconds < best) best = t.seconds, fastest = Kernel(k);
    }
    e.timings.push_back(std::move(t));
  }
  if (!std::isfinite(best)) {
    e.skipped = "no candidate could run it";
    e.timings.clear();
    return e;
  }
  // The rules' kernel stays unless another beats it by the margin: close calls do not flip between runs.
  const Kernel pick = best <= rule_time * (1 - options.margin) ? fastest : rule;
  e.chosen = cpu_backend::kernel_name(pick);
  chosen = pick;
  return e;
}
std::ostream& print_saved(std::ostream& os, const TuneReport& r) {
  if (r.path.empty()) return os << "Nothing saved.\n";
  return os << "Saved " << r.table_entries << " shape(s) to " << r.path << (r.note.empty() ? "" : "; " + r.note)
            << "\n";
}
}  // namespace

std::string kernel_table_path() { return cpu_backend::tuned_table_path(); }

TuneReport tune_kernels(const std::function<void()>& workload, const TuneOptions& options) {
  if (!workload) detail::fail("[tune_kernels] the workload is empty; pass a function that runs your model");
  if (options.reps < 1) detail::fail("[tune_kernels] reps must be at least 1; got ", options.reps);
  if (!(options.margin >= 0 && options.margin < 1))
    detail::fail("[tune_kernels] margin must be in [0, 1); got ", options.margin);
  if (cpu_backend::active_isa() != cpu_backend::detected_isa())
    detail::fail("[tune_kernels] the CPU kernels are capped at ", cpu_backend::isa_name(cpu_backend::active_isa()),
                 " below this CPU's ", cpu_backend::isa_name(cpu_backend::detected_isa()),
                 "; a table is timed and used at the full ISA");
  const std::string path = options.path.empty() ? cpu_backend::tuned_table_path() : options.path;
  if (options.save) {  // before the workload and the timings, not after
    std::error_code ec;
    const std::filesystem::path folder = std::filesystem::absolute(path, ec).parent_path();
    if (!std::filesystem::is_directory(folder, ec))
      detail::fail("[tune_kernels] cannot write the kernel table ", path, ": its folder ", folder.string(),
                   " does not exist");
  }
  // One tuning at a time: recording is process-wide.
  static std::mutex tuning;
  std::lock_guard<std::mutex> lock(tuning);

  {
    Recording recording;
    workload();
  }
  TuneReport report;
  report.cpu = cpu_backend::cpu_key();
  std::map<Query, Kernel> table;
  for (const auto& [q, candidates] : cpu_backend::recorded_queries()) {
    std::optional<Kernel> chosen;
    report.entries.push_back(tune_one(q, candidates, options, chosen));
    if (chosen) table[q] = *chosen;
  }
  if (!options.save) return report;

  std::string why;
  if (std::optional<cpu_backend::TunedEntries> earlier = cpu_backend::read_tuned_table(path, why))
    for (const auto& [q, k] : *earlier) table.emplace(q, k);  // this run's entries win
  else if (!why.empty())
    report.note = "replaced the unusable table there (" + why + ")";
  cpu_backend::save_tuned_table(path, cpu_backend::TunedEntries(table.begin(), table.end()));
  cpu_backend::reload_tuned_table();
  report.path = path;
  report.table_entries = table.size();
  return report;
}

std::ostream& operator<<(std::ostream& os, const TuneReport& r) {
  os << "Kernel choices on " << r.cpu << "\n";
  if (r.entries.empty()) os << "  (the workload made no CPU kernel choice)\n";
  if (r.entries.empty()) return print_saved(os, r);
  size_t shape_width = 5, site_width = 4;
  for (const TuneEntry& e : r.entries)
    shape_width = std::max(shape_width, e.shape.size()), site_width = std::max(site_width, e.site.size());
  const int site_w = int(site_width) + 2, shape_w = int(shape_width) + 2;
  os << "  " << std::left << std::setw(site_w) << "site" << std::setw(8) << "threads" << std::setw(shape_w) << "shape"
     << std::setw(10) << "rule" << std::setw(10) << "chosen" << "times (ms)\n";
  for (const TuneEntry& e : r.entries) {
    os << "  " << std::setw(site_w) << e.site << std::setw(8) << e.threads << std::setw(shape_w) << e.shape
       << std::setw(10) << e.rule << std::setw(10) << (e.skipped.empty() ? e.chosen : "-");
    if (!e.skipped.empty()) os << "skipped: " << e.skipped;
    for (size_t i = 0; i < e.timings.size(); ++i) {
      const TuneTiming& t = e.timings[i];
      os << (i ? ", " : "") << t.kernel << " ";
      if (t.error.empty())
        os << std::fixed << std::setprecision(4) << t.seconds * 1e3 << std::defaultfloat;
      else
        os << "failed (" << t.error << ")";
    }
    os << "\n";
  }
  os << std::right;
  return print_saved(os, r);
}

}  // namespace flux
