// libFuzzer target: data::read_csv (plain or gzip) with options taken from the input's first byte
// (delimiter, header, dtype). Every input either throws flux::Error or gives a (rows, columns) CPU
// tensor that survives printing every value (%.17g) and parsing the text again, bit for bit.
#include <cmath>
#include <cstdio>

#include "flux/flux.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  data::CsvOptions options;
  const char delimiters[] = {',', ';', '\t', ' '};
  options.delimiter = delimiters[mode & 3];
  options.header = (mode >> 2) & 1;
  const DType dtypes[] = {DType::f32, DType::f64, DType::i32, DType::i64};
  options.dtype = dtypes[(mode >> 3) & 3];
  if ((mode >> 5) & 1) options.columns = {0, -1};
  const std::string& path = flux_fuzz::input_path(data + 1, size - 1);
  Tensor t;
  try {
    t = data::read_csv(path, options);
  } catch (const Error&) {
    return 0;
  }
  flux_fuzz::check(t.defined() && t.shape().size() == 2 && t.dtype() == options.dtype, "read_csv gave no 2-D tensor of the dtype");
  if (t.numel() > 100000) return 0;
  // Print and parse again: the same tensor (integers printed as integers, floats with %.17g).
  const bool integer = options.dtype == DType::i32 || options.dtype == DType::i64;
  auto v = t.to_vector<double>();
  auto n = integer ? t.to_vector<int64_t>() : std::vector<int64_t>();  // no float -> int casts of inf
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  if (rows == 0) return 0;
  std::string text;
  char buf[64];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      if (integer) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n[i]));
      else std::snprintf(buf, sizeof buf, "%.17g", v[i]);
      text += (c ? "," : "");
      text += buf;
    }
    text += "\n";
  }
  data::CsvOptions again;
  again.dtype = options.dtype;
  Tensor u = data::parse_csv(text, again, "<reprinted>");
  flux_fuzz::check(u.shape() == t.shape(), "the reprinted table has another shape");
  auto w = u.to_vector<double>();
  auto m = integer ? u.to_vector<int64_t>() : std::vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (integer) flux_fuzz::check(n[i] == m[i], "an integer changed when printed and parsed");
    else flux_fuzz::check(std::isnan(v[i]) ? std::isnan(w[i]) : v[i] == w[i], "a value changed when printed and parsed");
  }
  return 0;
}
