#include "io/detail/whole_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "volt/core/check.h"

namespace volt::detail {

std::string read_whole_file(const std::string& path, const char* tag, const char* what,
                            const char* fix) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VOLT_CHECK(fd >= 0, CheckpointError, tag, " cannot open ", what, " '", path, "' (",
             std::strerror(errno), "); ", fix);
  std::string file;
  struct stat st;
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  if (err == 0 && S_ISDIR(st.st_mode)) err = EISDIR;
  if (err == 0) {
    file.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < file.size()) {
      const ssize_t n = ::read(fd, &file[done], file.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) err = errno;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    file.resize(done);  // a file that shrank while read: the caller's size checks report it
  }
  ::close(fd);
  VOLT_CHECK(err == 0, CheckpointError, tag, " cannot read ", what, " '", path, "' (",
             std::strerror(err), "); ", fix);
  return file;
}

}  // namespace volt::detail
