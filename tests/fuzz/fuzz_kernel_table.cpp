// libFuzzer target: the CPU kernel table (src/backends/cpu/tuned_table.hpp) as every flux program
// reads it at its first kernel choice. "@CPU@" in an input stands for this machine's key, so that the
// seeds are valid tables on any machine. Reading never throws; it accepts a table or says why not;
// an accepted table is sorted and distinct, and saving it reads back to the same entries.
#include <algorithm>
#include <string>

#include "src/backends/cpu/tuned_table.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux::cpu_backend;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  const std::string key = cpu_key();
  for (size_t at = text.find("@CPU@"); at != std::string::npos; at = text.find("@CPU@", at + key.size()))
    text.replace(at, 5, key);
  std::string why;
  const std::optional<TunedEntries> entries =
      read_tuned_table(flux_fuzz::input_path(reinterpret_cast<const uint8_t*>(text.data()), text.size()), why);
  flux_fuzz::check(entries.has_value() == why.empty(), "a table accepted with a reason, or refused without one");
  if (!entries) return 0;
  for (size_t i = 1; i < entries->size(); ++i)
    flux_fuzz::check((*entries)[i - 1].first < (*entries)[i].first, "accepted entries are not sorted and distinct");
  const std::string saved = flux_fuzz::scratch_dir() + "/flux-kernels.tsv";
  save_tuned_table(saved, *entries);
  std::string again_why;
  const std::optional<TunedEntries> again = read_tuned_table(saved, again_why);
  flux_fuzz::check(again && *again == *entries, "a saved table does not read back to its entries");
  return 0;
}
