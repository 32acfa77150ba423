// Weight initialisers (Flux.jl src/utils.jl: nfan, glorot_*, kaiming_*, orthogonal).
#include "flux/nn/init.hpp"

#include <cmath>
#include <vector>

#include "flux/error.hpp"
#include "flux/ops.hpp"
#include "src/checked_size.hpp"

namespace flux {

namespace {
void check_shape(const char* api, const Shape& shape) {
  for (int64_t d : shape)
    if (d <= 0) detail::fail("[", api, "] dimensions must be positive; got ", to_string(shape));
}

// Uniform on [-limit, limit) in the requested dtype, one temporary alive at a time (a float64
// expression would hold several full-size float64 temporaries for a large layer).
Tensor uniform_symmetric(const Shape& shape, double limit, DType t) {
  Tensor w = rand(shape, t);
  w = w * (2.0 * limit);
  return w - limit;
}

// Q of the thin QR factorisation of the (m, n) row-major matrix a, m >= n, with R's diagonal
// positive (so Q = Q_householder * sign(diag(R)), as Flux fixes the signs): Gram-Schmidt with one
// re-orthogonalisation pass ("twice is enough"), in float64.
std::vector<double> orthonormal_columns(std::vector<double> a, int64_t m, int64_t n) {
  std::vector<double> col(size_t(m), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r = 0; r < m; ++r) col[size_t(r)] = a[size_t(r * n + j)];
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t i = 0; i < j; ++i) {
        double dot = 0;
        for (int64_t r = 0; r < m; ++r) dot += a[size_t(r * n + i)] * col[size_t(r)];
        for (int64_t r = 0; r < m; ++r) col[size_t(r)] -= dot * a[size_t(r * n + i)];
      }
    double norm = 0;
    for (double v : col) norm += v * v;
    norm = std::sqrt(norm);
    if (norm == 0) detail::fail("[orthogonal] the Gaussian draw was rank-deficient (column ", j, ")");
    for (int64_t r = 0; r < m; ++r) a[size_t(r * n + j)] = col[size_t(r)] / norm;
  }
  return a;
}
}  // namespace

std::pair<int64_t, int64_t> nfan(const Shape& shape) {
  // Flux: nfan() = (1, 1); nfan(n) = (1, n); nfan(out, in) = (in, out);
  // nfan(k..., in, out) = prod(k) .* (in, out). Here the axes are reversed: (out, in, k...).
  if (shape.size() == 0) return {1, 1};
  if (shape.size() == 1) return {1, shape[0]};
  int64_t receptive = 1;
  for (int i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

Tensor GlorotUniform::operator()(const Shape& shape, DType t) const {
  check_shape("glorot_uniform", shape);
  auto [fan_in, fan_out] = nfan(shape);
  return uniform_symmetric(shape, gain * std::sqrt(6.0 / double(fan_in + fan_out)), t);
}

Tensor GlorotUniform::operator()(int64_t out, int64_t in, DType t) const {
  if (out <= 0 || in <= 0) detail::fail("[glorot_uniform] dimensions must be positive; got (", out, ", ", in, ")");
  return (*this)(Shape{out, in}, t);
}

Tensor GlorotNormal::operator()(const Shape& shape, DType t) const {
  check_shape("glorot_normal", shape);
  auto [fan_in, fan_out] = nfan(shape);
  return randn(shape, t) * (gain * std::sqrt(2.0 / double(fan_in + fan_out)));
}

Tensor KaimingUniform::operator()(const Shape& shape, DType t) const {
  check_shape("kaiming_uniform", shape);
  return uniform_symmetric(shape, gain * std::sqrt(3.0 / double(nfan(shape).first)), t);
}

Tensor KaimingNormal::operator()(const Shape& shape, DType t) const {
  check_shape("kaiming_normal", shape);
  return randn(shape, t) * (gain / std::sqrt(double(nfan(shape).first)));
}

Tensor Orthogonal::operator()(const Shape& shape, DType t) const {
  check_shape("orthogonal", shape);
  if (shape.size() < 2)
    detail::fail("[orthogonal] needs at least 2 dimensions (a matrix); got shape ", to_string(shape));
  const int64_t rows = shape[0], cols = shape.numel() / shape[0];
  // Flux: orthogonal(rows, cols) = permutedims(orthogonal(cols, rows)) when rows < cols.
  const int64_t m = std::max(rows, cols), n = std::min(rows, cols);
  std::vector<double> q = orthonormal_columns(randn(Shape{m, n}, DType::f64).to_vector<double>(), m, n);
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] = gain * (rows >= cols ? q[size_t(r * n + c)] : q[size_t(c * n + r)]);
  return Tensor(out, shape).cast(t);
}

namespace detail {
Tensor initialise(const char* api, const Initialiser& init, const Shape& shape, DType t) {
  if (!init) fail("[", api, "] .init is empty; pass an initialiser such as glorot_uniform");
  checked_numel(api, shape, t);  // Dense(1 << 62, 4): an error naming the layer, not a wrapped count
  Tensor w = init(shape, t);
  if (!w.defined() || w.shape() != shape)
    fail("[", api, "] init returned ", w.defined() ? summary(w) : std::string("an undefined tensor"),
         "; expected shape ", to_string(shape));
  return w.dtype() == t ? w : w.cast(t);
}
}  // namespace detail

}  // namespace flux
