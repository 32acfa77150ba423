#include "flux/autodiff.hpp"

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "flux/ops.hpp"
#include "src/autodiff_state.hpp"

namespace flux::autodiff {

namespace {
thread_local Tape* g_active = nullptr;
thread_local int g_backward_depth = 0;  // Tape::backward calls running on this thread (src/autodiff_state.hpp)
std::atomic<uint64_t> g_generation{0};
struct BackwardRunning {
  BackwardRunning() { ++g_backward_depth; }
  ~BackwardRunning() { --g_backward_depth; }
};
}  // namespace

namespace {
// Whether t is tracked by a tape enclosing `tape` (one started before it on this thread and still
// recording): nested differentiation, which is refused (Tape::leaf in autodiff.hpp).
bool tracked_by_enclosing(const Tape* tape, const Tensor& t) {
  if (!t.defined() || t.impl()->tape_id < 0) return false;
  for (const Tape* outer = tape ? tape->enclosing() : nullptr; outer; outer = outer->enclosing())
    if (t.impl()->tape_generation == outer->generation()) return true;
  return false;
}

[[noreturn]] void refuse_nested() {
  detail::fail("[gradient] nested differentiation is not supported: a gradient (or withgradient) inside a ",
               "function being differentiated uses a tensor that the outer gradient tracks, and the outer ",
               "gradient would silently treat the inner result as a constant (d/dx of d/dx x^3 would give 0). ",
               "Take second derivatives by finite differences of gradients, or call the inner gradient inside ",
               "a flux::autodiff::NoGrad scope to use its value as a constant on purpose");
}
}  // namespace

Tape::Tape() : generation_(++g_generation), previous_(g_active) { g_active = this; }
Tape::~Tape() { g_active = previous_; }

Tensor Tape::leaf(const Tensor& x) {
  if (!x.defined()) return x;
  if (tracked_by_enclosing(this, x)) refuse_nested();
  auto impl = std::make_shared<TensorImpl>(*x.impl());
  impl->tape_id = int64_t(nodes_.size());
  impl->tape_generation = generation_;
  nodes_.push_back(Node{});
  return Tensor(impl);
}

bool recording() { return g_active != nullptr; }

bool tracked(const Tensor& t) {
  return g_active && t.defined() && t.impl()->tape_id >= 0 &&
         t.impl()->tape_generation == g_active->generation();
}

template <class List> void record_list(Tensor& out, const List& inputs, Backward& backward) {
  if (!g_active) return;
  Tape::Node node;
  bool any = false;
  node.inputs.reserve(inputs.size());
  for (const Tensor* in : inputs) {
    bool t = tracked(*in);
    if (!t && g_active->enclosing() && tracked_by_enclosing(g_active, *in)) refuse_nested();
    node.inputs.push_back(t ? in->impl()->tape_id : -1);
    any = any || t;
  }
  if (!any) return;
  node.backward = std::move(backward);
  auto& nodes = g_active->nodes();
  out.impl()->tape_id = int64_t(nodes.size());
  out.impl()->tape_generation = g_active->generation();
  nodes.push_back(std::move(node));
}

namespace {
std::atomic<bool> g_note_sites{false};
std::mutex g_sites_mutex;
std::set<std::string> g_sites;
void note_site(const Tensor& out, const char* file, int line) {
  if (!g_note_sites.load(std::memory_order_relaxed) || !tracked(out)) return;
  std::string s = std::string(file) + ":" + std::to_string(line);
  std::lock_guard<std::mutex> lock(g_sites_mutex);
  g_sites.insert(std::move(s));
}
}  // namespace

void record(Tensor& out, std::initializer_list<const Tensor*> inputs, Backward backward, const char* file, int line) {
  record_list(out, inputs, backward);
  note_site(out, file, line);
}
void record(Tensor& out, const std::vector<const Tensor*>& inputs, Backward backward, const char* file, int line) {
  record_list(out, inputs, backward);
  note_site(out, file, line);
}

void note_recorded_sites(bool enabled) { g_note_sites.store(enabled); }
std::vector<std::string> recorded_sites() {
  std::lock_guard<std::mutex> lock(g_sites_mutex);
  return {g_sites.begin(), g_sites.end()};
}

NoGrad::NoGrad() : saved_(g_active) { g_active = nullptr; }
NoGrad::~NoGrad() { g_active = saved_; }

void Tape::backward(const Tensor& output, double seed) {
  if (output.numel() != 1)
    detail::fail("[gradient] the function must return a scalar (one-element) tensor; got shape ",
                 to_string(output.shape()));
  if (!is_floating(output.dtype()))
    detail::fail("[gradient] the function returned a tensor of dtype ", dtype_name(output.dtype()),
                 "; a floating-point loss is needed");
  grads_.assign(nodes_.size(), Tensor());
  // For on_gradient_final: the leaves (nodes without inputs) grouped by the node that uses them
  // first; a leaf's gradient is final once backward has passed that node. -1: never used.
  std::vector<std::vector<int64_t>> final_after;
  if (on_final_) {
    std::vector<int64_t> first_use(nodes_.size(), -1);
    for (int64_t i = int64_t(nodes_.size()) - 1; i >= 0; --i)
      for (int64_t id : nodes_[i].inputs)
        if (id >= 0) first_use[id] = i;
    int64_t output_id = tracked(output) ? output.impl()->tape_id : -1;
    final_after.resize(nodes_.size());
    std::vector<int64_t> unused;
    for (int64_t id = 0; id < int64_t(nodes_.size()); ++id) {
      if (nodes_[id].backward || !nodes_[id].inputs.empty()) continue;  // an op, not a leaf
      if (id == output_id) final_after[id].push_back(id);  // f returned this leaf itself
      else if (first_use[id] < 0 || first_use[id] > output_id) unused.push_back(id);
      else final_after[first_use[id]].push_back(id);
    }
    for (int64_t id : unused) on_final_(id);
  }
  auto report_final = [&](int64_t i) {
    if (on_final_)
      for (int64_t id : final_after[i]) on_final_(id);
  };
  if (!tracked(output)) return;  // output does not depend on the inputs: all gradients are zero
  NoGrad no_grad;
  BackwardRunning running;
  grads_[output.impl()->tape_id] = full(output.shape(), seed, output.dtype(), output.device());
  for (int64_t i = int64_t(nodes_.size()) - 1; i >= 0; --i) {
    Node& node = nodes_[i];
    if (!node.backward || !grads_[i].defined()) {
      report_final(i);
      continue;
    }
    std::vector<Tensor> input_grads = node.backward(grads_[i]);
    for (size_t k = 0; k < node.inputs.size() && k < input_grads.size(); ++k) {
      int64_t id = node.inputs[k];
      if (id < 0 || !input_grads[k].defined()) continue;
      Tensor& slot = grads_[id];
      slot = slot.defined() ? add(slot, input_grads[k]) : input_grads[k];
    }
    node.backward = nullptr;  // free captured tensors early
    grads_[i] = Tensor();
    report_final(i);
  }
}

void Tape::release_grad(const Tensor& t) {
  if (!t.defined()) return;
  int64_t id = t.impl()->tape_id;
  if (t.impl()->tape_generation == generation_ && id >= 0 && id < int64_t(grads_.size())) grads_[id] = Tensor();
}

Tensor Tape::grad(const Tensor& t) const {
  if (!t.defined()) return t;
  int64_t id = t.impl()->tape_id;
  if (t.impl()->tape_generation == generation_ && id >= 0 && id < int64_t(grads_.size()) &&
      grads_[id].defined()) {
    Tensor g = grads_[id];
    if (g.dtype() != t.dtype()) g = g.cast(t.dtype());
    // A fresh handle per parameter: two parameters may have received the very same gradient tensor.
    auto impl = std::make_shared<TensorImpl>(*g.impl());
    impl->tape_id = -1;
    return Tensor(impl);
  }
  return zeros(t.shape(), t.dtype(), t.device());
}

}  // namespace flux::autodiff

namespace flux::detail {
bool backward_running() { return autodiff::g_backward_depth > 0; }

namespace {
thread_local int g_recorded_forward_depth = 0;  // RecordedForward scopes on a tape, on this thread
}  // namespace
RecordedForward::RecordedForward(bool on_tape) : on_tape_(on_tape) { g_recorded_forward_depth += on_tape_ ? 1 : 0; }
RecordedForward::~RecordedForward() { g_recorded_forward_depth -= on_tape_ ? 1 : 0; }
bool recorded_forward_running() { return g_recorded_forward_depth > 0; }
}  // namespace flux::detail
