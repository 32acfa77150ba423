// Splitting observations (rows along the first axis) into a training and a test part, as MLUtils'
// splitobs(data; at, shuffle, stratified) and scikit-learn's train_test_split do.
//   auto [train, test] = data::splitobs({X, y}, {.at = 0.8, .seed = 42, .stratified = y});
//   auto [Xtrain, ytrain] = train;                      // the same rows of X and y, on their devices
//   auto [Xa, Xb] = data::splitobs(X, {.at = 0.9});      // one tensor
// Unlike MLUtils (shuffle = false by default), the rows are shuffled unless .shuffle = false.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::data {

struct SplitOptions {
  /// The fraction of observations in the first (training) part: round(at * n), in [0, 1].
  double at = 0.8;
  /// Shuffle before splitting; false keeps the original order within each part.
  bool shuffle = true;
  /// Seed of the shuffle's own generator (the same seed gives the same split everywhere); unset:
  /// the global generator (flux::seed) draws it.
  std::optional<uint64_t> seed = std::nullopt;
  /// Class labels (N,) or (N, 1), integer or Bool, any device: each class is split in the proportion `at`
  /// (round(at * count) of its rows go to the first part), so both parts keep the class balance.
  Tensor stratified = {};
};

/// The row indices of each part for n observations (ascending when shuffle = false).
struct SplitIndices {
  std::vector<int64_t> train;
  std::vector<int64_t> test;
};
SplitIndices split_indices(int64_t n, const SplitOptions& options = {});

/// Rows `rows` of x (on x's device, any dtype); an empty list gives (0, ...).
Tensor take_obs(const Tensor& x, const std::vector<int64_t>& rows);

/// Checks that every tensor is defined, has an observation axis and as many rows as the first.
void check_same_obs(const char* api, const Tensor* data, size_t count);

/// x's rows split in two (see SplitOptions).
std::pair<Tensor, Tensor> splitobs(const Tensor& x, const SplitOptions& options = {});

/// Several tensors with the same number of rows, split alike: the same rows of each go to each part.
template <size_t N>
std::pair<std::array<Tensor, N>, std::array<Tensor, N>> splitobs(const Tensor (&data)[N], const SplitOptions& options = {}) {
  static_assert(N > 0, "[splitobs] needs at least one tensor");
  check_same_obs("splitobs", data, N);
  SplitIndices idx = split_indices(data[0].shape()[0], options);
  std::pair<std::array<Tensor, N>, std::array<Tensor, N>> out;
  for (size_t i = 0; i < N; ++i) {
    out.first[i] = take_obs(data[i], idx.train);
    out.second[i] = take_obs(data[i], idx.test);
  }
  return out;
}

}  // namespace flux::data
