#pragma once
/// volt::Module: a torch::nn::Module that also says how to train, validate, test and predict.

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <map>
#include <string>
#include <vector>

#include "volt/core/batch.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/run_context.h"

namespace volt {

class Module;

/// Manual-optimization handle: zero_grad() and step() go through the Trainer's strategy.
class ManualOptimizer {
 public:
  ManualOptimizer(RunContext* ctx, size_t index) : ctx_(ctx), index_(index) {}
  /// Resets the gradients of this optimizer's parameters (set to undefined).
  void zero_grad();
  /// One optimizer step via the strategy and precision; increments global_step.
  void step();
  /// Counts a step without running the optimizer: global_step and the step-interval
  /// schedulers advance as after step(). For a step replayed from a CUDA graph, whose captured
  /// work already holds the optimizer step (docs/CUDA_GRAPHS.md).
  void count_step();
  torch::optim::Optimizer& optimizer();

 private:
  RunContext* ctx_;
  size_t index_;
};

/// Subclass and override training_step and configure_optimizers (LightningModule semantics).
/// The Trainer calls the hooks in Lightning's order; all hooks default to doing nothing.
class Module : public torch::nn::Module {
 public:
  Module() = default;
  explicit Module(std::string name) : torch::nn::Module(std::move(name)) {}

  /// Returns the loss to minimise (automatic optimization) or an undefined tensor to skip the
  /// batch / when optimizing manually.
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  virtual void validation_step(const Batch& batch, int64_t batch_idx) {}
  virtual void test_step(const Batch& batch, int64_t batch_idx) {}
  /// Default: throws ConfigError asking to override it.
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  virtual std::vector<OptimizerConfig> configure_optimizers() = 0;

  // Hooks, in the order the fit loop calls them.
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_start() {}
  virtual void on_train_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_train_batch_start(const Batch& batch, int64_t batch_idx) {}
  virtual void on_train_batch_end(const Batch& batch, int64_t batch_idx) {}
  virtual void on_before_backward(const at::Tensor& loss) {}
  virtual void on_after_backward() {}
  virtual void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {}
  virtual void on_validation_start() {}
  virtual void on_validation_end() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_epoch_end() {}
  /// Add module-specific state to a checkpoint / read it back.
  virtual void on_save_checkpoint(torch::serialize::OutputArchive& archive) {}
  virtual void on_load_checkpoint(torch::serialize::InputArchive& archive) {}

  /// Logs a scalar; see LogOptions for step/epoch defaults.
  void log(const std::string& name, const at::Tensor& value, const LogOptions& opts = {});
  void log(const std::string& name, double value, const LogOptions& opts = {});

  /// Manual optimization (Lightning's automatic_optimization = False).
  bool automatic_optimization() const { return automatic_optimization_; }
  void set_automatic_optimization(bool on) { automatic_optimization_ = on; }
  void manual_backward(const at::Tensor& loss);
  std::vector<ManualOptimizer> optimizers();
  std::vector<std::shared_ptr<LRScheduler>> lr_schedulers();

  /// Hyper-parameters recorded by loggers (e.g. hparams.yaml).
  void save_hyperparameters(std::map<std::string, std::string> hp) { hparams_ = std::move(hp); }
  const std::map<std::string, std::string>& hparams() const { return hparams_; }

  /// The Trainer's profiler for custom regions: `profiler().start("x")` / `stop("x")`, or
  /// `auto r = profiler().profile("x");` (include volt/profiler/profiler.h). Without a profiler
  /// it records nothing. Throws ConfigError outside a Trainer run.
  Profiler& profiler();

  int64_t current_epoch() const;
  int64_t global_step() const;
  /// The active run, or nullptr outside Trainer calls.
  RunContext* run() const { return run_; }
  /// Set by the Trainer for the duration of a run.
  void attach(RunContext* run) { run_ = run; }

 private:
  RunContext& require_run(const char* what) const;
  RunContext* run_ = nullptr;
  bool automatic_optimization_ = true;
  std::map<std::string, std::string> hparams_;
};

}  // namespace volt
