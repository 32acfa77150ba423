// libFuzzer target: load_checkpoint into a small model with an OptimiserChain(ClipNorm, Adam) state
// (model tensors, moment buffers, step counts, dtype conversion on load). Every input either throws
// flux::Error, leaving the model and state as they were when the file does not match, or restores a
// state that save_checkpoint + load_checkpoint reproduce bit for bit.
// The model, its state and their snapshot are made once per process and made afresh only after a
// file was accepted (which changes them), so a refused input costs one load attempt and one snapshot.
// Building and snapshotting a model per input made this target ~10x slower than the other readers.
// Every input still meets a freshly made model and state, so a crash reproduces from its input alone.
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
  struct Fresh {
    Model model = make_model();
    optimisers::State state = make_state(model);
    std::string snap = snapshot(model, state);
  };
  static Fresh* target = new Fresh;  // what the input is loaded into (reachable at exit: no leak report)
  const std::string& path = flux_fuzz::input_path(data, size);
  Metadata meta;
  try {
    meta = load_checkpoint(path, target->model, target->state);
  } catch (const Error& e) {
    // A file that does not match is refused before anything changes (a data error after the checks
    // cannot happen: parse() has bounded every tensor).
    flux_fuzz::check(snapshot(target->model, target->state) == target->snap,
                     "a refused checkpoint changed the model or its state");
    return 0;
  }
  const std::string loaded = snapshot(target->model, target->state);
  const std::string out = flux_fuzz::scratch_dir() + "/roundtrip.checkpoint";
  save_checkpoint(out, target->model, target->state, meta);
  Fresh roundtrip;
  Metadata meta2 = load_checkpoint(out, roundtrip.model, roundtrip.state);
  flux_fuzz::check(snapshot(roundtrip.model, roundtrip.state) == loaded,
                   "a checkpoint round trip changed a tensor or a step count");
  flux_fuzz::check(meta2 == load_metadata(out), "metadata differ after a round trip");
  delete target;
  target = new Fresh;  // the next input meets an untouched model again
  return 0;
}
