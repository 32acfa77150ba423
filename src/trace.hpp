// Op tracing (not installed): while a Recorder is installed on this thread, every op of the op layer
// that runs a kernel reports itself (its entry in src/ops/registry.hpp, input and output tensors,
// attributes) once, right after it computed its result. onnx::save (src/onnx/export.cpp) installs one for a single inference forward.
// Off, the cost per op is one thread-local load and a branch. Ops composed from other ops report
// nothing themselves; an op that reports after its inner ops did (layernorm over reshapes, say) is
// the producer of its result from then on, and the exporter drops inner results nothing reads.
#pragma once
#include <cstdint>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::ops {
struct Op;  // src/ops/registry.hpp
}

namespace flux::trace {

struct Attr {
  const char* name;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct Event {
  const ops::Op* op;
  std::vector<Tensor> inputs;  // an undefined entry: an optional input that was absent
  Tensor output;
  std::vector<Attr> attrs;

  const Attr* attr(const char* name) const;  // nullptr when absent
  std::vector<int64_t> ints(const char* name) const { return attr(name) ? attr(name)->ints : std::vector<int64_t>{}; }
  int64_t int1(const char* name) const { return attr(name) && !attr(name)->ints.empty() ? attr(name)->ints[0] : 0; }
  double float1(const char* name) const { return attr(name) && !attr(name)->floats.empty() ? attr(name)->floats[0] : 0; }
};

class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void record(Event event) = 0;
};
/// A recorder that keeps every event.
struct Events final : Recorder {
  std::vector<Event> events;
  void record(Event e) override { events.push_back(std::move(e)); }
};

extern thread_local Recorder* g_recorder;

inline bool active() { return g_recorder != nullptr; }
/// Reports one op to the installed recorder (call only when active()).
void emit(const ops::Op& op, std::vector<Tensor> inputs, const Tensor& output, std::vector<Attr> attrs = {});

/// Installs `r` on this thread for its scope.
class Scope {
 public:
  explicit Scope(Recorder* r) : saved_(g_recorder) { g_recorder = r; }
  ~Scope() { g_recorder = saved_; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Recorder* saved_;
};

}  // namespace flux::trace
