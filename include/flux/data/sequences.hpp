// MLUtils' chunk and batchseq, with observations along the first axis as everywhere in flux:
//   auto [q, k, v] = ...; std::vector<Tensor> parts = data::chunk(qkv, 3, -1);  // 3 equal parts of the last axis
//   Tensor batch = data::batchseq({seq_a, seq_b}, 0);  // (T_i, ...) each -> (2, max T_i, ...), padded with 0
#pragma once
#include <cstdint>
#include <vector>

#include "flux/tensor.hpp"

namespace flux::data {

/// Splits x into n parts along `axis` (default the first, the observations), as MLUtils' chunk(x, n):
/// every part has ceil(size / n) entries but the last, which has what remains (parts never empty:
/// n must not exceed the axis length). The parts are slices: differentiable, on x's device.
std::vector<Tensor> chunk(const Tensor& x, int64_t n, int axis = 0);

/// Pads sequences of shape (T_i, ...) (the same trailing shape, dtype and device) with `pad` to the
/// longest and stacks them: (number of sequences, max T_i, ...), flux's (N, T, features) layout
/// (MLUtils' batchseq(seqs, pad) gives the same values as a vector over time). Differentiable.
Tensor batchseq(const std::vector<Tensor>& sequences, double pad = 0);

}  // namespace flux::data
