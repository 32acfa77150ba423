// libFuzzer target: the text data reader (data::load_text, plain or gzip) and what follows it in a
// training program: CharVocab, encode, decode, text_windows, split_text. Every input either throws
// flux::Error or round-trips: decode(encode(text)) == text, and windows hold next-character targets.
#include "flux/flux.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace flux;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = flux_fuzz::input_path(data, size);
  std::string text;
  try {
    text = data::load_text(path);
  } catch (const Error&) {
    return 0;
  }
  if (text.empty()) return 0;
  data::CharVocab vocab(text);
  flux_fuzz::check(vocab.size() >= 1 && vocab.size() <= 256, "vocabulary size outside 1..256");
  if (text.size() > 65536) return 0;  // bounded work per input (gzip inflates)
  Tensor ids = vocab.encode(text);
  flux_fuzz::check(vocab.decode(ids) == text, "decode(encode(text)) != text");
  const int64_t seq = 1 + int64_t(uint8_t(text[0]) % 8);
  if (int64_t(text.size()) > seq + 1) {
    auto w = data::text_windows(ids, seq);
    auto in = w.inputs.to_vector<int64_t>(), next = w.targets.to_vector<int64_t>();
    auto all = ids.to_vector<int64_t>();
    for (int64_t i = 0; i < w.inputs.shape()[0]; ++i)
      for (int64_t j = 0; j < seq; ++j) {
        flux_fuzz::check(in[size_t(i * seq + j)] == all[size_t(i * seq + j)], "window input is not the text");
        flux_fuzz::check(next[size_t(i * seq + j)] == all[size_t(i * seq + j + 1)], "window target is not the next character");
      }
    try {
      auto split = data::split_text(ids, 0.25);
      flux_fuzz::check(split.train.numel() + split.validation.numel() == ids.numel(), "split lost characters");
    } catch (const Error& e) {  // too short a text for a non-empty part: a documented error
      flux_fuzz::check(std::string(e.what()).find("[split_text]") == 0, "split_text failed without naming itself");
    }
  }
  return 0;
}
