#pragma once
// Private: how a checkpoint path is opened, for every strategy (Strategy::load_checkpoint) and
// for load_weights, which has none.

#include <torch/serialize/archive.h>

#include <string>

namespace volt {

class CheckpointIO;

namespace detail {

/// A ZeRO checkpoint folder (every rank's shard) consolidated, else the file read through `io`.
/// `weights_only`: the folder's optimizer states are not consolidated (nothing will read them:
/// validate / test / predict, load_weights).
torch::serialize::InputArchive read_checkpoint(const std::string& path, CheckpointIO& io,
                                               bool weights_only);

}  // namespace detail
}  // namespace volt
