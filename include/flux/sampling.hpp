// Drawing classes from scores, as StatsBase's wsample over softmax(logits / temperature) in Flux's
// char-rnn and nanoGPT generators:
//   Tensor next = sample_logits(model(context), {.temperature = 0.8});   // (N, C) -> (N,) Int64
#pragma once
#include <cstdint>

#include "flux/tensor.hpp"

namespace flux {

struct SampleOptions {
  /// Scales the logits as logits / temperature: below 1 sharper, above 1 flatter; 0 takes the argmax.
  double temperature = 1.0;
  /// Keep only the k largest logits of each row before drawing (0: all).
  int64_t top_k = 0;
};

/// One class index per row of `logits` (..., C) drawn with probability softmax(logits / temperature)
/// along the last axis: Int64 of shape (...), on logits' device. Draws come from the global seeded
/// generator (flux::seed), so a seed repeats them. The logits are read to the host (a few rows of a
/// vocabulary: the sampling step of a generator, not a training op).
Tensor sample_logits(const Tensor& logits, SampleOptions o = {});

}  // namespace flux
