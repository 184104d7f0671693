#pragma once
/// AsyncCheckpointIO: a checkpoint is serialised on the caller's thread and written, fsync'ed and
/// renamed into place on a background thread (Lightning's AsyncCheckpointIO), in volt's
/// checkpoint format (TorchCheckpointIO's files, byte for byte).

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "volt/io/checkpoint_io.h"

namespace volt {

/// Settings of AsyncCheckpointIO.
struct AsyncCheckpointIOOptions {
  /// Checkpoints serialised but not yet on disk. A save beyond this waits until the oldest is
  /// written. Each one holds a checkpoint's bytes in memory, so at most max_pending + 1
  /// checkpoints' bytes exist at once (the +1 being serialised by save(), or the kept buffer
  /// of reuse_buffer). Default: 1.
  TORCH_ARG(int64_t, max_pending) = 1;
  /// Keep the largest written checkpoint's buffer and serialise the next save into it: no new
  /// memory (and no page faults) per save, at the cost of holding one checkpoint's bytes
  /// between saves. false frees each checkpoint's bytes once written. Default: true.
  TORCH_ARG(bool, reuse_buffer) = true;

 public:
  /// Throws ConfigError when max_pending < 1.
  void validate() const;
};

std::ostream& operator<<(std::ostream& os, const AsyncCheckpointIOOptions& o);

/// What an AsyncCheckpointIO has done so far.
struct AsyncCheckpointIOStats {
  int64_t saves = 0;               ///< saves finished in the background (written or failed)
  int64_t failures = 0;            ///< saves and removes that failed
  int64_t waits = 0;               ///< saves that waited because max_pending were in flight
  int64_t peak_pending = 0;        ///< most saves queued or being written at once
  int64_t peak_pending_bytes = 0;  ///< most checkpoint bytes held at once by queued saves
  double caller_seconds = 0;       ///< time save() kept its caller (serialising, waiting)
  double writer_seconds = 0;       ///< background time spent writing, fsyncing, renaming
  int64_t buffer_reuses = 0;       ///< saves serialised into a kept buffer (reuse_buffer)
};

/// Lightning's AsyncCheckpointIO for volt's format. save() copies the archive's tensors into
/// the file's bytes before it returns, so the file holds their values at the call, whatever the
/// caller changes afterwards; the CRC, the write, fsync and rename (TorchCheckpointIO's atomic
/// write) run on one background thread, in call order. remove() is queued behind the saves
/// issued before it, so a file is never deleted before its replacement is on disk; load() and
/// flush() wait for everything issued before them. A failed save is logged when it happens and
/// thrown (CheckpointError) by the next load or flush, or by the next save once that save's
/// checkpoint is queued (Lightning's order: it is not lost to the failure), so a run's end (the
/// Strategy flushes) never hides it; the removals queued behind it are skipped, keeping the
/// files it was to replace. A failed removal is a warning (and counts in stats().failures), as
/// the Strategy treats a synchronous one: the old file stays. A process killed with writes
/// pending leaves the previous files intact, as with synchronous writes.
class AsyncCheckpointIO : public CheckpointIO {
 public:
  explicit AsyncCheckpointIO(AsyncCheckpointIOOptions options = {});
  /// Finishes the pending writes; a failure not reported yet is logged (destructors do not
  /// throw).
  ~AsyncCheckpointIO() override;
  AsyncCheckpointIO(const AsyncCheckpointIO&) = delete;
  AsyncCheckpointIO& operator=(const AsyncCheckpointIO&) = delete;

  void save(torch::serialize::OutputArchive& archive, const std::string& path) override;
  torch::serialize::InputArchive load(const std::string& path) override;
  void remove(const std::string& path) override;
  /// Queued as remove() is, and skipped as it is behind a failed save (the link would name a
  /// file that is not there): `path` keeps what it named.
  void link(const std::string& target, const std::string& path) override;
  void flush() override;

  AsyncCheckpointIOStats stats() const;
  const AsyncCheckpointIOOptions& options() const { return options_; }

 private:
  struct Impl;
  AsyncCheckpointIOOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
