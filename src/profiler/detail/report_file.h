#pragma once
// Private: a profiler report written after the reports already in its file (Lightning's
// profilers open their output file to append), the whole file replaced atomically.

#include <filesystem>
#include <string>

#include "io/detail/whole_file.h"
#include "volt/core/atomic_file.h"

namespace volt {
namespace detail {

/// Writes `text` after what `path` holds (nothing when it does not exist yet). `tag` names the
/// profiler in a read error.
inline void append_report(const std::string& path, const std::string& text, const char* tag) {
  std::string before;
  if (std::filesystem::exists(path)) {
    before = read_whole_file(path, tag, "the report", "check its permissions or remove it");
  }
  atomic_write_file(path, before + text);
}

}  // namespace detail
}  // namespace volt
