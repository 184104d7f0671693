#pragma once
/// DeviceStatsMonitor: logs the device's memory statistics (the reference's ten metrics: Limit,
/// InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize, TotalSystemAllocs,
/// TotalSystemFrees, TotalActiveAllocs) per step or per epoch, as Lightning's callback of the
/// same name. On the CPU they come from volt's counting allocator (volt/accelerators/
/// cpu_memory.h); docs/OBSERVABILITY.md defines each.

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

struct DeviceStatsMonitorOptions {
  /// kStep: at the Trainer's per-step logging cadence (every log_every_n_steps optimizer
  /// steps); kEpoch: at the end of each training epoch. Default: Interval::kStep.
  TORCH_ARG(Interval, logging_interval) = Interval::kStep;
  /// Also log host stats: resident set size (bytes) and the process's CPU use since the
  /// previous log (percent of one core). Default: false.
  TORCH_ARG(bool, host_stats) = false;
};

std::ostream& operator<<(std::ostream& os, const DeviceStatsMonitorOptions& o);

/// Keys are "device_stats/<Metric>" (and "device_stats/host_rss_bytes",
/// "device_stats/host_cpu_percent" with host_stats), sent straight to the loggers (rank 0).
class DeviceStatsMonitor : public Callback {
 public:
  static constexpr const char* kPrefix = "device_stats/";

  explicit DeviceStatsMonitor(DeviceStatsMonitorOptions options = {});
  std::string state_key() const override { return "DeviceStatsMonitor"; }
  /// Checks that there are loggers and device stats, and starts counting (on the CPU this
  /// installs the counting allocator).
  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  /// The last values logged, by key.
  const Metrics& last_logged() const { return last_; }

 private:
  void log(RunContext& run, int64_t step);
  DeviceStatsMonitorOptions options_;
  int64_t last_step_logged_ = -1;
  double last_cpu_s_ = 0, last_wall_s_ = 0;
  Metrics last_;
};

}  // namespace volt
