#pragma once
// The newest of several paths by modification time (nanoseconds): ckpt_path="last" picks the
// newest of ModelCheckpoint's last files and OnExceptionCheckpoint's file, and ModelCheckpoint
// the newest of its last*.ckpt files, with one comparison.

#include <sys/stat.h>

#include <string>
#include <utility>

namespace volt {
namespace detail {

class NewestPath {
 public:
  /// Takes `path` when its modification time (from `st`) is later than the newest so far; ties
  /// keep the first.
  void consider(std::string path, const struct stat& st) {
    const struct timespec& t = st.st_mtim;
    if (path_.empty() || t.tv_sec > time_.tv_sec ||
        (t.tv_sec == time_.tv_sec && t.tv_nsec > time_.tv_nsec)) {
      path_ = std::move(path);
      time_ = t;
    }
  }

  /// The newest path considered, or "" when none was.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  struct timespec time_ {};
};

}  // namespace detail
}  // namespace volt
