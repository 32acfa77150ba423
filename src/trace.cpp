#include "src/trace.hpp"

namespace flux::trace {

thread_local Recorder* g_recorder = nullptr;

void emit(const char* op, std::vector<Tensor> inputs, const Tensor& output, std::vector<Attr> attrs) {
  Recorder* r = g_recorder;
  if (!r || !output.defined()) return;
  // An op that returned one of its inputs unchanged (a cast to the same dtype) adds nothing.
  for (const Tensor& in : inputs)
    if (in.defined() && in.impl() == output.impl()) return;
  g_recorder = nullptr;  // the recorder may run ops of its own
  try {
    r->record(Event{op, std::move(inputs), output, std::move(attrs)});
  } catch (...) {
    g_recorder = r;
    throw;
  }
  g_recorder = r;
}

void emit(const char* op, std::initializer_list<Tensor> inputs, const Tensor& output, std::vector<Attr> attrs) {
  emit(op, std::vector<Tensor>(inputs), output, std::move(attrs));
}

}  // namespace flux::trace
