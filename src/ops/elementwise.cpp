// Elementwise ops with broadcasting, casts and device moves; each backward sits beside its forward.
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#include "flux/autodiff.hpp"
#include "flux/ops.hpp"
#include "src/checked_size.hpp"
#include "src/autocast.hpp"
#include "src/ops/ops_internal.hpp"
#include "src/ops/registry.hpp"
#include "src/ops/through_float32.hpp"
#include "src/trace.hpp"

namespace flux {

using backend::BinaryOp;
using backend::UnaryOp;
using Grads = std::vector<Tensor>;

namespace detail {

void check_defined(const char* api, const Tensor& t) {
  if (!t.defined()) fail("[", api, "] got an undefined (default-constructed) tensor");
}

void check_same_device(const char* api, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device())
    fail("[", api, "] tensors on ", to_string(a.device()), " and ", to_string(b.device()),
         "; move one with to(x, device)");
}

Shape broadcast_shapes(const char* api, const Shape& a, const Shape& b) {
  int n = std::max(a.size(), b.size());
  Shape out;
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.size()), ib = i - (n - b.size());
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail("[", api, "] shapes ", to_string(a), " and ", to_string(b), " cannot be broadcast together");
    out.push_back(da == 1 ? db : da);
  }
  checked_numel(api, out);
  return out;
}

// Element strides of `s` broadcast to `out` (0 on broadcast axes).
static void broadcast_strides(const Shape& s, const Shape& out, int64_t* strides) {
  int n = out.size(), off = n - s.size();
  int64_t st = 1;
  for (int i = n - 1; i >= 0; --i) {
    int j = i - off;
    if (j < 0 || s[j] == 1) {
      strides[i] = 0;
    } else {
      strides[i] = st;
    }
    if (j >= 0) st *= s[j];
  }
}

backend::Broadcast make_plan(const Shape& out, std::initializer_list<const Shape*> operands) {
  backend::Broadcast p;
  p.ndim = out.size();
  for (int i = 0; i < out.size(); ++i) p.shape[i] = out[i];
  int k = 0;
  p.contiguous = true;
  for (const Shape* s : operands) {
    broadcast_strides(*s, out, p.stride[k]);
    if (*s != out) p.contiguous = false;
    ++k;
  }
  return p;
}

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

Tensor raw_cast(const Tensor& x, DType t) {
  if (x.dtype() == t) return x;
  Tensor out = Tensor::empty(x.shape(), t, x.device());
  if (x.numel()) x.backend().cast(x.device().index(), x.dtype(), flux::detail::buffer_of(x), t, flux::detail::buffer_of(out), x.numel());
  if (trace::active()) trace::emit(ops::cast, {x}, out, {{"to", {int64_t(t)}, {}}});
  return out;
}

static std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  std::ostringstream os;
  os << v;
  return os.str();
}

// The rule for conversions to an integer dtype (README, "Conversions"): a value the integer type cannot
// hold (NaN, ±Inf, a float whose truncation is out of range, an Int64 beyond Int32 or UInt8) is a
// flux::Error, the same on every device (Julia's InexactError; a C++ cast would be undefined and the
// devices would disagree: INT64_MIN, wrapping, saturation). In-range floats truncate toward zero
// (C++, NumPy's astype, PyTorch's to()); Bool is x != 0. Costs a min, a max and one host read.
void check_integer_cast(const char* api, const Tensor& x, DType t) {
  if (t != DType::i32 && t != DType::i64 && t != DType::u8) return;
  const DType from = x.dtype();
  if (from == t || from == DType::boolean || from == DType::u8 || (from == DType::i32 && t == DType::i64)) return;
  if (x.numel() == 0) return;
  // Open bounds on the value itself: its truncation toward zero fits exactly inside them.
  const double below = t == DType::u8 ? -1.0 : t == DType::i32 ? -2147483649.0 : -9223372036854777856.0;
  const double above = t == DType::u8 ? 256.0 : t == DType::i32 ? 2147483648.0 : 9223372036854775808.0;
  autodiff::NoGrad no_grad;
  Tensor v = is_half(from) ? raw_cast(x, DType::f32) : x;
  Tensor range = stack({min(v).cast(DType::f64), max(v).cast(DType::f64)});
  const std::vector<double> lohi = range.to_vector<double>();
  const double lo = lohi[0], hi = lohi[1];
  double bad = 0;
  if (std::isnan(lo) || std::isnan(hi)) bad = std::numeric_limits<double>::quiet_NaN();
  else if (!(lo > below)) bad = lo;
  else if (!(hi < above)) bad = hi;
  else return;
  const char* range_text = t == DType::u8 ? "0 to 255" : t == DType::i32 ? "-2147483648 to 2147483647"
                                                                          : "-9223372036854775808 to 9223372036854775807";
  fail("[", api, "] cannot convert ", value_text(bad), " to ", dtype_name(t), " (from ", summary(x), "): NaN, Inf and ",
       "values outside ", range_text, " have no ", dtype_name(t), " value (Julia's InexactError); values in range ",
       "truncate toward zero");
}

}  // namespace detail

using namespace detail;

// ---------------- casts and moves ----------------
Tensor Tensor::cast(DType t) const {
  check_defined("cast", *this);
  if (dtype() == t) return *this;
  check_integer_cast("cast", *this, t);
  Tensor out = raw_cast(*this, t);
  DType from = dtype();
  if (is_floating(from) && is_floating(t))
    autodiff::record(out, {this}, [from](const Tensor& g) { return Grads{g.cast(from)}; });
  return out;
}

Tensor to(const Tensor& x, const Device& d) {
  check_defined("to", x);
  Device from = x.device();
  if (from == d) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), d);
  size_t bytes = x.nbytes();
  if (bytes) {
    backend::Backend& src = x.backend();
    backend::Backend& dst = out.backend();
    bool done = false;
    if (&src == &dst) done = src.copy_peer(d.index(), flux::detail::buffer_of(out), from.index(), flux::detail::buffer_of(x), bytes);
    if (!done) {
      if (from.is_cpu()) {
        dst.copy_from_host(d.index(), flux::detail::buffer_of(out), static_cast<char*>(flux::detail::buffer_of(x).handle) + flux::detail::buffer_of(x).offset, bytes);
      } else if (d.is_cpu()) {
        src.copy_to_host(from.index(), static_cast<char*>(flux::detail::buffer_of(out).handle) + flux::detail::buffer_of(out).offset, flux::detail::buffer_of(x), bytes);
      } else {
        std::vector<unsigned char> staging(bytes);
        src.copy_to_host(from.index(), staging.data(), flux::detail::buffer_of(x), bytes);
        dst.copy_from_host(d.index(), flux::detail::buffer_of(out), staging.data(), bytes);
        dst.synchronize(d.index());
      }
    }
  }
  autodiff::record(out, {&x}, [from](const Tensor& g) { return Grads{to(g, from)}; });
  if (trace::active()) trace::emit(ops::to, {x}, out);
  return out;
}

// ---------------- binary ----------------
namespace {

// Runs a broadcasting binary op in dtype `t` (inputs already cast).
Tensor binary_raw(const char* api, BinaryOp op, const Tensor& a, const Tensor& b) {
  Shape out_shape = broadcast_shapes(api, a.shape(), b.shape());
  bool cmp = op >= BinaryOp::eq;
  DType t = a.dtype();
  Tensor out = Tensor::empty(out_shape, cmp ? DType::boolean : t, a.device());
  if (out.numel() == 0) return out;
  backend::Broadcast plan = make_plan(out_shape, {&a.shape(), &b.shape()});
  a.backend().binary(a.device().index(), op, t, flux::detail::buffer_of(a), flux::detail::buffer_of(b), flux::detail::buffer_of(out), plan);
  return out;
}

// Whether the backward of `op` reads operand `which` (0: a, 1: b) when the gradients of the tracked
// operands (need_a, need_b) are computed: what the tape keeps of them.
bool operand_read(BinaryOp op, int which, bool need_a, bool need_b) {
  switch (op) {
    case BinaryOp::mul: return which == 0 ? need_b : need_a;    // da = g b, db = g a
    case BinaryOp::div: return which == 1 || need_b;            // da = g / b, db = -(g / b) a / b
    case BinaryOp::pow: case BinaryOp::maximum: case BinaryOp::minimum: return true;
    default: return false;                                      // add, sub: shapes only
  }
}

// The gradients of a and b (shapes sa, sb) of out = op(a, b) for the output gradient g; a, b and out
// are defined where operand_read (and, for pow, out) says the formula reads them.
Grads binary_grads(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, const Shape& sa, const Shape& sb,
                   bool need_a, bool need_b, const Tensor& g) {
  switch (op) {
    case BinaryOp::add: return Grads{need_a ? sum_to(g, sa) : Tensor(), need_b ? sum_to(g, sb) : Tensor()};
    case BinaryOp::sub: return Grads{need_a ? sum_to(g, sa) : Tensor(), need_b ? sum_to(-g, sb) : Tensor()};
    case BinaryOp::mul: return Grads{need_a ? sum_to(g * b, sa) : Tensor(), need_b ? sum_to(g * a, sb) : Tensor()};
    case BinaryOp::div: {
      Tensor ga = g / b;
      return Grads{sum_to(ga, sa), need_b ? sum_to(-(ga * a) / b, sb) : Tensor()};
    }
    case BinaryOp::pow: {
      // d/da a^b = b a^(b-1), taken as 0 where b == 0 (a^0 is constant, also at a = 0; not 0 * Inf)
      Tensor zero = zeros(Shape{}, g.dtype(), g.device());
      Tensor ga = where(eq(b, zero), zero, g * b * pow(a, b - 1.0));
      Tensor safe_log = log(where(a > 0.0, a, ones_like(a)));
      Tensor gb = g * out * safe_log;
      return Grads{sum_to(ga, sa), sum_to(gb, sb)};
    }
    case BinaryOp::maximum:
    case BinaryOp::minimum: {
      const bool is_max = op == BinaryOp::maximum;
      // The gradient goes to the operand that was taken (a on ties). A NaN operand was taken (the
      // output is NaN) and its derivative is NaN: g * a there, never a silent 0 (clamp, relu-like uses).
      Tensor nan_a = ne(a, a), nan_b = ne(b, b);
      Tensor pick_a = where(nan_b, nan_a, is_max ? ge(a, b) : le(a, b));  // with nan_a: ge/le are false
      pick_a = where(nan_a, nan_a, pick_a);
      Tensor z = zeros(Shape{}, g.dtype(), g.device());
      Tensor ga = where(pick_a, where(nan_a, g * a, g), z), gb = where(pick_a, z, where(nan_b, g * b, g));
      return Grads{sum_to(ga, sa), sum_to(gb, sb)};
    }
    default: return Grads{Tensor(), Tensor()};
  }
}

Tensor binary(const ops::Op& entry, BinaryOp op, const Tensor& a0, const Tensor& b0) {
  const char* api = entry.name;
  check_defined(api, a0);
  check_defined(api, b0);
  check_same_device(api, a0, b0);
  DType t = promote(a0.dtype(), b0.dtype());
  bool cmp = op >= BinaryOp::eq;
  if (t == DType::boolean && !cmp && op != BinaryOp::maximum && op != BinaryOp::minimum) t = DType::i64;
  // `/` is true division as in Julia and NumPy: integers divide to Float32 (never truncate).
  if ((op == BinaryOp::pow || op == BinaryOp::div) && !is_floating(t)) t = DType::f32;
  DType compute = is_half(t) ? DType::f32 : t;
  // Half operands: one node on the half operands, which are what it keeps (what autocast's memory
  // saving rests on: no Float32 copies outlive the op). x + y and x - y (residual connections, bias
  // adds): an operand of the output's shape gets g or -g exactly, in the low dtype; a broadcast one, g
  // summed in Float32. The others cast the kept operands up and run the Float32 formulas.
  if (is_half(t) && a0.dtype() == t && b0.dtype() == t && !trace::active()) {
    const Shape s = broadcast_shapes(api, a0.shape(), b0.shape());
    const bool need_a = autodiff::tracked(a0), need_b = autodiff::tracked(b0);
    const bool exact = (op == BinaryOp::add || op == BinaryOp::sub) && (a0.shape() == s || b0.shape() == s);
    LowBackward backward;
    if (exact)
      backward = [op, need_a, need_b, sa = a0.shape(), sb = b0.shape()](const Grads&, const Tensor& g) {
        auto grad = [&](const Shape& to, bool negate) {
          if (to == g.shape()) return negate ? -g : g;
          const Tensor summed = sum_to(raw_cast(g, DType::f32), to);
          return negate ? -summed : summed;
        };
        return Grads{need_a ? grad(sa, false) : Tensor(), need_b ? grad(sb, op == BinaryOp::sub) : Tensor()};
      };
    else
      backward = [api, op, need_a, need_b, sa = a0.shape(), sb = b0.shape()](const Grads& k, const Tensor& g) {
        const Tensor o = op == BinaryOp::pow ? binary_raw(api, op, k[0], k[1]) : Tensor();
        return binary_grads(op, k[0], k[1], o, sa, sb, need_a, need_b, g);
      };
    const Tensor none;  // a comparison has no gradient: no node
    return through_float32(
        nullptr, {cmp ? &none : &a0, cmp ? &none : &b0},
        {operand_read(op, 0, need_a, need_b) ? a0 : Tensor(), operand_read(op, 1, need_a, need_b) ? b0 : Tensor()},
        [&](Grads&) {
          // One pass on the backend where it reads half storage (binary_half: the same bits as the three passes).
          if (half_storage(a0)) {
            Tensor out = Tensor::empty(s, cmp ? DType::boolean : t, a0.device());
            if (out.numel() == 0 || a0.backend().binary_half(a0.device().index(), op, t, buffer_of(a0), buffer_of(b0),
                                                             buffer_of(out), make_plan(s, {&a0.shape(), &b0.shape()})))
              return out;
          }
          const Tensor out = binary_raw(api, op, raw_cast(a0, DType::f32), raw_cast(b0, DType::f32));
          return cmp ? out : raw_cast(out, t);
        },
        std::move(backward), {}, exact ? std::optional<DType>(t) : DType::f32);
  }
  // A Float32 and a Float16/BFloat16 operand of one shape added or subtracted (a residual connection
  // under autocast: x + f(x) with f in bf16): one pass on the backend where it reads the half storage
  // (binary_mixed), bitwise the cast up and the Float32 op, one node whose gradients g and ±g are cast
  // to each operand's dtype (as the recorded cast's would be).
  if ((op == BinaryOp::add || op == BinaryOp::sub) && a0.shape() == b0.shape() &&
      (a0.dtype() == DType::f32 ? half_storage(b0) : b0.dtype() == DType::f32 && half_storage(a0)) && !trace::active()) {
    const bool half_first = a0.dtype() != DType::f32, need_a = autodiff::tracked(a0), need_b = autodiff::tracked(b0);
    return through_float32(
        nullptr, {&a0, &b0}, {},
        [&](Grads&) {
          Tensor out = Tensor::empty(a0.shape(), DType::f32, a0.device());
          if (out.numel() == 0 || a0.backend().binary_mixed(a0.device().index(), op, half_first ? a0.dtype() : b0.dtype(),
                                                            half_first, buffer_of(a0), buffer_of(b0), buffer_of(out),
                                                            out.numel()))
            return out;
          return binary_raw(api, op, raw_cast(a0, DType::f32), raw_cast(b0, DType::f32));
        },
        [op, need_a, need_b](const Grads&, const Tensor& g) {
          return Grads{need_a ? g : Tensor(), need_b ? (op == BinaryOp::sub ? -g : g) : Tensor()};
        });
  }
  Tensor a = a0.dtype() == compute ? a0 : a0.cast(compute);
  Tensor b = b0.dtype() == compute ? b0 : b0.cast(compute);
  Tensor out;
  {
    autodiff::NoGrad inner;  // the casts above are recorded; the raw op is recorded below
    out = binary_raw(api, op, a, b);
  }
  if (trace::active()) trace::emit(entry, {a, b}, out);
  if (!cmp && is_floating(compute)) {
    // Only the gradients of tracked operands are computed: x * 2.0 or x + bias_constant would
    // otherwise pay a full-size product and a reduction for the constant (undefined = zero); only
    // the operands those gradients read are kept.
    const bool need_a = autodiff::tracked(a), need_b = autodiff::tracked(b);
    const Tensor keep_a = operand_read(op, 0, need_a, need_b) ? a : Tensor();
    const Tensor keep_b = operand_read(op, 1, need_a, need_b) ? b : Tensor();
    const Tensor keep_out = op == BinaryOp::pow ? out : Tensor();
    autodiff::record(out, {&a, &b}, [op, keep_a, keep_b, keep_out, sa = a.shape(), sb = b.shape(), need_a,
                                     need_b](const Tensor& g) {
      return binary_grads(op, keep_a, keep_b, keep_out, sa, sb, need_a, need_b, g);
    });
  }
  if (!cmp && is_half(t)) return out.cast(t);
  return out;
}

Tensor scalar_like(const Tensor& x, double v) {
  check_defined("scalar", x);
  DType t = x.dtype();
  if (!is_floating(t) && v != std::floor(v)) t = DType::f32;
  if (t == DType::boolean) t = DType::i64;
  return full(Shape{}, v, t, x.device());
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(ops::add, BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(ops::sub, BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(ops::mul, BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(ops::div, BinaryOp::div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(ops::pow, BinaryOp::pow, a, b); }
Tensor pow(const Tensor& a, double e) {
  if (e == 2.0) return square(a);
  return binary(ops::pow, BinaryOp::pow, a, scalar_like(a, e).cast(is_floating(a.dtype()) ? a.dtype() : DType::f32));
}
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(ops::maximum, BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(ops::minimum, BinaryOp::minimum, a, b); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like(b, a), b); }
Tensor operator-(const Tensor& a) { return neg(a); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary(ops::eq, BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(ops::ne, BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(ops::lt, BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(ops::le, BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(ops::gt, BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(ops::ge, BinaryOp::ge, a, b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator>(const Tensor& a, double b) { return gt(a, scalar_like(a, b)); }
Tensor operator<(const Tensor& a, double b) { return lt(a, scalar_like(a, b)); }

Tensor where(const Tensor& cond, const Tensor& a0, const Tensor& b0) {
  check_defined("where", cond);
  check_defined("where", a0);
  check_defined("where", b0);
  check_same_device("where", cond, a0);
  check_same_device("where", a0, b0);
  if (cond.dtype() != DType::boolean)
    fail("[where] the condition must be a Bool tensor, got ", dtype_name(cond.dtype()));
  DType t = promote(a0.dtype(), b0.dtype());
  DType compute = is_half(t) ? DType::f32 : t;
  Tensor a = a0.cast(compute), b = b0.cast(compute);
  Shape s = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a.shape()), b.shape());
  Tensor out = Tensor::empty(s, compute, a.device());
  if (out.numel()) {
    backend::Broadcast plan = make_plan(s, {&cond.shape(), &a.shape(), &b.shape()});
    a.backend().where(a.device().index(), compute, flux::detail::buffer_of(cond), flux::detail::buffer_of(a), flux::detail::buffer_of(b), flux::detail::buffer_of(out), plan);
  }
  if (trace::active()) trace::emit(ops::where, {cond, a, b}, out);
  if (is_floating(compute)) {
    const bool need_a = autodiff::tracked(a), need_b = autodiff::tracked(b);  // e.g. where(mask, s, -inf)
    autodiff::record(out, {&a, &b}, [cond, sa = a.shape(), sb = b.shape(), need_a, need_b](const Tensor& g) {
      Tensor z = zeros(Shape{}, g.dtype(), g.device());
      return Grads{need_a ? sum_to(where(cond, g, z), sa) : Tensor(), need_b ? sum_to(where(cond, z, g), sb) : Tensor()};
    });
  }
  return is_half(t) ? out.cast(t) : out;
}

// ---------------- unary ----------------
namespace {
// op(x) unrecorded; Float16/BFloat16 in one pass where the backend reads half storage (unary_half: the
// same bits), else through Float32.
Tensor unary_raw(UnaryOp op, const Tensor& x, double alpha = 0) {
  const bool half = is_half(x.dtype());
  if (!half || half_storage(x)) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend::Backend& be = x.backend();
    const int dev = x.device().index();
    if (x.numel() == 0) return out;
    if (!half) be.unary(dev, op, x.dtype(), buffer_of(x), buffer_of(out), x.numel(), alpha);
    if (!half || be.unary_half(dev, op, x.dtype(), buffer_of(x), buffer_of(out), x.numel(), alpha)) return out;
  }
  return raw_cast(unary_raw(op, raw_cast(x, DType::f32), alpha), x.dtype());
}

bool needs_float(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::sign: case UnaryOp::square: case UnaryOp::relu:
    case UnaryOp::step: return false;
    default: return true;
  }
}

// Forward in the compute dtype, record backward(x, y, g), cast back for half types.
template <class B> Tensor unary(const ops::Op& entry, UnaryOp op, const Tensor& x0, double alpha, B backward) {
  const char* api = entry.name;
  check_defined(api, x0);
  DType t = x0.dtype();
  if (needs_float(op) && !is_floating(t)) t = DType::f32;
  if (t == DType::boolean) t = DType::i64;
  DType compute = is_half(t) ? DType::f32 : t;
  if (is_half(t) && x0.dtype() == t) {
    // Half storage: the tape keeps x and y in the half dtype (what autocast's memory saving rests on)
    // and runs the backward formula in Float32.
    return through_float32(
        &entry, {&x0}, {x0},
        [&](Grads& kept) {
          Tensor y = unary_raw(op, x0, alpha);
          kept.push_back(y);
          return y;
        },
        [backward](const Grads& k, const Tensor& g) { return Grads{backward(k[0], k[1], g)}; },
        {{"alpha", {}, {alpha}}});
  }
  Tensor x = x0.cast(compute);
  Tensor y = unary_raw(op, x, alpha);
  if (trace::active()) trace::emit(entry, {x}, y, {{"alpha", {}, {alpha}}});
  if (is_floating(compute))
    autodiff::record(y, {&x}, [x, y, backward](const Tensor& g) { return Grads{backward(x, y, g)}; });
  return is_half(t) ? y.cast(t) : y;
}
}  // namespace

Tensor neg(const Tensor& x) { return unary(ops::neg, UnaryOp::neg, x, 0, [](auto&, auto&, const Tensor& g) { return -g; }); }
// exp and log are on autocast's Float32 list.
Tensor exp(const Tensor& x0) {
  const Tensor x = autocast_f32(x0);
  return unary(ops::exp, UnaryOp::exp, x, 0, [](auto&, const Tensor& y, const Tensor& g) { return g * y; });
}
Tensor log(const Tensor& x0) {
  const Tensor x = autocast_f32(x0);
  return unary(ops::log, UnaryOp::log, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g / x; });
}
Tensor sqrt(const Tensor& x) {
  return unary(ops::sqrt, UnaryOp::sqrt, x, 0, [](auto&, const Tensor& y, const Tensor& g) { return g / (y * 2.0); });
}
Tensor abs(const Tensor& x) {
  return unary(ops::abs, UnaryOp::abs, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g * sign(x); });
}
Tensor sign(const Tensor& x) {
  return unary(ops::sign, UnaryOp::sign, x, 0, [](auto&, auto&, const Tensor& g) { return zeros_like(g); });
}
Tensor square(const Tensor& x) {
  return unary(ops::square, UnaryOp::square, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g * x * 2.0; });
}
Tensor sin(const Tensor& x) { return unary(ops::sin, UnaryOp::sin, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g * cos(x); }); }
Tensor cos(const Tensor& x) { return unary(ops::cos, UnaryOp::cos, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return -(g * sin(x)); }); }
// erf'(x) = 2/sqrt(pi) exp(-x^2)
Tensor erf(const Tensor& x) {
  return unary(ops::erf, UnaryOp::erf, x, 0, [](const Tensor& x, auto&, const Tensor& g) {
    return g * exp(-(x * x)) * 1.1283791670955126;
  });
}
Tensor log1p(const Tensor& x) {
  return unary(ops::log1p, UnaryOp::log1p, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g / (x + 1.0); });
}
Tensor detail::tanh_op(const Tensor& x) {
  return unary(ops::tanh, UnaryOp::tanh, x, 0, [](auto&, const Tensor& y, const Tensor& g) { return g * (1.0 - y * y); });
}
Tensor clamp(const Tensor& x, double lo, double hi) {
  if (lo > hi) fail("[clamp] lower bound ", lo, " is above upper bound ", hi);
  return minimum(maximum(x, scalar_like(x, lo).cast(x.dtype())), scalar_like(x, hi).cast(x.dtype()));
}

namespace detail {
Tensor sigmoid_op(const Tensor& x) {
  return unary(ops::sigmoid, UnaryOp::sigmoid, x, 0, [](auto&, const Tensor& y, const Tensor& g) { return g * y * (1.0 - y); });
}
Tensor fused_unary_grad(UnaryOp op, const Tensor& x, const Tensor& g);  // below
Tensor relu_grad(const Tensor& x, const Tensor& g) {
  if (Tensor dx = fused_unary_grad(UnaryOp::relu, x, g); dx.defined()) return dx;
  return g * unary_raw(UnaryOp::step, x);
}
Tensor relu_op(const Tensor& x) {
  if (x.defined() && is_half(x.dtype())) {
    // A low activation: the mask product is exact in the low dtype, so the backward runs there: one
    // pass where the backend has relu's fused gradient on half storage, else the step and the product
    // (no Float32 copies of x, y and g either way).
    return through_float32(
        &ops::relu, {&x}, {x}, [&](Grads&) { return unary_raw(UnaryOp::relu, x); },
        [](const Grads& k, const Tensor& g) { return Grads{relu_grad(k[0], g)}; }, {{"alpha", {}, {0.0}}}, x.dtype());
  }
  return unary(ops::relu, UnaryOp::relu, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return relu_grad(x, g); });
}
Tensor leakyrelu_op(const Tensor& x, double a) {
  return unary(ops::leakyrelu, UnaryOp::leakyrelu, x, a, [a](const Tensor& x, auto&, const Tensor& g) {
    Tensor s = unary_raw(UnaryOp::step, x);
    return g * (s * (1.0 - a) + a);
  });
}
// Backward formulas avoid cancellation where the forward saturates: elu's a exp(x) rather than
// y + a, gelu's and swish's sigmoid(-u) rather than 1 - sigmoid(u) (NNlib's deriv_gelu uses the
// sigmoid form), so the gradients stay exact in the tails whatever the last ulp of the device's
// exp/tanh. sigmoid' = y (1 - y) and tanh' = 1 - y^2 (as NNlib and PyTorch) have no large factor:
// their error is at most ~1 ulp of 1, and 0 where y is exactly 1 (the kernels saturate exactly).
Tensor elu_op(const Tensor& x, double a) {
  return unary(ops::elu, UnaryOp::elu, x, a, [a](const Tensor& x, auto&, const Tensor& g) {
    return where(x > 0.0, g, g * exp(x) * a);
  });
}
// The backend's fused dx = g f'(x) (Backend::unary_backward) for f32/f64 (relu: bf16/f16 too), or
// undefined when it has none (or FLUX_LIBRARY_KERNELS=0): the callers then compose the same formula from ops.
Tensor fused_unary_grad(UnaryOp op, const Tensor& x, const Tensor& g) {
  const DType t = x.dtype();
  const bool dtype_ok = t == DType::f32 || t == DType::f64 || (op == UnaryOp::relu && is_half(t));
  if (!library_kernels() || !dtype_ok || g.dtype() != t || g.shape() != x.shape())
    return Tensor();
  Tensor dx = Tensor::empty(x.shape(), t, x.device());
  if (x.numel() == 0) return dx;
  if (!x.backend().unary_backward(x.device().index(), op, t, flux::detail::buffer_of(x), flux::detail::buffer_of(g), flux::detail::buffer_of(dx), x.numel()))
    return Tensor();
  return dx;
}
Tensor gelu_op(const Tensor& x) {
  return unary(ops::gelu, UnaryOp::gelu, x, 0, [](const Tensor& x, auto&, const Tensor& g) {
    if (Tensor dx = fused_unary_grad(UnaryOp::gelu, x, g); dx.defined()) return dx;
    // gelu(x) = x s(u), u = c2 x (1 + k x^2), c2 = 2 sqrt(2 / pi):
    // gelu'(x) = s(u) + x s(u) s(-u) c2 (1 + 3 k x^2)
    const double c2 = 1.5957691216057308, k = 0.044715;
    Tensor x2 = x * x;
    Tensor u = x * (1.0 + x2 * k) * c2;
    Tensor s = sigmoid_op(u);
    return g * (s + x * s * sigmoid_op(-u) * (1.0 + x2 * (3.0 * k)) * c2);
  });
}
// PyTorch's exact GELU from public ops (their backward comes with them). Traced as one "gelu_erf"
// event, so that the exporter can write it as one node (ONNX Gelu from opset 20).
Tensor gelu_erf_op(const Tensor& x) {
  auto composite = [&] { return x * (1.0 + erf(x * 0.70710678118654752440)) * 0.5; };
  if (!trace::active()) return composite();
  Tensor y;
  {
    trace::Scope untraced(nullptr);
    y = composite();
  }
  trace::emit(ops::gelu_erf, {x}, y);
  return y;
}
Tensor softplus_op(const Tensor& x) {
  return unary(ops::softplus, UnaryOp::softplus, x, 0, [](const Tensor& x, auto&, const Tensor& g) { return g * sigmoid_op(x); });
}
Tensor swish_op(const Tensor& x) {
  return unary(ops::swish, UnaryOp::swish, x, 0, [](const Tensor& x, auto&, const Tensor& g) {
    if (Tensor dx = fused_unary_grad(UnaryOp::swish, x, g); dx.defined()) return dx;
    Tensor s = sigmoid_op(x);  // swish'(x) = s + x s (1 - s), with 1 - s = sigmoid(-x): exact for large x
    return g * (s + x * s * sigmoid_op(-x));
  });
}
Tensor step_raw(const Tensor& x) { return unary_raw(UnaryOp::step, x); }
}  // namespace detail

// ---------------- in place ----------------
void copy_(Tensor& dst, const Tensor& src) {
  check_defined("copy_", dst);
  check_defined("copy_", src);
  if (dst.shape() != src.shape())
    fail("[copy_] shapes ", to_string(dst.shape()), " (destination) and ", to_string(src.shape()), " (source) differ");
  Tensor s = src;
  if (s.device() != dst.device()) s = to(s, dst.device());
  if (s.dtype() != dst.dtype()) {
    check_integer_cast("copy_", s, dst.dtype());
    s = raw_cast(s, dst.dtype());
  }
  if (dst.nbytes()) dst.backend().copy(dst.device().index(), flux::detail::buffer_of(dst), flux::detail::buffer_of(s), dst.nbytes());
  mark_written(dst);
}

void sub_(Tensor& dst, const Tensor& src) {
  check_defined("sub_", dst);
  check_defined("sub_", src);
  check_same_device("sub_", dst, src);
  if (dst.shape() != src.shape() || dst.dtype() != src.dtype())
    fail("[sub_] needs equal shapes and dtypes; got ", summary(dst), " and ", summary(src));
  if (is_half(dst.dtype())) {  // kernels have no half arithmetic: subtract in float32, store back
    autodiff::NoGrad no_grad;
    Tensor d32 = raw_cast(dst, DType::f32);
    sub_(d32, raw_cast(src, DType::f32));
    copy_(dst, d32);
    return;
  }
  backend::Broadcast plan = make_plan(dst.shape(), {&dst.shape(), &src.shape()});
  if (dst.numel())
    dst.backend().binary(dst.device().index(), BinaryOp::sub, dst.dtype(), flux::detail::buffer_of(dst), flux::detail::buffer_of(src), flux::detail::buffer_of(dst), plan);
  mark_written(dst);
}

}  // namespace flux
