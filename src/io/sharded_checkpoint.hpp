// Sharded checkpoints read as one whole model (not installed): load_checkpoint(path, model, opt_state)
// on a folder written by distributed::save_checkpoint gathers every rank's chunks.
#pragma once
#include <string>

#include "flux/io/safetensors.hpp"

namespace flux::io_detail {

/// True when `path` is a folder holding a sharded checkpoint's index.json.
bool is_sharded_checkpoint(const std::string& path);
/// Fills the whole arrays of `model_targets` and `s` from the chunks of every rank's file.
Metadata load_sharded_gathered(const std::string& path, const Targets& model_targets, optimisers::State& s,
                               optimisers::GradScaler* scaler);

}  // namespace flux::io_detail
