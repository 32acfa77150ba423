// ONNX export and import.
//
//   auto net = onnx::load("resnet18.onnx") | dev;            // an onnx::Model: a layer on any device
//   Tensor logits = net(x);  std::cout << net;  withgradient(f, net);  save("ft.safetensors", net);
//   onnx::save("model.onnx", model, x);                      // traces one inference forward on x
//   onnx::save("model.onnx", model, x, {.dynamic_axes = {{0, 1}}});   // batch and sequence dynamic
//   onnx::save("model.onnx", model, x, y);                   // a model of two inputs: model(x, y)
//
// save runs model(x...) once in inference mode (no tape: BatchNorm uses its running statistics,
// Dropout is off) while recording every op of the op layer that runs (flux/ops.hpp: the layer autodiff
// records), and writes those ops as an ONNX graph: so every model exports, built-in layers, the user's
// own FLUX_LAYER structs, lambdas in a Chain, on any device. The model's tensors become initialisers
// named as state(model) names them ("layers.0.weight"); tensors the forward creates that do not
// depend on the inputs (a causal mask) become anonymous initialisers. To tell the dimensions that follow
// the inputs' dynamic axes from fixed ones, the forward runs a second time with those axes grown (rows of
// x repeated): reshapes, slices and zero states that follow the batch are written with shapes computed
// from the input's (Shape/Gather in the graph), everything else with its value. Axis 0 of every input is
// dynamic by default ("batch"); `.dynamic_axes` lists every input's dynamic axes instead. An op with no
// ONNX form (training-mode Dropout or BatchNorm, random numbers) is a flux::Error naming the op and the
// nearest parameter's layer path; nothing is written then. The file is written atomically (a temporary
// file renamed into place). Needs a build with ONNX (CMake FLUX_ONNX, scripts/deps.sh onnx); without it
// both functions throw a flux::Error that says so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <array>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "flux/functor.hpp"
#include "flux/tensor.hpp"

namespace flux::onnx {

struct SaveOptions {
  /// Per input, its dynamic axes; empty (default): axis 0 of every input.
  std::vector<std::vector<int>> dynamic_axes = {};
  /// The ONNX opset written: 13 to 21; default 17, the newest Debian 12's ONNX 1.12 checker knows (ONNX
  /// Runtime reads them all; LayerNormalization needs 17, ReduceMax/Min take axes as an input from 18).
  int64_t opset = 17;
  /// Graph input and output names; default "input", "input_1", ... and "output", "output_1", ...
  std::vector<std::string> input_names = {};
  std::vector<std::string> output_names = {};
  /// Initialisers of 1 KiB and more go to "<file name>.data" beside the model (ONNX external data),
  /// as for models over protobuf's 2 GiB limit, which are written so whatever this says.
  bool external_data = false;
};

/// Whether this build reads and writes ONNX (FLUX_ONNX found ONNX and protobuf).
bool available();

namespace detail {
using Forward = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
void save_traced(const std::string& path, const Forward& forward, const std::vector<std::pair<std::string, Tensor>>& state,
                 const std::vector<Tensor>& inputs, const SaveOptions& options);

template <class R> std::vector<Tensor> outputs_of(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_convertible_v<T, Tensor>) {
    return {Tensor(r)};
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    return r;
  } else {
    std::vector<Tensor> out;
    std::apply([&](const auto&... t) { (out.push_back(Tensor(t)), ...); }, r);
    return out;
  }
}

template <class M, size_t... I> std::vector<Tensor> call(const M& model, const std::vector<Tensor>& xs, std::index_sequence<I...>) {
  return outputs_of(model(xs[I]...));
}
}  // namespace detail

/// Exports `model` traced on one example input (any device).
template <class M> void save(const std::string& path, const M& model, const Tensor& x, const SaveOptions& options = {}) {
  detail::save_traced(
      path, [&](const std::vector<Tensor>& xs) { return detail::call(model, xs, std::make_index_sequence<1>()); },
      ::flux::state(model), {x}, options);
}

/// Exports a model of several inputs, called as model(x0, x1, ...).
template <class M, class... X>
  requires(sizeof...(X) >= 2 && (std::is_convertible_v<X, Tensor> && ...))
void save(const std::string& path, const M& model, const X&... xs) {
  detail::save_traced(
      path, [&](const std::vector<Tensor>& in) { return detail::call(model, in, std::make_index_sequence<sizeof...(X)>()); },
      ::flux::state(model), {Tensor(xs)...}, SaveOptions{});
}

/// Exports a model of several inputs with options.
template <class M, size_t N>
void save(const std::string& path, const M& model, const std::array<Tensor, N>& xs, const SaveOptions& options) {
  detail::save_traced(
      path, [&](const std::vector<Tensor>& in) { return detail::call(model, in, std::make_index_sequence<N>()); },
      ::flux::state(model), std::vector<Tensor>(xs.begin(), xs.end()), options);
}

// ---- import ----

namespace detail {
struct Graph;  // the parsed, checked graph (src/onnx/import.cpp)
}  // namespace detail

/// A model read from an ONNX file, as a layer: net(x) runs its graph with flux's ops on the device its
/// tensors live on (`| dev` moves them), recorded by autodiff like any layer. Its initialisers are its
/// tensors, named as in the file: the floating ones are parameters (trained by optimisers), except
/// BatchNormalization's running statistics and integer constants, which are NonTrainable; so state(),
/// safetensors save/load, optimisers and gradient() work on it as on any layer. The graph itself is
/// shared (immutable) between copies.
class Model {
 public:
  Model() = default;
  /// Runs the graph on its one input (or its first, the others absent) and returns its first output.
  Tensor operator()(const Tensor& x) const;
  /// Runs the graph on its inputs (in the file's order) and returns every output.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) const;
  std::vector<std::string> input_names() const;
  std::vector<std::string> output_names() const;
  /// "onnx::Model(path: 49 nodes (Conv × 20, ...), opset 17; input (batch, 3, 224, 224) -> output (batch, 1000))"
  std::string summary() const;

  std::vector<std::pair<std::string, Tensor>> parameters;
  std::vector<std::pair<std::string, NonTrainable>> buffers;
  std::shared_ptr<const detail::Graph> graph;
};

/// Walks the initialisers (flux/functor.hpp): parameters, then buffers, in the file's order.
template <class Self, class Visit>
  requires std::is_same_v<std::remove_const_t<Self>, Model>
void flux_fields(Self& self, Visit&& visit) {
  for (auto& [name, t] : self.parameters) visit(name.c_str(), t);
  for (auto& [name, t] : self.buffers) visit(name.c_str(), t);
}
inline const char* flux_layer_name(const Model*) { return "onnx::Model"; }
std::ostream& operator<<(std::ostream& os, const Model& m);

/// Reads and checks an ONNX file: opsets 11 to 21, IR versions up to 10, each operator in the form its
/// opset selects. Errors (flux::Error): unreadable, truncated or corrupt files; an opset or IR version
/// newer than that (both named); every unsupported operator at once, each with its node
/// name; malformed graphs (a value used before it is defined, initialisers whose data do not match their
/// shape). Operators: see README.md ("ONNX").
Model load(const std::string& path);
/// The same from the file's bytes (`context` names it in errors); what the fuzz target drives.
Model load_from_bytes(const std::string& bytes, const std::string& context = "ONNX model");
/// The operators the importer runs (default domain), sorted.
std::vector<std::string> supported_operators();

}  // namespace flux::onnx
