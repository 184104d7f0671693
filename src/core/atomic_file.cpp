#include "volt/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "detail/atomic_file_writer.h"
#include "detail/temp_files.h"
#include "volt/core/check.h"

namespace volt {
namespace {

// Appends smaller than this are gathered; larger ones go straight to the file.
constexpr size_t kGather = 1 << 20;

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

namespace detail {

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), dir_(parent_dir(path_)) {
  make_dirs(dir_);
  // Temp files of writers that died mid-write (they accumulate, one per kill) go first.
  remove_stale_temps(dir_);
  tmp_ = temp_path_for(path_);
  // Locked until closed: the file is unlinked or renamed before then, so a cleanup never sees
  // a live writer's file unlocked.
  fd_ = create_locked_temp(tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::unlink(tmp_.c_str());
  ::close(fd_);
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  ::unlink(tmp_.c_str());
  ::close(fd_);
  fd_ = -1;
  VOLT_CHECK(false, CheckpointError, "[CheckpointIO] ", what, " '", tmp_, "' failed (",
             std::strerror(err), "); check free disk space. The previous '", path_,
             "' is untouched.");
  __builtin_unreachable();
}

void AtomicFileWriter::write_all(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing", w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFileWriter::flush_buffer() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  VOLT_ASSERT(fd_ >= 0, "AtomicFileWriter::write after commit or failure");
  size_ += n;
  if (buffer_.size() + n <= kGather) {
    buffer_.append(static_cast<const char*>(data), n);
    return;
  }
  flush_buffer();
  if (n < kGather) {
    buffer_.append(static_cast<const char*>(data), n);
    return;
  }
  write_all(static_cast<const char*>(data), n);
}

void AtomicFileWriter::overwrite(const void* data, size_t n, uint64_t offset) {
  VOLT_ASSERT(fd_ >= 0 && offset + n <= size_, "AtomicFileWriter::overwrite beyond the data");
  flush_buffer();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing", w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void AtomicFileWriter::commit() {
  VOLT_ASSERT(fd_ >= 0, "AtomicFileWriter::commit twice or after a failure");
  flush_buffer();
  // fsync before rename: otherwise a power loss can leave the new name pointing at no data.
  if (::fsync(fd_) != 0) fail("flushing", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    ::close(fd_);
    fd_ = -1;
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] renaming '", tmp_, "' to '", path_,
               "' failed (", std::strerror(err), ").");
  }
  ::close(fd_);
  fd_ = -1;
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename itself durable
    ::close(dfd);
  }
}

}  // namespace detail

void atomic_write_file(const std::string& path, const std::string& data) {
  detail::AtomicFileWriter file(path);
  file.write(data.data(), data.size());
  file.commit();
}

}  // namespace volt
