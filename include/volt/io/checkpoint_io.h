#pragma once
/// CheckpointIO: turns a checkpoint archive into a file and back, atomically and verified.

#include <torch/serialize/archive.h>

#include <string>

#include "volt/core/atomic_file.h"  // atomic_write_file, historically declared here

namespace volt {

/// Storage of checkpoint archives (Lightning's CheckpointIO plugin). Implementations must never
/// leave a partial file at `path`. Operations take effect in the order they are called: a load
/// or remove sees every save issued before it, even when saves finish in the background.
class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  virtual void save(torch::serialize::OutputArchive& archive, const std::string& path) = 0;
  /// Throws CheckpointError when the file is missing, truncated or fails its integrity check.
  virtual torch::serialize::InputArchive load(const std::string& path) = 0;
  /// Deletes the checkpoint file at `path` (a missing file is not an error; one that cannot be
  /// deleted, e.g. in a read-only folder, is a CheckpointError).
  virtual void remove(const std::string& path);
  /// Makes `path` a symbolic link to the checkpoint file or folder `target`, relative to
  /// `path`'s folder (the pair can move together), replacing a file or link at `path`
  /// atomically: the link is made under a temporary name and renamed over it. Ordered after
  /// the saves before it, as remove. Where the file system has no symbolic links a file
  /// `target` is copied to `path` atomically (Lightning's shutil.copy fallback); a `path` that
  /// is a folder, or a folder `target` there, is a CheckpointError (`path` unchanged).
  /// ModelCheckpoint's save_last = SaveLast::kLink.
  virtual void link(const std::string& target, const std::string& path);
  /// Returns once every save and remove issued so far is on disk, and throws (CheckpointError)
  /// the first of their failures not reported yet. The Trainer calls it when a run ends.
  /// Synchronous implementations have nothing to wait for. Default: nothing.
  virtual void flush() {}
};

/// volt's file format: an 8-byte magic "VOLTCKPT", u32 format version, u64 payload size,
/// u32 CRC-32 of the payload, then libtorch's serialized archive. Written to a temporary file
/// in the same folder, fsync'ed, renamed over `path`, and the folder fsync'ed: a crash at any
/// point leaves either the old file or the new one.
/// save() streams libtorch's serializer into the temporary file (no buffer of the checkpoint's
/// size); load() reads the file into one buffer and parses it in place.
class TorchCheckpointIO : public CheckpointIO {
 public:
  static constexpr uint32_t kFormatVersion = 1;
  void save(torch::serialize::OutputArchive& archive, const std::string& path) override;
  torch::serialize::InputArchive load(const std::string& path) override;
};

}  // namespace volt
