// Interim: no tuned table is read yet (the rules decide); replaced by the table reader.
#include "src/backends/cpu/tuned_table.hpp"

namespace flux::cpu_backend {
std::optional<Kernel> tuned_choice(const Query&) { return std::nullopt; }
std::string cpu_key() { return {}; }
std::string tuned_table_path() { return {}; }
void save_tuned_table(const std::string&, const std::vector<std::pair<Query, Kernel>>&) {}
void reload_tuned_table() {}
}  // namespace flux::cpu_backend
