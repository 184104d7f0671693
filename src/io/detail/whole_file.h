#pragma once
// Private: a file's bytes in one buffer of its size, read straight into it (no stream copies,
// no doubling growth), for the readers that parse whole files (checkpoints, safetensors).

#include <string>

namespace volt::detail {

/// The bytes of `path`. A file that cannot be opened or read, or a folder, is a CheckpointError
/// "<tag> cannot open|read <what> '<path>' (<strerror>); <fix>".
std::string read_whole_file(const std::string& path, const char* tag, const char* what,
                            const char* fix);

}  // namespace volt::detail
