// Shape and indexing ops: Tensor::reshape and contiguous_copy, broadcast_to, sum_to, permute, slice,
// concat, stack, index_select, onehot, flatten.
#include <algorithm>
#include <numeric>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/checked_size.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"

namespace flux {

using Grads = std::vector<Tensor>;
using namespace detail;

namespace {
// Row-major element strides of a contiguous shape.
void contiguous_strides(const Shape& s, int64_t* out) {
  int64_t st = 1;
  for (int i = s.size() - 1; i >= 0; --i) {
    out[i] = st;
    st *= s[i];
  }
}

// Copies a window of `src` (shape `window`, starting at `start` along `axis`) into a fresh tensor,
// or (embed = true) copies all of `src` into a zero tensor of shape `outer_shape` at that window.
Tensor window_copy(const Tensor& src, const Shape& out_shape, int axis, int64_t start, bool embed) {
  Tensor out = embed ? zeros(out_shape, src.dtype(), src.device()) : Tensor::empty(out_shape, src.dtype(), src.device());
  const Shape& small = embed ? src.shape() : out_shape;
  const Shape& big = embed ? out_shape : src.shape();
  if (small.numel() == 0) return out;
  backend::StridedCopy p;
  p.ndim = small.size();
  int64_t big_strides[backend::kMaxDims], small_strides[backend::kMaxDims];
  contiguous_strides(big, big_strides);
  contiguous_strides(small, small_strides);
  for (int i = 0; i < p.ndim; ++i) {
    p.shape[i] = small[i];
    p.src_stride[i] = embed ? small_strides[i] : big_strides[i];
    p.dst_stride[i] = embed ? big_strides[i] : small_strides[i];
  }
  backend::Buffer s = flux::detail::buffer_of(src), d = flux::detail::buffer_of(out);
  size_t shift = size_t(start * big_strides[axis]) * dtype_size(src.dtype());
  if (embed) d.offset += shift; else s.offset += shift;
  src.backend().strided_copy(src.device().index(), src.dtype(), s, d, p);
  return out;
}
}  // namespace

// The Tensor members that report themselves to the tracer (tensor.hpp), here beside the other shape ops.
Tensor Tensor::reshape(Shape s) const {
  if (!defined()) detail::fail("[reshape] the tensor is undefined (default-constructed)");
  const TensorImpl& i = *impl();
  int infer = -1;
  int64_t known = 1;
  for (int k = 0; k < s.size(); ++k) {
    if (s[k] == -1) {
      if (infer >= 0) detail::fail("[reshape] only one axis may be -1 in ", to_string(s));
      infer = k;
    } else if (s[k] < 0) {
      detail::fail("[reshape] negative dimension in ", to_string(s));
    } else {
      known = detail::checked_mul("reshape", "the element count of the new shape", known, s[k]);
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0)
      detail::fail("[reshape] cannot reshape ", to_string(i.shape), " into ", to_string(s));
    s[infer] = numel() / known;
  }
  if (detail::checked_numel("reshape", s, i.dtype) != numel())
    detail::fail("[reshape] cannot reshape ", to_string(i.shape), " (", numel(), " elements) into ",
                 to_string(s), " (", s.numel(), " elements)");
  auto view = std::make_shared<TensorImpl>(i);
  view->shape = s;
  view->tape_id = -1;
  Tensor out(view);
  if (trace::active()) trace::emit(ops::reshape, {*this}, out, {{"shape", s.vec(), {}}});
  Shape original = i.shape;
  autodiff::record(out, {this}, [original](const Tensor& g) { return std::vector<Tensor>{g.reshape(original)}; });
  return out;
}

Tensor Tensor::contiguous_copy() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  if (nbytes()) backend().copy(device().index(), flux::detail::buffer_of(out), flux::detail::buffer_of(*this), nbytes());
  Tensor src = *this;
  if (trace::active()) trace::emit(ops::to, {src}, out);
  autodiff::record(out, {&src}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", x);
  if (x.shape() == shape) return x;
  Shape b = broadcast_shapes("broadcast_to", x.shape(), shape);
  if (b != shape) fail("[broadcast_to] cannot broadcast shape ", to_string(x.shape()), " to ", to_string(shape));
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel()) {
    backend::Broadcast plan = make_plan(shape, {&x.shape()});
    backend::StridedCopy p;
    p.ndim = shape.size();
    contiguous_strides(shape, p.dst_stride);
    for (int i = 0; i < p.ndim; ++i) {
      p.shape[i] = shape[i];
      p.src_stride[i] = plan.stride[0][i];
    }
    x.backend().strided_copy(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(out), p);
  }
  if (trace::active()) trace::emit(ops::broadcast_to, {x}, out, {{"shape", shape.vec(), {}}});
  Shape from = x.shape();
  autodiff::record(out, {&x}, [from](const Tensor& g) { return Grads{sum_to(g, from)}; });
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_defined("sum_to", x);
  if (x.shape() == shape) return x;
  const Shape& s = x.shape();
  int lead = s.size() - shape.size();
  if (lead < 0) fail("[sum_to] cannot sum shape ", to_string(s), " down to the larger shape ", to_string(shape));
  std::vector<int> axes;
  for (int i = 0; i < s.size(); ++i) {
    if (i < lead) {
      axes.push_back(i);
    } else if (shape[i - lead] == 1 && s[i] != 1) {
      axes.push_back(i);
    } else if (shape[i - lead] != s[i]) {
      fail("[sum_to] cannot sum shape ", to_string(s), " down to ", to_string(shape));
    }
  }
  Tensor y = axes.empty() ? x : sum(x, axes, true);
  return y.reshape(shape);
}

Tensor permute(const Tensor& x, const std::vector<int>& axes) {
  check_defined("permute", x);
  int n = x.ndim();
  if (int(axes.size()) != n)
    fail("[permute] got ", axes.size(), " axes for a ", n, "-dimensional tensor of shape ", to_string(x.shape()));
  std::vector<int> norm(n), seen(n, 0);
  for (int i = 0; i < n; ++i) {
    norm[i] = normalize_axis("permute", axes[i], n);
    if (seen[norm[i]]++) fail("[permute] axis ", axes[i], " appears twice");
  }
  Shape out_shape;
  for (int i = 0; i < n; ++i) out_shape.push_back(x.shape()[norm[i]]);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel()) {
    int64_t in_strides[backend::kMaxDims];
    contiguous_strides(x.shape(), in_strides);
    backend::StridedCopy p;
    p.ndim = n;
    contiguous_strides(out_shape, p.dst_stride);
    for (int i = 0; i < n; ++i) {
      p.shape[i] = out_shape[i];
      p.src_stride[i] = in_strides[norm[i]];
    }
    x.backend().strided_copy(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(out), p);
  }
  if (trace::active()) trace::emit(ops::permute, {x}, out, {{"perm", std::vector<int64_t>(norm.begin(), norm.end()), {}}});
  std::vector<int> inverse(n);
  for (int i = 0; i < n; ++i) inverse[norm[i]] = i;
  autodiff::record(out, {&x}, [inverse](const Tensor& g) { return Grads{permute(g, inverse)}; });
  return out;
}

Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop) {
  check_defined("slice", x);
  if (x.ndim() == 0) fail("[slice] cannot slice a 0-dimensional tensor");
  int a = normalize_axis("slice", axis, x.ndim());
  int64_t n = x.shape()[a];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  if (start < 0 || stop > n || start > stop)
    fail("[slice] range [", start, ", ", stop, ") is out of bounds for axis ", axis, " of shape ", to_string(x.shape()));
  Shape out_shape = x.shape();
  out_shape[a] = stop - start;
  Tensor out;
  if (a == 0) {  // a view: rows of the first axis are contiguous
    auto impl = std::make_shared<TensorImpl>(*x.impl());
    impl->shape = out_shape;
    impl->offset += size_t(start * (n ? x.numel() / n : 0)) * dtype_size(x.dtype());
    impl->tape_id = -1;
    out = Tensor(impl);
  } else {
    out = window_copy(x, out_shape, a, start, false);
  }
  if (trace::active()) trace::emit(ops::slice, {x}, out, {{"range", {a, start, stop}, {}}});
  Shape full_shape = x.shape();
  autodiff::record(out, {&x}, [full_shape, a, start](const Tensor& g) {
    return Grads{window_copy(g, full_shape, a, start, true)};
  });
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  if (xs.empty()) fail("[concat] needs at least one tensor");
  for (const Tensor& x : xs) check_defined("concat", x);
  const Tensor& first = xs[0];
  if (first.ndim() == 0) fail("[concat] cannot concatenate 0-dimensional tensors; use stack");
  int a = normalize_axis("concat", axis, first.ndim());
  Shape out_shape = first.shape();
  int64_t total = 0;
  DType t = first.dtype();
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor& x = xs[k];
    check_same_device("concat", first, x);
    if (x.ndim() != first.ndim())
      fail("[concat] tensor ", k, " has shape ", to_string(x.shape()), " but tensor 0 has shape ", to_string(first.shape()));
    for (int i = 0; i < x.ndim(); ++i)
      if (i != a && x.shape()[i] != first.shape()[i])
        fail("[concat] shapes ", to_string(first.shape()), " and ", to_string(x.shape()), " differ outside axis ", axis);
    total += x.shape()[a];
    t = promote(t, x.dtype());
  }
  out_shape[a] = total;
  Tensor out = Tensor::empty(out_shape, t, first.device());
  int64_t offset = 0;
  std::vector<Tensor> inputs;
  for (const Tensor& x0 : xs) {
    Tensor x = x0.cast(t);
    inputs.push_back(x);
    if (x.numel()) {
      int64_t big[backend::kMaxDims];
      contiguous_strides(out_shape, big);
      backend::StridedCopy p;
      p.ndim = x.ndim();
      contiguous_strides(x.shape(), p.src_stride);
      for (int i = 0; i < p.ndim; ++i) {
        p.shape[i] = x.shape()[i];
        p.dst_stride[i] = big[i];
      }
      backend::Buffer d = flux::detail::buffer_of(out);
      d.offset += size_t(offset * big[a]) * dtype_size(t);
      x.backend().strided_copy(x.device().index(), t, flux::detail::buffer_of(x), d, p);
    }
    offset += x.shape()[a];
  }
  if (trace::active()) trace::emit(ops::concat, inputs, out, {{"axis", {a}, {}}});
  if (!is_floating(t)) return out;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<const Tensor*> recorded;
  int64_t s = 0;
  for (const Tensor& x : inputs) {
    ranges.push_back({s, s + x.shape()[a]});
    s += x.shape()[a];
    recorded.push_back(&x);
  }
  autodiff::record(out, recorded, [ranges, a](const Tensor& g) {
    Grads r;
    for (auto [b, e] : ranges) r.push_back(slice(g, a, b, e));
    return r;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int axis) {
  if (xs.empty()) fail("[stack] needs at least one tensor");
  for (const Tensor& x : xs) check_defined("stack", x);
  int n = xs[0].ndim() + 1;
  int a = normalize_axis("stack", axis, n);
  std::vector<Tensor> expanded;
  for (const Tensor& x : xs) {
    if (x.shape() != xs[0].shape())
      fail("[stack] shapes ", to_string(xs[0].shape()), " and ", to_string(x.shape()), " differ");
    Shape s;
    for (int i = 0; i < x.ndim(); ++i) {
      if (i == a) s.push_back(1);
      s.push_back(x.shape()[i]);
    }
    if (a == x.ndim()) s.push_back(1);
    expanded.push_back(x.reshape(s));
  }
  return concat(expanded, a);
}

Tensor index_select(const Tensor& x, int axis, const Tensor& indices) {
  check_defined("index_select", x);
  check_defined("index_select", indices);
  check_same_device("index_select", x, indices);
  if (indices.dtype() != DType::i64 && indices.dtype() != DType::i32)
    fail("[index_select] indices must be Int32 or Int64, got ", dtype_name(indices.dtype()));
  if (indices.ndim() > 1) fail("[index_select] indices must be 1-dimensional, got shape ", to_string(indices.shape()));
  if (x.ndim() == 0) fail("[index_select] cannot index a 0-dimensional tensor");
  int a = normalize_axis("index_select", axis, x.ndim());
  Tensor idx = raw_cast(indices.reshape(Shape{indices.numel()}), DType::i64);
  int64_t outer = 1, inner = 1, len = x.shape()[a], nidx = idx.numel();
  for (int i = 0; i < a; ++i) outer *= x.shape()[i];
  for (int i = a + 1; i < x.ndim(); ++i) inner *= x.shape()[i];
  {  // range check on the host: out-of-range indices must never read memory
    for (int64_t v : idx.to_vector<int64_t>())
      if (v < 0 || v >= len)
        fail("[index_select] index ", v, " is out of range for axis ", axis, " of length ", len, " (0-based)");
  }
  Shape out_shape = x.shape();
  out_shape[a] = nidx;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel()) x.backend().gather(x.device().index(), x.dtype(), flux::detail::buffer_of(x), flux::detail::buffer_of(idx), flux::detail::buffer_of(out), outer, len, inner, nidx);
  if (trace::active()) trace::emit(ops::index_select, {x, indices}, out, {{"axis", {a}, {}}});
  Shape full_shape = x.shape();
  if (is_floating(x.dtype()))
    autodiff::record(out, {&x}, [idx, full_shape, outer, len, inner, nidx](const Tensor& g) {
      Tensor r = zeros(full_shape, g.dtype(), g.device());
      if (g.numel()) g.backend().scatter_add(g.device().index(), g.dtype(), flux::detail::buffer_of(g), flux::detail::buffer_of(idx), flux::detail::buffer_of(r), outer, len, inner, nidx);
      return Grads{r};
    });
  return out;
}

Tensor gather(const Tensor& x, int axis, const Tensor& indices) { return index_select(x, axis, indices); }

Tensor onehot(const Tensor& labels, int64_t nclasses, DType t) {
  check_defined("onehot", labels);
  if (labels.dtype() != DType::i64 && labels.dtype() != DType::i32 && labels.dtype() != DType::u8)
    fail("[onehot] labels must be an integer tensor, got ", dtype_name(labels.dtype()));
  if (nclasses <= 0) fail("[onehot] nclasses must be positive, got ", nclasses);
  checked_numel("onehot", Shape{labels.numel(), nclasses}, t);  // before arange(nclasses) and the compare
  for (int64_t v : labels.to_vector<int64_t>())
    if (v < 0 || v >= nclasses) fail("[onehot] label ", v, " is outside 0..", nclasses - 1);
  // Labels of any shape S give S + (nclasses,): (N,) -> (N, C), (N, T) -> (N, T, C) (onehotbatch on a matrix).
  Shape out = labels.shape();
  out.push_back(nclasses);
  Tensor l = raw_cast(labels, DType::i64).reshape(Shape{labels.numel(), 1});
  Tensor classes = arange(nclasses, DType::i64, labels.device()).reshape(Shape{1, nclasses});
  return raw_cast(eq(l, classes), t).reshape(out);
}

Tensor detail::flatten_op(const Tensor& x) {
  check_defined("flatten", x);
  if (x.ndim() == 0) fail("[flatten] needs at least 1 dimension (observations on the first); got a 0-dimensional tensor");
  int64_t rest = 1;
  for (int i = 1; i < x.ndim(); ++i) rest *= x.shape()[i];
  return x.reshape(Shape{x.shape()[0], rest});  // recorded by reshape; shares storage
}

Tensor onecold(const Tensor& scores) {
  check_defined("onecold", scores);
  if (scores.ndim() == 0) fail("[onecold] needs at least one dimension");
  return argmax(scores, -1);
}

}  // namespace flux
