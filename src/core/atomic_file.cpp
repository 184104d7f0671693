#include "volt/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "detail/temp_files.h"
#include "volt/core/check.h"

namespace volt {
namespace {

std::string parent_dir(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

void make_dirs(const std::string& dir) {
  if (dir.empty() || dir == "." || dir == "/") return;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    VOLT_CHECK(S_ISDIR(st.st_mode), CheckpointError, "[CheckpointIO] '", dir,
               "' exists but is not a folder; choose another checkpoint folder.");
    return;
  }
  make_dirs(parent_dir(dir));
  VOLT_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, CheckpointError,
             "[CheckpointIO] cannot create folder '", dir, "' (", std::strerror(errno),
             "); check permissions or choose another dirpath.");
}

}  // namespace

void atomic_write_file(const std::string& path, const std::string& data) {
  const std::string dir = parent_dir(path);
  make_dirs(dir);
  // Temp files of writers that died mid-write (they accumulate, one per kill) go first.
  detail::remove_stale_temps(dir);
  const std::string tmp = detail::temp_path_for(path);
  // Locked until closed: the file is unlinked or renamed before then, so a cleanup never sees
  // a live writer's file unlocked.
  const int fd = detail::create_locked_temp(tmp);
  const auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    ::close(fd);
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] ", what, " '", tmp, "' failed (",
               std::strerror(err), "); check free disk space. The previous '", path,
               "' is untouched.");
  };
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", n < 0 ? errno : EIO);
    p += n;
    left -= static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a power loss can leave the new name pointing at no data.
  if (::fsync(fd) != 0) fail("flushing", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ::close(fd);
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] renaming '", tmp, "' to '", path,
               "' failed (", std::strerror(err), ").");
  }
  ::close(fd);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename itself durable
    ::close(dfd);
  }
}

}  // namespace volt
