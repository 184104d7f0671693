#pragma once
// The checkpoint envelope reader on bytes already in memory: TorchCheckpointIO::load reads the
// file and calls it; fuzz/envelope_fuzzer.cpp feeds it hostile bytes.

#include <torch/serialize/input-archive.h>

#include <string>

namespace volt {
namespace detail {

/// Checks magic, format version, payload size and CRC-32 of `file` (the bytes of the checkpoint
/// named `path` in messages) and loads its libtorch archive; any defect throws CheckpointError.
torch::serialize::InputArchive parse_checkpoint(const std::string& file, const std::string& path);

}  // namespace detail
}  // namespace volt
