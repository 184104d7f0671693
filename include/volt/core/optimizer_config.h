#pragma once
/// What configure_optimizers returns: optimizers, each with an optional LR scheduler.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "volt/core/types.h"

namespace volt {

class LRScheduler;  // optim/lr_scheduler.h

/// One optimizer and its optional scheduler.
struct OptimizerConfig {
  /// Implicit from any libtorch optimizer, so `return {std::make_shared<SGD>(...)};` works.
  template <typename Opt,
            typename = std::enable_if_t<std::is_base_of<torch::optim::Optimizer, Opt>::value>>
  OptimizerConfig(std::shared_ptr<Opt> optimizer)  // NOLINT: implicit by design
      : optimizer_(std::move(optimizer)) {}
  /// The optimizer (required).
  TORCH_ARG(std::shared_ptr<torch::optim::Optimizer>, optimizer);
  /// LR scheduler driving this optimizer. Default: none.
  TORCH_ARG(std::shared_ptr<LRScheduler>, scheduler);
  /// Scheduler stepping interval. Default: Interval::kEpoch.
  TORCH_ARG(Interval, interval) = Interval::kEpoch;
  /// Step the scheduler every `frequency` intervals: epochs, or this optimizer's steps (Lightning
  /// counts the epoch's batches; a step skipped by the precision does not count). Default: 1.
  TORCH_ARG(int64_t, frequency) = 1;
  /// The logged metric a ReduceLROnPlateau scheduler steps on (required with one); other
  /// schedulers step without a metric, whatever this names (as Lightning). Default: "" (none).
  TORCH_ARG(std::string, monitor);
  /// When the monitored metric was not logged by the time the scheduler is due: true stops the
  /// run with a ConfigError naming the metrics there are, false warns and skips that step
  /// (Lightning's `strict`). Default: true.
  TORCH_ARG(bool, strict) = true;
  /// The name LearningRateMonitor logs this optimizer's rates under, instead of "lr-<Type>"
  /// (Lightning's lr_scheduler config "name"; here also for an optimizer without a scheduler).
  /// Default: "" (lr-<Type>).
  TORCH_ARG(std::string, name);
};

}  // namespace volt
