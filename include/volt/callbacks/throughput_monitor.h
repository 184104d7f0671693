#pragma once
/// ThroughputMonitor: logs training throughput (samples and batches per second of wall time),
/// as Lightning's callback of the same name.

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

struct ThroughputMonitorOptions {
  /// Samples in a batch; it must read only sizes, never tensor values (that would wait for the
  /// device). Unset means Batch::size() (dim 0 of the input). Default: unset.
  TORCH_ARG(std::function<int64_t(const Batch&)>, batch_size_fn);
};

std::ostream& operator<<(std::ostream& os, const ThroughputMonitorOptions& o);

/// Logs "train_samples_per_sec" and "train_batches_per_sec" at the Trainer's per-step logging
/// cadence (the steps where (step + 1) % log_every_n_steps == 0), each measured over the wall
/// time since the previous log, not counting validation. Reads only batch sizes, so it adds no
/// device synchronisation. With several data-parallel replicas (RunContext::data_parallel_size)
/// those are the job's rates, rank 0's times the replicas (each trains a shard of equal length,
/// as Lightning's monitor assumes), and "train_device_samples_per_sec" /
/// "train_device_batches_per_sec" are rank 0's own (Lightning's device/ figures); the processes
/// of one pipeline or tensor-parallel group share their samples and count once.
class ThroughputMonitor : public Callback {
 public:
  static constexpr const char* kSamplesPerSec = "train_samples_per_sec";
  static constexpr const char* kBatchesPerSec = "train_batches_per_sec";
  static constexpr const char* kDeviceSamplesPerSec = "train_device_samples_per_sec";
  static constexpr const char* kDeviceBatchesPerSec = "train_device_batches_per_sec";

  explicit ThroughputMonitor(ThroughputMonitorOptions options = {});
  std::string state_key() const override { return "ThroughputMonitor"; }
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_validation_start(RunContext& run, Module& module) override;
  void on_validation_end(RunContext& run, Module& module) override;
  /// The last values logged, by name.
  const Metrics& last_logged() const { return last_; }

 private:
  using Clock = std::chrono::steady_clock;
  void start_window(Clock::time_point now);
  ThroughputMonitorOptions options_;
  Clock::time_point window_start_;
  Clock::time_point validation_start_;
  double paused_s_ = 0;  // validation time inside the current window
  int64_t samples_ = 0;  // samples trained in the current window
  int64_t batches_ = 0;  // batches trained in the current window
  int64_t last_global_step_ = 0;
  Metrics last_;
};

}  // namespace volt
