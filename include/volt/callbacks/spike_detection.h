#pragma once
/// SpikeDetection: ends a fit with TrainingSpikeError when the training loss jumps far from its
/// running mean, and writes the batches to leave out when the run is resumed (Lightning's
/// SpikeDetection callback, from lightning.fabric.utilities.spike).

#include <ATen/Tensor.h>
#include <torch/arg.h>

#include <deque>
#include <iosfwd>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/core/errors.h"

namespace volt {

struct SpikeDetectionOptions {
  /// kMin: the loss should fall, so a spike is a jump up; kMax: the tracked value should rise,
  /// so a spike is a drop. Default: kMin.
  TORCH_ARG(Mode, mode) = Mode::kMin;
  /// Losses (the latest finite ones) whose mean is the reference. Default: 10.
  TORCH_ARG(int64_t, window) = 10;
  /// Training batches of the fit before spikes are looked for (the mean fills meanwhile).
  /// Default: 1.
  TORCH_ARG(int64_t, warmup) = 1;
  /// A spike is at least this far from the running mean, on the bad side; 0 = no absolute
  /// bound. Default: 0 (Lightning's None).
  TORCH_ARG(double, atol) = 0.0;
  /// ... and at least rtol × |running mean| from it; 0 = no relative bound. Default: 2.
  TORCH_ARG(double, rtol) = 2.0;
  /// The JSON file the batches to leave out are written to (a list of batch indices within the
  /// epoch, Lightning's skip_batches.json), or a folder to write skip_batches.json into;
  /// "" = <log_dir>/skip_batches.json: the run's folder beside its checkpoints, or
  /// default_root_dir without a logger (Lightning: default_root_dir). Default: "".
  TORCH_ARG(std::string, exclude_batches_path) = "";
  /// A non-finite loss (NaN, ±inf) is a spike. When false such a loss is neither judged nor
  /// averaged (the Trainer's detect_nonfinite_loss still fails the run on it). Default: true.
  TORCH_ARG(bool, finite_only) = true;

 public:
  /// ConfigError on the first bad value.
  void validate() const;
};

std::ostream& operator<<(std::ostream& os, const SpikeDetectionOptions& o);

/// What SpikeDetection throws on every rank when a spike was found (Lightning's
/// TrainingSpikeException). The fit ends as a failed run (callbacks' on_exception run, so an
/// OnExceptionCheckpoint saves); the checkpoints written before the spike stay.
class TrainingSpikeError : public Error {
 public:
  TrainingSpikeError(const std::string& msg, int64_t batch_idx)
      : Error(msg), batch_idx_(batch_idx) {}
  /// The batch (index within its epoch) whose loss spiked.
  int64_t batch_idx() const { return batch_idx_; }

 private:
  int64_t batch_idx_;
};

/// Watches each training batch's loss (the one its backward ran on, before accumulation
/// scaling; under manual optimization the last manual_backward's). A loss is a spike when it is
/// no better than the previous batch's and worse than the mean of the last `window` losses by at
/// least atol and by at least rtol × |mean| (or, with finite_only, when it is not finite). Each
/// rank judges its own loss; when any rank finds a spike every rank appends the batch and the one
/// before it to the list, rank 0 writes the list atomically to the JSON file, and every rank
/// throws TrainingSpikeError at the same batch. The running mean, the previous loss, the list and
/// the batches seen are checkpointed, so a resumed fit goes on judging where it stopped.
///
/// Reads each batch's loss on the host (a device sync per batch on CUDA) and, with several
/// processes, makes one small all-reduce per batch (Lightning's makes a barrier and one).
/// Departure from Lightning: the spike must lie on the bad side of the mean (above it for kMin);
/// Lightning compares the absolute distance, so a loss far *below* the mean but above the
/// previous batch's counted as a spike. Warmup counts the fit's batches, not each epoch's.
class SpikeDetection : public Callback {
 public:
  explicit SpikeDetection(SpikeDetectionOptions options = SpikeDetectionOptions());
  std::string state_key() const override { return "SpikeDetection"; }
  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_before_backward(RunContext& run, Module& module, const at::Tensor& loss) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  const SpikeDetectionOptions& options() const { return options_; }
  /// Batches (indices within their epoch) found bad so far: each spike's and the one before it.
  const std::vector<int64_t>& bad_batches() const { return bad_batches_; }
  /// The mean of the last `window` finite losses; NaN before the first.
  double running_mean() const;
  /// Where the list is written for a run whose log_dir is `root`.
  std::string exclude_batches_file(const std::string& root) const;

 private:
  bool is_spike(double loss) const;
  SpikeDetectionOptions options_;
  std::deque<double> window_;
  double last_ = 0.0;
  bool has_last_ = false;
  std::vector<int64_t> bad_batches_;
  int64_t seen_ = 0;
  at::Tensor loss_;  // this batch's loss, detached; undefined until its backward
};

}  // namespace volt
