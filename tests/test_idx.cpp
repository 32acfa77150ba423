// IDX reader and Fashion-MNIST loader: every element type, plain and gzip (one or several members),
// conversions, the exact error for every kind of bad file, and Debian's real data set when installed.
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flux/flux.hpp"

using namespace flux;

namespace {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/flux-idx-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// One gzip member holding `bytes` (zlib's deflate with the gzip wrapper).
std::string gzip(const std::string& bytes) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(bytes.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = uInt(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string be32(uint32_t v) {
  return {char(v >> 24), char((v >> 16) & 0xff), char((v >> 8) & 0xff), char(v & 0xff)};
}

/// Header 0x00 0x00 type ndims, then the big-endian dimensions.
std::string header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string s = {'\0', '\0', char(type), char(dims.size())};
  for (uint32_t d : dims) s += be32(d);
  return s;
}

template <class T> std::string big_endian(const std::vector<T>& values) {
  std::string s;
  for (T v : values) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T); ++i) s += char(b[sizeof(T) - 1 - i]);  // host is little-endian
  }
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("non-flux exception: ") + e.what();
  }
  return "no error";
}

/// Writes `bytes` both plain (name) and gzipped (name.gz); returns the two paths.
std::pair<std::string, std::string> write_both(const TempDir& dir, const std::string& name, const std::string& bytes) {
  write_bytes(dir.file(name), bytes);
  write_bytes(dir.file(name + ".gz"), gzip(bytes));
  return {dir.file(name), dir.file(name + ".gz")};
}

}  // namespace

TEST(Idx, UInt8StaysUInt8WithItsShape) {
  TempDir dir;
  std::vector<uint8_t> v = {0, 1, 2, 127, 128, 255};
  auto [plain, gz] = write_both(dir, "u8.idx", header(0x08, {2, 3}) + std::string(v.begin(), v.end()));
  for (const std::string& path : {plain, gz}) {
    Tensor t = data::read_idx(path);
    EXPECT_EQ(t.dtype(), DType::u8) << path;
    EXPECT_EQ(t.shape(), Shape({2, 3})) << path;
    EXPECT_EQ(t.device(), Device()) << path;
    EXPECT_EQ(t.to_vector<uint8_t>(), v) << path;
  }
}

TEST(Idx, EveryElementTypeBigEndian) {
  TempDir dir;
  {
    std::vector<int8_t> v = {-128, -1, 0, 1, 127};
    auto [plain, gz] = write_both(dir, "i8", header(0x09, {5}) + big_endian(v));
    for (const std::string& path : {plain, gz}) {
      Tensor t = data::read_idx(path);
      EXPECT_EQ(t.dtype(), DType::i32);
      EXPECT_EQ(t.shape(), Shape({5}));
      EXPECT_EQ(t.to_vector<int32_t>(), std::vector<int32_t>({-128, -1, 0, 1, 127}));
    }
  }
  {
    std::vector<int16_t> v = {-32768, -2, 0, 258, 32767, 1000};
    auto [plain, gz] = write_both(dir, "i16", header(0x0B, {3, 1, 2}) + big_endian(v));
    for (const std::string& path : {plain, gz}) {
      Tensor t = data::read_idx(path);
      EXPECT_EQ(t.dtype(), DType::i32);
      EXPECT_EQ(t.shape(), Shape({3, 1, 2}));
      EXPECT_EQ(t.to_vector<int32_t>(), std::vector<int32_t>({-32768, -2, 0, 258, 32767, 1000}));
    }
  }
  {
    std::vector<int32_t> v = {std::numeric_limits<int32_t>::min(), -70000, 0, 16909060, std::numeric_limits<int32_t>::max()};
    auto [plain, gz] = write_both(dir, "i32", header(0x0C, {5, 1}) + big_endian(v));
    for (const std::string& path : {plain, gz}) {
      Tensor t = data::read_idx(path);
      EXPECT_EQ(t.dtype(), DType::i32);
      EXPECT_EQ(t.shape(), Shape({5, 1}));
      EXPECT_EQ(t.to_vector<int32_t>(), v);
    }
  }
  {
    std::vector<float> v = {-1.5f, 0.0f, 3.25f, 1e-30f, -6.5e20f, 0.1f};
    auto [plain, gz] = write_both(dir, "f32", header(0x0D, {2, 3}) + big_endian(v));
    for (const std::string& path : {plain, gz}) {
      Tensor t = data::read_idx(path);
      EXPECT_EQ(t.dtype(), DType::f32);
      EXPECT_EQ(t.shape(), Shape({2, 3}));
      EXPECT_EQ(t.to_vector<float>(), v);  // bit-exact
    }
  }
  {
    std::vector<double> v = {3.141592653589793, -2.718281828459045, 1e-300, 0.1};
    auto [plain, gz] = write_both(dir, "f64", header(0x0E, {1, 2, 2}) + big_endian(v));
    for (const std::string& path : {plain, gz}) {
      Tensor t = data::read_idx(path);
      EXPECT_EQ(t.dtype(), DType::f64);
      EXPECT_EQ(t.shape(), Shape({1, 2, 2}));
      EXPECT_EQ(t.to_vector<double>(), v);
    }
  }
}

TEST(Idx, ConvertsWhenAsked) {
  TempDir dir;
  auto [plain, gz] = write_both(dir, "u8", header(0x08, {4}) + std::string({char(0), char(7), char(200), char(255)}));
  for (const std::string& path : {plain, gz}) {
    Tensor f = data::read_idx(path, Float32);
    EXPECT_EQ(f.dtype(), DType::f32);
    EXPECT_EQ(f.to_vector<float>(), std::vector<float>({0, 7, 200, 255}));
    Tensor l = data::read_idx(path, Int64);
    EXPECT_EQ(l.dtype(), DType::i64);
    EXPECT_EQ(l.to_vector<int64_t>(), std::vector<int64_t>({0, 7, 200, 255}));
    EXPECT_EQ(data::read_idx(path, UInt8).dtype(), DType::u8);
  }
}

TEST(Idx, GzipIsRecognisedByItsMagicNotItsName) {
  TempDir dir;
  std::string bytes = header(0x08, {3}) + std::string({char(9), char(8), char(7)});
  write_bytes(dir.file("plain.gz"), bytes);              // plain bytes under a .gz name
  write_bytes(dir.file("packed.idx"), gzip(bytes));      // gzip under a plain name
  EXPECT_EQ(data::read_idx(dir.file("plain.gz")).to_vector<uint8_t>(), std::vector<uint8_t>({9, 8, 7}));
  EXPECT_EQ(data::read_idx(dir.file("packed.idx")).to_vector<uint8_t>(), std::vector<uint8_t>({9, 8, 7}));
}

TEST(Idx, ConcatenatedGzipMembersAreOneStream) {
  // `cat a.gz b.gz` is a valid gzip file whose content is a then b (gunzip reads it so).
  TempDir dir;
  std::string bytes = header(0x08, {2, 2}) + std::string({char(1), char(2), char(3), char(4)});
  write_bytes(dir.file("two.gz"), gzip(bytes.substr(0, 10)) + gzip(bytes.substr(10)));
  Tensor t = data::read_idx(dir.file("two.gz"));
  EXPECT_EQ(t.shape(), Shape({2, 2}));
  EXPECT_EQ(t.to_vector<uint8_t>(), std::vector<uint8_t>({1, 2, 3, 4}));
}

TEST(Idx, LargeFileThroughManyInflateChunks) {
  // More than the reader's 64 KiB output buffer, so inflate runs many rounds.
  TempDir dir;
  std::string values(300 * 1000, '\0');
  for (size_t i = 0; i < values.size(); ++i) values[i] = char((i * 7919) % 251);
  auto [plain, gz] = write_both(dir, "big", header(0x08, {300, 1000}) + values);
  for (const std::string& path : {plain, gz}) {
    std::vector<uint8_t> got = data::read_idx(path).to_vector<uint8_t>();
    ASSERT_EQ(got.size(), values.size());
    EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size()), 0) << path;
  }
}

TEST(IdxErrors, MissingFileAndFolder) {
  TempDir dir;
  std::string p = dir.file("nothing.idx");
  EXPECT_EQ(error_of([&] { data::read_idx(p); }), "[read_idx] cannot open '" + p + "': no such file");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.path()); }), "[read_idx] cannot open '" + dir.path() + "': is a directory");
}

TEST(IdxErrors, ShortFile) {
  TempDir dir;
  write_bytes(dir.file("short"), std::string("\0\0\x08", 3));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("short")); }),
            "[read_idx] '" + dir.file("short") + "' holds 3 bytes, too short for an IDX header (4 magic bytes "
            "0x00 0x00 <type> <ndims>, then 4 bytes per dimension)");
  write_bytes(dir.file("empty"), "");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("empty")); }),
            "[read_idx] '" + dir.file("empty") + "' holds 0 bytes, too short for an IDX header (4 magic bytes "
            "0x00 0x00 <type> <ndims>, then 4 bytes per dimension)");
  // Magic says three dimensions, the file ends inside the second.
  write_bytes(dir.file("header"), header(0x08, {2, 2, 2}).substr(0, 10));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("header")); }),
            "[read_idx] '" + dir.file("header") + "' holds 10 bytes, too short for the header of an IDX file "
            "with 3 dimensions (16 bytes)");
}

TEST(IdxErrors, BadMagic) {
  TempDir dir;
  write_bytes(dir.file("text"), "hello world");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("text")); }),
            "[read_idx] '" + dir.file("text") + "' is not an IDX file: it starts with 0x68 0x65 0x6c 0x6c, "
            "expected 0x00 0x00 <type> <ndims>");
  write_bytes(dir.file("one"), std::string("\0\x01\x08\x01", 4) + be32(1) + "x");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("one")); }),
            "[read_idx] '" + dir.file("one") + "' is not an IDX file: it starts with 0x00 0x01 0x08 0x01, "
            "expected 0x00 0x00 <type> <ndims>");
}

TEST(IdxErrors, UnknownTypeAndDimensionCount) {
  TempDir dir;
  write_bytes(dir.file("type"), header(0x0A, {1}) + "x");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("type")); }),
            "[read_idx] '" + dir.file("type") + "' has unknown IDX type code 0x0a; expected 0x08 (u8), 0x09 (i8), "
            "0x0b (i16), 0x0c (i32), 0x0d (f32) or 0x0e (f64)");
  write_bytes(dir.file("nd0"), header(0x08, {}) + "x");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("nd0")); }),
            "[read_idx] '" + dir.file("nd0") + "' declares 0 dimensions; expected 1 to 8");
  write_bytes(dir.file("nd9"), header(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}) + "x");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("nd9")); }),
            "[read_idx] '" + dir.file("nd9") + "' declares 9 dimensions; expected 1 to 8");
}

TEST(IdxErrors, DimensionsThatDoNotMatchTheSize) {
  TempDir dir;
  write_bytes(dir.file("few"), header(0x08, {2, 3}) + "abcde");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("few")); }),
            "[read_idx] '" + dir.file("few") + "': dimensions (2, 3) of u8 need 6 bytes of data after the "
            "12-byte header, but the file holds 5");
  write_bytes(dir.file("many"), header(0x0C, {2}) + std::string(9, 'x'));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("many")); }),
            "[read_idx] '" + dir.file("many") + "': dimensions (2,) of i32 need 8 bytes of data after the "
            "8-byte header, but the file holds 9");
  // A product that does not fit in 64 bits is reported, not wrapped around.
  write_bytes(dir.file("huge"), header(0x0E, {0xffffffffu, 0xffffffffu, 2}) + "x");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("huge")); }),
            "[read_idx] '" + dir.file("huge") + "': dimensions (4294967295, 4294967295, 2) of f64 need more "
            "than 2^63 bytes of data after the 16-byte header, but the file holds 1");
  // A zero dimension makes the data empty, but the other dimensions must still form a shape whose
  // element count fits in 64 bits (found by tests/fuzz/fuzz_idx under UBSan: signed overflow).
  write_bytes(dir.file("zero"), header(0x08, {0xffffffffu, 0xff8b1400u, 0}));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("zero")); }),
            "[read_idx] '" + dir.file("zero") + "': dimensions (4294967295, 4287304704, 0) hold more than 2^63 "
            "elements in their non-zero dimensions; a tensor cannot have that shape");
  write_bytes(dir.file("zero_ok"), header(0x08, {3, 0, 5}));
  EXPECT_EQ(data::read_idx(dir.file("zero_ok")).shape(), Shape({3, 0, 5}));
  // Inside gzip, the message says so and gives the inflated size.
  write_bytes(dir.file("few.gz"), gzip(header(0x0B, {4}) + "abc"));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("few.gz")); }),
            "[read_idx] '" + dir.file("few.gz") + "' (gzip, inflated to 11 bytes): dimensions (4,) of i16 need 8 "
            "bytes of data after the 8-byte header, but the file holds 3");
}

TEST(IdxErrors, TruncatedAndCorruptGzip) {
  TempDir dir;
  std::string values(5000, '\0');
  for (size_t i = 0; i < values.size(); ++i) values[i] = char(i * 31 % 256);
  std::string packed = gzip(header(0x08, {5000}) + values);
  ASSERT_GT(packed.size(), 100u);
  // Cut: the end marker and the CRC/length trailer are missing.
  std::string cut = packed.substr(0, packed.size() / 2);
  write_bytes(dir.file("cut.gz"), cut);
  std::string msg = error_of([&] { data::read_idx(dir.file("cut.gz")); });
  EXPECT_EQ(msg.rfind("[read_idx] '" + dir.file("cut.gz") + "' is a truncated gzip file: the compressed stream ends after " +
                          std::to_string(cut.size()) + " bytes (",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find(" bytes inflated) without its end marker and checksum"), std::string::npos) << msg;
  // Only the trailer (CRC-32 and length) missing.
  write_bytes(dir.file("trailer.gz"), packed.substr(0, packed.size() - 4));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("trailer.gz")); }),
            "[read_idx] '" + dir.file("trailer.gz") + "' is a truncated gzip file: the compressed stream ends after " +
                std::to_string(packed.size() - 4) + " bytes (5008 bytes inflated) without its end marker and checksum");
  // Just the gzip magic.
  write_bytes(dir.file("magic.gz"), packed.substr(0, 2));
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("magic.gz")); }),
            "[read_idx] '" + dir.file("magic.gz") + "' is a truncated gzip file: the compressed stream ends after 2 "
            "bytes (0 bytes inflated) without its end marker and checksum");
  // A wrong CRC-32: zlib names it.
  std::string bad_crc = packed;
  bad_crc[bad_crc.size() - 8] = char(bad_crc[bad_crc.size() - 8] ^ 0x5a);
  write_bytes(dir.file("crc.gz"), bad_crc);
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("crc.gz")); }),
            "[read_idx] '" + dir.file("crc.gz") + "' is a corrupt gzip file (zlib: incorrect data check) after 5008 "
            "inflated bytes");
  // Garbage after a complete member is not another member.
  write_bytes(dir.file("tail.gz"), packed + "garbage");
  EXPECT_EQ(error_of([&] { data::read_idx(dir.file("tail.gz")); }),
            "[read_idx] '" + dir.file("tail.gz") + "' is a corrupt gzip file (zlib: incorrect header check) after "
            "5008 inflated bytes");
}

// ---- Fashion-MNIST ----

namespace {

/// A tiny Fashion-MNIST-shaped folder: n images of 28x28 whose pixel (r, c) of image i is (i + r + c) % 256.
void write_fake_fashion(const TempDir& dir, const std::string& prefix, uint32_t n, bool gz,
                        const std::vector<uint8_t>& labels) {
  std::string pixels;
  for (uint32_t i = 0; i < n; ++i)
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) pixels += char((i + uint32_t(r) + uint32_t(c)) % 256);
  std::string images = header(0x08, {n, 28, 28}) + pixels;
  std::string lab = header(0x08, {uint32_t(labels.size())}) + std::string(labels.begin(), labels.end());
  std::string suffix = gz ? ".gz" : "";
  write_bytes(dir.file(prefix + "-images-idx3-ubyte" + suffix), gz ? gzip(images) : images);
  write_bytes(dir.file(prefix + "-labels-idx1-ubyte" + suffix), gz ? gzip(lab) : lab);
}

}  // namespace

TEST(FashionMnist, LoadsImagesScaledAndLabelsAsInt64) {
  TempDir dir;
  write_fake_fashion(dir, "train", 3, true, {9, 0, 4});
  write_fake_fashion(dir, "t10k", 2, false, {1, 8});  // plain files are found too
  data::FashionMnist fm = data::load_fashion_mnist(dir.path());
  EXPECT_EQ(fm.folder, dir.path());
  EXPECT_EQ(fm.train.images.shape(), Shape({3, 1, 28, 28}));
  EXPECT_EQ(fm.train.images.dtype(), DType::f32);
  EXPECT_EQ(fm.train.labels.shape(), Shape({3}));
  EXPECT_EQ(fm.train.labels.dtype(), DType::i64);
  EXPECT_EQ(fm.train.labels.to_vector<int64_t>(), std::vector<int64_t>({9, 0, 4}));
  EXPECT_EQ(fm.test.images.shape(), Shape({2, 1, 28, 28}));
  EXPECT_EQ(fm.test.labels.to_vector<int64_t>(), std::vector<int64_t>({1, 8}));
  std::vector<float> px = fm.train.images.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c)
        ASSERT_EQ(px[size_t(i * 784 + r * 28 + c)], float((i + r + c) % 256) / 255.0f) << i << " " << r << " " << c;
}

TEST(FashionMnistErrors, MissingFolderNamesThePackage) {
  EXPECT_EQ(error_of([] { data::load_fashion_mnist("/nonexistent/fashion"); }),
            "[load_fashion_mnist] folder '/nonexistent/fashion' does not exist; install Debian's "
            "dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), which puts the idx files in "
            "/usr/share/datasets/fashion-mnist, or pass the folder that holds train-images-idx3-ubyte.gz");
}

TEST(FashionMnistErrors, MissingFileNamesBothNamesAndThePackage) {
  TempDir dir;
  write_fake_fashion(dir, "train", 2, true, {1, 2});
  EXPECT_EQ(error_of([&] { data::load_fashion_mnist(dir.path()); }),
            "[load_fashion_mnist] neither '" + dir.file("t10k-images-idx3-ubyte.gz") + "' nor '" +
                dir.file("t10k-images-idx3-ubyte") + "' exists; the Fashion-MNIST idx files come with Debian's "
                "dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)");
}

TEST(FashionMnistErrors, WrongShapesCountsAndLabels) {
  {
    TempDir dir;
    write_fake_fashion(dir, "train", 2, true, {1, 2, 3});
    write_fake_fashion(dir, "t10k", 1, true, {1});
    EXPECT_EQ(error_of([&] { data::load_fashion_mnist(dir.path()); }),
              "[load_fashion_mnist] '" + dir.file("train-images-idx3-ubyte.gz") + "' holds 2 images but '" +
                  dir.file("train-labels-idx1-ubyte.gz") + "' holds 3 labels");
  }
  {
    TempDir dir;
    write_fake_fashion(dir, "train", 2, true, {1, 10});
    write_fake_fashion(dir, "t10k", 1, true, {1});
    EXPECT_EQ(error_of([&] { data::load_fashion_mnist(dir.path()); }),
              "[load_fashion_mnist] '" + dir.file("train-labels-idx1-ubyte.gz") + "': label 1 is 10; expected 0..9");
  }
  {
    TempDir dir;
    write_fake_fashion(dir, "t10k", 1, true, {1});
    write_bytes(dir.file("train-images-idx3-ubyte.gz"), gzip(header(0x08, {1, 28, 27}) + std::string(28 * 27, 'a')));
    write_bytes(dir.file("train-labels-idx1-ubyte.gz"), gzip(header(0x08, {1}) + "\x01"));
    EXPECT_EQ(error_of([&] { data::load_fashion_mnist(dir.path()); }),
              "[load_fashion_mnist] '" + dir.file("train-images-idx3-ubyte.gz") + "' holds u8 (1, 28, 27); "
              "expected u8 images (N, 28, 28)");
  }
  {
    TempDir dir;
    write_fake_fashion(dir, "t10k", 1, true, {1});
    write_fake_fashion(dir, "train", 1, true, {1});
    write_bytes(dir.file("train-labels-idx1-ubyte.gz"), gzip(header(0x0C, {1}) + be32(1)));
    EXPECT_EQ(error_of([&] { data::load_fashion_mnist(dir.path()); }),
              "[load_fashion_mnist] '" + dir.file("train-labels-idx1-ubyte.gz") + "' holds i32 (1,); "
              "expected u8 labels (N,)");
  }
}

TEST(FashionMnist, DebianDataSet) {
  if (!std::filesystem::is_directory(data::kFashionMnistFolder))
    GTEST_SKIP() << data::kFashionMnistFolder << " is absent (install dataset-fashion-mnist)";
  data::FashionMnist fm = data::load_fashion_mnist();
  EXPECT_EQ(fm.train.images.shape(), Shape({60000, 1, 28, 28}));
  EXPECT_EQ(fm.train.labels.shape(), Shape({60000}));
  EXPECT_EQ(fm.test.images.shape(), Shape({10000, 1, 28, 28}));
  EXPECT_EQ(fm.test.labels.shape(), Shape({10000}));
  // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
  std::vector<int64_t> count(10, 0);
  for (int64_t y : fm.test.labels.to_vector<int64_t>()) ++count[size_t(y)];
  EXPECT_EQ(count, std::vector<int64_t>(10, 1000));
  // The reader agrees with itself on the raw file, and pixels span [0, 1].
  Tensor raw = data::read_idx(std::string(data::kFashionMnistFolder) + "/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(raw.dtype(), DType::u8);
  EXPECT_EQ(raw.shape(), Shape({10000, 28, 28}));
  std::vector<uint8_t> r = raw.slice(0, 1).to_vector<uint8_t>();
  std::vector<float> f = fm.test.images.slice(0, 1).to_vector<float>();
  uint8_t lo = 255, hi = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    ASSERT_EQ(f[i], float(r[i]) / 255.0f);
    lo = std::min(lo, r[i]);
    hi = std::max(hi, r[i]);
  }
  EXPECT_EQ(lo, 0);
  EXPECT_GT(hi, 200);
  EXPECT_EQ(fm.test.labels.to_vector<int64_t>()[0], 9);  // the first test image is an ankle boot
}
