// The plan of a sharded model (distributed/shard.hpp): the options a user picks, and what every rank
// knows about how the model's trainable arrays are cut into chunks (one per rank) and, at stage 3,
// grouped into the layers that are gathered one at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flux/distributed.hpp"
#include "flux/tensor.hpp"

namespace flux::distributed {

struct ShardOptions {
  /// 1: optimiser state and master weights sharded; 2: gradients too (reduce-scatter during backward);
  /// 3: parameters too (each layer all-gathered around its forward and its backward, FSDP).
  int stage = 1;
  /// Gradients are reduce-scattered in buckets of about this many bytes (of the wire dtype), in reverse
  /// parameter order; parameters are all-gathered in buckets of the same size.
  int64_t bucket_bytes = int64_t(25) << 20;
  /// BFloat16: gradients cross the wire in bf16 (half the bytes) and each rank sums the ranks' bf16
  /// chunks in float32 (MPI_Ialltoall, then a local sum in rank order); none: float32 (float64 for
  /// float64 arrays) reduce-scatter.
  std::optional<DType> wire = std::nullopt;
};

namespace detail {

/// What every rank knows about the sharding of one model.
struct ShardPlan {
  Communicator comm;
  ShardOptions options;
  std::vector<std::string> names;  // PyTorch-style names of the trainable arrays, params() order
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;         // the model's
  std::vector<DType> master_dtypes;  // float32 for f16/bf16 arrays, else the array's
  std::vector<Device> devices;
  std::vector<int64_t> chunk;        // ceil(numel / ranks): elements per rank
  std::vector<std::vector<size_t>> units;  // stage 3: each layer's arrays (indices above), in call order
  int rank = 0, ranks = 1;
};

/// Array i, in dtype t, crosses MPI from and into its own memory: on the CPU, its elements exactly
/// `ranks` chunks (already in rank order) and large enough that a collective of its own beats a
/// packed copy (the same answer on every rank).
bool rank_major(const ShardPlan& plan, size_t i, DType t);

/// `units`: stage 3's layers (each array in exactly one); empty below stage 3.
std::shared_ptr<const ShardPlan> make_plan(const Communicator& comm, const std::vector<std::string>& names,
                                           const std::vector<Tensor>& params, const ShardOptions& options,
                                           std::vector<std::vector<size_t>> units = {});

}  // namespace detail
}  // namespace flux::distributed
