#pragma once
/// SpikeDetection: ends a fit with TrainingSpikeError when the training loss jumps far from its
/// running mean, and writes the batches to leave out when the run is resumed (Lightning's
/// SpikeDetection callback, from lightning.fabric.utilities.spike). SpikeDetector is the judging
/// itself, which the Trainer's callback and Fabric's (volt/fabric/spike_detection.h) share.

#include <ATen/Tensor.h>
#include <torch/arg.h>

#include <deque>
#include <functional>
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

/// What a loop tells SpikeDetector about the batch it judges.
struct SpikeSite {
  /// The batch's index within its epoch: what the list of batches to leave out holds.
  int64_t batch_idx = 0;
  /// Words after "training spike in batch N" in the error, e.g. " of epoch 0 (global step 4)".
  std::string position;
  /// The folder of skip_batches.json when exclude_batches_path is "".
  std::string root;
  /// This process writes the list (global rank 0).
  bool writes = true;
  /// With several processes: true when `spike_here` is true on any rank (every rank calls it
  /// once per judged batch, so it may be a collective). Empty for one process.
  std::function<bool(bool spike_here)> any_rank;
};

/// The judging both SpikeDetection forms share (Lightning's lightning.fabric SpikeDetection,
/// which its Trainer callback derives from): a batch's loss is a spike when it is no better than
/// the previous batch's and worse than the mean of the last `window` losses by at least atol and
/// by at least rtol × |mean| (or, with finite_only, when it is not finite). Each rank judges its
/// own loss; when any rank finds a spike every rank appends the batch and the one before it to
/// the list, the writing process writes the list atomically to the JSON file, and every rank
/// throws TrainingSpikeError. A hand-written loop may use it directly.
///
/// Departure from Lightning: the spike must lie on the bad side of the mean (above it for kMin);
/// Lightning compares the absolute distance, so a loss far *below* the mean but above the
/// previous batch's counted as a spike. Warmup counts the batches judged so far, not the epoch's
/// batch index; non-finite losses never enter the mean.
class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeDetectionOptions options = SpikeDetectionOptions());
  /// Judges one batch's loss (a one-element tensor, read on the host: a device sync on CUDA).
  /// An undefined `loss` (a batch that ran no backward) is not judged but still takes part in
  /// the ranks' agreement. Throws TrainingSpikeError when this or another rank's loss spiked.
  void judge(const at::Tensor& loss, const SpikeSite& site);
  /// Forgets every loss and batch (a new fit).
  void reset();

  const SpikeDetectionOptions& options() const { return options_; }
  /// Batches (indices within their epoch) found bad so far: each spike's and the one before it.
  const std::vector<int64_t>& bad_batches() const { return bad_batches_; }
  /// The mean of the last `window` finite losses; NaN before the first.
  double running_mean() const;
  /// Where the list is written when the site's root is `root`.
  std::string exclude_batches_file(const std::string& root) const;
  /// The running mean's losses (the latest is the previous batch's), the list and the batches
  /// seen.
  void save_state(torch::serialize::OutputArchive& archive) const;
  void load_state(torch::serialize::InputArchive& archive);

 private:
  bool is_spike(double loss) const;
  SpikeDetectionOptions options_;
  std::deque<double> window_;  // the latest finite losses; back(): the previous judged batch's
  std::vector<int64_t> bad_batches_;
  int64_t seen_ = 0;
};

/// The Trainer's SpikeDetection callback: judges each training batch's loss (the one its
/// backward ran on, before accumulation scaling; under manual optimization the last
/// manual_backward's) with a SpikeDetector at the end of the batch, in the run's log_dir by
/// default. The detector's state is checkpointed, so a resumed fit goes on judging where it
/// stopped. With several processes it makes one small all-reduce per batch (Lightning's makes a
/// barrier and one). Warmup counts the fit's batches, not each epoch's.
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

  const SpikeDetector& detector() const { return detector_; }
  const SpikeDetectionOptions& options() const { return detector_.options(); }
  const std::vector<int64_t>& bad_batches() const { return detector_.bad_batches(); }
  double running_mean() const { return detector_.running_mean(); }
  std::string exclude_batches_file(const std::string& root) const {
    return detector_.exclude_batches_file(root);
  }

 private:
  SpikeDetector detector_;
  at::Tensor loss_;  // this batch's loss, detached; undefined until its backward
};

}  // namespace volt
