// Character-level text data; see include/flux/data/text.hpp.
#include "flux/data/text.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "flux/backend.hpp"
#include "flux/error.hpp"
#include "flux/out_of_memory.hpp"
#include "src/data/read_file.hpp"

namespace flux::data {
namespace {

using flux::detail::fail;

std::string shape_of(const Tensor& t) { return to_string(t.shape()); }

/// A printable form of one byte for messages: 'a', '\n', 0xff.
std::string show_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (c == '\n') return "'\\n'";
  if (c == '\t') return "'\\t'";
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", u);
  return buf;
}

std::vector<int64_t> ids_of(const char* api, const Tensor& ids) {
  if (!ids.defined()) fail("[", api, "] the id tensor is undefined");
  if (ids.dtype() != DType::i64 && ids.dtype() != DType::i32)
    fail("[", api, "] expects Int32 or Int64 ids, got ", dtype_name(ids.dtype()), " of shape ", shape_of(ids));
  return ids.to_vector<int64_t>();
}

}  // namespace

namespace detail {

std::string read_text_file(const char* api, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("[", api, "] cannot open '", path, "': no such file");
  if (std::filesystem::is_directory(path, ec)) fail("[", api, "] cannot open '", path, "': is a directory");
  // A device file (/dev/zero) would be read without end; a FIFO (a pipe, <(...)) ends and is allowed.
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::is_regular_file(status) && !std::filesystem::is_fifo(status))
    fail("[", api, "] cannot read '", path, "': not a regular file (a device, socket or other special file)");
  // gzread reads plain files unchanged and inflates gzip members.
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail("[", api, "] cannot open '", path, "' for reading");
  std::string text;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n > 0) {
      try {
        text.append(buf, size_t(n));
      } catch (const std::exception&) {  // bad_alloc / length_error: a gzip bomb or a huge file
        gzclose(f);
        throw OutOfMemory("CPU", text.size() + size_t(n), 0, 0, 0, std::string("host memory for [") + api + "] '" + path + "'");
      }
    }
    if (n < int(sizeof buf)) {
      int code = Z_OK;
      const char* msg = gzerror(f, &code);
      if (code != Z_OK && code != Z_STREAM_END) {
        std::string why = msg ? msg : "zlib error " + std::to_string(code);
        gzclose(f);
        fail("[", api, "] '", path, "' is a corrupt or truncated gzip file (zlib: ", why, ") after ", text.size(),
             " inflated bytes");
      }
      if (n <= 0 || gzeof(f)) break;
    }
  }
  gzclose(f);
  return text;
}

}  // namespace detail

std::string load_text(const std::string& path) { return detail::read_text_file("load_text", path); }

CharVocab::CharVocab(const std::string& text) {
  if (text.empty()) fail("[CharVocab] the text is empty; a vocabulary needs at least one character");
  bool seen[256] = {};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::fill(std::begin(index_), std::end(index_), int16_t(-1));
  for (int b = 0; b < 256; ++b)
    if (seen[b]) {
      index_[b] = int16_t(symbols_.size());
      symbols_.push_back(static_cast<char>(b));
    }
}

int64_t CharVocab::id(char c) const {
  int16_t i = index_[static_cast<unsigned char>(c)];
  if (i < 0) fail("[CharVocab] character ", show_char(c), " is not in the vocabulary of ", size(), " symbols");
  return i;
}

char CharVocab::symbol(int64_t id) const {
  if (id < 0 || id >= size())
    fail("[CharVocab] id ", id, " is out of range for a vocabulary of ", size(), " symbols (expected 0..", size() - 1,
         ")");
  return symbols_[size_t(id)];
}

Tensor CharVocab::encode(const std::string& s) const {
  std::vector<int64_t> ids(s.size());
  for (size_t i = 0; i < s.size(); ++i) ids[i] = id(s[i]);
  return Tensor(ids, Shape{int64_t(s.size())});
}

std::string CharVocab::decode(const std::vector<int64_t>& ids) const {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) s[i] = symbol(ids[i]);
  return s;
}

std::string CharVocab::decode(const Tensor& ids) const { return decode(ids_of("CharVocab", ids)); }

TextWindows text_windows(const Tensor& ids, int64_t seq_len, int64_t stride) {
  std::vector<int64_t> v = ids_of("text_windows", ids);
  if (ids.ndim() != 1) fail("[text_windows] expects a 1-D id sequence, got shape ", shape_of(ids));
  if (seq_len < 1) fail("[text_windows] seq_len must be at least 1, got ", seq_len);
  if (stride < 0) fail("[text_windows] stride must be 0 (= seq_len) or positive, got ", stride);
  if (stride == 0) stride = seq_len;
  const int64_t L = int64_t(v.size());
  if (L < seq_len + 1)
    fail("[text_windows] a sequence of ", L, " ids is too short for one window of ", seq_len,
         " ids plus its next-id target (needs ", seq_len + 1, ")");
  const int64_t n = (L - seq_len - 1) / stride + 1;
  std::vector<int64_t> x(size_t(n * seq_len)), y(size_t(n * seq_len));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < seq_len; ++t) {
      x[size_t(i * seq_len + t)] = v[size_t(i * stride + t)];
      y[size_t(i * seq_len + t)] = v[size_t(i * stride + t + 1)];
    }
  return {Tensor(x, Shape{n, seq_len}), Tensor(y, Shape{n, seq_len})};
}

TextSplit split_text(const Tensor& ids, double validation_fraction) {
  std::vector<int64_t> v = ids_of("split_text", ids);
  if (ids.ndim() != 1) fail("[split_text] expects a 1-D id sequence, got shape ", shape_of(ids));
  if (!(validation_fraction > 0 && validation_fraction < 1))
    fail("[split_text] validation_fraction must lie in (0, 1), got ", validation_fraction);
  const int64_t L = int64_t(v.size());
  const int64_t n_valid = int64_t(double(L) * validation_fraction);
  if (n_valid < 1 || n_valid >= L)
    fail("[split_text] a fraction ", validation_fraction, " of ", L, " ids leaves an empty part");
  const int64_t n_train = L - n_valid;
  std::vector<int64_t> a(v.begin(), v.begin() + n_train), b(v.begin() + n_train, v.end());
  return {Tensor(a, Shape{n_train}), Tensor(b, Shape{n_valid})};
}

}  // namespace flux::data
