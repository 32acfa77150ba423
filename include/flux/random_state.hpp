// The global random generators' state as a value, to save and restore exactly (resuming a run):
//   RandomState g = random_state();   ...   set_random_state(g);   // the same draws again
// Two generators make the state: the host generator (rand, randn, randperm, init, DataLoader's
// shuffle seed) and the device stream (rand_like, dropout), whose values are a pure function of its
// seed and call counter on every device. Devices hold no generator of their own, so one value covers
// the CPU, OpenCL and CUDA alike. save_checkpoint stores it; load_checkpoint restores it.
#pragma once
#include <cstdint>
#include <random>
#include <string>

namespace flux {

struct RandomState {
  std::mt19937_64 host;         // the host generator, as seed(n) left it and draws advanced it
  uint64_t device_seed = 0;     // the device stream's seed (seed(n) sets it to n)
  uint64_t device_counter = 0;  // values the device stream has drawn since the seed
  bool operator==(const RandomState&) const = default;
};

/// The current state of both generators.
RandomState random_state();
/// Makes both generators continue from `state`.
void set_random_state(const RandomState& state);
/// The state as text (one line, as save_checkpoint stores it), and back; parse_random_state throws
/// flux::Error naming what is malformed.
std::string to_string(const RandomState& state);
RandomState parse_random_state(const std::string& text);

}  // namespace flux
