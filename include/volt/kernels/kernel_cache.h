#pragma once
/// KernelCache: compiled kernels kept on disk between runs, so that a kernel is compiled once per
/// machine instead of once per process (the reference's recipe cache). Lookups go to memory
/// first (the caller's), then to this folder; writes and eviction run on a background thread,
/// so a caller never waits for them. After each write the oldest entries are removed until the
/// folder holds at most 0.99 x the size cap, one process at a time (flock on eviction.lock).
/// A cache that cannot be used (unwritable folder, bad entry) warns once and the caller compiles
/// as if it were empty: it never stops training.
///
///   VOLT_KERNEL_CACHE_CONFIG=/tmp/volt_kernels,true,1024   # folder, clear at start, MiB
///
/// No torch includes.

#include <torch/arg.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace volt {

/// Where a KernelCache keeps its entries and how big the folder may grow.
struct KernelCacheOptions {
  explicit KernelCacheOptions(std::string dir) : dir_(std::move(dir)) {}
  /// The options VOLT_KERNEL_CACHE_CONFIG="dir,clear_at_start,size_mb" sets (clear_at_start:
  /// true/false/1/0), else <volt cache folder>/kernels, false, 1024 (the folder is
  /// $VOLT_CACHE_DIR, $XDG_CACHE_HOME/volt or ~/.cache/volt). A malformed value is a
  /// ConfigError naming the field.
  static KernelCacheOptions from_env();

  /// Folder of the entries, created on first use.
  TORCH_ARG(std::string, dir);
  /// When the cache opens, remove the entries written before this process started (each
  /// process of a job starts before any of them writes, so no rank removes another's entry).
  /// Default: false.
  TORCH_ARG(bool, clear_at_start) = false;
  /// Size cap of the folder in MiB, >= 1. Default: 1024.
  TORCH_ARG(int64_t, size_mb) = 1024;
};

std::ostream& operator<<(std::ostream& os, const KernelCacheOptions& options);

/// What a KernelCache did so far (this object only).
struct KernelCacheStats {
  int64_t hits = 0;       ///< find() calls that returned an entry
  int64_t misses = 0;     ///< find() calls that did not
  int64_t stores = 0;     ///< entries written
  int64_t evictions = 0;  ///< entries removed to keep the folder under the cap
  int64_t failures = 0;   ///< writes or evictions that failed (warned once)
};

/// One entry on disk.
struct KernelCacheEntry {
  std::string key;
  int64_t bytes = 0;
};

/// A folder of compiled kernels shared by every process on the machine; thread-safe.
class KernelCache {
 public:
  /// Validates the options (ConfigError); opening the folder (and clear_at_start) happens here,
  /// and a folder that cannot be created disables the cache with one warning.
  explicit KernelCache(KernelCacheOptions options);
  /// Waits for the pending writes.
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  /// The path of entry `key` when the folder holds it, refreshing its time so that eviction
  /// (oldest first) spares the entries in use; nullopt when absent or the cache is disabled.
  /// Keys are file names: letters, digits, '.', '_', '-', not starting with '.' (ValueError).
  std::optional<std::string> find(const std::string& key);
  /// Queues `bytes` to be written as entry `key` (atomically: readers see all of it or
  /// nothing), followed by an eviction pass; returns at once.
  void store(const std::string& key, std::string bytes);
  /// Removes entry `key` (one found to be bad); nothing when absent.
  void remove(const std::string& key);
  /// Blocks until every store queued so far is written and evicted.
  void flush();

  /// The entries on disk now, oldest first; their total is the folder's size.
  std::vector<KernelCacheEntry> entries() const;
  bool enabled() const;
  KernelCacheStats stats() const;
  const KernelCacheOptions& options() const { return options_; }

  /// The process-wide cache (options from_env(), opened on first use) that volt's JIT uses.
  static KernelCache& global();

 private:
  void worker();
  void write_and_evict(const std::string& key, const std::string& bytes);
  void evict(const std::string& just_written);
  void clear_stale_at_start();
  void fail(const std::string& what);

  KernelCacheOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> queue_;
  int64_t in_flight_ = 0;  // queued or being written
  bool stopping_ = false;
  bool enabled_ = true;
  KernelCacheStats stats_;
  std::thread thread_;  // started by the first store
};

}  // namespace volt
