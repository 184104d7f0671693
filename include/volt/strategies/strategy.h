#pragma once
/// Strategy: owns the accelerator, precision and checkpoint IO, and decides how the model is
/// placed, stepped, backpropagated, reduced across processes and checkpointed.

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "volt/accelerators/accelerator.h"
#include "volt/core/batch.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/types.h"
#include "volt/io/checkpoint_io.h"
#include "volt/precision/precision.h"

namespace volt {

class Module;

/// Which part of the data this process reads: the data loaders shard by it.
struct DataShard {
  int64_t rank = 0;
  int64_t world_size = 1;
  /// Whether every step, outside training too, runs collectives across the shards (ZeRO stage
  /// 3 gathers its partitioned parameters in each forward): the shards must then hold as many
  /// batches each, so prediction pads them as the other stages do instead of giving each
  /// sample to one rank only.
  bool lockstep = false;
};

/// A request to end the loop that every rank must act on at the same batch: a stop signal, a
/// callback's or module's request_stop(), or max_time.
struct StopRequest {
  int signal = 0;            ///< SIGINT / SIGTERM received (0: none)
  bool should_stop = false;  ///< request_stop() (EarlyStopping, Timer, a module)
  bool time_up = false;      ///< TrainerOptions::max_time reached
  /// TrainerOptions::val_check_interval_s has passed since the last validation (not a stop: the
  /// ranks agree on it to validate at the same batch).
  bool val_due = false;
};

/// The Trainer's loop settings a strategy may check its own configuration against (DeepSpeed's
/// batch arithmetic and gradient clipping); set by the Trainer before launch() and, for
/// `fitting`, by Fabric::setup.
struct LoopSettings {
  int64_t accumulate_grad_batches = 1;
  c10::optional<double> gradient_clip_val;
  /// Whether the entry point trains (fit); under Fabric, whether the module being set up came
  /// with optimizers. false (validate / test / predict): no optimizer is set up, and ZeRO
  /// stage 3 partitions the weights alone (ZeRO-Inference).
  bool fitting = true;
};

/// The Trainer talks to devices, numeric formats and process groups only through this class
/// (Lightning's Strategy). Sharded strategies may partition parameters, gradients and optimizer
/// state: nothing outside the Strategy assumes a parameter is whole, that optimizer state is
/// local, or that there is one process. The defaults are right for one process on one device.
class Strategy {
 public:
  Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<Precision> precision,
           std::shared_ptr<CheckpointIO> checkpoint_io);
  virtual ~Strategy() = default;
  /// Registry name ("single_device").
  virtual std::string name() const = 0;

  // ------------------------------------------------------------------ processes
  /// Starts the other local processes of the job when volt must start them itself (Lightning's
  /// launcher); called once at the start of each Trainer entry point, before setup_environment.
  virtual void launch() {}
  /// Creates process groups etc. Called at the start of each Trainer entry point.
  virtual void setup_environment() {}
  /// A digest of the run's configuration (set by the Trainer before launch()); multi-process
  /// strategies compare it at rendezvous so ranks started with different settings fail at once.
  void set_config_fingerprint(std::string fingerprint) { fingerprint_ = std::move(fingerprint); }
  const std::string& config_fingerprint() const { return fingerprint_; }
  void set_loop_settings(LoopSettings settings) { loop_ = settings; }
  const LoopSettings& loop_settings() const { return loop_; }
  /// Global rank of this process, 0-based.
  virtual int64_t rank() const { return 0; }
  /// Rank of this process on its node.
  virtual int64_t local_rank() const { return 0; }
  /// Index of this process's node.
  virtual int64_t node_rank() const { return 0; }
  /// Number of processes in the job.
  virtual int64_t world_size() const { return 1; }
  bool is_global_zero() const { return rank() == 0; }
  /// The shard of each data set this process reads (the distributed sampler's rank/size).
  virtual DataShard data_shard() const { return {rank(), world_size()}; }
  /// Called when a run ends, also after errors; the base tears the precision down.
  virtual void teardown();
  /// Set before teardown(): whether the run failed (the Trainer's error handler, a Fabric
  /// destroyed by an exception). The ranks may then be out of step, so a teardown runs nothing
  /// collective (a gather would meet another rank's collective of the loop, or wait for it).
  void set_run_failed(bool failed) { run_failed_ = failed; }
  bool run_failed() const { return run_failed_; }
  /// Called when fit() failed with a DistributedError (a rank died or hung): true when the
  /// strategy relaunched its processes and fit() should run again, resuming from `checkpoint`
  /// (the newest last checkpoint; "" when there is none: fit()'s own ckpt_path, or the start),
  /// which restart_checkpoint() then returns. The default never restarts.
  virtual bool restart_after_failure(const std::exception& error, const std::string& checkpoint) {
    return false;
  }
  /// In a process of a restarted attempt: the checkpoint the job resumes from, which overrides
  /// fit()'s ckpt_path ("last": the newest last checkpoint, e.g. after torchrun restarted the
  /// workers); "" otherwise. With several processes rank 0's answer counts.
  virtual std::string restart_checkpoint() const { return ""; }

  // ------------------------------------------------------------------ model and optimizers
  virtual c10::Device root_device() const = 0;
  /// Moves the module to the root device and lets precision convert it (DDP also broadcasts the
  /// weights and builds its gradient buckets here).
  virtual void setup_module(Module& module);
  /// Adapts the optimizers configure_optimizers returned (ZeRO partitions their state here); may
  /// add one when the module returned none (DeepSpeed's JSON optimizer).
  virtual void setup_optimizers(Module& module, std::vector<OptimizerConfig>& optimizers) {}
  virtual Batch batch_to_device(const Batch& batch) const;

  // ------------------------------------------------------------------ steps
  /// module_training_step (or the call set_training_step_call installed) inside the strategy's
  /// training_forward_context (DDP's buffer broadcast and SyncBatchNorm, ZeRO's gathers).
  virtual at::Tensor training_step(Module& module, const Batch& batch, int64_t batch_idx);
  /// What the strategy does around a training forward of `module` while the returned object
  /// lives: DdpStrategy broadcasts rank 0's buffers (broadcast_buffers) and runs the module's
  /// BatchNorm layers over the whole batch (sync_batchnorm). training_step holds it around the
  /// module's step, Fabric::forward_context around the program's forward. It may run
  /// collectives: every rank enters it for the same forwards. Default: nothing (null).
  virtual std::shared_ptr<void> training_forward_context(Module& module) { return nullptr; }
  /// module.training_step on the batch the precision converted, inside the precision's forward
  /// context: the part of training_step a traced step records.
  at::Tensor module_training_step(Module& module, const Batch& batch, int64_t batch_idx);
  using TrainingStepCall = std::function<at::Tensor(Module&, const Batch&, int64_t)>;
  /// Makes training_step run `call` instead of module_training_step (the Trainer's
  /// trace_training_step installs a traced one for each step); an empty call restores it.
  void set_training_step_call(TrainingStepCall call) { step_call_ = std::move(call); }
  virtual void validation_step(Module& module, const Batch& batch, int64_t batch_idx);
  virtual void test_step(Module& module, const Batch& batch, int64_t batch_idx);
  virtual at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx);
  /// Backpropagates `loss` through the precision, which runs `module`'s backward hook.
  /// `sync_gradients` is false on micro-batches that only accumulate: a data-parallel strategy
  /// skips its gradient all-reduce there (no_sync).
  virtual void backward(const at::Tensor& loss, Module& module, bool sync_gradients = true);
  /// A module a backward reaches, and whether its gradients are synchronized in that backward
  /// (false while it only accumulates).
  struct Reached {
    Module* module;
    bool sync_gradients;
  };
  /// One backward through several set-up modules (a Fabric loop's generator and discriminator
  /// step): the gradients of each module in `modules` are synchronized as backward(loss, module,
  /// sync_gradients) would synchronize them, and the precision runs the first module's backward
  /// hook (none when `modules` is empty). Every rank must pass the same modules. Default:
  /// backward(loss, module, sync) for one module, else the precision's backward.
  virtual void backward_through(const at::Tensor& loss, const std::vector<Reached>& modules);
  /// How a step clips, between the unscale and the step, given the clip value and algorithm the
  /// strategy resolved (the Trainer passes the module's configure_gradient_clipping).
  using ClipCall = std::function<void(c10::optional<double> value, ClipAlgorithm algorithm)>;
  /// Unscales, clips, then steps; false if precision skipped the step (e.g. inf gradients under
  /// loss scaling). Clipping: `clip(value, algorithm)` when given, else clip_gradients when the
  /// value is > 0.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer, c10::optional<double> clip_value,
                              ClipAlgorithm algorithm, const ClipCall& clip = nullptr);
  /// Clips this optimizer's gradients in place; for kNorm returns the total norm over every
  /// shard of every parameter (sharded strategies reduce it) as a 0-dim tensor, not read (see
  /// Precision::clip_gradients), else an undefined tensor.
  virtual at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                    ClipAlgorithm algorithm);
  /// Sets every gradient of the optimizer's parameters to none.
  virtual void zero_grad(torch::optim::Optimizer& optimizer);

  // ------------------------------------------------------------------ collectives
  /// Reduces a tensor across processes (identity for one process).
  virtual at::Tensor reduce(const at::Tensor& value, Reduce op) const { return value; }
  /// Rank `src`'s value on every rank (identity for one process).
  virtual at::Tensor broadcast(const at::Tensor& value, int64_t src = 0) const { return value; }
  /// Every rank's value, in rank order (equal shapes).
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& value) const { return {value}; }
  /// Waits until every process reaches the barrier.
  virtual void barrier(const std::string& name = "") {}
  /// Runs `work` where data is prepared for the others (prepare_data): on the first process of
  /// each node (`per_node`) or on global rank 0 only; every process waits until each of them
  /// has finished, however long that takes, while they live (a multi-process strategy bounds
  /// the wait by their heartbeats, not by its collective timeout). `work`'s exception
  /// propagates where it ran; the other processes fail with an Error naming it. Every process
  /// calls it. One process: work().
  virtual void run_preparation(const std::string& name, bool per_node,
                               const std::function<void()>& work) {
    work();
  }
  /// One decision for all ranks, so callbacks (EarlyStopping, ModelCheckpoint) never diverge:
  /// true when `decision` holds on every rank (all = true) or on any rank (all = false).
  virtual bool reduce_boolean_decision(bool decision, bool all = true) const { return decision; }
  /// The ranks' stop requests combined (largest signal; any should_stop; any time_up), so that
  /// all ranks leave the loop at the same batch. Every rank calls it at the same points (each
  /// training batch end, epoch boundaries). lagged = true: an empty request, or the combination
  /// of requests an earlier lagged call sent (multi-process strategies exchange them while
  /// later batches run, so the loop never waits, and DdpStrategy only about every 0.1 s, on a
  /// schedule the ranks agree on); a non-empty result sends nothing more, so the ranks stay
  /// paired. lagged = false: waits for this call's combination (and any exchange still under
  /// way). One process: `local`.
  virtual StopRequest agree_on_stop(const StopRequest& local, bool lagged) { return local; }

  // ------------------------------------------------------------------ checkpoint state
  virtual void save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const;
  /// strict: as volt::load_module_state (false loads the entries that match, Lightning's
  /// strict_loading / Fabric's load(strict=False)).
  virtual void load_model_state(Module& module, torch::serialize::InputArchive& ar,
                                bool strict) const;
  virtual void save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::OutputArchive& ar) const;
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::InputArchive& ar) const;
  /// The partial gradient sums of an interrupted accumulation, by parameter name.
  virtual void save_accumulated_gradients(const Module& module,
                                          torch::serialize::OutputArchive& ar) const;
  virtual void load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar);
  /// Random-generator states of this process by name ("torch_cpu", plus the accelerator's).
  virtual std::map<std::string, at::Tensor> rng_states() const;
  /// Restores states from rng_states(); a missing "torch_cpu" is a CheckpointError.
  virtual void set_rng_states(const std::map<std::string, at::Tensor>& states);
  /// Writes the checkpoint (only the global-zero process writes).
  virtual void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path);
  virtual torch::serialize::InputArchive load_checkpoint(const std::string& path);
  /// Deletes a checkpoint (the global-zero process alone; a folder of shards after the saves
  /// before it). A removal that fails, or a folder that holds no volt checkpoint (never
  /// deleted), is a warning: the other processes would wait for a rank that stopped here.
  virtual void remove_checkpoint(const std::string& path);
  /// Makes `path` a symbolic link to the checkpoint `target` (CheckpointIO::link; the
  /// global-zero process alone), after the saves before it. A volt checkpoint folder at `path`
  /// is removed first. A link that cannot be made is a warning, as a failed removal: `path`
  /// keeps what it held.
  virtual void link_checkpoint(const std::string& target, const std::string& path);
  /// Waits until every checkpoint this run saved is on disk (CheckpointIO::flush) and throws a
  /// failed background write; the Trainer calls it when an entry point's work is done.
  /// Multi-process strategies also make every rank wait for rank 0's writes, so no rank reads a
  /// checkpoint that is still being written.
  virtual void flush_checkpoints();

  Accelerator& accelerator() const { return *accelerator_; }
  Precision& precision() const { return *precision_; }
  CheckpointIO& checkpoint_io() const { return *checkpoint_io_; }
  /// Replaces the CheckpointIO (TrainerOptions::checkpoint_io); null is a ConfigError.
  void set_checkpoint_io(std::shared_ptr<CheckpointIO> checkpoint_io);
  /// Batch normalization over the whole data-parallel batch (TrainerOptions::sync_batchnorm,
  /// Lightning's sync_batchnorm; volt/distributed/sync_batchnorm.h): data-parallel strategies
  /// apply it in setup_module when they run several processes; with one process it changes
  /// nothing (logged). A strategy that cannot throws ConfigError.
  virtual void set_sync_batchnorm(bool on) { sync_batchnorm_ = on; }
  bool sync_batchnorm() const { return sync_batchnorm_; }
  /// Called before the gradient accumulation factor changes during fit (a
  /// GradientAccumulationScheduler); a strategy whose batch arithmetic fixes it throws
  /// ConfigError. Default: accepts.
  virtual void check_accumulation_change(int64_t accumulate_grad_batches) const {}
  /// Called during fit when the set of the module's parameters that require a gradient is no
  /// longer the one setup_module saw (a callback froze or unfroze layers: BackboneFinetuning).
  /// DDP builds its gradient buckets again; a strategy that cannot follow throws ConfigError.
  /// Default: nothing to do.
  virtual void trainable_parameters_changed(Module& module) {}

 protected:
  /// optimizer_step's clipping: `clip(value, algorithm)` when given, else clip_gradients when
  /// the value is > 0.
  void clip_for_step(torch::optim::Optimizer& optimizer, c10::optional<double> value,
                     ClipAlgorithm algorithm, const ClipCall& clip);
  bool sync_batchnorm_ = false;
  std::string fingerprint_;
  LoopSettings loop_;
  std::shared_ptr<Accelerator> accelerator_;
  std::shared_ptr<Precision> precision_;
  std::shared_ptr<CheckpointIO> checkpoint_io_;

 private:
  TrainingStepCall step_call_;
  bool run_failed_ = false;
};

}  // namespace volt
