#pragma once
// AtomicFileWriter: atomic_write_file for bytes that are produced piece by piece (a checkpoint
// streamed out of libtorch's serializer), so no whole-file buffer is needed. The file appears at
// its path only on commit(); destroying the writer before that leaves the previous file as it
// was and removes the temporary file. No torch includes.

#include <cstddef>
#include <cstdint>
#include <string>

namespace volt {
namespace detail {

class AtomicFileWriter {
 public:
  /// Creates the parent folders, removes dead writers' temporary files there, and opens this
  /// writer's locked temporary file. Throws CheckpointError with the OS reason.
  explicit AtomicFileWriter(std::string path);
  /// Without commit(): removes the temporary file; `path` keeps what it had.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends `n` bytes (small pieces are gathered into one write). Throws CheckpointError.
  void write(const void* data, size_t n);
  /// Overwrites `n` bytes at `offset`, inside what was already appended (e.g. a header whose
  /// fields are known only at the end). Throws CheckpointError.
  void overwrite(const void* data, size_t n, uint64_t offset);
  /// Bytes appended so far.
  uint64_t size() const { return size_; }
  /// Flushes, fsyncs, renames the file over `path` and fsyncs the folder. Throws CheckpointError
  /// (the temporary file is then removed and `path` is untouched).
  void commit();

 private:
  void write_all(const char* data, size_t n);
  void flush_buffer();
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_, dir_, tmp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string buffer_;  // small appends, written in one go
};

}  // namespace detail
}  // namespace volt
