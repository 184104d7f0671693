#pragma once
/// volt::Module: a torch::nn::Module that also says how to train, validate, test and predict.

#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/core/batch.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/run_context.h"

namespace volt {

class Callback;
class DataLoader;  // volt/data/data_loader.h (a layer above)
class LRScheduler;
class Module;
namespace detail {
struct DefaultSteps;
}  // namespace detail

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
  /// Defaults: nothing (Lightning's unimplemented steps): fit then skips validation with a
  /// warning, and validate() / test() are a ConfigError asking to override it. The Trainer
  /// tells by running the first batch, so an override that calls this default counts as none.
  virtual void validation_step(const Batch& batch, int64_t batch_idx);
  virtual void test_step(const Batch& batch, int64_t batch_idx);
  /// Default: throws ConfigError asking to override it.
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  virtual std::vector<OptimizerConfig> configure_optimizers() = 0;
  /// Replaces configure_optimizers() for the runs of this module: the Trainer calls `make`
  /// instead (LightningCLI's automatic optimizers: the CLI sets it for --optimizer /
  /// --lr_scheduler, as Lightning replaces the module's method). An empty function puts
  /// configure_optimizers() back.
  void replace_configure_optimizers(std::function<std::vector<OptimizerConfig>(Module&)> make);
  /// What the Trainer steps: the replacement's optimizers when one is set, else
  /// configure_optimizers()'s.
  std::vector<OptimizerConfig> make_optimizers();

  /// Downloads or writes what the data needs, once per node (prepare_data_per_node(), the
  /// default) or once per job: at every entry point, before any setup hook, on the first process
  /// of each node (or global rank 0) while the others wait for it, however long it takes. Do not
  /// set state here that other processes need (they do not run it); setup() is for that. Its
  /// use of the random generators is undone (the run draws the same either way). Not in tuner
  /// trials. Lightning's LightningModule.prepare_data.
  virtual void prepare_data() {}
  /// true: prepare_data runs on each node's first process (for node-local disks); false: on
  /// global rank 0 only (a filesystem the nodes share). Default: true.
  virtual bool prepare_data_per_node() const { return true; }

  /// The module's own data (Lightning's LightningModule.train_dataloader() and the others), for
  /// the entry points given no loaders (Trainer::fit(module), validate(module), test(module),
  /// predict(module)) and for the validation of fit(module, train) given no validation loader.
  /// A DataModule given to an entry point replaces all of them. Asked for where a DataModule's
  /// are (after the setup hooks; again under reload_dataloaders_every_n_epochs, at the epochs a
  /// DataModule's are, current_epoch() then the loop's epoch). Override them with
  /// volt/data/data_loader.h included. Defaults: train_dataloader() throws ConfigError, the
  /// others have no loader, the plural ones return the singular one's (several validation, test
  /// or predict loaders: override those).
  virtual DataLoader train_dataloader();
  virtual c10::optional<DataLoader> val_dataloader();
  virtual c10::optional<DataLoader> test_dataloader();
  virtual c10::optional<DataLoader> predict_dataloader();
  virtual std::vector<DataLoader> val_dataloaders();
  virtual std::vector<DataLoader> test_dataloaders();
  virtual std::vector<DataLoader> predict_dataloaders();
  /// The batch size the module's loaders are built with, for BatchSizeFinder when the run uses
  /// them (Lightning's `model.batch_size`): as DataModule::batch_size / set_batch_size. Unset
  /// (the default) = not tunable; the default set_batch_size throws ConfigError.
  virtual c10::optional<int64_t> batch_size() const;
  virtual void set_batch_size(int64_t batch_size);

  // Set-up hooks: once per fit/validate/test/predict (and per tuner trial), so make them
  // idempotent.
  /// After the callbacks' setup, before configure_model, before the strategy takes the module
  /// (DDP's gradient buckets, the device) and before configure_optimizers: the place to freeze
  /// parameters. Lightning's LightningModule.setup.
  virtual void setup(Stage stage) {}
  /// After setup, once the processes are up: the place for layers built only then (Lightning's
  /// configure_model). Skip the ones that exist already: it runs at every entry point.
  virtual void configure_model() {}
  /// At the end of the entry point, after the callbacks' teardown, also when it failed.
  virtual void teardown(Stage stage) {}
  /// Callbacks this module brings (Lightning's configure_callbacks), asked for at the start of
  /// every entry point: each joins the Trainer's callbacks, replacing those of its exact type
  /// (logged), and ModelCheckpoints move to the end of the list, as Lightning.
  virtual std::vector<std::shared_ptr<Callback>> configure_callbacks() { return {}; }

  /// Around each batch's move to the device, in every loop, before its batch-start hooks:
  /// on_before_batch_transfer gets it as the loader made it, on_after_batch_transfer on the
  /// device (augmentation on the GPU goes there). Return the batch, changed or not. A hook the
  /// run's DataModule overrides is used instead of the module's (Lightning's rule).
  virtual Batch on_before_batch_transfer(Batch batch) { return batch; }
  virtual Batch on_after_batch_transfer(Batch batch) { return batch; }
  /// The move itself, to `device` (the run's). Default: the strategy's move
  /// (RunContext::batch_to_device: non-blocking copies, DeepSpeed's bf16 input cast). Override
  /// for what must stay where it is, or a move of your own.
  virtual Batch transfer_batch_to_device(Batch batch, c10::Device device);

  // Hooks, in the order the fit loop calls them (docs/HOOKS.md lists it). At each one the
  // callbacks' hook of the same name runs first, except at an epoch's end.
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_start() {}
  virtual void on_train_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  /// Before training_step. May call skip_rest_of_epoch().
  virtual void on_train_batch_start(const Batch& batch, int64_t batch_idx) {}
  virtual void on_train_batch_end(const Batch& batch, int64_t batch_idx) {}
  virtual void on_before_backward(const at::Tensor& loss) {}
  virtual void on_after_backward() {}
  virtual void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {}
  /// After the optimizer step, before its gradients are zeroed (automatic optimization).
  virtual void on_before_zero_grad(torch::optim::Optimizer& optimizer) {}

  /// Before a validation pass of fit outside an accumulation window (not the sanity check's,
  /// not mid-window, as Lightning), before the other validation hooks. Lightning's default sets
  /// the gradients to none to free their memory; volt's does nothing, as they are none already
  /// after each optimizer step.
  virtual void on_validation_model_zero_grad() {}
  /// Before a validation pass (the sanity check's too), after save_training_modes(): the
  /// default calls eval(); override it to keep, say, dropout on.
  virtual void on_validation_model_eval() { eval(); }
  /// After the pass: the default puts every submodule back in the mode it had before it (a
  /// BatchNorm a callback left in eval mode stays in eval mode), as Lightning.
  virtual void on_validation_model_train() { restore_training_modes(); }
  virtual void on_validation_start() {}
  virtual void on_validation_end() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_validation_batch_start(const Batch& batch, int64_t batch_idx) {}
  virtual void on_validation_batch_end(const Batch& batch, int64_t batch_idx) {}
  /// As on_validation_model_eval / on_validation_model_train, around a test pass.
  virtual void on_test_model_eval() { eval(); }
  virtual void on_test_model_train() { restore_training_modes(); }
  virtual void on_test_start() {}
  virtual void on_test_end() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_epoch_end() {}
  virtual void on_test_batch_start(const Batch& batch, int64_t batch_idx) {}
  virtual void on_test_batch_end(const Batch& batch, int64_t batch_idx) {}
  /// Before predict's pass; after it the modes are put back as after a validation pass.
  virtual void on_predict_model_eval() { eval(); }
  virtual void on_predict_start() {}
  virtual void on_predict_end() {}
  virtual void on_predict_epoch_start() {}
  virtual void on_predict_epoch_end() {}
  virtual void on_predict_batch_start(const Batch& batch, int64_t batch_idx) {}
  /// `prediction` is what predict_step returned for the batch.
  virtual void on_predict_batch_end(const at::Tensor& prediction, const Batch& batch,
                                    int64_t batch_idx) {}
  // The steps of automatic optimization, overridable (Lightning's LightningModule.backward,
  // optimizer_step, optimizer_zero_grad, configure_gradient_clipping, lr_scheduler_step). Each
  // default does what the Trainer does without it; override one to change that part of a step.

  /// Backpropagates `loss` as the precision hands it over: divided by accumulate_grad_batches,
  /// scaled under 16-mixed, inside the strategy's gradient hooks (DDP's all-reduce, ZeRO's
  /// partitioning). Also what manual_backward runs. Default: loss.backward().
  virtual void backward(const at::Tensor& loss);
  /// Takes the optimizer step once a step's gradients are in (after on_after_backward; with
  /// accumulate_grad_batches > 1 on the micro-batch that steps). `step()` runs the
  /// on_before_optimizer_step hooks, unscales the gradients (16-mixed), calls
  /// configure_gradient_clipping and steps the optimizer through the strategy; it returns false
  /// when the precision skipped the step (inf/NaN gradients). The default calls it. An override
  /// may change the optimizer first (a learning-rate warm-up) or not call step(): then nothing
  /// steps, global_step and the step-interval schedulers stay, and the gradients are zeroed as
  /// after a step. Calling step() twice is a ValueError.
  virtual void optimizer_step(int64_t epoch, int64_t batch_idx, torch::optim::Optimizer& optimizer,
                              const std::function<bool()>& step);
  /// After on_before_zero_grad. Default: the optimizer's gradients set to none through the
  /// strategy (zero_grad(optimizer) of RunContext; ZeRO's gradient shards too).
  virtual void optimizer_zero_grad(int64_t epoch, int64_t batch_idx,
                                   torch::optim::Optimizer& optimizer);
  /// Inside step(), after the unscale, with the run's clip value (TrainerOptions::
  /// gradient_clip_val, or the strategy's own, e.g. DeepSpeed's JSON gradient_clipping; nullopt
  /// when neither sets one) and algorithm. Default: clip_gradients(optimizer, value, algorithm).
  virtual void configure_gradient_clipping(torch::optim::Optimizer& optimizer,
                                           c10::optional<double> gradient_clip_val,
                                           ClipAlgorithm gradient_clip_algorithm);
  /// Steps a scheduler when its interval and frequency say so (automatic optimization; after
  /// the global step advanced, or at a training epoch's end). `metric`: the value of the
  /// config's monitor, when it has one. Default: scheduler.step(*metric) or scheduler.step().
  virtual void lr_scheduler_step(LRScheduler& scheduler, c10::optional<double> metric);

  /// Clips this optimizer's gradients in place through the strategy (under ZeRO the norm spans
  /// every process's shard) and precision; under manual optimization the gradients are unscaled
  /// first (16-mixed). `gradient_clip_val`: nullopt takes TrainerOptions::gradient_clip_val
  /// (nothing is clipped when it has none); another value while the Trainer has one is a
  /// ConfigError (set one of them, as Lightning); <= 0 clips nothing. `gradient_clip_algorithm`:
  /// nullopt takes the Trainer's. Returns the total norm before clipping (a 0-dim tensor, not
  /// read: reading it is a host sync on CUDA) for kNorm, else an undefined tensor.
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer,
                            c10::optional<double> gradient_clip_val = c10::nullopt,
                            c10::optional<ClipAlgorithm> gradient_clip_algorithm = c10::nullopt);

  /// Add module-specific state to a checkpoint / read it back.
  virtual void on_save_checkpoint(torch::serialize::OutputArchive& archive) {}
  virtual void on_load_checkpoint(torch::serialize::InputArchive& archive) {}

  /// Logs a scalar; see LogOptions for step/epoch defaults.
  void log(const std::string& name, const at::Tensor& value, const LogOptions& opts = {});
  void log(const std::string& name, double value, const LogOptions& opts = {});
  /// log() of each entry with the same options (Lightning's log_dict).
  void log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& opts = {});

  /// Every process's `value` stacked in rank order: [world_size, *value.sizes()] (equal shapes
  /// on every rank). A whole validation set's predictions for a metric over all of them, say.
  /// With sync_grads the result is differentiable (a contrastive loss over the global batch):
  /// each process's value gets the sum over the processes of the gradients for its slice, and
  /// every process must then run its backward through the result. Departure: one process gets
  /// [1, *value.sizes()] too (Lightning returns the value unchanged there).
  at::Tensor all_gather(const at::Tensor& value, bool sync_grads = false);

  /// The optimizer steps the running fit will take (Lightning's
  /// Trainer.estimated_stepping_batches), for a schedule's length in configure_optimizers
  /// (OneCycleLR's total_steps): per process, ceil(training batches per epoch after the
  /// limits / accumulate_grad_batches) times max_epochs, at most max_steps. With a
  /// GradientAccumulationScheduler each epoch counts at its own factor (Lightning counts every
  /// epoch at the Trainer's factor, 1 beside a scheduler).
  /// ConfigError outside fit. (Neither max_epochs nor max_steps set means max_epochs 1000, as
  /// Lightning.)
  int64_t estimated_stepping_batches() const;

  /// With several optimizers (manual optimization, a GAN's generator and discriminator):
  /// parameters of the other optimizers stop requiring gradients until untoggle_optimizer,
  /// which gives back each its own setting (Lightning's toggle_optimizer /
  /// untoggle_optimizer), so a backward for one optimizer computes only its gradients.
  void toggle_optimizer(size_t index);
  void untoggle_optimizer(size_t index);

  /// Every parameter stops requiring gradients and the module goes to evaluation mode
  /// (Lightning's freeze); unfreeze() undoes both for every parameter and submodule.
  void freeze();
  void unfreeze();

  /// From this module's on_train_batch_start only (Lightning's `return -1` there): this batch
  /// and the rest of the epoch are not trained. No training_step, no batch-end hooks and no
  /// validation at the epoch's end; a part-accumulated step's gradients are dropped through the
  /// zero-grad hooks (Lightning zeroes them at the next window's start); the epoch-interval
  /// schedulers step as after an epoch's last batch and the epoch-end hooks run, then the next
  /// epoch starts (a checkpoint written there resumes at it). With several processes it needs
  /// set_may_skip_rest_of_epoch(true); then any rank's call skips on every rank. ValueError from
  /// any other place.
  void skip_rest_of_epoch();
  /// Whether the ranks agree on skip_rest_of_epoch() at each training batch: one blocking
  /// all-reduce of a flag per batch (a host sync on CUDA), so that a call on any rank skips on
  /// every rank. Set it (in the constructor or setup()) on a module that may skip and trains
  /// with several processes; without it a skip there is a ValueError on the rank that called it,
  /// as that rank alone would leave the others waiting in their next all-reduce (Lightning's
  /// ranks hang there). One process needs nothing. Default: false.
  bool may_skip_rest_of_epoch() const { return may_skip_rest_of_epoch_; }
  void set_may_skip_rest_of_epoch(bool on) { may_skip_rest_of_epoch_ = on; }

  /// Manual optimization (Lightning's automatic_optimization = False).
  bool automatic_optimization() const { return automatic_optimization_; }
  void set_automatic_optimization(bool on) { automatic_optimization_ = on; }
  /// Whether a checkpoint's weights must match this module's exactly (Lightning's
  /// strict_loading): true (the default) refuses a missing, unexpected or differently shaped
  /// entry with a CheckpointError; false loads the entries that match and leaves the rest, e.g.
  /// for a module that added a layer (a fit's resume still needs optimizer state that matches).
  bool strict_loading() const { return strict_loading_; }
  void set_strict_loading(bool on) { strict_loading_ = on; }
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
  /// In validation_step / test_step / predict_step and their batch hooks: which of the pass's
  /// loaders the batch came from (Lightning passes it as the steps' `dataloader_idx` argument;
  /// volt keeps the one-loader signatures and answers here). 0 with one loader and outside a run.
  int64_t dataloader_idx() const;
  /// The active run, or nullptr outside Trainer calls.
  RunContext* run() const { return run_; }
  /// Set by the Trainer for the duration of a run.
  void attach(RunContext* run) { run_ = run; }

  /// The training mode of this module and of each submodule, in modules() order;
  /// set_training_modes() puts such a list back (train() on everything when submodules were
  /// added or removed since).
  std::vector<bool> training_modes() const;
  void set_training_modes(const std::vector<bool>& modes);
  /// training_modes() kept in the module, for restore_training_modes() to put back. The
  /// evaluation loops record it before the *_model_eval hooks.
  void save_training_modes();
  void restore_training_modes();

 private:
  friend struct detail::DefaultSteps;
  /// The overridable steps whose default ran since the Trainer last cleared these bits
  /// (src/core/detail/default_steps.h): how it tells an override from the default.
  unsigned default_steps_ran_ = 0;
  /// skip_rest_of_epoch(): 0 outside on_train_batch_start, 1 inside it, 2 once it was called
  /// there (set and read by the fit loop through detail::DefaultSteps).
  int batch_start_ = 0;
  RunContext& require_run(const char* what) const;
  RunContext* run_ = nullptr;
  bool automatic_optimization_ = true;
  bool strict_loading_ = true;
  bool may_skip_rest_of_epoch_ = false;
  std::map<std::string, std::string> hparams_;
  std::function<std::vector<OptimizerConfig>(Module&)> configure_optimizers_replacement_;
  std::vector<bool> saved_modes_;
  /// toggle_optimizer's record: each parameter of every optimizer with its requires_grad.
  std::vector<std::pair<at::Tensor, bool>> toggled_;
};

}  // namespace volt
