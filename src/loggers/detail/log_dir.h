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

/// Creates root/version_N for the next free N and returns N. The folder is claimed by its own
/// mkdir: two runs starting at once into one root get different versions (next_version alone
/// would give both the same).
int64_t claim_next_version(const std::string& root, const std::string& component);

}  // namespace detail
}  // namespace volt
