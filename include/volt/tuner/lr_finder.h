#pragma once
/// lr_find: the learning-rate range test of Lightning's Tuner.lr_find (Smith, "Cyclical Learning
/// Rates", arXiv:1506.01186): a short fit whose learning rate grows every optimizer step from
/// min_lr to max_lr, recording the smoothed loss; the module and the random state are left as
/// they were, and suggestion() proposes where the loss falls fastest.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/trainer/trainer_options.h"

namespace volt {

class Module;

enum class LrFinderMode { kExponential, kLinear };

struct LrFinderOptions {
  /// The first learning rate tried. Default: 1e-8.
  TORCH_ARG(double, min_lr) = 1e-8;
  /// The learning rate of the last step. Default: 1.
  TORCH_ARG(double, max_lr) = 1.0;
  /// Optimizer steps (learning rates) to try. Default: 100.
  TORCH_ARG(int64_t, num_training) = 100;
  /// How the rate grows between steps: geometrically (kExponential) or by equal amounts.
  /// Default: kExponential.
  TORCH_ARG(LrFinderMode, mode) = LrFinderMode::kExponential;
  /// Stop once the smoothed loss exceeds this many times the best so far (diverged); unset =
  /// try every rate. Default: 4.
  TORCH_ARG(c10::optional<double>, early_stop_threshold) = 4.0;

 public:
  /// Throws ConfigError on the first invalid value.
  void validate() const;
};

/// What lr_find measured: the learning rate of each optimizer step and the smoothed training
/// loss after it (the mean over its micro-batches when gradients are accumulated).
struct LrFinderResult {
  /// How the rates grew; decides the axis suggestion() differentiates along.
  LrFinderMode mode = LrFinderMode::kExponential;
  std::vector<double> lrs;
  std::vector<double> losses;
  /// The index of the suggested rate: the steepest descent of the loss along the axis the rates
  /// were spaced on, log10(lr) for kExponential and lr for kLinear (torch.gradient's
  /// second-order differences with those coordinates), leaving out the first `skip_begin` and
  /// last `skip_end` points and non-finite losses; unset when fewer than two points remain
  /// (logged). Lightning 2.6 differentiates along lr in both modes, which on an exponential
  /// ladder divides by the tiny steps between the smallest rates and tends to suggest one of
  /// them (its issue #21141).
  c10::optional<int64_t> suggestion_index(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  /// lrs[suggestion_index(...)], or unset.
  c10::optional<double> suggestion(int64_t skip_begin = 10, int64_t skip_end = 1) const;
};

/// Runs the range test on `train` with a Trainer built from `options` (its accelerator,
/// strategy, precision, accumulation and clipping count; the test sets its own stop, turns off
/// validation, checkpoints, loggers, the progress bar and the module's LR scheduler, and drops
/// the options' callbacks, profiler and CheckpointIO). The module needs exactly one optimizer;
/// every param group runs at the tested rate. Afterwards the module's parameters and buffers and
/// torch's CPU random state are as before the call, also when it throws. With fast_dev_run it does
/// nothing (warned) and returns an empty result, as Lightning. One process on one device
/// (ConfigError for options that make another strategy: its Trainer would launch processes of
/// its own); for a multi-process run add LearningRateFinder to that run's callbacks.
LrFinderResult lr_find(Module& module, DataLoader train, TrainerOptions options = TrainerOptions(),
                       LrFinderOptions finder = LrFinderOptions());
/// The same with the DataModule's train_dataloader() (after its setup(Stage::kFit)).
LrFinderResult lr_find(Module& module, DataModule& data, TrainerOptions options = TrainerOptions(),
                       LrFinderOptions finder = LrFinderOptions());
/// The same with the module's own Module::train_dataloader().
LrFinderResult lr_find(Module& module, TrainerOptions options = TrainerOptions(),
                       LrFinderOptions finder = LrFinderOptions());

}  // namespace volt
