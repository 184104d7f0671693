#include "volt/io/async_checkpoint_io.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <ostream>
#include <thread>
#include <vector>

#include "detail/checkpoint_envelope.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

constexpr const char* kTag = "AsyncCheckpointIO";
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void AsyncCheckpointIOOptions::validate() const {
  VOLT_CHECK(max_pending() >= 1, ConfigError, "[AsyncCheckpointIO] max_pending=", max_pending(),
             " must be >= 1 (checkpoints written in the background at once); use 1 to bound "
             "memory to two checkpoints.");
}

std::ostream& operator<<(std::ostream& os, const AsyncCheckpointIOOptions& o) {
  return os << "AsyncCheckpointIOOptions(max_pending=" << o.max_pending()
            << ", reuse_buffer=" << o.reuse_buffer() << ")";
}

/// One writer thread, started by the first save or remove, and a FIFO of its tasks. Everything
/// below is guarded by `mu`; the writer drops the lock while it does a task's I/O.
struct AsyncCheckpointIO::Impl {
  enum class Kind { kSave, kRemove, kLink };
  struct Task {
    Kind kind = Kind::kSave;
    std::string path;
    std::string bytes;  // the unsealed file (saves); the link's target (links)
    // Removals and links: the failed saves the caller had been told of when it queued this one.
    int64_t failed_saves_known = 0;
    bool save() const { return kind == Kind::kSave; }
  };

  std::mutex mu;
  std::condition_variable changed;  // a task queued or finished, or stop requested
  std::deque<Task> queue;
  bool busy = false;          // the writer is doing a task it has taken off the queue
  int64_t pending_saves = 0;  // queued or being written
  int64_t pending_bytes = 0;
  bool stop = false;
  std::vector<std::string> errors;  // the save failures not yet thrown to the caller, in order
  int64_t failed_saves = 0;         // saves that failed, by the writer's count
  int64_t failed_saves_known = 0;   // of those, the ones a rethrow had told the caller of
  // A written checkpoint's buffer, kept for the next save (reuse_buffer): serialising into
  // memory already touched skips the allocation and its page faults, which cost more than the
  // copy itself (docs/PERFORMANCE.md "Checkpoint writing").
  std::string spare;
  bool reuse = true;
  AsyncCheckpointIOStats stats;
  std::thread writer;

  void start_locked() {
    if (!writer.joinable()) writer = std::thread([this] { run(); });
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      changed.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, and nothing left to write
      Task task = std::move(queue.front());
      queue.pop_front();
      if (!task.save() && failed_saves > task.failed_saves_known) {
        // A save queued before this removal failed, unknown to the caller when it asked for the
        // removal: the file that save was to replace stays. (Whether the failure was thrown
        // since does not matter; before session 81 a rethrow in between let the removal run.)
        // A link would name the file that save did not write: `path` keeps what it named.
        log_warning(kTag, "kept '" + task.path +
                              (task.kind == Kind::kLink ? "' (not relinked)" : "' (not removed)") +
                              ": an earlier save failed");
        changed.notify_all();  // flush() may be waiting for the queue to empty
        continue;
      }
      busy = true;
      lock.unlock();
      const auto t0 = Clock::now();
      std::string failure;
      try {
        if (task.save()) {
          detail::seal_checkpoint(task.bytes);
          atomic_write_file(task.path, task.bytes);
        } else if (task.kind == Kind::kLink) {
          detail::make_link(task.bytes, task.path);
        } else {
          detail::remove_file(task.path);  // CheckpointIO::remove: a missing file is fine
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
      const double spent = seconds_since(t0);
      if (!failure.empty()) {
        if (task.save()) {
          log_error(kTag, "background save of '" + task.path + "' failed: " + failure);
        } else {
          // As Strategy::remove_checkpoint treats a synchronous removal that fails: an old
          // checkpoint that stays costs disk space, not the run (nor the next checkpoint).
          log_warning(kTag, std::string("background ") +
                                (task.kind == Kind::kLink ? "link" : "removal") + " of '" +
                                task.path + "' failed: " + failure +
                                (task.kind == Kind::kLink ? " It keeps what it held."
                                                          : " The file stays; delete it by hand."));
        }
      }
      lock.lock();
      busy = false;
      stats.writer_seconds += spent;
      if (task.save()) {
        --pending_saves;
        pending_bytes -= static_cast<int64_t>(task.bytes.size());
        ++stats.saves;
        if (reuse && task.bytes.capacity() > spare.capacity()) spare.swap(task.bytes);
      }
      if (!failure.empty()) {
        ++stats.failures;
        if (task.save()) {
          ++failed_saves;
          errors.push_back("the background save of '" + task.path + "' failed: " + failure);
        }
      }
      changed.notify_all();
    }
  }

  /// Throws the save failures not reported yet, the first first (and forgets them). The removal
  /// queued behind a failed save is skipped (run()); the next save, flush or load throws the
  /// failure.
  void rethrow_locked() {
    if (errors.empty()) return;
    // Every failure not reported yet, in one error: only the first was kept, and the others
    // (with max_pending >= 2) were never thrown although the caller counted as told of them.
    std::string what = errors.front();
    for (size_t i = 1; i < errors.size(); ++i) what += "; then " + errors[i];
    errors.clear();
    failed_saves_known = failed_saves;
    VOLT_CHECK(false, CheckpointError, "[AsyncCheckpointIO] ", what,
               " (the files it would have replaced are intact; fix the cause and save again).");
  }

  void wait_idle_locked(std::unique_lock<std::mutex>& lock) {
    changed.wait(lock, [&] { return queue.empty() && !busy; });
  }
};

AsyncCheckpointIO::AsyncCheckpointIO(AsyncCheckpointIOOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  impl_->reuse = options_.reuse_buffer();
}

AsyncCheckpointIO::~AsyncCheckpointIO() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->stop = true;
  impl_->changed.notify_all();
  lock.unlock();
  if (impl_->writer.joinable()) impl_->writer.join();  // it drains the queue first
  for (const auto& error : impl_->errors) {
    log_error(kTag, "destroyed with a failure nobody was told of: " + error);
  }
}

void AsyncCheckpointIO::save(torch::serialize::OutputArchive& archive, const std::string& path) {
  const auto t0 = Clock::now();
  Impl::Task task{Impl::Kind::kSave, path, {}};
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->spare.empty()) ++impl_->stats.buffer_reuses;  // a kept, written buffer
    task.bytes.swap(impl_->spare);
  }
  // The snapshot: the tensors' bytes are copied here, on the caller's thread.
  detail::serialize_checkpoint(archive, task.bytes);
  const auto bytes = static_cast<int64_t>(task.bytes.size());
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (impl_->pending_saves >= options_.max_pending()) {
    ++impl_->stats.waits;
    impl_->changed.wait(lock, [&] { return impl_->pending_saves < options_.max_pending(); });
  }
  ++impl_->pending_saves;
  impl_->pending_bytes += bytes;
  impl_->stats.peak_pending = std::max(impl_->stats.peak_pending, impl_->pending_saves);
  impl_->stats.peak_pending_bytes = std::max(impl_->stats.peak_pending_bytes, impl_->pending_bytes);
  impl_->queue.push_back(std::move(task));
  impl_->start_locked();
  impl_->stats.caller_seconds += seconds_since(t0);
  impl_->changed.notify_all();
  // An earlier save's failure after this one is queued (as Lightning's AsyncCheckpointIO
  // submits the save, then raises): the checkpoint of this call is not lost to it.
  impl_->rethrow_locked();
}

torch::serialize::InputArchive AsyncCheckpointIO::load(const std::string& path) {
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->wait_idle_locked(lock);
    impl_->rethrow_locked();
  }
  return TorchCheckpointIO().load(path);
}

void AsyncCheckpointIO::remove(const std::string& path) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->queue.push_back(Impl::Task{Impl::Kind::kRemove, path, {}, impl_->failed_saves_known});
  impl_->start_locked();
  impl_->changed.notify_all();
}

void AsyncCheckpointIO::link(const std::string& target, const std::string& path) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->queue.push_back(Impl::Task{Impl::Kind::kLink, path, target, impl_->failed_saves_known});
  impl_->start_locked();
  impl_->changed.notify_all();
}

void AsyncCheckpointIO::flush() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->wait_idle_locked(lock);
  impl_->rethrow_locked();
}

AsyncCheckpointIOStats AsyncCheckpointIO::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace volt
