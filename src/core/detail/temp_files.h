#pragma once
// The temporary files of atomic_write_file: "<path>.volt-tmp.<pid>", locked while being written, so
// that a writer killed mid-write (SIGKILL, OOM, power) leaves debris that the next writer in
// the folder can recognise as dead and remove, without ever touching a live writer's file.
// No torch includes.

#include <string>

namespace volt {
namespace detail {

/// "<path>.volt-tmp.<this process's pid>".
std::string temp_path_for(const std::string& path);

/// True for names volt's temporary files have: "<name>.volt-tmp.<digits>" with a non-empty
/// name (an infix of its own: other programs' "x.tmp.123" are not volt's to remove).
bool is_temp_name(const std::string& file_name);

/// Creates (or truncates) `tmp` for writing and returns its descriptor holding an exclusive
/// flock, which the kernel releases when the descriptor closes or the process dies. The caller
/// renames or unlinks the file before closing. Throws CheckpointError with the OS reason.
int create_locked_temp(const std::string& tmp);

/// Removes every temporary file in `dir` whose writer is gone: those whose lock can be taken at
/// once. A live writer holds its lock, so its file stays, whatever pid its name holds (a reused
/// pid fools a liveness check by pid, not a lock). Errors are ignored: this is tidying up.
void remove_stale_temps(const std::string& dir);

}  // namespace detail
}  // namespace volt
