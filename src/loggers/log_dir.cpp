#include "detail/log_dir.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "volt/core/check.h"

namespace volt {
namespace detail {

void make_dirs(const std::string& path, const std::string& component) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      VOLT_CHECK(false, ConfigError, "[", component, "] cannot create folder '", cur, "' (",
                 std::strerror(errno), "); choose a writable save_dir.");
    }
    struct stat st;
    VOLT_CHECK(::stat(cur.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ConfigError, "[", component,
               "] cannot create folder '", cur,
               "': a file of that name is in the way; choose another path.");
  }
}

int64_t next_version(const std::string& root) {
  int64_t next = 0;
  if (DIR* d = ::opendir(root.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("version_", 0) != 0) continue;
      const std::string digits = n.substr(8);
      // Not volt's: no number, or one past int64 (18 digits always fit; std::stoll throws beyond).
      if (digits.empty() || digits.size() > 18 ||
          digits.find_first_not_of("0123456789") != std::string::npos) {
        continue;
      }
      next = std::max<int64_t>(next, std::stoll(digits) + 1);
    }
    ::closedir(d);
  }
  return next;
}

}  // namespace detail
}  // namespace volt
