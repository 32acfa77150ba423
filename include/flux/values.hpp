// A tensor's values on the host as free functions, for generic code: inside a generic lambda,
// `m(x).item<float>()` needs `.template` (m(x) is a dependent expression); these do not.
//   auto [loss, grads] = withgradient([&](auto& m) { return mse(m(x), y); }, model);
//   float l = item<float>(loss);  std::vector<int64_t> p = to_vector<int64_t>(onecold(model(x)));
#pragma once
#include <vector>

#include "flux/tensor.hpp"

namespace flux {

/// t.item<T>(): the single value of a one-element tensor, converted to T (a host sync).
template <class T> T item(const Tensor& t) { return t.item<T>(); }
/// t.to_vector<T>(): all values converted to T, row-major (a host sync).
template <class T> std::vector<T> to_vector(const Tensor& t) { return t.to_vector<T>(); }

}  // namespace flux
