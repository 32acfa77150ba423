// Shared by flux_bench.cpp and torch_bench.cpp: timing, peak RSS, and the wide MLP's GEMM list.
#pragma once
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;
struct Timer {
  Clock::time_point t0 = Clock::now();
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
};

// Calls f in batches of `batch` until `seconds` have passed; returns calls per second. The result
// of f is accumulated into a volatile so the work cannot be elided.
template <class F> double rate(F&& f, double seconds, int batch = 1) {
  static volatile float sink = 0;
  Timer t;
  int64_t calls = 0;
  do {
    for (int i = 0; i < batch; ++i) sink = sink + float(f());
    calls += batch;
  } while (t.seconds() < seconds);
  return double(calls) / t.seconds();
}

// The same, counting this thread's CPU time instead of wall time: for the per-op cases, whose work
// never leaves the calling thread, it is far less sensitive to other processes on shared cores.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
template <class F> double rate_cpu(F&& f, double seconds, int batch = 1) {
  static volatile float sink = 0;
  double t0 = thread_cpu_seconds();
  int64_t calls = 0;
  do {
    for (int i = 0; i < batch; ++i) sink = sink + float(f());
    calls += batch;
  } while (thread_cpu_seconds() - t0 < seconds);
  return double(calls) / (thread_cpu_seconds() - t0);
}

// The converged variants of the MNIST MLP and char LSTM rows: the timed steps follow this many steps
// of training on the benchmark batch (warm-up included; the same in torch_bench.py). By 1000 steps the
// MLP's loss is ~2e-5 and a fifth of its Adam first moments (those of weights whose gradient died out)
// have decayed into the subnormal range, where rounding keeps them; the LSTM is at loss ~0.3 by 300.
constexpr int64_t kMnistConvergeSteps = 1000, kLstmConvergeSteps = 300;

// The convolutional cases (LeNet-5, the Fashion-MNIST CNN: batch 128 of 28x28 images; ResNet-18
// inference on kResnetSize x kResnetSize images, batch 1 and 32).
constexpr int64_t kCnnBatch = 128;
constexpr int64_t kResnetSize = 112;

// The sequence cases, at the defaults of examples/char_lstm.cpp and examples/tiny_transformer.cpp:
// character windows of kSeqLen over a vocabulary of kVocab symbols, batch kSeqBatch.
//   lstm:        one-hot (N, T, V) -> LSTM(V => kLstmHidden) -> (N T, H) -> Dense(H => V) logits
//   transformer: ids (N, T) -> token Embedding(V => D) + positional Embedding(T => D), 2 pre-norm blocks
//                [x + MHA(LayerNorm(x), kHeads heads, causal), x + Dense(4D => D)(gelu(Dense(D => 4D)(LayerNorm(x))))],
//                LayerNorm(D) -> Dense(D => V) logits (N T, V), D = kModelDim
// Loss: cross-entropy of the logits against the next symbol (one-hot for flux, class indices for torch).
constexpr int64_t kSeqBatch = 32, kSeqLen = 64, kVocab = 62, kLstmHidden = 256, kModelDim = 64, kHeads = 4;
// Parameter counts the programs print and check: (4H (V + H) + 8H) + (H V + V), and
// V D + T D + 2 [2 (2D) + (3 D D + 3 D) + (D D + D) + (4 D D + 4 D) + (4 D D + D)] + 2D + (D V + V).
constexpr int64_t kLstmParameters = 4 * kLstmHidden * (kVocab + kLstmHidden) + 8 * kLstmHidden + kLstmHidden * kVocab + kVocab;
constexpr int64_t kTransformerParameters =
    kVocab * kModelDim + kSeqLen * kModelDim +
    2 * (4 * kModelDim + 4 * kModelDim * kModelDim + 4 * kModelDim + 8 * kModelDim * kModelDim + 5 * kModelDim) +
    2 * kModelDim + kModelDim * kVocab + kVocab;

// The mixed-precision rows (issue 36), each run in float32 and in bf16 autocast:
//   resnet_train: ResNet-18 (kResnetSize, batch kResnetTrainBatch, 1000 classes) training step, BatchNorm
//                 in training mode, cross-entropy, Adam(1e-3)
//   encoder:      a pre-norm transformer encoder on x (kEncBatch, kEncLen, kEncDim), kEncLayers layers of
//                 [x + MHA(LayerNorm(x)) with kEncHeads heads (no mask), x + Dense(F => D)(relu(Dense(D => F)(LayerNorm(x))))],
//                 F = kEncFfn, then LayerNorm(D) (PyTorch: TransformerEncoderLayer(norm_first=True, dropout=0) x 4
//                 + LayerNorm); training step: mse against a target of x's shape, Adam(1e-3); inference: the forward.
constexpr int64_t kResnetTrainBatch = 32;
constexpr int64_t kEncBatch = 16, kEncLen = 128, kEncDim = 256, kEncLayers = 4, kEncHeads = 4, kEncFfn = 1024;
// Per layer: attention (4 D D + 4 D), two LayerNorms (4 D), the FFN (2 D F + F + D); the final LayerNorm 2 D.
constexpr int64_t kEncParameters =
    kEncLayers * (4 * kEncDim * kEncDim + 4 * kEncDim + 4 * kEncDim + 2 * kEncDim * kEncFfn + kEncFfn + kEncDim) +
    2 * kEncDim;
// decoder: a GPT-style pre-norm decoder stack on x (kDecBatch, kDecLen, kDecDim), kDecLayers layers of
// [x + causal MHA(LayerNorm(x)) with kDecHeads heads, x + Dense(F => D)(relu(Dense(D => F)(LayerNorm(x))))],
// F = kDecFfn, then LayerNorm(D); PyTorch: the same block with F.scaled_dot_product_attention(is_causal=True).
// Training step: mse against a target of x's shape, Adam(1e-3); inference: the forward.
constexpr int64_t kDecBatch = 4, kDecLen = 512, kDecDim = 768, kDecLayers = 4, kDecHeads = 12, kDecFfn = 3072;
constexpr int64_t kDecParameters =
    kDecLayers * (4 * kDecDim * kDecDim + 4 * kDecDim + 4 * kDecDim + 2 * kDecDim * kDecFfn + kDecFfn + kDecDim) +
    2 * kDecDim;
// attention_memory: one causal MultiHeadAttention(kDecDim, kDecHeads) at batch kMemBatch, forward and backward.
constexpr int64_t kMemBatch = 4;

// The serve case (issue 37): one model in testmode called from 1 and from 2 threads at once: the MNIST
// MLP at batch kServeMlpBatch, ResNet-18 (kResnetSize, batch 1 and 32), and an LSTM(kServeLstmIn =>
// kServeLstmHidden) + Dense(kServeLstmHidden => kServeLstmIn) on (kServeLstmBatch, kServeLstmSteps,
// kServeLstmIn) inputs.
constexpr int64_t kServeMlpBatch = 32, kServeLstmIn = 64, kServeLstmHidden = 128, kServeLstmBatch = 4,
                  kServeLstmSteps = 32;

// Symbol ids of the benchmark batch, (kSeqBatch, kSeqLen) row-major, and the next-symbol targets: a
// fixed sequence that visits every symbol (7 and 62 are coprime).
inline std::vector<int64_t> seq_ids(int64_t shift = 0) {
  std::vector<int64_t> v(size_t(kSeqBatch * kSeqLen));
  for (int64_t i = 0; i < kSeqBatch * kSeqLen; ++i) v[size_t(i)] = ((i + shift) * 7 + (i + shift) / 11) % kVocab;
  return v;
}

inline double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Row-major C (m, n) = op(A) op(B) with inner size k; ta/tb as cblas's transposes.
struct GemmShape {
  int64_t m, n, k;
  bool ta, tb;
};

// The GEMMs one training step of the wide MLP (1024 -> 4096 -> 4096 -> 1024, batch 256) needs:
// 3 forward (x W^T), 3 weight gradients (g^T x), 2 input gradients (g W); the first layer's input
// gradient is not needed.
inline std::vector<GemmShape> wide_gemms() {
  const int64_t B = 256;
  const int64_t dims[4] = {1024, 4096, 4096, 1024};
  std::vector<GemmShape> v;
  for (int l = 0; l < 3; ++l) {
    int64_t in = dims[l], out = dims[l + 1];
    v.push_back({B, out, in, false, true});     // y = x W^T
    v.push_back({out, in, B, true, false});     // dW = g^T x
    if (l > 0) v.push_back({B, in, out, false, false});  // dx = g W
  }
  return v;
}

inline double wide_step_flops() {
  double f = 0;
  for (const GemmShape& s : wide_gemms()) f += 2.0 * double(s.m) * double(s.n) * double(s.k);
  return f;
}

}  // namespace bench
