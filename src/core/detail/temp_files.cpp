#include "temp_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/detail/ascii.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  const std::string suffix = ".volt-tmp." + std::to_string(::getpid());
  // A name near the file system's 255-byte limit leaves no room for the suffix (ENAMETOOLONG
  // for a valid name): its temporary file takes as much of the name as fits, cut at a UTF-8
  // character's start. Two long names sharing that start share the temporary name, which the
  // lock serialises (create_locked_temp starts over when the name moved on).
  constexpr size_t kNameMax = 255;
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  std::string out = path;
  if (path.size() - base + suffix.size() > kNameMax) {
    size_t keep = base + kNameMax - suffix.size();
    while (keep > base && (static_cast<unsigned char>(path[keep]) & 0xC0) == 0x80) --keep;
    out.resize(keep);
  }
  return out + suffix;
}

bool is_temp_name(const std::string& name) {
  static const std::string kInfix = ".volt-tmp.";
  const size_t pos = name.rfind(kInfix);
  if (pos == std::string::npos || pos == 0 || pos + kInfix.size() == name.size()) return false;
  for (size_t i = pos + kInfix.size(); i < name.size(); ++i) {
    if (!ascii_digit(name[i])) return false;
  }
  return true;
}

int create_locked_temp(const std::string& tmp) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    // O_NOFOLLOW: a link planted at this (predictable) name is removed, never written through.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP) {
      ::unlink(tmp.c_str());
      continue;
    }
    VOLT_CHECK(fd >= 0, CheckpointError, "[CheckpointIO] cannot create '", tmp, "' (",
               std::strerror(errno), "); check that the folder is writable.");
    int rc;
    do {
      rc = ::flock(fd, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      VOLT_CHECK(false, CheckpointError, "[CheckpointIO] cannot lock '", tmp, "' (",
                 std::strerror(err), "); write checkpoints to a local file system.");
    }
    // Between open and flock another writer's cleanup may have locked and removed this file
    // (unlocked, it looked dead): then the name is gone or names a newer file; start over.
    struct stat mine, named;
    if (::fstat(fd, &mine) == 0 && ::stat(tmp.c_str(), &named) == 0 && same_file(mine, named)) {
      if (::ftruncate(fd, 0) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        ::close(fd);
        VOLT_CHECK(false, CheckpointError, "[CheckpointIO] cannot truncate '", tmp, "' (",
                   std::strerror(err), ").");
      }
      return fd;
    }
    ::close(fd);
  }
  VOLT_CHECK(false, CheckpointError, "[CheckpointIO] '", tmp,
             "' kept disappearing while being created; is another program deleting files in "
             "that folder?");
  return -1;
}

void remove_stale_temps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_temp_name(name)) continue;
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat opened, named;
    // Holding the lock, nobody volt-conformant can rename or remove this name; checking that it
    // still names the file we locked keeps a newer writer's file (same name) safe.
    if (::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::lstat(path.c_str(), &named) == 0 &&
        same_file(opened, named)) {
      ::unlink(path.c_str());
    }
    ::close(fd);
  }
  ::closedir(d);
}

}  // namespace detail
}  // namespace volt
