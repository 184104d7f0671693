#pragma once
// Run-folder helpers shared by the loggers: save_dir/name/version_N.

#include <cstdint>
#include <string>

namespace volt {
namespace detail {

/// mkdir -p; throws ConfigError "[<component>] cannot create folder ..." on failure.
void make_dirs(const std::string& path, const std::string& component);

/// max(N of existing root/version_N) + 1, or 0 when there is none.
int64_t next_version(const std::string& root);

}  // namespace detail
}  // namespace volt
