// libFuzzer target: load_checkpoint into a small model with an OptimiserChain(ClipNorm, Adam) state
// (model tensors, moment buffers, step counts, dtype conversion on load). Every input either throws
// flux::Error, leaving the model and state as they were when the file does not match, or restores a
// state that save_checkpoint + load_checkpoint reproduce bit for bit.
#include "flux/flux.hpp"
#define FLUX_FUZZ_WITH_TENSORS
#include "flux/backend.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

namespace {
auto make_model() { return Chain(Dense(2, 3, relu), Dense(3, 1)); }
using Model = decltype(make_model());

optimisers::State make_state(const Model& m) {
  return optimisers::setup(optimisers::OptimiserChain(optimisers::ClipNorm(1.0), optimisers::Adam(1e-3)), m);
}

std::string snapshot(const Model& m, const optimisers::State& s) {
  std::string out;
  for (const auto& [name, t] : pytorch_state(m)) out += name + "=" + flux_fuzz::raw_bytes(t) + ";";
  io_detail::Targets opt;
  io_detail::add_optimiser_state(s, opt);
  for (const auto& [name, t] : opt) out += name + "=" + flux_fuzz::raw_bytes(t) + ";";
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = flux_fuzz::input_path(data, size);
  Model model = make_model();
  optimisers::State state = make_state(model);
  const std::string before = snapshot(model, state);
  Metadata meta;
  try {
    meta = load_checkpoint(path, model, state);
  } catch (const Error& e) {
    // A file that does not match is refused before anything changes (a data error after the checks
    // cannot happen: parse() has bounded every tensor).
    flux_fuzz::check(snapshot(model, state) == before, "a refused checkpoint changed the model or its state");
    return 0;
  }
  const std::string loaded = snapshot(model, state);
  const std::string out = flux_fuzz::scratch_dir() + "/roundtrip.checkpoint";
  save_checkpoint(out, model, state, meta);
  Model model2 = make_model();
  optimisers::State state2 = make_state(model2);
  Metadata meta2 = load_checkpoint(out, model2, state2);
  flux_fuzz::check(snapshot(model2, state2) == loaded, "a checkpoint round trip changed a tensor or a step count");
  flux_fuzz::check(meta2 == load_metadata(out), "metadata differ after a round trip");
  return 0;
}
