// libFuzzer target: the size arithmetic behind tensors and layers (src/checked_size.cpp and its
// callers), from fuzzed dimensions: zeros, reshape, broadcast_to, conv / conv_transpose / maxpool
// geometry, Dense, Embedding, DataLoader and arange. Each case's expected outcome is computed here in
// 128-bit arithmetic, and the library must agree: a shape that is negative or whose element count
// does not fit in int64 is a flux::Error (never a wrapped count, a crash or an object without
// storage); a small valid one succeeds with exactly that shape. Sizes between "small" and
// "unrepresentable" would allocate real memory, so those cases are not run.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flux/flux.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

namespace {
using i128 = __int128;
constexpr i128 kMax = std::numeric_limits<int64_t>::max();
constexpr i128 kSmall = 1 << 16;  // outputs at most this many elements are built
// Float32 tensors of more than this many elements have more bytes than the address space: an error.
constexpr i128 kTooBig = kMax / 4;

// a * b for a, b in [0, kMax + 1], capped at kMax + 1 (no 128-bit overflow: (2^63)^2 < 2^127).
i128 mul_cap(i128 a, i128 b) { return a * b > kMax ? kMax + 1 : a * b; }

// Reads fuzzed values: a selector byte picks a small size (0..8), a power of two near 2^31 / 2^62,
// or raw 8 bytes (any int64, negative included).
struct Input {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t byte() { return at < size ? data[at++] : 0; }
  int64_t raw() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    int64_t s;
    std::memcpy(&s, &v, sizeof s);
    return s;
  }
  int64_t dim() {
    const uint8_t sel = byte();
    switch (sel % 8) {
      case 0: case 1: case 2: case 3: return sel / 8 % 9;
      case 4: return (int64_t(1) << (28 + sel / 8 % 6)) + sel / 64;
      case 5: return (int64_t(1) << (58 + sel / 8 % 5)) - sel / 64;
      case 6: return -int64_t(sel / 8 % 3) - 1;
      default: return raw();
    }
  }
  int64_t positive() {  // >= 1 mostly (what stride and dilation need), with the occasional bad value
    int64_t v = dim();
    return byte() % 16 == 0 ? v : (v < 1 ? 1 - v % 4 : v);
  }
};

// The library's verdict on f(): 1 success, 0 flux::Error (OutOfMemory included). Any other exception
// escapes (a libFuzzer crash: every exception thrown to a user must be a flux::Error).
template <class F> int outcome(F f) {
  try {
    f();
    return 1;
  } catch (const Error&) {
    return 0;
  }
}

// Element count of dims in 128 bits, -1 when a dimension is negative, kMax + 1 once it passes int64.
i128 count(const std::vector<int64_t>& dims) {
  i128 n = 1;
  for (int64_t d : dims)
    if (d < 0) return -1;
  for (int64_t d : dims) {
    n *= d;
    if (n > kMax) return kMax + 1;
  }
  return n;
}

void check_zeros_and_reshape(Input& in) {
  const int nd = in.byte() % 9;
  std::vector<int64_t> dims;
  for (int i = 0; i < nd; ++i) dims.push_back(in.dim());
  const i128 n = count(dims);
  // zeros: an error for negative or uncountable shapes, the shape itself when small.
  if (n < 0 || n > kTooBig || n <= kSmall) {
    Tensor z;
    const int ok = outcome([&] { z = zeros(Shape(dims)); });
    flux_fuzz::check(ok == (n >= 0 && n <= kSmall), "zeros: success and the shape's element count disagree");
    if (ok) flux_fuzz::check(z.shape() == Shape(dims) && z.numel() == int64_t(n), "zeros: wrong shape");
  }
  // reshape of a 24-element tensor (a view, no allocation: always run); a -1 infers its axis, once.
  Tensor x = arange(24.0);
  std::vector<int64_t> target = dims;
  if (!target.empty() && in.byte() % 4 == 0) target[in.byte() % target.size()] = -1;
  int infer = -1;
  i128 known = 1;
  bool bad = false;
  for (size_t i = 0; i < target.size() && !bad; ++i) {
    if (target[i] == -1) {
      bad = infer >= 0;
      infer = int(i);
    } else if (target[i] < 0 || (known *= target[i]) > kMax) {
      bad = true;
    }
  }
  const bool fits = !bad && (infer >= 0 ? known != 0 && 24 % known == 0 : known == 24);
  Tensor r;
  const int ok = outcome([&] { r = x.reshape(Shape(target)); });
  flux_fuzz::check(ok == fits, "reshape: success and the element count disagree");
  if (ok) {
    flux_fuzz::check(r.numel() == 24 && r.ndim() == int(target.size()), "reshape: wrong element count");
    if (infer >= 0) flux_fuzz::check(r.shape()[infer] == int64_t(24 / known), "reshape: wrong inferred axis");
  }
  // broadcast_to from (1, 1) (allocates the result: only small or uncountable targets).
  if (dims.size() >= 2 && (n < 0 || n > kTooBig || n <= kSmall)) {
    Tensor b;
    const int bok = outcome([&] { b = broadcast_to(ones({1, 1}), Shape(dims)); });
    flux_fuzz::check(bok == (n >= 0 && n <= kSmall), "broadcast_to: success and the element count disagree");
    if (bok) flux_fuzz::check(b.shape() == Shape(dims), "broadcast_to: wrong shape");
  }
}

// One spatial axis of conv: out = (in + 2 pad - (d (k - 1) + 1)) / s + 1 in 128 bits; -1 when the
// window does not fit, kMax + 1 when an intermediate size passes int64.
i128 conv_axis(int64_t size, int64_t k, int64_t pad, int64_t stride, int64_t dilation) {
  const i128 padded = i128(size) + pad + pad, effective = i128(dilation) * (k - 1) + 1;
  if (padded > kMax || effective > kMax) return kMax + 1;
  if (effective > padded) return -1;
  return (padded - effective) / stride + 1;
}

void check_conv(Input& in) {
  const int64_t c = 1 + in.byte() % 3, o = 1 + in.byte() % 3, k = 1 + in.byte() % 3, size = 1 + in.byte() % 6;
  const int64_t pad = in.dim(), stride = in.positive(), dilation = in.positive();
  Tensor x = ones({1, c, size, size}), w = ones({o, c, k, k});
  const bool bad_options = pad < 0 || stride < 1 || dilation < 1;
  const i128 axis = bad_options ? -1 : conv_axis(size, k, pad, stride, dilation);
  const bool invalid = axis < 0;
  const i128 pixels = invalid ? 0 : mul_cap(axis, axis), columns = mul_cap(pixels, c * k * k), elements = mul_cap(pixels, o);
  const bool uncountable = !invalid && (axis > kMax || pixels > kMax || columns > kMax || elements > kTooBig);
  if (invalid || uncountable || (elements <= kSmall && columns <= 4 * kSmall)) {
    Tensor y;
    const int ok = outcome([&] { y = conv(x, w, Tensor(), {.stride = stride, .pad = pad, .dilation = dilation}); });
    flux_fuzz::check(ok == (!invalid && !uncountable), "conv: success and the geometry disagree");
    if (ok) flux_fuzz::check(y.shape() == Shape({1, o, int64_t(axis), int64_t(axis)}), "conv: wrong output shape");
  }
  // conv_transpose: out = (in - 1) s - 2 pad + d (k - 1) + 1 (output_padding 0); checked like conv,
  // and the unpadded extent (in - 1) s + d (k - 1) + 1 must fit in int64 too.
  const i128 extent = bad_options ? 0 : (i128(size) - 1) * stride + i128(dilation) * (k - 1) + 1;
  const i128 t = bad_options ? 0 : extent - 2 * i128(pad);
  const bool t_invalid = t < 1;
  const i128 t_elements = t_invalid ? 0 : mul_cap(mul_cap(t > kMax ? kMax + 1 : t, t > kMax ? kMax + 1 : t), o);
  const bool t_uncountable = !t_invalid && (t > kMax || extent > kMax || t_elements > kTooBig);
  if (t_invalid || t_uncountable || t_elements <= kSmall) {
    Tensor y;
    const int ok = outcome([&] { y = conv_transpose(x, ones({c, o, k, k}), Tensor(), {.stride = stride, .pad = pad, .dilation = dilation}); });
    flux_fuzz::check(ok == (!t_invalid && !t_uncountable), "conv_transpose: success and the geometry disagree");
    if (ok) flux_fuzz::check(y.shape() == Shape({1, o, int64_t(t), int64_t(t)}), "conv_transpose: wrong output shape");
  }
  // maxpool with a fuzzed window and pad: an error or the right shape, never a crash (its pad rule
  // is checked by the pooling tests).
  const int64_t window = in.dim();
  const i128 p = window > 0 && pad >= 0 ? conv_axis(size, window, pad, window, 1) : -1;
  const bool p_bad = p < 0 || p > kMax;
  const i128 p_elements = p_bad ? 0 : mul_cap(mul_cap(p, p), c);
  if (window > 0 && pad >= 0 && (p_bad || p_elements > kTooBig || p_elements <= kSmall)) {
    Tensor y;
    const int ok = outcome([&] { y = maxpool(x, {window, window}, {.pad = pad}); });
    if (p_bad || p_elements > kTooBig) flux_fuzz::check(!ok, "maxpool: accepted a window that does not fit");
    if (ok) flux_fuzz::check(y.shape() == Shape({1, c, int64_t(p), int64_t(p)}), "maxpool: wrong output shape");
  }
}

void check_layers(Input& in) {
  const int64_t a = in.dim(), b = in.dim();
  const i128 n = a <= 0 || b <= 0 ? -1 : mul_cap(a, b);
  if (n < 0 || n > kTooBig || n <= kSmall) {
    const bool good = n > 0 && n <= kSmall;
    Dense d;
    int ok = outcome([&] { d = Dense(a, b); });
    flux_fuzz::check(ok == good, "Dense: success and the weight's size disagree");
    if (ok) flux_fuzz::check(d.weight.shape() == Shape({b, a}), "Dense: wrong weight shape");
    Embedding e;
    ok = outcome([&] { e = Embedding(a, b); });
    flux_fuzz::check(ok == good, "Embedding: success and the table's size disagree");
    if (ok) flux_fuzz::check(e.weight.shape() == Shape({a, b}), "Embedding: wrong table shape");
  }
  // DataLoader over 1..16 observations with any batchsize: its length and its batches agree.
  const int64_t nobs = 1 + in.byte() % 16, batchsize = in.dim();
  const bool partial = in.byte() % 2;
  Tensor X = arange(double(nobs)).reshape({nobs, 1});
  int ok = outcome([&] {
    DataLoader loader({X}, {.batchsize = batchsize, .partial = partial});
    const int64_t want = nobs / batchsize + (partial && nobs % batchsize ? 1 : 0);
    flux_fuzz::check(loader.size() == want, "DataLoader: wrong number of batches");
    int64_t batches = 0, rows = 0;
    for (auto [xb] : loader) ++batches, rows += xb.shape()[0];
    flux_fuzz::check(batches == want && rows == (partial ? nobs : want * batchsize), "DataLoader: batches disagree with size()");
  });
  flux_fuzz::check(ok == (batchsize > 0), "DataLoader: success and the batchsize disagree");
}

void check_arange(Input& in) {
  double v[3];
  for (double& d : v) {
    const int64_t r = in.raw();
    std::memcpy(&d, &r, sizeof d);
    if (in.byte() % 2) d = double(r % 1000);  // mostly ordinary numbers
  }
  const double start = v[0], stop = v[1], step = v[2];
  const double count = std::ceil((stop - start) / step);
  const bool finite = std::isfinite(start) && std::isfinite(stop) && std::isfinite(step) && step != 0;
  if (!finite || !(count <= 9007199254740992.0) || count <= double(kSmall)) {
    Tensor t;
    const int ok = outcome([&] { t = arange(start, stop, step); });
    flux_fuzz::check(ok == (finite && count <= double(kSmall)), "arange: success and the element count disagree");
    if (ok) flux_fuzz::check(t.numel() == (count > 0 ? int64_t(count) : 0), "arange: wrong element count");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  switch (in.byte() % 4) {
    case 0: check_zeros_and_reshape(in); break;
    case 1: check_conv(in); break;
    case 2: check_layers(in); break;
    default: check_arange(in); break;
  }
  return 0;
}
