#pragma once
/// ThroughputMonitor: logs the throughput of training, validation, testing and prediction
/// (batches, samples, items and FLOPs per second over a rolling window, MFU, running totals),
/// as Lightning's callback of the same name.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

struct ThroughputMonitorOptions {
  /// Samples in a batch; it must read only sizes, never tensor values (that would wait for the
  /// device). Unset means Batch::size() (dim 0 of the input). Default: unset.
  TORCH_ARG(std::function<int64_t(const Batch&)>, batch_size_fn);
  /// Items in a batch (e.g. its tokens, padding included), for the items_per_sec rates and the
  /// "lengths" total; sizes only, as batch_size_fn. Unset: no items figures. Default: unset.
  TORCH_ARG(std::function<int64_t(const Batch&)>, length_fn);
  /// FLOPs one device runs for one training batch, forward and backward (measure_flops with
  /// a loss_fn, volt/profiler/flops.h; Lightning's LightningModule.flops_per_batch). 0: no
  /// FLOPs figures while training. Default: 0.
  TORCH_ARG(int64_t, flops_per_batch) = 0;
  /// The same for a validation, test or predict batch (forward only: measure_flops without a
  /// loss_fn). 0: no FLOPs figures there. Default: 0.
  TORCH_ARG(int64_t, eval_flops_per_batch) = 0;
  /// One device's peak FLOPs per second for the run's compute dtype, for "device/mfu".
  /// Default: unset (no MFU).
  TORCH_ARG(c10::optional<double>, available_flops);
  /// Batches in the rolling window the rates are measured over (at least 2); rates are
  /// logged once a stage has run this many. Default: 100 (Lightning's).
  TORCH_ARG(int64_t, window_size) = 100;
  /// Between the stage, "device" and a figure's name. Default: "/".
  TORCH_ARG(std::string, separator) = "/";
  /// ThroughputOptions::using_sparse_model. Default: unset.
  TORCH_ARG(c10::optional<bool>, using_sparse_model);
  /// ThroughputOptions::sparse_cuda_acceleration_factor. Default: 2.0.
  TORCH_ARG(double, sparse_cuda_acceleration_factor) = 2.0;
};

std::ostream& operator<<(std::ostream& os, const ThroughputMonitorOptions& o);

/// Lightning's keys, "<stage>/<figure>" (volt/profiler/throughput.h lists the figures) for the
/// stages "train", "validate" (a fit's validation and Trainer::validate), "test" and
/// "predict"; the sanity check is not measured. Every batch counts (accumulated ones too).
/// Training logs where the Trainer logs its step metrics (a batch whose optimizer steps pass a
/// multiple of log_every_n_steps), under the same step; an evaluation loop logs after every
/// log_every_n_steps-th batch of its run, under its batch count over its runs (Lightning's
/// iteration number). Each start (a fit's training and each of its validation runs, each
/// Trainer::validate / test / predict call) opens a new window and clock; the totals start
/// anew in a fit and go on over repeated validate / test / predict calls, as Lightning's. A
/// fit's validation is left out of the training clock. Only global rank 0 measures, and it
/// reads only sizes, so the monitor adds no device synchronisation. The job's figures are
/// rank 0's times RunContext::data_parallel_size (the processes of one pipeline or
/// tensor-parallel group share their samples and count once).
class ThroughputMonitor : public Callback {
 public:
  static constexpr const char* kSamplesPerSec = "train/samples_per_sec";  ///< several replicas
  static constexpr const char* kBatchesPerSec = "train/batches_per_sec";  ///< several replicas
  static constexpr const char* kDeviceSamplesPerSec = "train/device/samples_per_sec";
  static constexpr const char* kDeviceBatchesPerSec = "train/device/batches_per_sec";

  explicit ThroughputMonitor(ThroughputMonitorOptions options = {});
  std::string state_key() const override { return "ThroughputMonitor"; }
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_validation_start(RunContext& run, Module& module) override;
  void on_validation_batch_end(RunContext& run, Module& module, const Batch& batch,
                               int64_t batch_idx) override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_test_start(RunContext& run, Module& module) override;
  void on_test_batch_end(RunContext& run, Module& module, const Batch& batch,
                         int64_t batch_idx) override;
  void on_predict_start(RunContext& run, Module& module) override;
  void on_predict_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                            const Batch& batch, int64_t batch_idx) override;
  /// The last values logged, by key.
  const Metrics& last_logged() const { return last_; }
  const ThroughputMonitorOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  // The loops measured apart: a fit's validation and Trainer::validate are Lightning's two
  // validation loops.
  enum class Loop { kTrain, kFitValidation, kValidate, kTest, kPredict };
  static const char* loop_key(Loop loop);
  struct StageClock;
  StageClock& start(RunContext& run, Loop loop, bool fresh);
  // Adds the batch to the loop's window; true when it was counted (rank 0).
  bool update(RunContext& run, Loop loop, const Batch& batch);
  void log(RunContext& run, Loop loop, int64_t step);
  void evaluation_batch_end(RunContext& run, Loop loop, const Batch& batch);
  ThroughputMonitorOptions options_;
  std::map<Loop, std::shared_ptr<StageClock>> clocks_;
  Clock::time_point validation_start_;
  int64_t last_global_step_ = 0;
  Metrics last_;
};

}  // namespace volt
