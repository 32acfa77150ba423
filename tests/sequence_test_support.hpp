// Helpers for the sequence-model suites (test_embedding, test_layer_norms, test_attention): seeded
// inputs, Flux-style printing, error capture, and a float64 central-difference gradient check.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_devices.hpp"

namespace flux::testing {

inline std::vector<double> uniform_values(size_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}
/// A float64 CPU tensor of `shape` with seeded uniform values in [lo, hi).
inline Tensor uniform_tensor(const Shape& shape, uint64_t seed, double lo = -2, double hi = 2) {
  return Tensor(uniform_values(size_t(shape.numel()), lo, hi, seed), shape);
}
template <class T> std::string to_text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

/// The model with every floating-point leaf in float64, on the CPU.
template <class M> M to_f64_cpu(const M& m) {
  return fmap([](const Tensor& t) { return is_floating(t.dtype()) ? to(t, Device()).f64() : to(t, Device()); }, m);
}

/// Checks gradient() of L = sum(f(xs) * W) (W fixed, random) against central differences, all in
/// float64 on the CPU, for every input in `wrt` (indices into xs).
inline void expect_finite_difference_gradient(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                              std::vector<Tensor> xs, double tol = 1e-6, double step = 1e-5) {
  Tensor y0 = f(xs);
  Tensor w = Tensor(uniform_values(size_t(y0.numel()), 0.5, 1.5, 42), y0.shape());
  auto objective = [&](const std::vector<Tensor>& v) { return sum(f(v) * w); };
  std::vector<Tensor> grads = gradient(objective, xs);
  ASSERT_EQ(grads.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(grads[i].shape(), xs[i].shape()) << "input " << i;
    std::vector<double> g = grads[i].to_vector<double>();
    std::vector<double> base = xs[i].to_vector<double>();
    for (size_t k = 0; k < base.size(); ++k) {
      auto at = [&](double delta) {
        std::vector<double> moved = base;
        moved[k] += delta;
        std::vector<Tensor> v = xs;
        v[i] = Tensor(moved, xs[i].shape());
        return objective(v).item<double>();
      };
      double numeric = (at(step) - at(-step)) / (2 * step);
      EXPECT_NEAR(g[k], numeric, tol * (1 + std::abs(numeric))) << "input " << i << " element " << k;
    }
  }
}

}  // namespace flux::testing
