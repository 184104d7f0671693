#pragma once
/// atomic_write_file: the one way volt writes a file that matters (checkpoints, logs' metrics,
/// saved configs, measurements). No torch includes.

#include <string>

namespace volt {

/// Writes `data` to `path` atomically (temp file + fsync + rename + fsync of the folder),
/// creating parent folders. The temp file "<path>.volt-tmp.<pid>" is flock'ed while written, and
/// each write first removes the temp files in the folder that no live writer holds (left by a
/// writer that was killed). Throws CheckpointError with the OS reason on failure.
void atomic_write_file(const std::string& path, const std::string& data);

}  // namespace volt
