#pragma once
/// RunContext: the narrow view of a running Trainer that modules and callbacks are handed.

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <iosfwd>
#include <string>
#include <vector>

#include "volt/core/batch.h"
#include "volt/core/loop_state.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/types.h"

namespace volt {

class DataLoader;
class DataModule;
class Logger;
class LRScheduler;
class Profiler;
struct TrainerOptions;

/// Options of Module::log. on_step / on_epoch default by context: training steps log per step,
/// validation/test steps and epoch hooks log per epoch (as in Lightning). on_step is allowed in
/// training and validation/test steps and their batch hooks: a validation/test step value goes
/// to the loggers after each batch, at the pass's batch count (Lightning's rows).
struct LogOptions {
  /// Show the value in the progress bar. Default: false.
  TORCH_ARG(bool, prog_bar) = false;
  /// Log the value at each step. Default: nullopt (per context).
  TORCH_ARG(c10::optional<bool>, on_step);
  /// Aggregate over the epoch and log at its end. Default: nullopt (per context).
  TORCH_ARG(c10::optional<bool>, on_epoch);
  /// Epoch aggregation. Default: Reduce::kMean (weighted by batch size).
  TORCH_ARG(Reduce, reduce) = Reduce::kMean;
  /// The weight of this value in the epoch's mean (Lightning's batch_size): e.g. the tokens a
  /// loss was averaged over, for batches whose size is not their first dimension's. Default:
  /// nullopt (the batch's size).
  TORCH_ARG(c10::optional<int64_t>, batch_size);
  /// Send to loggers (false: only callback_metrics / progress bar). Default: true.
  TORCH_ARG(bool, logger) = true;
  /// Reduce the value across processes with `reduce` (mean, sum, max, min) before it is used,
  /// so every rank sees the same number (a no-op with one process). Default: false.
  TORCH_ARG(bool, sync_dist) = false;
  /// In a pass over several validation/test loaders, a value logged from a step or batch hook
  /// is named "<name>/dataloader_idx_<N>" after its loader, so the loaders' values stay apart
  /// (Lightning's rule). false keeps the name as given: then give each loader its own names
  /// (one name from two loaders is a ConfigError). No effect with one loader. Default: true.
  TORCH_ARG(bool, add_dataloader_idx) = true;
};

std::ostream& operator<<(std::ostream& os, const LogOptions& o);

/// Implemented by the Trainer for the duration of a run. Modules and callbacks never see the
/// Trainer itself: they read progress and ask for the few actions listed here.
class RunContext {
 public:
  virtual ~RunContext() = default;
  virtual const LoopState& state() const = 0;
  /// True while fit's sanity check runs its validation batches (the validation hooks run then
  /// too; a callback acting on validation results returns early, as Lightning's).
  bool sanity_checking() const { return state().stage == Stage::kSanityCheck; }
  /// Latest values of everything logged (monitor keys for callbacks).
  virtual const Metrics& callback_metrics() const = 0;
  /// Puts a value a callback computed into callback_metrics() (where other callbacks and
  /// plateau schedulers may monitor it) without logging it: LearningRateMonitor's rates, as
  /// Lightning's trainer.callback_metrics.update. A value logged under the same name later
  /// replaces it.
  virtual void set_callback_metric(const std::string& name, double value) = 0;
  /// Values logged with prog_bar=true.
  virtual const Metrics& progress_bar_metrics() const = 0;
  virtual void log(const std::string& name, const at::Tensor& value, const LogOptions& opts) = 0;
  /// Writes a full checkpoint (weights, optimizers, loop, RNG, callbacks) atomically to `path`;
  /// weights_only: the weights, the loop counters, the DataModule's and the module's own state,
  /// which validate/test/predict and load_weights read but a fit cannot resume from
  /// (Lightning's save_weights_only).
  virtual void save_checkpoint(const std::string& path, bool weights_only) = 0;
  void save_checkpoint(const std::string& path) { save_checkpoint(path, false); }
  /// Deletes a checkpoint written by save_checkpoint (a file or a sharded folder) through the
  /// strategy's CheckpointIO, after every save issued before it is on disk; rank 0 owns the
  /// files, other ranks do nothing.
  virtual void remove_checkpoint(const std::string& path) = 0;
  /// Makes `path` a symbolic link to the checkpoint `target` (a file or sharded folder written
  /// by save_checkpoint) through the strategy's CheckpointIO, after every save issued before
  /// it; rank 0 owns the files, other ranks do nothing (Strategy::link_checkpoint).
  virtual void link_checkpoint(const std::string& target, const std::string& path) = 0;
  /// Ends fit() after the current batch / validation check.
  virtual void request_stop() = 0;
  /// The checkpoint this run started from (fit's resume, or the weights validate/test/predict
  /// loaded); "" when none (Lightning's trainer.ckpt_path). ModelCheckpoint never deletes it.
  virtual std::string ckpt_path() const { return ""; }
  /// Folder of the first logger's run (e.g. save_dir/name/version_3), or default_root_dir.
  virtual std::string log_dir() const = 0;
  virtual bool is_global_zero() const = 0;
  /// Number of processes in the job (1 without a data-parallel strategy).
  virtual int64_t world_size() const = 0;
  /// This process's rank in the job, 0 .. world_size() - 1.
  virtual int64_t global_rank() const = 0;
  /// Processes training distinct samples, the data-parallel replicas (Strategy::data_shard):
  /// world_size() under DDP and ZeRO, world_size() / stages under the pipeline, world_size() /
  /// tensor_parallel_size under model_parallel, 1 in one process.
  virtual int64_t data_parallel_size() const { return world_size(); }
  /// One decision for every rank: true when `decision` holds on all ranks (all = true) or on
  /// any rank (all = false). Callbacks use it so ranks never diverge (e.g. stop or save).
  virtual bool reduce_boolean_decision(bool decision, bool all = true) = 0;
  virtual int64_t max_epochs() const = 0;
  virtual int64_t max_steps() const = 0;
  /// The optimizer steps this fit will take (Lightning's Trainer.estimated_stepping_batches):
  /// see Module::estimated_stepping_batches.
  virtual int64_t estimated_stepping_batches() const = 0;
  /// Every process's value stacked in rank order: see Module::all_gather.
  virtual at::Tensor all_gather(const at::Tensor& value, bool sync_grads) = 0;
  /// Per-step metrics reach the loggers every this many optimizer steps.
  virtual int64_t log_every_n_steps() const = 0;
  virtual std::vector<OptimizerConfig>& optimizer_configs() = 0;
  /// Changes the batches accumulated per optimizer step from the next batch on
  /// (state().accumulate_grad_batches); GradientAccumulationScheduler calls it when an epoch
  /// starts. Throws what check_accumulate_grad_batches throws, and ValueError inside the batch loop
  /// while a step is part accumulated (its gradients are scaled by the old factor).
  virtual void set_accumulate_grad_batches(int64_t batches) = 0;
  /// ConfigError unless set_accumulate_grad_batches(batches) may be called in this run: a value
  /// below 1, manual optimization, or a strategy that fixes the factor (DeepSpeed).
  virtual void check_accumulate_grad_batches(int64_t batches) const = 0;
  /// The loggers this process writes to: all of them on global rank 0, none on other ranks
  /// (one set of log files per job).
  virtual const std::vector<std::shared_ptr<Logger>>& loggers() const = 0;
  /// Whether the run has loggers at all (the same answer on every rank; use it to validate a
  /// configuration, loggers() to write).
  virtual bool has_loggers() const = 0;
  /// The run's profiler (TrainerOptions::profiler), or a PassThroughProfiler that records
  /// nothing: custom regions in user code (start/stop, profile("name")) go here.
  virtual Profiler& profiler() = 0;
  /// Memory statistics of this process's device by the reference's names (Limit, InUse,
  /// MaxInUse, NumAllocs, ...; docs/OBSERVABILITY.md), from the accelerator. On the CPU the
  /// first call installs volt's counting allocator, so counts start there.
  virtual Metrics device_stats() = 0;
  /// The strategy's name: "single_device", "ddp", "deepspeed" (callbacks that cannot work with
  /// a strategy refuse it by name).
  virtual std::string strategy_name() const = 0;
  /// One pass of the module's training_step over the current epoch's training batches
  /// (limit_train_batches applies), through the strategy and precision, in train mode without
  /// gradients: no backward, optimizer step, logging (log() calls are dropped) or hooks. For
  /// statistics kept in buffers, e.g. BatchNorm's after StochasticWeightAveraging changed the
  /// weights (torch.optim.swa_utils.update_bn). With several processes each rank passes over its
  /// own batches and then every rank takes rank 0's buffers. Call it from a hook of fit:
  /// ValueError elsewhere (validate(), a step); ConfigError under manual optimization
  /// (training_step would step).
  virtual void forward_training_data() = 0;
  /// The options the Trainer was built with (the tuner callbacks build their trial runs from
  /// them).
  virtual const TrainerOptions& trainer_options() const = 0;
  /// The DataModule this entry point was given (its prepare_data and setup run first), one
  /// asking the module's own loaders (Module::train_dataloader()...), or nullptr for loaders.
  virtual DataModule* data_module() = 0;
  /// The training loader of the running fit (the one given, or the DataModule's; sharded with
  /// several processes), or nullptr outside fit and before its loaders exist (setup hooks).
  virtual const DataLoader* train_dataloader() const = 0;
  /// During predict(): the dataset indices of the current batch's samples, in the batch's
  /// order (Lightning's batch_indices), so predictions can be matched to their samples; with
  /// several processes this rank's shard, where the distributed sampler's padding may repeat
  /// an index of the data set's start. Empty outside predict().
  virtual const std::vector<int64_t>& predict_batch_indices() const = 0;
  /// Manual optimization: backward through the strategy and precision.
  virtual void manual_backward(const at::Tensor& loss) = 0;
  /// Manual optimization: one optimizer step through the strategy (counts as a global step).
  virtual void manual_step(size_t optimizer_index) = 0;
  /// Manual optimization: sets this optimizer's gradients to none through the strategy.
  virtual void manual_zero_grad(size_t optimizer_index) = 0;
  /// Clips this optimizer's gradients through the strategy and precision (Module::clip_gradients
  /// says how nullopt and a conflicting value resolve).
  virtual at::Tensor clip_gradients(torch::optim::Optimizer& optimizer,
                                    c10::optional<double> gradient_clip_val,
                                    c10::optional<ClipAlgorithm> gradient_clip_algorithm) = 0;
  /// Sets this optimizer's gradients to none through the strategy (ZeRO's shards too).
  virtual void zero_grad(torch::optim::Optimizer& optimizer) = 0;
  /// `batch` on the run's device, moved as the strategy moves every batch
  /// (Module::transfer_batch_to_device's default).
  virtual Batch batch_to_device(const Batch& batch) const = 0;
  /// scheduler.step(*metric), or scheduler.step() without a metric (Module::lr_scheduler_step's
  /// default).
  virtual void step_lr_scheduler(LRScheduler& scheduler, c10::optional<double> metric) = 0;
  /// Manual optimization: counts an optimizer step that ran elsewhere (replayed from a CUDA
  /// graph): global_step and step-interval schedulers advance as after manual_step.
  virtual void manual_count_step(size_t optimizer_index) = 0;
};

}  // namespace volt
