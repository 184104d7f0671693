#pragma once
/// HostSyncMonitor: op placement and host syncs inside training steps, the reference's
/// LOG_LEVEL_PT_FALLBACK. It logs each op that runs on CPU tensors while the model is on an
/// accelerator and each host-device synchronisation (item() / _local_scalar_dense, is_nonzero,
/// equal, nonzero, copies to the host), and prints a per-op frequency table when fit ends. On
/// a CPU-only run it reports the host reads that would stall an accelerator. Also switched on
/// for every Trainer by the environment variable VOLT_LOG_HOST_SYNCS=1 (or 2: log each one).

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

struct HostSyncMonitorOptions {
  /// Log every occurrence as it happens (true) or only the first of each op in each part of
  /// the step (false); the table at the end of fit counts all of them. Default: false.
  TORCH_ARG(bool, log_each) = false;
  /// Rows of the table printed when fit ends (most frequent first). Default: 20.
  TORCH_ARG(int64_t, row_limit) = 20;
};

std::ostream& operator<<(std::ostream& os, const HostSyncMonitorOptions& o);

/// Watches every libtorch op (an at::RecordFunction callback, on every thread) from
/// on_train_batch_start to on_train_batch_end, so validation, checkpoints and callbacks later in
/// the list are not counted. One HostSyncMonitor observes at a time in a process.
class HostSyncMonitor : public Callback {
 public:
  /// The environment variable that adds a monitor to every Trainer: 1 logs the first of each
  /// op, 2 logs each one, 0 or unset adds none.
  static constexpr const char* kEnvVar = "VOLT_LOG_HOST_SYNCS";

  /// One row of the table: what ran, where in the step, how often.
  struct Row {
    std::string op;    ///< e.g. "aten::_local_scalar_dense"
    std::string kind;  ///< "host sync" or "CPU op"
    /// The part of the step, by this callback's hooks (a module's hook runs after the
    /// callbacks' of the same name): "training_step" (from on_train_batch_start: the module's
    /// on_train_batch_start, the forward), "non-finite loss check" (the Trainer's own loss
    /// read), "backward" (from on_before_backward: the module's on_before_backward, the backward
    /// pass, the on_after_backward hooks) or "optimizer_step" (from on_before_optimizer_step: the
    /// module's on_before_optimizer_step, clipping, the step, the zero-grad hooks, zero_grad,
    /// the on_train_batch_end hooks of the callbacks before this one).
    std::string where;
    int64_t count = 0;
  };

  explicit HostSyncMonitor(HostSyncMonitorOptions options = {});
  ~HostSyncMonitor() override;
  /// A monitor configured by VOLT_LOG_HOST_SYNCS, or null when it is unset or 0. Throws
  /// ConfigError for any other value.
  static std::shared_ptr<HostSyncMonitor> from_environment();

  std::string state_key() const override { return "HostSyncMonitor"; }
  /// Starts observing (paused until the first training batch). Throws ConfigError when another
  /// HostSyncMonitor observes in this process.
  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_batch_start(RunContext& run, Module& module, const Batch& batch,
                            int64_t batch_idx) override;
  void on_before_backward(RunContext& run, Module& module, const at::Tensor& loss) override;
  void on_before_optimizer_step(RunContext& run, Module& module,
                                torch::optim::Optimizer& optimizer) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  /// Pauses too: a batch the module skipped (Module::skip_rest_of_epoch) has no batch end.
  void on_train_epoch_end(RunContext& run, Module& module) override;
  /// Stops observing and logs the table (rank 0).
  void on_fit_end(RunContext& run, Module& module) override;
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;

  /// The counts of the last fit, most frequent first.
  const std::vector<Row>& rows() const;
  /// Training steps (batches) observed in the last fit.
  int64_t steps() const;
  /// The table logged at the end of the last fit.
  const std::string& table() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
