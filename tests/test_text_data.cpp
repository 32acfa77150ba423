// Character-level text data (include/flux/data/text.hpp): load_text on plain and gzip files, the
// shipped King James text, CharVocab encode/decode, text_windows and split_text, and the exact error
// for every kind of bad input.
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "flux/flux.hpp"

using namespace flux;
using ::testing::HasSubstr;

#define EXPECT_FLUX_ERROR(statement, text) \
  EXPECT_THAT([&] { (void)(statement); }, ::testing::ThrowsMessage<::flux::Error>(HasSubstr(text)))

namespace {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/flux-text-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string gzip_bytes(const std::string& plain) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, uLong(plain.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = uInt(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

const std::string kShipped = std::string(FLUX_SOURCE_DIR) + "/data/kjv_genesis_exodus.txt.gz";

}  // namespace

TEST(TextData, LoadsPlainAndGzipAlike) {
  TempDir dir;
  std::string text = "In the beginning\nGod created the heaven and the earth.\n";
  for (int i = 0; i < 12; ++i) text += text;  // 229 KB: several inflate buffers
  write_bytes(dir.file("a.txt"), text);
  write_bytes(dir.file("a.txt.gz"), gzip_bytes(text));
  write_bytes(dir.file("gz-without-suffix"), gzip_bytes(text));
  write_bytes(dir.file("empty.txt"), "");
  EXPECT_EQ(data::load_text(dir.file("a.txt")), text);
  EXPECT_EQ(data::load_text(dir.file("a.txt.gz")), text);
  EXPECT_EQ(data::load_text(dir.file("gz-without-suffix")), text);
  EXPECT_EQ(data::load_text(dir.file("empty.txt")), "");
}

TEST(TextData, BadFilesNameThePath) {
  TempDir dir;
  EXPECT_FLUX_ERROR(data::load_text(dir.file("missing.txt")), "[load_text] cannot open '" + dir.file("missing.txt") +
                                                                  "': no such file");
  std::filesystem::create_directory(dir.file("folder"));
  EXPECT_FLUX_ERROR(data::load_text(dir.file("folder")), "': is a directory");
  std::string packed = gzip_bytes(std::string(50000, 'x') + "tail");
  write_bytes(dir.file("truncated.gz"), packed.substr(0, packed.size() / 2));
  EXPECT_FLUX_ERROR(data::load_text(dir.file("truncated.gz")),
                    "[load_text] '" + dir.file("truncated.gz") + "' is a corrupt or truncated gzip file");
  std::string corrupt = packed;
  for (size_t i = 12; i < 40; ++i) corrupt[i] = char(0xA5);
  write_bytes(dir.file("corrupt.gz"), corrupt);
  EXPECT_FLUX_ERROR(data::load_text(dir.file("corrupt.gz")), "is a corrupt or truncated gzip file (zlib: ");
}

TEST(TextData, ShippedKingJamesText) {
  std::string text = data::load_text(kShipped);
  EXPECT_EQ(text.size(), 366194u);  // as stated in data/LICENSE-kjv
  EXPECT_EQ(text.substr(0, 55), "In the beginning God created the heaven and the earth.\n");
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2746);
  data::CharVocab vocab(text);
  EXPECT_EQ(vocab.size(), 62);
  EXPECT_EQ(vocab.symbol(0), '\n');
  EXPECT_EQ(vocab.symbol(1), ' ');
  EXPECT_EQ(vocab.decode(vocab.encode(text)), text);
}

TEST(TextData, CharVocabEncodeDecode) {
  data::CharVocab vocab("hello, world");
  EXPECT_EQ(vocab.symbols(), " ,dehlorw");
  EXPECT_EQ(vocab.size(), 9);
  EXPECT_EQ(vocab.id(' '), 0);
  EXPECT_EQ(vocab.id('w'), 8);
  Tensor ids = vocab.encode("world");
  EXPECT_EQ(ids.dtype(), DType::i64);
  EXPECT_EQ(ids.shape(), Shape({5}));
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{8, 6, 7, 5, 2}));
  EXPECT_EQ(vocab.decode(ids), "world");
  EXPECT_EQ(vocab.decode(ids.cast(DType::i32).reshape({5, 1})), "world");
  EXPECT_EQ(vocab.decode(std::vector<int64_t>{3, 4}), "eh");

  EXPECT_FLUX_ERROR(vocab.id('z'), "[CharVocab] character 'z' is not in the vocabulary of 9 symbols");
  EXPECT_FLUX_ERROR(vocab.encode("hi\n"), "[CharVocab] character 'i' is not in the vocabulary");
  EXPECT_FLUX_ERROR(vocab.id('\n'), "[CharVocab] character '\\n' is not in the vocabulary");
  EXPECT_FLUX_ERROR(vocab.symbol(9), "[CharVocab] id 9 is out of range for a vocabulary of 9 symbols (expected 0..8)");
  EXPECT_FLUX_ERROR(vocab.decode(std::vector<int64_t>{-1}), "[CharVocab] id -1 is out of range");
  EXPECT_FLUX_ERROR(vocab.decode(Tensor({1.0f, 2.0f})), "[CharVocab] expects Int32 or Int64 ids, got Float32 of shape (2,)");
  EXPECT_FLUX_ERROR(data::CharVocab(""), "[CharVocab] the text is empty");
}

TEST(TextData, WindowsHaveNextCharacterTargets) {
  std::vector<int64_t> v(11);
  for (int i = 0; i < 11; ++i) v[size_t(i)] = 100 + i;
  Tensor ids(v, Shape{11});
  // No overlap: N = floor((11 - 3 - 1) / 3) + 1 = 3 windows starting at 0, 3, 6.
  auto w = data::text_windows(ids, 3);
  EXPECT_EQ(w.inputs.shape(), Shape({3, 3}));
  EXPECT_EQ(w.targets.shape(), Shape({3, 3}));
  EXPECT_EQ(w.inputs.dtype(), DType::i64);
  EXPECT_EQ(w.inputs.to_vector<int64_t>(), (std::vector<int64_t>{100, 101, 102, 103, 104, 105, 106, 107, 108}));
  EXPECT_EQ(w.targets.to_vector<int64_t>(), (std::vector<int64_t>{101, 102, 103, 104, 105, 106, 107, 108, 109}));
  // Stride 4 over 11 ids with T = 5: starts 0, 4 (the last target is id 9, index 9 < 11).
  auto s = data::text_windows(ids, 5, 4);
  EXPECT_EQ(s.inputs.shape(), Shape({2, 5}));
  EXPECT_EQ(s.inputs.to_vector<int64_t>()[5], 104);
  EXPECT_EQ(s.targets.to_vector<int64_t>().back(), 109);
  // Exactly T + 1 ids give one window.
  EXPECT_EQ(data::text_windows(ids, 10).inputs.shape(), Shape({1, 10}));

  EXPECT_FLUX_ERROR(data::text_windows(ids, 11),
                    "[text_windows] a sequence of 11 ids is too short for one window of 11 ids plus its next-id target (needs 12)");
  EXPECT_FLUX_ERROR(data::text_windows(ids.reshape({1, 11}), 3), "[text_windows] expects a 1-D id sequence, got shape (1, 11)");
  EXPECT_FLUX_ERROR(data::text_windows(ids, 0), "[text_windows] seq_len must be at least 1, got 0");
  EXPECT_FLUX_ERROR(data::text_windows(ids, 2, -1), "[text_windows] stride must be 0 (= seq_len) or positive, got -1");
  EXPECT_FLUX_ERROR(data::text_windows(ids.f32(), 2), "[text_windows] expects Int32 or Int64 ids, got Float32 of shape (11,)");
}

TEST(TextData, SplitKeepsOrderAndSizes) {
  std::vector<int64_t> v(100);
  for (int i = 0; i < 100; ++i) v[size_t(i)] = i;
  auto split = data::split_text(Tensor(v, Shape{100}), 0.1);
  EXPECT_EQ(split.train.shape(), Shape({90}));
  EXPECT_EQ(split.validation.shape(), Shape({10}));
  EXPECT_EQ(split.train.to_vector<int64_t>().back(), 89);
  EXPECT_EQ(split.validation.to_vector<int64_t>().front(), 90);
  EXPECT_FLUX_ERROR(data::split_text(Tensor(v, Shape{100}), 1.0), "[split_text] validation_fraction must lie in (0, 1), got 1");
  EXPECT_FLUX_ERROR(data::split_text(Tensor(v, Shape{100}), 0.001), "[split_text] a fraction 0.001 of 100 ids leaves an empty part");
}
