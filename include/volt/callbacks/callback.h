#pragma once
/// Callback: observes the run at each hook and may keep state that checkpoints carry.

#include <torch/serialize/archive.h>

#include <exception>
#include <string>

#include "volt/core/batch.h"
#include "volt/core/run_context.h"

namespace volt {

class Module;

/// Override the hooks you need; every hook defaults to doing nothing. Hooks receive the
/// RunContext (progress, metrics, save_checkpoint, request_stop), never the Trainer. The Trainer
/// calls them in Lightning's order (docs/HOOKS.md): at each hook the callbacks in registration
/// order, then the module's method of the same name; at the end of an epoch the module's method
/// first, so that what it logs is in the reduced values the callbacks read. The validation hooks
/// also run during the sanity check (run.sanity_checking() tells it).
class Callback {
 public:
  virtual ~Callback() = default;
  /// Key of this callback's state inside checkpoints; must be unique among a run's callbacks.
  virtual std::string state_key() const = 0;

  /// At the start of fit/validate/test/predict, once the processes are up, before the strategy
  /// takes the module (DDP builds its gradient buckets from the parameters that require a
  /// gradient then) and before configure_optimizers: the place to freeze parameters
  /// (BaseFinetuning). Lightning's Callback.setup.
  virtual void setup(RunContext& run, Module& module, Stage stage) {}
  /// At the end of fit/validate/test/predict, also when it failed (after on_exception), for
  /// each callback whose setup ran: the place to release what setup acquired.
  virtual void teardown(RunContext& run, Module& module, Stage stage) {}
  virtual void on_fit_start(RunContext& run, Module& module) {}
  virtual void on_fit_end(RunContext& run, Module& module) {}
  virtual void on_sanity_check_start(RunContext& run, Module& module) {}
  virtual void on_sanity_check_end(RunContext& run, Module& module) {}
  virtual void on_train_start(RunContext& run, Module& module) {}
  virtual void on_train_end(RunContext& run, Module& module) {}
  virtual void on_train_epoch_start(RunContext& run, Module& module) {}
  virtual void on_train_epoch_end(RunContext& run, Module& module) {}
  virtual void on_train_batch_start(RunContext& run, Module& module, const Batch& batch,
                                    int64_t batch_idx) {}
  virtual void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                                  int64_t batch_idx) {}
  virtual void on_before_backward(RunContext& run, Module& module, const at::Tensor& loss) {}
  virtual void on_after_backward(RunContext& run, Module& module) {}
  virtual void on_before_optimizer_step(RunContext& run, Module& module,
                                        torch::optim::Optimizer& optimizer) {}
  /// After the optimizer step, before the gradients are zeroed (automatic optimization): the
  /// updated weights and the step's gradients are both there.
  virtual void on_before_zero_grad(RunContext& run, Module& module,
                                   torch::optim::Optimizer& optimizer) {}
  virtual void on_validation_start(RunContext& run, Module& module) {}
  virtual void on_validation_end(RunContext& run, Module& module) {}
  virtual void on_validation_epoch_start(RunContext& run, Module& module) {}
  virtual void on_validation_epoch_end(RunContext& run, Module& module) {}
  virtual void on_validation_batch_start(RunContext& run, Module& module, const Batch& batch,
                                         int64_t batch_idx) {}
  virtual void on_validation_batch_end(RunContext& run, Module& module, const Batch& batch,
                                       int64_t batch_idx) {}
  virtual void on_test_start(RunContext& run, Module& module) {}
  virtual void on_test_end(RunContext& run, Module& module) {}
  virtual void on_test_epoch_start(RunContext& run, Module& module) {}
  virtual void on_test_epoch_end(RunContext& run, Module& module) {}
  virtual void on_test_batch_start(RunContext& run, Module& module, const Batch& batch,
                                   int64_t batch_idx) {}
  virtual void on_test_batch_end(RunContext& run, Module& module, const Batch& batch,
                                 int64_t batch_idx) {}
  virtual void on_predict_start(RunContext& run, Module& module) {}
  virtual void on_predict_end(RunContext& run, Module& module) {}
  /// Around the one pass predict() makes over its loader (Lightning's predict epoch).
  virtual void on_predict_epoch_start(RunContext& run, Module& module) {}
  virtual void on_predict_epoch_end(RunContext& run, Module& module) {}
  /// Around each predict_step; run.predict_batch_indices() names the batch's samples.
  virtual void on_predict_batch_start(RunContext& run, Module& module, const Batch& batch,
                                      int64_t batch_idx) {}
  /// `prediction` is what predict_step returned for the batch.
  virtual void on_predict_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                                    const Batch& batch, int64_t batch_idx) {}
  /// Before a checkpoint takes the module's state (RunContext::save_checkpoint, so also
  /// ModelCheckpoint's saves and Trainer::save_checkpoint): a callback may put other values into
  /// the module's tensors here (WeightAveraging puts its average) and must put them back in
  /// on_save_checkpoint_end, which runs after the state is written, also when writing failed.
  virtual void on_save_checkpoint(RunContext& run, Module& module) {}
  virtual void on_save_checkpoint_end(RunContext& run, Module& module) {}
  /// Called when fit/validate/test/predict ends with an exception, before it propagates.
  virtual void on_exception(RunContext& run, Module& module, const std::exception& error) {}
  /// When fit resumes from a checkpoint: after every callback's load_state and before the
  /// optimizers' states are read, so that a callback which added param groups during the run
  /// being resumed (BaseFinetuning) adds them again and the saved state fits the optimizer.
  virtual void on_load_optimizer_states(RunContext& run, Module& module) {}

  /// Checkpointed state of this callback.
  virtual void save_state(torch::serialize::OutputArchive& archive) const {}
  virtual void load_state(torch::serialize::InputArchive& archive) {}
};

}  // namespace volt
