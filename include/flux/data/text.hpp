// Character-level text data: read a text file (plain or gzip), map its characters to integer ids,
// cut (N, T) windows with next-character targets, split train / validation.
//   std::string text = data::load_text(FLUX_SOURCE_DIR "/data/kjv_genesis_exodus.txt.gz");
//   data::CharVocab vocab(text);                       // the distinct bytes, sorted
//   auto [train, valid] = data::split_text(vocab.encode(text), 0.1);   // (L,) Int64 each
//   auto w = data::text_windows(train, 64);            // inputs (N, 64), targets (N, 64): next ids
// The shipped text (data/kjv_genesis_exodus.txt.gz, public domain, see data/LICENSE-kjv) is
// Genesis and Exodus of the King James Version, one verse per line: 366,194 bytes, 62 symbols.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::data {

/// The file's text; gzip files (magic 0x1f 0x8b, whatever their name) are inflated. A missing,
/// unreadable or corrupt file is a flux::Error naming the path.
std::string load_text(const std::string& path);

/// A character vocabulary: the distinct bytes of a text, in ascending byte order; id i is the i-th.
class CharVocab {
 public:
  /// The vocabulary of `text` (which must not be empty).
  explicit CharVocab(const std::string& text);
  int64_t size() const { return int64_t(symbols_.size()); }
  /// The symbols in id order.
  const std::string& symbols() const { return symbols_; }
  /// The id of `c`; a flux::Error if the vocabulary lacks it.
  int64_t id(char c) const;
  char symbol(int64_t id) const;
  /// Ids of every character of `s`, a (len,) Int64 CPU tensor.
  Tensor encode(const std::string& s) const;
  /// The text of integer ids (any shape, Int32 or Int64, any device), row-major.
  std::string decode(const Tensor& ids) const;
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::string symbols_;
  int16_t index_[256];
};

/// (N, T) Int64 windows of a 1-D id sequence: inputs[i] = ids[s, s + T), targets[i] = ids[s + 1,
/// s + T + 1), s = i * stride; N = floor((L - T - 1) / stride) + 1. stride 0 means T (no overlap).
struct TextWindows {
  Tensor inputs;
  Tensor targets;
};
TextWindows text_windows(const Tensor& ids, int64_t seq_len, int64_t stride = 0);

/// Splits a 1-D sequence into its first (1 - validation_fraction) and its last part (both CPU copies).
struct TextSplit {
  Tensor train;
  Tensor validation;
};
TextSplit split_text(const Tensor& ids, double validation_fraction);

}  // namespace flux::data
