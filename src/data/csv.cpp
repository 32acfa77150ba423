// Delimited text into tensors; see include/flux/data/csv.hpp.
//
// One pass over the text, line by line: each line is cut into fields (quotes honoured within the
// line), the field count is checked against the first row, and only the kept columns are parsed,
// straight into a vector of the requested element type. Nothing here reads past `text`, so any byte
// sequence is either a table or a flux::Error (tests/fuzz drives parse_csv with arbitrary input).
#include "flux/data/csv.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <system_error>
#include <type_traits>

#include "flux/error.hpp"
#include "src/data/read_file.hpp"

namespace flux::data {
namespace {

using flux::detail::fail;

struct Field {
  std::string text;  // unquoted, trimmed
  bool quoted = false;
};

bool is_blank(char c, char delimiter) { return (c == ' ' || c == '\t') && c != delimiter; }

/// A field's text as quoted in a message: 'abc', or the first 40 bytes and "...".
std::string show(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7f) {
      out += s[i];
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  if (s.size() > 40) out += "...";
  return out + "'";
}

/// Where a message points: "[api] 'file' line 3".
struct Place {
  const char* api;
  const std::string& source;
  int64_t line;
};

template <class... Args> [[noreturn]] void fail_at(const Place& p, const Args&... args) {
  fail("[", p.api, "] ", p.source, " line ", p.line, ": ", args...);
}

/// Cuts one line (without its line end) into fields. A space delimiter takes runs of spaces as one
/// separator and ignores leading and trailing ones (readdlm's whitespace rule).
void split_line(std::string_view line, char delimiter, const Place& place, std::vector<Field>& fields) {
  fields.clear();
  size_t i = 0;
  const size_t n = line.size();
  if (delimiter == ' ')
    while (i < n && line[i] == ' ') ++i;
  for (;;) {
    Field f;
    while (i < n && is_blank(line[i], delimiter)) ++i;
    if (i < n && line[i] == '"') {
      f.quoted = true;
      const size_t open = i++;
      bool closed = false;
      while (i < n) {
        if (line[i] == '"') {
          if (i + 1 < n && line[i + 1] == '"') {
            f.text += '"';
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        f.text += line[i++];
      }
      if (!closed)
        fail_at(place, "column ", fields.size() + 1, ": the quote opened at character ", open + 1,
                " is not closed on this line (quoted fields cannot span lines)");
      while (i < n && is_blank(line[i], delimiter)) ++i;
      if (i < n && line[i] != delimiter)
        fail_at(place, "column ", fields.size() + 1, ": text after the closing quote at character ", i + 1,
                " (expected the delimiter ", show(std::string(1, delimiter)), " or the line end)");
    } else {
      const size_t start = i;
      while (i < n && line[i] != delimiter) ++i;
      size_t stop = i;
      while (stop > start && is_blank(line[stop - 1], delimiter)) --stop;
      f.text.assign(line.substr(start, stop - start));
    }
    fields.push_back(std::move(f));
    if (i >= n) break;
    ++i;  // the delimiter
    if (delimiter == ' ') {
      while (i < n && line[i] == ' ') ++i;
      if (i >= n) break;  // trailing spaces
    }
  }
}

/// Parses one field as a double ("+1.5" accepted, as from_chars is not); false when it is not a
/// number in full.
bool parse_double(const std::string& s, double& out) {
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') ++b;
  if (b == e) return false;
  auto [ptr, ec] = std::from_chars(b, e, out);
  if (ptr != e) return false;
  // Beyond double's range from_chars leaves `out` unset; take strtod's +-inf (or 0 on underflow).
  if (ec == std::errc::result_out_of_range) out = std::strtod(std::string(b, e).c_str(), nullptr);
  return true;
}

/// Appends field `f` (column `col`, 0-based in the file) converted to T.
template <class T>
void push_value(std::vector<T>& out, const Field& f, int64_t col, const std::string& col_name, DType dtype,
                const Place& place) {
  auto where = [&] {
    std::string s = "column " + std::to_string(col + 1);
    if (!col_name.empty()) s += " (\"" + col_name + "\")";
    return s;
  };
  if (f.text.empty())
    fail_at(place, where(), ": empty field (a missing value); expected a number", f.quoted ? " inside the quotes" : "");
  if constexpr (std::is_integral_v<T>) {
    const char* b = f.text.data();
    const char* e = b + f.text.size();
    if (*b == '+' && e - b > 1) ++b;
    T v = 0;
    auto [ptr, ec] = std::from_chars(b, e, v);
    if (ec == std::errc() && ptr == e) {
      out.push_back(v);
      return;
    }
    // "123.000", as pandas and spreadsheets write whole numbers: the digits before the point, exactly
    // (through a double, 9007199254740993.0 would become ...992).
    const char* dot = std::find(b, e, '.');
    if (ec == std::errc() && ptr == dot && dot != e && std::all_of(dot + 1, e, [](char c) { return c == '0'; })) {
      out.push_back(v);
      return;
    }
    // Other forms ("1e3") through a double. T's largest value + 1 = 2^digits is the bound: double(max)
    // rounds up to it for Int64, and converting 2^63 to int64_t is undefined.
    double d = 0;
    if (ec != std::errc::result_out_of_range && parse_double(f.text, d) && std::isfinite(d) && d == std::floor(d) &&
        d >= double(std::numeric_limits<T>::min()) && d < std::ldexp(1.0, std::numeric_limits<T>::digits)) {
      out.push_back(T(d));  // "5.0", "1e3"
      return;
    }
    if (ec == std::errc::result_out_of_range || (parse_double(f.text, d) && std::isfinite(d) && d == std::floor(d)))
      fail_at(place, where(), ": ", show(f.text), " does not fit ", dtype_name(dtype), " (",
              std::numeric_limits<T>::min(), " .. ", std::numeric_limits<T>::max(), ")");
    fail_at(place, where(), ": ", show(f.text), " is not a whole number (the dtype is ", dtype_name(dtype),
            "; use Float32 or Float64 for fractional values)");
  } else {
    double d = 0;
    if (!parse_double(f.text, d))
      fail_at(place, where(), ": ", show(f.text), " is not a number");
    out.push_back(T(d));
  }
}

std::string list_names(const std::vector<Field>& header) {
  std::string s;
  for (size_t i = 0; i < header.size(); ++i) {
    if (i == 12) {
      s += ", ... (" + std::to_string(header.size()) + " in all)";
      break;
    }
    s += (i ? ", \"" : "\"") + header[i].text + "\"";
  }
  return s;
}

template <class T>
Tensor parse_as(const char* api, std::string_view text, const CsvOptions& o, const std::string& source) {
  std::vector<Field> fields, header;
  std::vector<int64_t> keep;       // file columns to keep, in output order
  std::vector<std::string> names;  // their header names (empty strings without a header)
  int64_t ncols = -1, first_line = 0, rows = 0, line_no = 0;
  std::vector<T> values;

  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool blank = true;
    for (char c : line)
      if (c != ' ' && c != '\t') {
        blank = false;
        break;
      }
    if (blank) continue;
    const Place place{api, source, line_no};
    split_line(line, o.delimiter, place, fields);

    if (ncols < 0) {  // the first non-blank line fixes the column count and the kept columns
      ncols = int64_t(fields.size());
      first_line = line_no;
      if (o.header) header = fields;
      if (!o.names.empty()) {
        for (const std::string& want : o.names) {
          int64_t found = -1;
          for (size_t c = 0; c < header.size(); ++c)
            if (header[c].text == want) {
              found = int64_t(c);
              break;
            }
          if (found < 0)
            fail_at(place, "no column is named \"", want, "\"; the header has ", list_names(header));
          keep.push_back(found);
        }
      } else if (!o.columns.empty()) {
        for (int64_t c : o.columns) {
          const int64_t r = c < 0 ? c + ncols : c;
          if (r < 0 || r >= ncols)
            fail_at(place, "column index ", c, " does not exist: the table has ", ncols, " columns (0..", ncols - 1,
                    ", or -1..-", ncols, " from the end)");
          keep.push_back(r);
        }
      } else {
        for (int64_t c = 0; c < ncols; ++c) keep.push_back(c);
      }
      for (int64_t c : keep) names.push_back(o.header ? header[size_t(c)].text : std::string());
      if (o.header) continue;
    }
    if (int64_t(fields.size()) != ncols)
      fail_at(place, "a ragged row: ", fields.size(), " field", fields.size() == 1 ? "" : "s", " where line ",
              first_line, " has ", ncols, " (delimiter ", show(std::string(1, o.delimiter)), ")");
    for (size_t k = 0; k < keep.size(); ++k)
      push_value(values, fields[size_t(keep[k])], keep[k], names[k], o.dtype, place);
    ++rows;
  }
  if (ncols < 0)
    fail("[", api, "] ", source, " holds no rows (it is empty or blank)", o.header ? "; expected a header row" : "");
  return Tensor(values, Shape{rows, int64_t(keep.size())});
}

void check_options(const char* api, const CsvOptions& o, const std::string& source) {
  if (o.delimiter == '"' || o.delimiter == '\n' || o.delimiter == '\r')
    fail("[", api, "] ", source, ": the delimiter cannot be ", show(std::string(1, o.delimiter)));
  if (!o.names.empty() && !o.header)
    fail("[", api, "] ", source, ": columns chosen by name (.names) need .header = true");
  if (!o.names.empty() && !o.columns.empty())
    fail("[", api, "] ", source, ": choose columns by index (.columns) or by name (.names), not both");
  if (o.dtype != DType::f32 && o.dtype != DType::f64 && o.dtype != DType::i32 && o.dtype != DType::i64)
    fail("[", api, "] ", source, ": dtype ", dtype_name(o.dtype), " is not supported; expected Float32, Float64, ",
         "Int32 or Int64");
}

Tensor parse_any(const char* api, std::string_view text, const CsvOptions& o, const std::string& source) {
  check_options(api, o, source);
  switch (o.dtype) {
    case DType::f64: return parse_as<double>(api, text, o, source);
    case DType::i32: return parse_as<int32_t>(api, text, o, source);
    case DType::i64: return parse_as<int64_t>(api, text, o, source);
    default: return parse_as<float>(api, text, o, source);
  }
}

}  // namespace

Tensor read_csv(const std::string& path, const CsvOptions& options) {
  const std::string text = detail::read_text_file("read_csv", path);
  return parse_any("read_csv", text, options, "'" + path + "'");
}

Tensor parse_csv(std::string_view text, const CsvOptions& options, const std::string& source) {
  return parse_any("parse_csv", text, options, source);
}

std::vector<std::string> read_csv_header(const std::string& path, char delimiter) {
  const std::string text = detail::read_text_file("read_csv_header", path);
  const std::string source = "'" + path + "'";
  std::vector<Field> fields;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line = std::string_view(text).substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    split_line(line, delimiter, Place{"read_csv_header", source, line_no}, fields);
    std::vector<std::string> names;
    for (Field& f : fields) names.push_back(std::move(f.text));
    return names;
  }
  fail("[read_csv_header] ", source, " holds no lines (it is empty or blank)");
}

std::vector<int64_t> column_range(int64_t start, int64_t stop) {
  if (stop < start) fail("[column_range] stop ", stop, " is before start ", start);
  std::vector<int64_t> r;
  r.reserve(size_t(stop - start));
  for (int64_t c = start; c < stop; ++c) r.push_back(c);
  return r;
}

}  // namespace flux::data
