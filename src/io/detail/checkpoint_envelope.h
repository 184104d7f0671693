#pragma once
// The checkpoint envelope reader on bytes already in memory: TorchCheckpointIO::load reads the
// file and calls it; fuzz/envelope_fuzzer.cpp feeds it hostile bytes.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <string>

namespace volt {
namespace detail {

/// Checks magic, format version, payload size and CRC-32 of `file` (the bytes of the checkpoint
/// named `path` in messages) and loads its libtorch archive; any defect throws CheckpointError.
torch::serialize::InputArchive parse_checkpoint(const std::string& file, const std::string& path);

/// Replaces `file` with the bytes of a checkpoint file for `archive`, the header's payload size
/// and CRC still zero: libtorch serialises the archive straight after the header (one copy of
/// each tensor). This is the part that reads the tensors. `file`'s capacity is reused: a buffer
/// kept from an earlier checkpoint of the same size takes no new memory (no page faults).
void serialize_checkpoint(torch::serialize::OutputArchive& archive, std::string& file);

/// Fills in the header of serialize_checkpoint's bytes (payload size, CRC-32 of the payload).
void seal_checkpoint(std::string& file);

/// unlink(path); a missing file is fine, any other failure (a read-only folder) a
/// CheckpointError: the caller believed the file gone.
void remove_file(const std::string& path);

/// CheckpointIO::link's work: `path` becomes a symbolic link to `target` (relative to `path`'s
/// folder), made under a temporary name and renamed over `path`; CheckpointError when `path`
/// is a folder or the link cannot be made (`path` unchanged).
void make_link(const std::string& target, const std::string& path);

}  // namespace detail
}  // namespace volt
