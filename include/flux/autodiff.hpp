// Reverse-mode autodiff: a tape recorded only inside gradient()/withgradient().
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::autodiff {

/// Gradients of one op's inputs given the gradient of its output; undefined entries mean zero.
using Backward = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

class Tape {
 public:
  Tape();
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  /// A handle to x's storage that is recorded as an input of the differentiation.
  /// Nested differentiation is not supported: a tape started while another records (gradient inside a
  /// function being differentiated) throws "[gradient] nested differentiation ..." as soon as it
  /// would read a tensor the enclosing tape tracks (as a leaf or an op's input), since its result would
  /// reach the outer gradient as a constant (d/dx of d/dx x^3 would be 0). An inner gradient of
  /// tensors the outer tape does not track is independent and allowed; so is any under NoGrad.
  Tensor leaf(const Tensor& x);
  /// Runs the tape backwards from the scalar `output`; gradients are then looked up with grad().
  /// `seed` is d(objective)/d(output): 1 differentiates output itself; distributed::withgradient
  /// passes 1/ranks, so that the sum of the ranks' gradients is their mean without a pass over it.
  void backward(const Tensor& output, double seed = 1);
  /// The gradient of a tracked tensor (zeros of its shape when it did not influence the output).
  Tensor grad(const Tensor& tracked) const;
  /// Drops the tape's reference to a final gradient (grad() then gives zeros): sharded training frees
  /// each gradient once its bucket has been sent.
  void release_grad(const Tensor& tracked);
  /// During backward(), calls f(tape_id) once per leaf as soon as its gradient is final (no op left
  /// to add to it; grad() then holds it): leaves that did not influence the output first, the
  /// others as backward passes their first use. Lets communication overlap the rest of backward.
  void on_gradient_final(std::function<void(int64_t tape_id)> f) { on_final_ = std::move(f); }

  struct Node {
    std::vector<int64_t> inputs;  // tape ids, -1 for inputs that are not recorded
    Backward backward;
  };
  uint64_t generation() const { return generation_; }
  /// The tape that was recording on this thread when this one started (null: none, or under NoGrad).
  const Tape* enclosing() const { return previous_; }
  std::vector<Node>& nodes() { return nodes_; }

 private:
  uint64_t generation_;
  Tape* previous_;
  std::vector<Node> nodes_;
  std::vector<Tensor> grads_;
  std::function<void(int64_t)> on_final_;
};

/// True while a tape records on this thread (inside gradient()/withgradient(), outside NoGrad):
/// layers in automatic mode (BatchNorm, Dropout) then use their training behaviour.
bool recording();
/// True when an op's result should be recorded (a tape is active and t is on it).
bool tracked(const Tensor& t);
/// Records `out` as the result of an op on `inputs` if any input is tracked. `file`:`line` name the
/// op's backward in the library's source (see recorded_sites); GCC's and clang's __builtin_FILE /
/// __builtin_LINE, because clang 14 with libstdc++ 12 has no std::source_location.
void record(Tensor& out, std::initializer_list<const Tensor*> inputs, Backward backward,
            const char* file = __builtin_FILE(), int line = __builtin_LINE());
void record(Tensor& out, const std::vector<const Tensor*>& inputs, Backward backward,
            const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// While enabled, every call site of record() that put a node on a tape is noted, as "file:line";
/// recorded_sites() lists them. For the test that checks that the gradient-parity sweep reaches
/// every backward the library has (tests/test_gradient_parity.cpp). Off by default.
void note_recorded_sites(bool enabled);
std::vector<std::string> recorded_sites();
/// Suspends recording in its scope (used while running backward closures).
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
 private:
  Tape* saved_;
};

}  // namespace flux::autodiff
