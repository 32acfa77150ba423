// The tuned kernel table (flux-tune's output): for each query timed on this CPU, the kernel that ran
// fastest. Read once, on the first choice, from the file tuned_table_path() names; a table made on
// another CPU model, for another flux version, or that does not parse is ignored with one warning.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/backends/cpu/kernel_choice.hpp"

namespace flux::cpu_backend {

/// A table's entries: a query and the kernel that runs it.
using TunedEntries = std::vector<std::pair<Query, Kernel>>;

/// The tuned kernel for q, if the table has it (lock-free after the first call).
std::optional<Kernel> tuned_choice(const Query& q);
/// What keys a table to this machine: the CPU model name, the detected ISA and flux's version.
std::string cpu_key();
/// Where the table is read from and written to: $FLUX_KERNEL_TABLE, else flux-kernels.tsv beside the
/// preferences file (see tuned_table.cpp).
std::string tuned_table_path();
/// Writes `entries` for this machine to `path` (whole file or nothing: a temporary renamed over it).
void save_tuned_table(const std::string& path, const TunedEntries& entries);
/// The entries of the table at `path` when it is valid for this machine (the tuner adds to them);
/// nullopt with `why` empty when there is no file, with `why` saying what is wrong otherwise.
std::optional<TunedEntries> read_tuned_table(const std::string& path, std::string& why);
/// Drops the loaded table so that the next choice reads the file again (the tuner, tests).
void reload_tuned_table();

}  // namespace flux::cpu_backend
