#include "detail/cgroup_memory.h"

#include <algorithm>
#include <string>

#include "core/detail/numbers.h"

namespace volt {
namespace detail {
namespace {

// A limit file's bytes, or -1 for none ("max", a missing or unreadable file, v1's "unlimited":
// 2^63 - 1 rounded down to a page, far beyond any machine).
int64_t read_limit(const std::string& path) {
  auto in = detail::c_stream<std::ifstream>(path);
  std::string s;
  if (!(in >> s) || s.empty() || s == "max") return -1;
  try {
    const int64_t v = std::stoll(s);
    return v > 0 && v < (int64_t{1} << 62) ? v : -1;
  } catch (...) {
    return -1;
  }
}

// The tighter of two limits, -1 meaning none.
int64_t tighter(int64_t a, int64_t b) {
  if (a < 0) return b;
  return b < 0 ? a : std::min(a, b);
}

// The tightest limit in `dir` + `path` and each of its ancestors up to `dir` itself.
int64_t tightest_on_path(const std::string& dir, std::string path, const std::string& file) {
  int64_t best = -1;
  while (true) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    best = tighter(best, read_limit(dir + path + "/" + file));
    if (path.empty()) return best;
    const size_t slash = path.rfind('/');
    path.erase(slash == std::string::npos ? 0 : slash);
  }
}

}  // namespace

int64_t cgroup_memory_limit(const std::string& root, const std::string& proc_self_cgroup) {
  // Lines "hierarchy-ID:controller-list:path"; v2's is "0::path". A missing line leaves its
  // path empty, the hierarchy's root: only the roots are read without /proc/self/cgroup, as volt
  // did before it walked the process's own path.
  std::string v2_path, v1_path;
  auto lines = detail::c_stream<std::istringstream>(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2_path = path;
      continue;
    }
    auto names = detail::c_stream<std::istringstream>(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c == "memory") v1_path = path;
    }
  }
  return tighter(tightest_on_path(root, v2_path, "memory.max"),
                 tightest_on_path(root + "/memory", v1_path, "memory.limit_in_bytes"));
}

}  // namespace detail
}  // namespace volt
