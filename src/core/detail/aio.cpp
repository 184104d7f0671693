#include "core/detail/aio.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "volt/core/check.h"
#include "volt/core/env.h"

namespace volt {
namespace detail {
namespace {
constexpr const char* kTag = "[AioFile]";
}  // namespace

struct AioFile::Ring {
  io_uring ring{};
};

AioFile::AioFile(std::string path, AioOptions options, bool create)
    : path_(std::move(path)), options_(options) {
  VOLT_CHECK(
      options_.block_size() > 0 && options_.queue_depth() > 0 && options_.queue_depth() <= 4096,
      ConfigError, kTag, " block_size=", options_.block_size(),
      " and queue_depth=", options_.queue_depth(),
      " must be > 0 (queue_depth at most 4096); use DeepSpeed's aio defaults (1048576, 8).");
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  fd_ = ::open(path_.c_str(), flags, 0600);
  VOLT_CHECK(fd_ >= 0, ConfigError, kTag, " cannot open '", path_, "' (", std::strerror(errno),
             "); point nvme_path at an existing, writable folder.");
  if (!options_.use_uring()) return;
  ring_ = std::make_unique<Ring>();
  const int rc =
      io_uring_queue_init(static_cast<unsigned>(options_.queue_depth()), &ring_->ring, 0);
  if (rc < 0) {
    ring_.reset();
    ::close(fd_);
    fd_ = -1;
    VOLT_CHECK(false, NotAvailable, kTag, " io_uring cannot start (", std::strerror(-rc),
               "); the kernel or a seccomp policy forbids it. Set aio use_uring=false (the "
               "pread/pwrite path) or allow io_uring.");
  }
  slots_.resize(static_cast<size_t>(options_.queue_depth()));
  for (size_t i = slots_.size(); i-- > 0;) free_.push_back(i);
  if (const auto n = env_value("VOLT_TEST_AIO_SUBMIT_FAILS"))
    fail_submit_at_ = std::atoll(n->c_str());
}

AioFile::~AioFile() {
  // Buffers may still be read by the kernel: drain before they can be freed.
  try {
    wait();
  } catch (...) {
  }
  if (ring_) io_uring_queue_exit(&ring_->ring);
  if (fd_ >= 0) ::close(fd_);
}

void AioFile::submit_write(const void* data, int64_t bytes, int64_t offset) {
  for (int64_t done = 0; done < bytes; done += options_.block_size()) {
    const int64_t n = std::min(options_.block_size(), bytes - done);
    enqueue(const_cast<char*>(static_cast<const char*>(data)) + done, n, offset + done, true);
  }
}

void AioFile::submit_read(void* data, int64_t bytes, int64_t offset) {
  for (int64_t done = 0; done < bytes; done += options_.block_size()) {
    const int64_t n = std::min(options_.block_size(), bytes - done);
    enqueue(static_cast<char*>(data) + done, n, offset + done, false);
  }
}

void AioFile::fail(const std::string& what) {
  if (error_.empty()) error_ = what;
}

void AioFile::run_posix(const Request& r) {
  int64_t done = 0;
  while (done < r.bytes) {
    const ssize_t n = r.write ? ::pwrite(fd_, r.data + done, r.bytes - done, r.offset + done)
                              : ::pread(fd_, r.data + done, r.bytes - done, r.offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(detail::str_cat(kTag, " ", r.write ? "writing " : "reading ", r.bytes,
                           " bytes at offset ", r.offset, " of '", path_, "' failed (",
                           n < 0 ? std::strerror(errno) : "the file ends first",
                           "); check the disk behind nvme_path (space, errors)."));
      return;
    }
    done += n;
  }
}

void AioFile::enqueue(char* data, int64_t bytes, int64_t offset, bool write) {
  if (!ring_) {
    run_posix(Request{data, bytes, offset, write});
    return;
  }
  while (free_.empty()) reap_one();
  const size_t slot = free_.back();
  free_.pop_back();
  slots_[slot] = Request{data, bytes, offset, write};
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  VOLT_ASSERT(sqe != nullptr, "io_uring has no free entry with ", free_.size(), " free slots");
  if (write) {
    io_uring_prep_write(sqe, fd_, data, static_cast<unsigned>(bytes),
                        static_cast<uint64_t>(offset));
  } else {
    io_uring_prep_read(sqe, fd_, data, static_cast<unsigned>(bytes), static_cast<uint64_t>(offset));
  }
  io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(slot));
  int rc;
  do {
    rc = ++submits_ == fail_submit_at_ ? -EAGAIN : io_uring_submit(&ring_->ring);
  } while (rc == -EINTR);
  if (rc >= 0) return;
  // The kernel took none of the queue: the request still sits in it and the next io_uring_enter
  // (reap_one's) would send it, reading or writing a buffer the caller may free once this
  // throws. Made a no-op, it completes harmlessly and returns its slot.
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(slot));
  slots_[slot] = Request{nullptr, 0, 0, write};
  VOLT_CHECK(false, DataError, kTag, " submitting I/O on '", path_, "' failed (",
             std::strerror(-rc), "); the request was withdrawn, its buffer untouched.");
}

void AioFile::reap_one() {
  io_uring_cqe* cqe = nullptr;
  int rc;
  for (;;) {
    // Sends what the queue still holds (a withdrawn request's no-op) while waiting: a bare
    // wait would never see that request complete.
    rc = io_uring_submit_and_wait(&ring_->ring, 1);
    if (rc == -EINTR) continue;
    if (rc < 0) break;
    rc = io_uring_peek_cqe(&ring_->ring, &cqe);
    if (rc != -EAGAIN) break;
  }
  VOLT_CHECK(rc == 0, DataError, kTag, " waiting for I/O on '", path_, "' failed (",
             std::strerror(-rc), ").");
  const size_t slot = reinterpret_cast<size_t>(io_uring_cqe_get_data(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  Request r = slots_[slot];
  free_.push_back(slot);
  if (r.data == nullptr) return;  // a withdrawn request's no-op
  if (res > 0 && res < r.bytes) {
    // A short transfer (signals, page-cache pressure): continue with the rest.
    enqueue(r.data + res, r.bytes - res, r.offset + res, r.write);
    return;
  }
  if (res <= 0) {
    fail(detail::str_cat(kTag, " ", r.write ? "writing " : "reading ", r.bytes, " bytes at offset ",
                         r.offset, " of '", path_, "' failed (",
                         res < 0 ? std::strerror(-res) : "the file ends first",
                         "); check the disk behind nvme_path (space, errors)."));
  }
}

int64_t AioFile::in_flight() const {
  return ring_ ? static_cast<int64_t>(slots_.size() - free_.size()) : 0;
}

void AioFile::wait() {
  while (ring_ && free_.size() < slots_.size()) reap_one();
  if (!error_.empty()) {
    std::string e;
    e.swap(error_);
    throw DataError(e);
  }
}

}  // namespace detail
}  // namespace volt
