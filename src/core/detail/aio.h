#pragma once
// AioFile: asynchronous reads and writes of byte ranges of one file at given offsets, through
// io_uring (liburing), for ZeRO-Infinity's NVMe swap files (issue #12). The posix backend
// (plain pread/pwrite, synchronous at submit) is the reference the tests compare against.

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace volt {
namespace detail {

struct AioOptions {
  /// Bytes per I/O request: larger ranges are cut into requests of this size (DeepSpeed's
  /// aio.block_size). Default: 1 MiB.
  TORCH_ARG(int64_t, block_size) = 1 << 20;
  /// Requests in flight at once (DeepSpeed's aio.queue_depth). Default: 8.
  TORCH_ARG(int64_t, queue_depth) = 8;
  /// true: io_uring; false: the pread/pwrite reference path. Default: true.
  TORCH_ARG(bool, use_uring) = true;
};

/// One open file with a queue of asynchronous requests. submit_read / submit_write return at
/// once (when more than queue_depth requests are outstanding they first wait for the oldest);
/// wait() returns when every submitted request is complete and throws the first failure. The
/// caller keeps each buffer alive and untouched until wait() returns or throws, also after a
/// submit_* call threw (the request the kernel refused is withdrawn and never touches its
/// buffer; the ones before it still run). Not thread-safe.
class AioFile {
 public:
  /// Opens (`create`: creates or truncates) `path` for reading and writing. Throws ConfigError
  /// naming the path when it cannot be opened, NotAvailable when io_uring cannot start.
  AioFile(std::string path, AioOptions options, bool create);
  ~AioFile();
  AioFile(const AioFile&) = delete;
  AioFile& operator=(const AioFile&) = delete;

  void submit_write(const void* data, int64_t bytes, int64_t offset);
  void submit_read(void* data, int64_t bytes, int64_t offset);
  /// Waits for every submitted request. Throws DataError on an I/O error or a short read (the
  /// file ends before offset + bytes).
  void wait();
  /// Requests submitted and not yet reaped.
  int64_t in_flight() const;
  const std::string& path() const { return path_; }
  const AioOptions& options() const { return options_; }

 private:
  struct Ring;
  struct Request {
    char* data;
    int64_t bytes;
    int64_t offset;
    bool write;
  };
  void enqueue(char* data, int64_t bytes, int64_t offset, bool write);
  void run_posix(const Request& r);
  void reap_one();
  void fail(const std::string& what);

  std::string path_;
  AioOptions options_;
  int fd_ = -1;
  std::unique_ptr<Ring> ring_;
  std::vector<Request> slots_;  // io_uring: one per request in flight (user_data = its index)
  std::vector<size_t> free_;    // indices of unused slots_
  std::string error_;           // the first failure since the last wait()
  // VOLT_TEST_AIO_SUBMIT_FAILS=N (read at construction): the N-th submission fails with EAGAIN.
  int64_t fail_submit_at_ = 0;
  int64_t submits_ = 0;
};

}  // namespace detail
}  // namespace volt
