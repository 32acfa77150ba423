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

void emit(const ops::Op& op, std::initializer_list<Tensor> inputs, const Tensor& output, std::vector<Attr> attrs) {
  emit(op, std::vector<Tensor>(inputs), output, std::move(attrs));
}

namespace {
const Attr* find(const std::vector<Attr>& attrs, const char* name) {
  for (const Attr& a : attrs)
    if (std::strcmp(a.name, name) == 0) return &a;
  return nullptr;
}
}  // namespace

std::vector<int64_t> Event::ints(const char* name) const {
  const Attr* a = find(attrs, name);
  return a ? a->ints : std::vector<int64_t>{};
}
int64_t Event::int1(const char* name, int64_t dflt) const {
  const Attr* a = find(attrs, name);
  return a && !a->ints.empty() ? a->ints[0] : dflt;
}
double Event::float1(const char* name, double dflt) const {
  const Attr* a = find(attrs, name);
  return a && !a->floats.empty() ? a->floats[0] : dflt;
}

}  // namespace flux::trace
