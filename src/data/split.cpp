// Splitting observations into two parts; see include/flux/data/split.hpp.
#include "flux/data/split.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "flux/error.hpp"
#include "flux/ops.hpp"

namespace flux::data {
namespace {

using flux::detail::fail;

/// A permutation of 0..n-1: from `gen` when seeded, else from the global generator.
std::vector<int64_t> permutation(int64_t n, std::mt19937_64* gen) {
  if (!gen) return randperm(n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t(0));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t((*gen)() % uint64_t(i + 1))]);
  return p;
}

int64_t first_part(double at, int64_t n) { return int64_t(std::llround(at * double(n))); }

std::vector<int64_t> class_labels(const Tensor& y, int64_t n) {
  if (y.dtype() != DType::i32 && y.dtype() != DType::i64 && y.dtype() != DType::u8 &&
      y.dtype() != DType::boolean)
    fail("[splitobs] .stratified expects integer class labels (Int32, Int64, UInt8 or Bool) of shape (", n, ",) or (", n,
         ", 1), got ", dtype_name(y.dtype()), " of shape ", to_string(y.shape()),
         (y.ndim() == 2 && y.shape()[1] > 1 ? "; for one-hot labels pass onecold(y)" : ""));
  const bool ok = y.ndim() >= 1 && y.ndim() <= 2 && y.shape()[0] == n && (y.ndim() == 1 || y.shape()[1] == 1);
  if (!ok)
    fail("[splitobs] .stratified has shape ", to_string(y.shape()), "; expected (", n, ",) or (", n,
         ", 1): one label per observation");
  return y.to_vector<int64_t>();
}

}  // namespace

SplitIndices split_indices(int64_t n, const SplitOptions& o) {
  if (n < 0) fail("[splitobs] the number of observations is negative (", n, ")");
  if (!(o.at >= 0 && o.at <= 1)) fail("[splitobs] .at = ", o.at, " is not a fraction in [0, 1]");
  std::mt19937_64 own(o.seed.value_or(0));
  std::mt19937_64* gen = o.seed ? &own : nullptr;
  SplitIndices out;
  if (!o.stratified.defined()) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t(0));
    if (o.shuffle) order = permutation(n, gen);
    const int64_t k = first_part(o.at, n);
    out.train.assign(order.begin(), order.begin() + k);
    out.test.assign(order.begin() + k, order.end());
  } else {
    std::vector<int64_t> labels = class_labels(o.stratified, n);
    std::map<int64_t, std::vector<int64_t>> by_class;  // ascending labels: a fixed order of draws
    for (int64_t i = 0; i < n; ++i) by_class[labels[size_t(i)]].push_back(i);
    for (auto& [label, rows] : by_class) {
      if (o.shuffle) {
        std::vector<int64_t> p = permutation(int64_t(rows.size()), gen), shuffled(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) shuffled[i] = rows[size_t(p[i])];
        rows = std::move(shuffled);
      }
      const int64_t k = first_part(o.at, int64_t(rows.size()));
      out.train.insert(out.train.end(), rows.begin(), rows.begin() + k);
      out.test.insert(out.test.end(), rows.begin() + k, rows.end());
    }
    // Mix the classes again: a shuffled order within each part, or the original order.
    for (std::vector<int64_t>* part : {&out.train, &out.test}) {
      if (o.shuffle) {
        std::vector<int64_t> p = permutation(int64_t(part->size()), gen), mixed(part->size());
        for (size_t i = 0; i < part->size(); ++i) mixed[i] = (*part)[size_t(p[i])];
        *part = std::move(mixed);
      } else {
        std::sort(part->begin(), part->end());
      }
    }
  }
  return out;
}

Tensor take_obs(const Tensor& x, const std::vector<int64_t>& rows) {
  if (!x.defined() || x.ndim() == 0) fail("[take_obs] expects a tensor with an observation axis");
  if (rows.empty()) return x.slice(0, 0);
  Tensor idx = to(Tensor(rows, Shape{int64_t(rows.size())}), x.device());
  return index_select(x, 0, idx);
}

void check_same_obs(const char* api, const Tensor* data, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (!data[i].defined()) fail("[", api, "] tensor ", i + 1, " is undefined");
    if (data[i].ndim() == 0)
      fail("[", api, "] tensor ", i + 1, " is a scalar; expected observations along the first axis");
    if (data[i].shape()[0] != data[0].shape()[0])
      fail("[", api, "] tensor ", i + 1, " has shape ", to_string(data[i].shape()), " but tensor 1 has ",
           to_string(data[0].shape()), "; every tensor needs the same number of observations along the first axis");
  }
}

std::pair<Tensor, Tensor> splitobs(const Tensor& x, const SplitOptions& options) {
  check_same_obs("splitobs", &x, 1);
  SplitIndices idx = split_indices(x.shape()[0], options);
  return {take_obs(x, idx.train), take_obs(x, idx.test)};
}

}  // namespace flux::data
