// sample_logits: softmax(logits / temperature) per row, top-k, then one inverse-CDF draw per row.
#include "flux/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flux/error.hpp"
#include "flux/move.hpp"

namespace flux {

Tensor sample_logits(const Tensor& logits, SampleOptions o) {
  if (!logits.defined()) detail::fail("[sample_logits] got an undefined tensor");
  if (!is_floating(logits.dtype())) detail::fail("[sample_logits] needs floating-point logits, got ", summary(logits));
  if (logits.ndim() == 0 || logits.shape()[logits.ndim() - 1] == 0)
    detail::fail("[sample_logits] needs logits (..., C) with C > 0 classes along the last axis, got ", summary(logits));
  if (!(o.temperature >= 0) || std::isinf(o.temperature))
    detail::fail("[sample_logits] temperature must be finite and >= 0 (0 takes the argmax), got ", o.temperature);
  if (o.top_k < 0) detail::fail("[sample_logits] top_k must be >= 0 (0: every class), got ", o.top_k);
  const int64_t c = logits.shape()[logits.ndim() - 1], rows = logits.numel() / c;
  std::vector<double> l = logits.to_vector<double>();
  std::vector<double> u = rand(Shape{rows}, DType::f64).to_vector<double>();  // the global seeded generator
  std::vector<int64_t> out(static_cast<size_t>(rows));
  std::vector<double> p(static_cast<size_t>(c));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = l.data() + r * c;
    for (int64_t j = 0; j < c; ++j)
      if (std::isnan(row[j])) detail::fail("[sample_logits] row ", r, " holds NaN logits");
    const int64_t best = std::max_element(row, row + c) - row;
    if (o.temperature == 0 || std::isinf(row[best])) {
      out[size_t(r)] = best;
      continue;
    }
    double cutoff = -std::numeric_limits<double>::infinity();
    if (o.top_k > 0 && o.top_k < c) {
      std::vector<double> sorted(row, row + c);
      std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
      cutoff = sorted[size_t(o.top_k - 1)];
    }
    double total = 0;
    for (int64_t j = 0; j < c; ++j) {
      p[size_t(j)] = row[j] >= cutoff ? std::exp((row[j] - row[best]) / o.temperature) : 0.0;
      total += p[size_t(j)];
    }
    double target = u[size_t(r)] * total, acc = 0;
    int64_t pick = best;
    for (int64_t j = 0; j < c; ++j) {
      acc += p[size_t(j)];
      if (p[size_t(j)] > 0 && target < acc) {
        pick = j;
        break;
      }
    }
    out[size_t(r)] = pick;
  }
  Shape shape(std::vector<int64_t>(logits.shape().begin(), logits.shape().end() - 1));
  return to(Tensor(out, shape), logits.device());
}

}  // namespace flux
