// The CPU kernel tuner: which kernel runs a shape (OpenBLAS or oneDNN for a GEMM, oneDNN or flux's
// panels for a Dense inference, oneDNN, Winograd or the few-pixel kernel for a conv) is decided by
// built-in rules; tune_kernels measures the candidates for the shapes your workload uses, on this
// CPU, and saves the fastest as a kernel table that later runs read in place of the rules.
//   auto report = flux::tune_kernels([&] { (void)model(x); });   // once, at the shapes you serve
//   std::cout << report;                                         // later runs read the table
// The table (kernel_table_path()) is keyed by CPU model, ISA and flux version; a run on another
// machine ignores it with one warning. Same table and same program: the same bits in every run.
// (The CPU backend implements this header: src/backends/cpu/tune.cpp.)
#pragma once
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace flux {

struct TuneOptions {
  int reps = 5;          // timings per kernel and shape; the best one counts
  double margin = 0.05;  // another kernel replaces the rules' choice only when this much faster (5%)
  std::string path{};    // the table to write; empty: kernel_table_path()
  bool save = true;      // false: measure and report, write nothing
};

/// One candidate kernel's time for one shape: the best of `reps` runs, or the error that stopped it.
struct TuneTiming {
  std::string kernel;
  double seconds = 0;
  std::string error;  // non-empty when the kernel could not run the shape
};

/// One shape the workload asked for.
struct TuneEntry {
  std::string site;    // "gemm" (a GEMM piece), "linear" (a Dense inference), "conv_forward"
  std::string shape;   // the shape, readable ("n 32 in 784 out 512 bias relu")
  int threads = 1;     // the pool's thread count it ran with
  std::string rule;    // the kernel the built-in rules choose
  std::string chosen;  // the kernel the table names: the fastest, or `rule` unless beaten by the margin
  std::vector<TuneTiming> timings;  // every candidate; empty when skipped
  std::string skipped;              // why the shape was not timed (no timer for its site, ...); else empty
};

struct TuneReport {
  std::string cpu;                 // the machine the table is for (CPU model | ISA | flux version)
  std::vector<TuneEntry> entries;  // in the order of site, threads, shape
  std::string path;                // the table written; empty when nothing was saved
  size_t table_entries = 0;        // shapes in the saved table: this run's and earlier runs' on this machine
  std::string note;                // e.g. that an unusable table at `path` was replaced
};
/// A table of the entries (site, shape, rule, chosen, times in ms) and the path written.
std::ostream& operator<<(std::ostream& os, const TuneReport& report);

/// Runs `workload` once (your model's forward or training step at the shapes you serve; its kernel
/// choices are recorded), times every candidate kernel of each recorded shape, and saves the choices,
/// added to the table's earlier entries for this machine, to options.path. The process reads the new
/// table at once. Throws flux::Error when the table cannot be written; rethrows the workload's errors.
TuneReport tune_kernels(const std::function<void()>& workload, const TuneOptions& options = {});

/// Where the kernel table is read from and saved to: $FLUX_KERNEL_TABLE when set, else
/// flux-kernels.tsv beside the preferences file (LocalPreferences.toml: $FLUX_PREFERENCES or the
/// current folder).
std::string kernel_table_path();

}  // namespace flux
