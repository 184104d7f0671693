#pragma once
// What the tuners share about their trial runs (short fits in Trainers of their own): the
// options such a Trainer runs with, and what is put back afterwards: a module's parameters and
// buffers (copied into the same tensors, so tied weights stay tied and holders see the old
// values; gradients dropped) and torch's CPU random state.

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "volt/trainer/trainer_options.h"

namespace volt {

class Module;

namespace detail {

/// `options` for a trial: no stop but the trial's own (max_epochs -1, no minima, no max_time),
/// no sanity check, overfit_batches, checkpoints, progress bar, summary, loggers or callbacks.
/// The caller adds its stop and batch limits.
TrainerOptions trial_options(TrainerOptions options);

class ModuleSnapshot {
 public:
  /// `tag` names the tuner in the error raised when the module's tensors changed in between.
  ModuleSnapshot(Module& module, std::string tag);
  void restore();

 private:
  Module& module_;
  std::string tag_;
  at::Tensor rng_;
  std::vector<at::Tensor> params_, buffers_;
};

}  // namespace detail
}  // namespace volt
