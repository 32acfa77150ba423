#include "src/trace.hpp"

#include <cstring>

namespace flux::trace {

thread_local Recorder* g_recorder = nullptr;

void emit(const ops::Op& op, std::vector<Tensor> inputs, const Tensor& output, std::vector<Attr> attrs) {
  Recorder* r = g_recorder;
  if (!r || !output.defined()) return;
  // An op that returned one of its inputs unchanged (a cast to the same dtype) adds nothing.
  for (const Tensor& in : inputs)
    if (in.defined() && in.impl() == output.impl()) return;
  g_recorder = nullptr;  // the recorder may run ops of its own
  try {
    r->record(Event{&op, std::move(inputs), output, std::move(attrs)});
  } catch (...) {
    g_recorder = r;
    throw;
  }
  g_recorder = r;
}

const Attr* Event::attr(const char* name) const {
  for (const Attr& a : attrs)
    if (std::strcmp(a.name, name) == 0) return &a;
  return nullptr;
}

}  // namespace flux::trace
