// Delimited text (CSV, TSV, whitespace-free tables of numbers) into tensors, as Julia's
// DelimitedFiles.readdlm does: one row per line, one column per field, all values numbers.
//   Tensor table = data::read_csv("digits.csv.gz");                        // (1797, 65) Float32
//   Tensor X = data::read_csv(path, {.columns = data::column_range(0, 64)});  // (1797, 64)
//   Tensor y = data::read_csv(path, {.columns = {64}, .dtype = DType::i64}).reshape({-1});
//   Tensor iris = data::read_csv("iris.csv", {.header = true, .names = {"sepal_length", "petal_width"}});
// Files may be gzip-compressed (recognised by the gzip magic 0x1f 0x8b, whatever their name).
// Blank lines are skipped; "\r\n" line ends are accepted; a field may be double-quoted ("1.5",
// "a ""b"" c") within one line; spaces and tabs around a field are ignored (unless one of them is
// the delimiter). Numbers are decimal, as std::from_chars reads them ("1", "-2.5e3", "nan", "inf").
// Every bad input is a flux::Error naming the file (or source), line and column: a field that is not
// a number, an empty field, a row with more or fewer fields than the first, an unclosed quote, a
// column or name that does not exist, an integer that does not fit the dtype.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::data {

struct CsvOptions {
  /// The field separator (one byte: ',', ';', '\t', ' ', ...).
  char delimiter = ',';
  /// The first non-blank line holds column names, not numbers.
  bool header = false;
  /// Columns to keep, 0-based, in this order (negative counts from the end: -1 is the last);
  /// empty: every column. Not together with `names`.
  std::vector<int64_t> columns = {};
  /// Columns to keep by their header names, in this order (needs header = true).
  std::vector<std::string> names = {};
  /// The tensor's dtype: Float32, Float64, Int32 or Int64 (integers must be whole numbers).
  DType dtype = DType::f32;
};

/// The rows of the file as a (rows, kept columns) CPU tensor. Throws flux::Error for a missing or
/// corrupt file and for every malformed line (see the top of this header).
Tensor read_csv(const std::string& path, const CsvOptions& options = {});

/// The same for text already in memory; `source` names it in error messages ("<text>" by default).
Tensor parse_csv(std::string_view text, const CsvOptions& options = {}, const std::string& source = "<text>");

/// The header row's names (the first non-blank line split at `delimiter`, quotes removed).
std::vector<std::string> read_csv_header(const std::string& path, char delimiter = ',');

/// {start, start + 1, ..., stop - 1}: a run of column indices for CsvOptions::columns.
std::vector<int64_t> column_range(int64_t start, int64_t stop);

}  // namespace flux::data
