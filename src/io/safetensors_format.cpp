// Parsing and writing safetensors headers. Every check here is a bound on what the loader may read:
// once parse() returns, each entry's [begin, end) lies inside the data section and matches its shape.
#include "src/io/safetensors_format.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "flux/error.hpp"

namespace flux::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using Json = nlohmann::json;
constexpr int kMaxRank = 8;  // Shape's inline capacity (backend::kMaxDims)

struct Code {
  const char* code;
  DType dtype;
  size_t size;
};
constexpr Code kCodes[] = {
    {"F32", DType::f32, 4}, {"F64", DType::f64, 8}, {"F16", DType::f16, 2},   {"BF16", DType::bf16, 2},
    {"I32", DType::i32, 4}, {"I64", DType::i64, 8}, {"U8", DType::u8, 1}, {"BOOL", DType::boolean, 1},
};
// Valid in the specification but without a flux dtype.
constexpr const char* kUnsupported[] = {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "C64",
                                        "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"};

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

/// Keeps a printed name short and printable in error messages.
std::string printable(const std::string& name) {
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c != 0x7f) out += char(c);
    else out += '?';
  }
  if (name.size() > 80) out += "...";
  return out + "'";
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// A non-negative integer JSON value, or an error naming `what`.
uint64_t unsigned_value(const Json& v, const std::string& context, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s >= 0) return uint64_t(s);
  }
  detail::fail(context, ": ", what, " must be a non-negative integer, got ", v.dump());
}

Entry parse_entry(const std::string& name, const Json& info, const std::string& context) {
  std::string where = context + ": tensor " + printable(name);
  if (!info.is_object()) detail::fail(where, ": expected an object with dtype, shape and data_offsets, got ", info.type_name());
  auto field = [&](const char* key) -> const Json& {
    auto it = info.find(key);
    if (it == info.end()) detail::fail(where, ": missing \"", key, "\"");
    return *it;
  };
  Entry e;
  e.name = name;

  const Json& dtype = field("dtype");
  if (!dtype.is_string()) detail::fail(where, ": \"dtype\" must be a string, got ", dtype.dump());
  const std::string& code = dtype.get_ref<const std::string&>();
  const Code* found = nullptr;
  for (const Code& c : kCodes)
    if (code == c.code) found = &c;
  if (!found) {
    for (const char* u : kUnsupported)
      if (code == u)
        detail::fail(where, ": dtype ", code, " is not supported by flux (supported: F32, F64, F16, BF16, I32, I64, U8, BOOL)");
    detail::fail(where, ": unknown dtype ", printable(code));
  }
  e.dtype = found->dtype;

  const Json& shape = field("shape");
  if (!shape.is_array()) detail::fail(where, ": \"shape\" must be an array, got ", shape.dump());
  if (shape.size() > size_t(kMaxRank)) detail::fail(where, ": ", shape.size(), " dimensions; flux supports at most ", kMaxRank);
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : shape) {
    uint64_t n = unsigned_value(d, where, "every \"shape\" entry");
    if (n > uint64_t(INT64_MAX)) overflow = true;
    e.shape.push_back(int64_t(n & uint64_t(INT64_MAX)));
    if (__builtin_mul_overflow(numel, n, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, uint64_t(found->size), &nbytes))
    detail::fail(where, ": shape ", shape.dump(), " has too many elements");

  const Json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    detail::fail(where, ": \"data_offsets\" must be [begin, end], got ", offsets.dump());
  e.begin = unsigned_value(offsets[0], where, "data_offsets[0]");
  e.end = unsigned_value(offsets[1], where, "data_offsets[1]");
  if (e.end < e.begin) detail::fail(where, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  if (e.end - e.begin != nbytes)
    detail::fail(where, ": shape ", shape_string(e.shape), " of ", code, " needs ", nbytes, " bytes but data_offsets [",
                 e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

}  // namespace

const char* dtype_code(DType t) {
  for (const Code& c : kCodes)
    if (c.dtype == t) return c.code;
  return "?";
}

size_t element_size(DType t) {
  for (const Code& c : kCodes)
    if (c.dtype == t) return c.size;
  return 1;
}

Layout parse(const uint8_t* data, size_t size, const std::string& context) {
  if (size < 8)
    detail::fail(context, ": truncated file: ", size, " bytes, fewer than the 8-byte header length");
  const uint64_t n = read_u64_le(data);
  if (n > kMaxHeaderBytes)
    detail::fail(context, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes (not a safetensors file?)");
  if (n > size - 8)
    detail::fail(context, ": header length ", n, " is larger than the ", size - 8, " bytes that follow it (truncated file?)");
  if (n == 0 || data[8] != '{') detail::fail(context, ": invalid JSON header: it must be an object starting with '{'");

  // Duplicate keys are an error in the format; nlohmann would keep the last one silently.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::array_start:
        keys.emplace_back();  // arrays count toward nesting depth
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      case Json::parse_event_t::value:
        break;
    }
    if (keys.size() > 3) throw Error(context + ": invalid JSON header: nested deeper than safetensors allows");
    return true;
  };
  Json header;
  const char* text = reinterpret_cast<const char*>(data + 8);
  try {
    header = Json::parse(text, text + n, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    detail::fail(context, ": invalid JSON header: ", e.what());
  }
  if (!duplicate.empty()) detail::fail(context, ": invalid JSON header: duplicate key ", printable(duplicate));
  if (!header.is_object()) detail::fail(context, ": invalid JSON header: expected an object, got ", header.type_name());

  Layout layout;
  layout.data_start = 8 + n;
  const uint64_t data_size = size - layout.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) detail::fail(context, ": \"__metadata__\" must be an object of strings, got ", it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          detail::fail(context, ": \"__metadata__\" value for ", printable(m.key()), " must be a string, got ", m->dump());
        layout.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    layout.entries.push_back(parse_entry(it.key(), *it, context));
  }

  // The tensors must tile the data section exactly: sorted by offset, each begins where the last ended.
  std::sort(layout.entries.begin(), layout.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : layout.entries) {
    if (e.end > data_size)
      detail::fail(context, ": truncated file: tensor ", printable(e.name), " ends at data byte ", e.end,
                   " but the data section has only ", data_size, " bytes");
    if (e.begin < expected)
      detail::fail(context, ": tensor ", printable(e.name), " at data_offsets [", e.begin, ", ", e.end, "] overlaps tensor ",
                   printable(previous->name), " which ends at ", expected);
    if (e.begin > expected)
      detail::fail(context, ": gap of ", e.begin - expected, " bytes before tensor ", printable(e.name), " (data_offsets [",
                   e.begin, ", ", e.end, "], previous data ends at ", expected, ")");
    expected = e.end;
    previous = &e;
  }
  if (expected != data_size)
    detail::fail(context, ": the data section has ", data_size, " bytes but the tensors cover only ", expected,
                 " (trailing bytes)");
  return layout;
}

std::string make_header(std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata,
                        const std::string& context) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    size_t sa = element_size(a.dtype), sb = element_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (Entry& e : entries) {
    if (e.name == "__metadata__") detail::fail(context, ": a tensor may not be named \"__metadata__\"");
    if (!names.insert(e.name).second) detail::fail(context, ": two tensors are named ", printable(e.name));
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= uint64_t(d);
    e.begin = offset;
    e.end = offset + numel * element_size(e.dtype);
    offset = e.end;
    header[e.name] = {{"dtype", dtype_code(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string json;
  try {
    json = header.dump();  // strict: names and metadata must be valid UTF-8
  } catch (const nlohmann::ordered_json::exception& e) {
    detail::fail(context, ": cannot write the header: ", e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace flux::safetensors
