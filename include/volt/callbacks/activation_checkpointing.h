#pragma once
/// ActivationCheckpointing: turns on activation checkpointing for named submodules of the model
/// at the start of fit, without editing the model (from C++ or a YAML config).

#include <torch/arg.h>
#include <iosfwd>

#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

struct ActivationCheckpointingOptions {
  explicit ActivationCheckpointingOptions(std::vector<std::string> modules)
      : modules_(std::move(modules)) {}
  /// Module paths or globs to checkpoint, as wrap_activation_checkpointing takes them
  /// ("blocks.*"); each must match an entry of a torch::nn::Sequential. Required.
  TORCH_ARG(std::vector<std::string>, modules);
  /// Keep checkpointed inputs in host memory (DeepSpeed's cpu_checkpointing); unset follows
  /// checkpoint_defaults() (which DeepSpeedStrategy's cpu_checkpointing sets). Default: unset.
  TORCH_ARG(c10::optional<bool>, cpu_checkpointing);
  /// Replay RNG states in recomputation (same dropout masks). Default: true.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

std::ostream& operator<<(std::ostream& os, const ActivationCheckpointingOptions& o);

/// Wraps the matching Sequential entries of the model with volt::checkpoint in on_fit_start,
/// after the strategy has set up the model and before the first forward; wrapping changes no
/// parameter, so what the strategy built stays valid. The model stays wrapped after fit
/// (checkpointing is inactive without grad mode, so validation and predict are unaffected).
/// A pattern that matches nothing or a module outside a Sequential is a ConfigError.
class ActivationCheckpointing : public Callback {
 public:
  explicit ActivationCheckpointing(ActivationCheckpointingOptions options);
  std::string state_key() const override { return "ActivationCheckpointing"; }
  void on_fit_start(RunContext& run, Module& module) override;
  const ActivationCheckpointingOptions& options() const { return options_; }

 private:
  ActivationCheckpointingOptions options_;
};

}  // namespace volt
