#pragma once
// Private: the Trainer's non-finite training-loss check (TrainerOptions::detect_nonfinite_loss)
// without a host read per step. Reading a loss on the host (item()) makes the host wait for an
// accelerator to finish the step, so each step only copies its loss into a small buffer on the
// loss's own device (one copy kernel, no wait); the host checks the buffer every `every`
// records (the logging cadence, at most kMaxPending), before a checkpoint is written and at the
// end of each training epoch, with one read when all are finite. The error names the first bad
// step, as an immediate check would; it is raised up to `every` - 1 steps later.

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace volt {
namespace detail {

class NonfiniteLossCheck {
 public:
  /// Where a recorded loss came from (for the error).
  struct Where {
    int64_t global_step = 0;
    int64_t epoch = 0;
    int64_t batch_idx = 0;
  };

  /// The most records between two reads (the buffer's length), whatever `every` is.
  static constexpr int64_t kMaxPending = 1024;

  /// Reads after `every` >= 1 records (1: after each, as a plain item() check).
  explicit NonfiniteLossCheck(int64_t every = 1) : every_(every < 1 ? 1 : every) {}

  void set_every(int64_t every) { every_ = every < 1 ? 1 : every; }
  int64_t every() const { return every_; }

  /// Records one scalar loss on its device (no host read); reads (check()) once `every` (or
  /// kMaxPending) records are pending.
  void record(const at::Tensor& loss, Where where);
  /// Checks the pending records (one host read when all are finite; none when nothing is
  /// pending) and throws ValueError naming the first non-finite loss among them.
  void check();
  /// Forgets pending records without reading them (a new fit, or after a failure).
  void reset();
  /// Records not read yet.
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }
  /// Host reads made so far (for tests and the host-sync accounting).
  int64_t reads() const { return reads_; }

 private:
  int64_t every_;
  int64_t reads_ = 0;
  at::Tensor losses_;  // [kMaxPending] on the loss's device, in its dtype; pending_ in front
  std::vector<Where> pending_;
};

}  // namespace detail
}  // namespace volt
