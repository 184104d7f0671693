#include "core/detail/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace volt {
namespace detail {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);  // a file, a link or an (by now) empty folder; a failure shows at the end
  return 0;
}

}  // namespace

bool remove_tree(const std::string& path) {
  if (path.empty()) return true;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  // Children before their folder (FTW_DEPTH); links are not followed (FTW_PHYS).
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ::lstat(path.c_str(), &st) != 0;
}

}  // namespace detail
}  // namespace volt
