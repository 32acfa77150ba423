// IDX reader (plain or gzip) and the Fashion-MNIST loader; see include/flux/data/idx.hpp.
#include "flux/data/idx.hpp"

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "flux/backend.hpp"
#include "flux/error.hpp"

namespace flux::data {
namespace {

namespace fs = std::filesystem;
using detail::fail;

/// The file's bytes, exactly as stored.
std::string read_file(const std::string& api, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("[", api, "] cannot open '", path, "': no such file");
  if (fs::is_directory(path, ec)) fail("[", api, "] cannot open '", path, "': is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[", api, "] cannot open '", path, "' for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("[", api, "] reading '", path, "' failed");
  return bytes;
}

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && uint8_t(bytes[0]) == 0x1f && uint8_t(bytes[1]) == 0x8b;
}

/// Inflates every gzip member of `packed` (concatenated members are one stream, as gunzip reads them).
std::string gunzip(const std::string& api, const std::string& path, const std::string& packed) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) fail("[", api, "] zlib could not start inflating '", path, "'");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  z.avail_in = uInt(packed.size());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    int rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_STREAM_END) {
      // Another member follows (or padding of zeros, which gzip ignores too).
      bool more = false;
      for (uInt i = 0; i < z.avail_in; ++i) more |= z.next_in[i] != 0;
      if (!more) break;
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) {
      inflateEnd(&z);
      fail("[", api, "] '", path, "' is a truncated gzip file: the compressed stream ends after ", packed.size(),
           " bytes (", out.size(), " bytes inflated) without its end marker and checksum");
    }
    std::string why = z.msg ? z.msg : ("zlib error " + std::to_string(rc));
    inflateEnd(&z);
    fail("[", api, "] '", path, "' is a corrupt gzip file (zlib: ", why, ") after ", out.size(), " inflated bytes");
  }
  inflateEnd(&z);
  return out;
}

const char* type_name(uint8_t code) {
  switch (code) {
    case 0x08: return "u8";
    case 0x09: return "i8";
    case 0x0B: return "i16";
    case 0x0C: return "i32";
    case 0x0D: return "f32";
    case 0x0E: return "f64";
    default: return nullptr;
  }
}
size_t type_size(uint8_t code) {
  switch (code) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    default: return 8;
  }
}

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
uint64_t big_endian_u64(const unsigned char* p) {
  return (uint64_t(big_endian_u32(p)) << 32) | big_endian_u32(p + 4);
}

/// A checked IDX file: its type code, dimensions and the values' bytes (still big-endian).
struct Idx {
  uint8_t type = 0;
  std::vector<int64_t> dims;
  std::string bytes;   // the whole (inflated) file
  size_t data_offset = 0;
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(bytes.data()) + data_offset; }
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

Idx parse_idx(const std::string& api, const std::string& path) {
  Idx f;
  std::string raw = read_file(api, path);
  const bool gz = is_gzip(raw);
  f.bytes = gz ? gunzip(api, path, raw) : std::move(raw);
  const std::string what = gz ? "'" + path + "' (gzip, inflated to " + std::to_string(f.bytes.size()) + " bytes)"
                              : "'" + path + "'";
  const auto* b = reinterpret_cast<const unsigned char*>(f.bytes.data());
  const size_t size = f.bytes.size();
  if (size < 4)
    fail("[", api, "] ", what, " holds ", size, " bytes, too short for an IDX header (4 magic bytes 0x00 0x00 "
         "<type> <ndims>, then 4 bytes per dimension)");
  if (b[0] != 0 || b[1] != 0) {
    char magic[32];
    std::snprintf(magic, sizeof magic, "0x%02x 0x%02x 0x%02x 0x%02x", b[0], b[1], b[2], b[3]);
    fail("[", api, "] ", what, " is not an IDX file: it starts with ", magic,
         ", expected 0x00 0x00 <type> <ndims>");
  }
  f.type = b[2];
  if (!type_name(f.type)) {
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", f.type);
    fail("[", api, "] ", what, " has unknown IDX type code ", code,
         "; expected 0x08 (u8), 0x09 (i8), 0x0b (i16), 0x0c (i32), 0x0d (f32) or 0x0e (f64)");
  }
  const int nd = b[3];
  if (nd < 1 || nd > backend::kMaxDims)
    fail("[", api, "] ", what, " declares ", nd, " dimensions; expected 1 to ", backend::kMaxDims);
  const size_t header = 4 + 4 * size_t(nd);
  if (size < header)
    fail("[", api, "] ", what, " holds ", size, " bytes, too short for the header of an IDX file with ", nd,
         " dimensions (", header, " bytes)");
  // Checked as we go, so that dimensions whose product overflows are reported, not wrapped.
  const size_t have = size - header, elem = type_size(f.type);
  unsigned __int128 need = elem;
  for (int i = 0; i < nd; ++i) {
    f.dims.push_back(int64_t(big_endian_u32(b + 4 + 4 * i)));
    need *= uint64_t(f.dims.back());
  }
  if (need != have) {
    std::string need_s = need > uint64_t(INT64_MAX) ? std::string("more than 2^63") : std::to_string(uint64_t(need));
    fail("[", api, "] ", what, ": dimensions ", dims_string(f.dims), " of ", type_name(f.type), " need ", need_s,
         " bytes of data after the ", header, "-byte header, but the file holds ", have);
  }
  // With a zero dimension the data is empty whatever the others say; the shape must still have an
  // element count that fits in 64 bits (Shape and Tensor multiply the dimensions in int64_t).
  unsigned __int128 nonzero = 1;
  for (int64_t d : f.dims)
    if (d != 0 && (nonzero *= uint64_t(d)) > uint64_t(INT64_MAX))
      fail("[", api, "] ", what, ": dimensions ", dims_string(f.dims), " hold more than 2^63 elements in their "
           "non-zero dimensions; a tensor cannot have that shape");
  f.data_offset = header;
  return f;
}

Tensor to_tensor(const Idx& f) {
  const Shape shape(f.dims);
  const int64_t n = f.count();
  const unsigned char* p = f.data();
  switch (f.type) {
    case 0x08: return Tensor(std::vector<uint8_t>(p, p + n), shape, DType::u8);
    case 0x09: {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(int8_t(p[i]));
      return Tensor(v, shape);
    }
    case 0x0B: {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(int16_t(uint16_t((p[2 * i] << 8) | p[2 * i + 1])));
      return Tensor(v, shape);
    }
    case 0x0C: {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(big_endian_u32(p + 4 * i));
      return Tensor(v, shape);
    }
    case 0x0D: {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits = big_endian_u32(p + 4 * i);
        std::memcpy(&v[size_t(i)], &bits, 4);
      }
      return Tensor(v, shape);
    }
    default: {
      std::vector<double> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint64_t bits = big_endian_u64(p + 8 * i);
        std::memcpy(&v[size_t(i)], &bits, 8);
      }
      return Tensor(v, shape);
    }
  }
}

/// `folder/name.gz`, else `folder/name`.
std::string find_member(const std::string& folder, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {name + ".gz", name}) {
    fs::path p = fs::path(folder) / candidate;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  fail("[load_fashion_mnist] neither '", (fs::path(folder) / (name + ".gz")).string(), "' nor '",
       (fs::path(folder) / name).string(), "' exists; the Fashion-MNIST idx files come with Debian's "
       "dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)");
}

ImageSet load_split(const std::string& folder, const std::string& prefix) {
  const std::string api = "load_fashion_mnist";
  const std::string images_path = find_member(folder, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_member(folder, prefix + "-labels-idx1-ubyte");
  Idx images = parse_idx(api, images_path), labels = parse_idx(api, labels_path);
  if (images.type != 0x08 || images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28)
    fail("[", api, "] '", images_path, "' holds ", type_name(images.type), " ", dims_string(images.dims),
         "; expected u8 images (N, 28, 28)");
  if (labels.type != 0x08 || labels.dims.size() != 1)
    fail("[", api, "] '", labels_path, "' holds ", type_name(labels.type), " ", dims_string(labels.dims),
         "; expected u8 labels (N,)");
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n)
    fail("[", api, "] '", images_path, "' holds ", n, " images but '", labels_path, "' holds ", labels.dims[0],
         " labels");
  std::vector<float> pixels(size_t(n) * 28 * 28);
  const unsigned char* p = images.data();
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(p[i]) / 255.0f;
  std::vector<int64_t> y(static_cast<size_t>(n));
  const unsigned char* q = labels.data();
  for (int64_t i = 0; i < n; ++i) {
    if (q[i] > 9) fail("[", api, "] '", labels_path, "': label ", i, " is ", int(q[i]), "; expected 0..9");
    y[size_t(i)] = q[i];
  }
  return {Tensor(pixels, Shape{n, 1, 28, 28}), Tensor(y, Shape{n})};
}

}  // namespace

Tensor read_idx(const std::string& path) { return to_tensor(parse_idx("read_idx", path)); }

Tensor read_idx(const std::string& path, DType dtype) {
  Tensor t = read_idx(path);
  return t.dtype() == dtype ? t : t.cast(dtype);
}

FashionMnist load_fashion_mnist(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    fail("[load_fashion_mnist] folder '", folder, "' does not exist; install Debian's dataset-fashion-mnist "
         "package (apt-get install dataset-fashion-mnist), which puts the idx files in ", kFashionMnistFolder,
         ", or pass the folder that holds train-images-idx3-ubyte.gz");
  FashionMnist out;
  out.folder = folder;
  out.train = load_split(folder, "train");
  out.test = load_split(folder, "t10k");
  return out;
}

}  // namespace flux::data
