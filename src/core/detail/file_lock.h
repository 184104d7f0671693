#pragma once
// An exclusive flock held for a scope: the bf16 probe's measurement and the kernel cache's
// eviction take one so that one process at a time does them. flock locks belong to an open file
// description, so two FileLocks on one path exclude each other even inside one process, and the
// kernel releases a dead holder's lock. No torch includes.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace volt {
namespace detail {

/// Holds an exclusive flock on `path` (created when missing) for its lifetime; locked() is false
/// when the file cannot be opened or locked.
class FileLock {
 public:
  explicit FileLock(const std::string& path)
      : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0) return;
    int rc;
    do {
      rc = ::flock(fd_, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool locked() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace detail
}  // namespace volt
