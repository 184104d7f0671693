#pragma once
// Private: the Trainer's non-finite training-loss check (TrainerOptions::detect_nonfinite_loss)
// without a host read per step. Reading a loss on the host (item()) makes the host wait for an
// accelerator to finish the step, so each step only records on the loss's own device whether
// the loss is finite and which recorded step was the first that was not; the host reads that
// one flag every `every` records (the logging cadence), before a checkpoint is written and at
// the end of each training epoch. The error names the first bad step, as an immediate check
// would; it is raised up to `every` - 1 steps later.

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

  /// Reads the flag after `every` >= 1 records (1: after each, as a plain item() check).
  explicit NonfiniteLossCheck(int64_t every = 1) : every_(every < 1 ? 1 : every) {}

  void set_every(int64_t every) { every_ = every < 1 ? 1 : every; }
  int64_t every() const { return every_; }

  /// Records one scalar loss on its device (no host read); reads the flag (check()) once
  /// `every` records are pending.
  void record(const at::Tensor& loss, Where where);
  /// Reads the pending records' flag (one host read; none when nothing is pending) and throws
  /// ValueError naming the first non-finite loss among them.
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
  at::Tensor first_bad_;  // int64 scalar on the loss's device: index into pending_, or -1
  at::Tensor bad_loss_;   // that loss's value (meaningful only when first_bad_ >= 0)
  std::vector<Where> pending_;
};

}  // namespace detail
}  // namespace volt
