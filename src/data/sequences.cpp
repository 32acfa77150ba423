// chunk and batchseq (flux/data/sequences.hpp), composed from slice, concat and stack.
#include "flux/data/sequences.hpp"

#include <algorithm>

#include "flux/error.hpp"
#include "flux/ops.hpp"

namespace flux::data {

std::vector<Tensor> chunk(const Tensor& x, int64_t n, int axis) {
  if (!x.defined()) detail::fail("[chunk] got an undefined tensor");
  if (x.ndim() == 0) detail::fail("[chunk] needs at least one axis; got a 0-dimensional tensor");
  const int a = axis < 0 ? axis + int(x.ndim()) : axis;
  if (a < 0 || a >= int(x.ndim())) detail::fail("[chunk] axis ", axis, " is out of range for shape ", to_string(x.shape()));
  const int64_t len = x.shape()[a];
  if (n <= 0 || n > len)
    detail::fail("[chunk] n must be in 1..", len, " (the length of axis ", axis, " of shape ", to_string(x.shape()),
                 "), got ", n);
  const int64_t size = (len + n - 1) / n;
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < len; start += size) parts.push_back(slice(x, a, start, std::min(len, start + size)));
  return parts;
}

Tensor batchseq(const std::vector<Tensor>& sequences, double pad) {
  if (sequences.empty()) detail::fail("[batchseq] got no sequences");
  const Tensor& first = sequences[0];
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    if (!s.defined()) detail::fail("[batchseq] sequence ", i, " is undefined");
    if (s.ndim() == 0) detail::fail("[batchseq] sequence ", i, " is 0-dimensional; sequences are (T, ...) with time first");
    Shape rest_i(std::vector<int64_t>(s.shape().begin() + 1, s.shape().end()));
    Shape rest_0(std::vector<int64_t>(first.shape().begin() + 1, first.shape().end()));
    if (s.ndim() != first.ndim() || rest_i != rest_0 || s.dtype() != first.dtype() || s.device() != first.device())
      detail::fail("[batchseq] sequence ", i, " is ", summary(s), " but sequence 0 is ", summary(first),
                   "; all need the same trailing shape, dtype and device (only the length T may differ)");
    longest = std::max(longest, s.shape()[0]);
  }
  std::vector<Tensor> padded;
  for (const Tensor& s : sequences) {
    if (s.shape()[0] == longest) {
      padded.push_back(s);
      continue;
    }
    Shape fill_shape = s.shape();
    fill_shape[0] = longest - s.shape()[0];
    padded.push_back(concat({s, full(fill_shape, pad, s.dtype(), s.device())}, 0));
  }
  return stack(padded, 0);
}

}  // namespace flux::data
