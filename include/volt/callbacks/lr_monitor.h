#pragma once
/// LearningRateMonitor: logs each optimizer's learning rate (and optionally momentum and weight
/// decay) per param group, as Lightning's callback of the same name.

#include <torch/arg.h>
#include <iosfwd>

#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

/// When LearningRateMonitor logs.
enum class LoggingInterval {
  kAuto,   ///< at each optimizer's scheduler interval (per step when it has no scheduler)
  kStep,   ///< at the Trainer's per-step logging cadence (log_every_n_steps)
  kEpoch,  ///< at the start of each training epoch
};

struct LearningRateMonitorOptions {
  /// Default: LoggingInterval::kAuto.
  TORCH_ARG(LoggingInterval, logging_interval) = LoggingInterval::kAuto;
  /// Also log momentum (SGD/RMSprop momentum, Adam-family beta1) as "<name>-momentum"; an
  /// optimizer without one logs 0, with a warning at train start (as Lightning). Default: false.
  TORCH_ARG(bool, log_momentum) = false;
  /// Also log weight decay as "<name>-weight_decay". Default: false.
  TORCH_ARG(bool, log_weight_decay) = false;
  /// Put before every name ("train/" gives "train/lr-SGD"), Lightning's log_key_prefix.
  /// Default: "".
  TORCH_ARG(std::string, log_key_prefix);
};

std::ostream& operator<<(std::ostream& os, const LearningRateMonitorOptions& o);

/// Names: "lr-<Optimizer>", or the OptimizerConfig's name, for one param group,
/// "lr-<Optimizer>/pg<i>" (1-based) for several, "-<k>" appended to repeated optimizer types,
/// as Lightning. Values go to the loggers and into callback_metrics (so EarlyStopping or a
/// ModelCheckpoint may monitor a rate); host values: reading an lr never touches a device.
class LearningRateMonitor : public Callback {
 public:
  explicit LearningRateMonitor(LearningRateMonitorOptions options = {});
  std::string state_key() const override { return "LearningRateMonitor"; }
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_batch_start(RunContext& run, Module& module, const Batch& batch,
                            int64_t batch_idx) override;
  void on_train_epoch_start(RunContext& run, Module& module) override;
  /// The last values logged, by name.
  const Metrics& last_logged() const { return last_; }

 private:
  void log(RunContext& run, bool epoch_boundary);
  LearningRateMonitorOptions options_;
  std::vector<std::string> names_;  // one per optimizer
  int64_t last_step_logged_ = -1;
  Metrics last_;
};

}  // namespace volt
