// A conv forward's question to the kernel-choice seam (Site::conv_forward, kernel_choice.hpp), by name:
// what conv.cpp asks, what its tuner timer turns back into a geometry, and what the tuner (tune.cpp) prints.
// Query::dims holds the fields in the order written here (the tuned table stores them so); padding is
// not part of the question.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "flux/backend.hpp"
#include "src/backends/cpu/kernel_choice.hpp"

namespace flux::cpu_backend {

struct ConvQuery {
  int64_t spatial = 2, batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  std::array<int64_t, 3> in{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1};  // unused axes: 1
  bool affine = false;  // the fused inference forward (conv_forward_affine)

  /// The question for a forward of g (unused axes as 1).
  static ConvQuery of(const backend::ConvGeometry& g, bool affine) {
    ConvQuery c;
    c.spatial = g.spatial, c.batch = g.batch, c.in_channels = g.in_channels, c.out_channels = g.out_channels;
    c.groups = g.groups, c.affine = affine;
    for (int i = 0; i < 3 && i < g.spatial; ++i)
      c.in[size_t(i)] = g.in[i], c.kernel[size_t(i)] = g.kernel[i], c.stride[size_t(i)] = g.stride[i],
      c.dilation[size_t(i)] = g.dilation[i];
    return c;
  }
  /// Read back from a query of Site::conv_forward.
  static ConvQuery from(const Query& q) {
    const auto& d = q.dims;
    ConvQuery c;
    c.spatial = d[0], c.batch = d[1], c.in_channels = d[2], c.out_channels = d[3], c.groups = d[4];
    for (size_t i = 0; i < 3; ++i)
      c.in[i] = d[5 + i], c.kernel[i] = d[8 + i], c.stride[i] = d[11 + i], c.dilation[i] = d[14 + i];
    c.affine = d[17] != 0;
    return c;
  }
  Query query(int threads) const {
    return {Site::conv_forward, threads,
            {spatial, batch, in_channels, out_channels, groups, in[0], in[1], in[2], kernel[0], kernel[1], kernel[2],
             stride[0], stride[1], stride[2], dilation[0], dilation[1], dilation[2], affine}};
  }
  /// A geometry that asks this question: "same" padding for odd kernels (the tuner's timer).
  backend::ConvGeometry geometry() const {
    backend::ConvGeometry g;
    g.spatial = int(std::clamp<int64_t>(spatial, 1, 3)), g.batch = batch, g.in_channels = in_channels;
    g.out_channels = out_channels, g.groups = groups;
    for (int i = 0; i < g.spatial; ++i) {
      const size_t a = size_t(i);
      g.in[i] = in[a], g.kernel[i] = kernel[a], g.stride[i] = stride[a], g.dilation[i] = dilation[a];
      g.pad_lo[i] = g.pad_hi[i] = g.dilation[i] * (g.kernel[i] - 1) / 2;
      g.out[i] = (g.in[i] + 2 * g.pad_lo[i] - g.dilation[i] * (g.kernel[i] - 1) - 1) / g.stride[i] + 1;
    }
    return g;
  }
};

}  // namespace flux::cpu_backend
