#pragma once
/// TrainerOptions: the loop's own settings; features arrive as objects (callbacks, loggers...).

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/limit.h"
#include "volt/core/spec.h"
#include "volt/core/types.h"
#include "volt/graphs/graph_options.h"

namespace volt {

class Accelerator;
class Strategy;
class Callback;
class Logger;
class Profiler;
class Precision;
class CheckpointIO;

struct TrainerOptions {
  /// "auto", "cpu", "cuda" or an Accelerator object. Default: "auto".
  TORCH_ARG(Spec<Accelerator>, accelerator) = "auto";
  /// Processes (devices) per node: N, or -1 = every device of the accelerator (1 on the CPU,
  /// where N processes share it). Default: -1.
  TORCH_ARG(int64_t, devices) = -1;
  /// Nodes (machines) taking part; world size = devices × num_nodes. Default: 1.
  TORCH_ARG(int64_t, num_nodes) = 1;
  /// "auto" (single_device for one process, ddp for more), "single_device", "ddp" or a Strategy
  /// object. Default: "auto".
  TORCH_ARG(Spec<Strategy>, strategy) = "auto";
  /// "32-true", "bf16-mixed", "bf16-true", "16-mixed" (CUDA), "64-true", "fp8" (Lightning's
  /// short names "32", "bf16", "16" and "64" too; `volt fit --help` lists them with their
  /// parameters) or a Precision object. Default: "32-true".
  TORCH_ARG(Spec<Precision>, precision) = "32-true";
  /// Stop after this many epochs; -1 = no limit (train until max_steps, max_time, a callback or
  /// the module stops it). Unset (Lightning's None): no limit when max_steps, max_time or a
  /// Timer callback bounds the fit, else 1000 with a warning, as Lightning's. Default: unset.
  TORCH_ARG(c10::optional<int64_t>, max_epochs);
  /// Keep training (ignore stop requests) until this many epochs. Unset (Lightning's None): 1
  /// when min_steps is set, else 0, as Lightning's (so a stop asked for in on_fit_start still
  /// trains a first epoch when min_steps is given). Default: unset.
  TORCH_ARG(c10::optional<int64_t>, min_epochs);
  /// Stop after this many optimizer steps; -1 = no limit. Default: -1.
  TORCH_ARG(int64_t, max_steps) = -1;
  /// Keep training (ignore stop requests) until this many optimizer steps, as min_epochs does
  /// for epochs; max_steps and max_epochs still end the run. Unset counts as 0. Default: unset.
  TORCH_ARG(c10::optional<int64_t>, min_steps);
  /// Stop after this many seconds of training, from on_train_start (as Lightning). Default: none.
  TORCH_ARG(c10::optional<double>, max_time);
  /// Batches per epoch/pass (int count or float fraction). Default: 1.0 (all).
  TORCH_ARG(Limit, limit_train_batches) = 1.0;
  TORCH_ARG(Limit, limit_val_batches) = 1.0;
  TORCH_ARG(Limit, limit_test_batches) = 1.0;
  TORCH_ARG(Limit, limit_predict_batches) = 1.0;
  /// Validate every N training batches (int) or fraction of an epoch (float). With
  /// check_val_every_n_epoch unset, N counts the fit's batches over epochs. Default: 1.0.
  TORCH_ARG(Limit, val_check_interval) = 1.0;
  /// Validate every N epochs; nullopt (Lightning's None): every val_check_interval batches of the
  /// whole fit, across epoch boundaries (step-based validation; val_check_interval must then be
  /// a count). Default: 1.
  TORCH_ARG(c10::optional<int64_t>, check_val_every_n_epoch) = 1;
  /// Time-based validation (Lightning's val_check_interval="DD:HH:MM:SS" / timedelta): validate
  /// after the first training batch that ends this many seconds of training after the fit's
  /// start or the last validation, on the epochs check_val_every_n_epoch selects, and not at an
  /// epoch's end otherwise. With several processes the ranks agree on it at their next stop
  /// vote (about every 0.1 s), so every rank validates at the same batch. Not checkpointed: a
  /// resumed fit starts the clock again. val_check_interval must stay 1.0. Default: unset.
  TORCH_ARG(c10::optional<double>, val_check_interval_s);
  /// With a DataModule, ask it for a new training loader every N epochs of fit and for new
  /// validation loaders at a validation N or more epochs after their last build (its
  /// current_epoch() says which epoch), as Lightning's reload_dataloaders_every_n_epochs;
  /// loaders passed to fit() directly are kept. 0 = load them once. Default: 0.
  TORCH_ARG(int64_t, reload_dataloaders_every_n_epochs) = 0;
  /// predict() returns predict_step's outputs (they stay in memory until the call returns);
  /// false returns none, for predictions a PredictionWriter callback writes out as they come,
  /// so memory does not grow with the data set (Lightning's return_predictions). Default: true.
  TORCH_ARG(bool, return_predictions) = true;
  /// Run validation, test and predict under c10::InferenceMode, as Lightning's inference_mode
  /// (torch.inference_mode): autograd keeps no version counters or view records there, so
  /// evaluation costs less than under NoGradGuard. Tensors made there are inference tensors:
  /// autograd refuses to save them for a backward later ("Inference tensors cannot be saved for
  /// backward") and they cannot be modified in place outside inference mode; a step whose
  /// outputs feed training clones them or runs with false (NoGradGuard). Unlike Lightning's, it
  /// holds with Gloo too: volt's collectives write only normal tensors. Default: true.
  TORCH_ARG(bool, inference_mode) = true;
  /// Validation batches run before training as a sanity check; -1 = all. Default: 2.
  TORCH_ARG(int64_t, num_sanity_val_steps) = 2;
  /// N > 0: run N batches of train/val/test once, no checkpoints or loggers. Default: 0.
  TORCH_ARG(int64_t, fast_dev_run) = 0;
  /// Debugging, as Lightning's overfit_batches: train every epoch on the same first batches (a
  /// count, or a fraction of the training loader) and validate on as many of the validation
  /// loader's; it replaces limit_train_batches and limit_val_batches and turns the training
  /// loader's shuffling off (logged). A model that cannot drive the loss on them towards zero
  /// has a bug. 0 = off. Default: 0.
  TORCH_ARG(Limit, overfit_batches) = 0.0;
  /// Accumulate gradients over N batches per optimizer step. Default: 1.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Clip gradients to this value (norm or value, see algorithm). Default: none.
  TORCH_ARG(c10::optional<double>, gradient_clip_val);
  /// kNorm (total 2-norm) or kValue (elementwise). Default: kNorm.
  TORCH_ARG(ClipAlgorithm, gradient_clip_algorithm) = ClipAlgorithm::kNorm;
  /// Send per-step metrics to loggers every N optimizer steps. Default: 50.
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  /// Show a throttled terminal progress bar. Default: true.
  TORCH_ARG(bool, enable_progress_bar) = true;
  /// Add a ModelCheckpoint (save last epoch) when none is given. Default: true.
  TORCH_ARG(bool, enable_checkpointing) = true;
  /// Log a ModelSummary (submodules, parameter counts, size, train/eval modes) at the start of
  /// fit when no ModelSummary callback is given, as Lightning. Default: true.
  TORCH_ARG(bool, enable_model_summary) = true;
  /// Add a CSVLogger under default_root_dir when no logger is given. Default: true.
  TORCH_ARG(bool, logger) = true;
  /// Root folder for logs and checkpoints. Default: ".".
  TORCH_ARG(std::string, default_root_dir) = ".";
  /// With several processes, shard every loader by the strategy's rank and world size (a
  /// distributed sampler: disjoint shards, reshuffled per epoch from the loader's seed, padded
  /// to equal length). Loaders that already set world_size > 1 are kept. Default: true.
  TORCH_ARG(bool, use_distributed_sampler) = true;
  /// With several data-parallel processes, BatchNorm layers normalise with the statistics of the
  /// whole global batch instead of each process's share (Lightning's sync_batchnorm; PyTorch's
  /// SyncBatchNorm): training then equals one process on the global batch. DdpStrategy only
  /// (ConfigError with DeepSpeed); nothing changes in one process. Default: false.
  TORCH_ARG(bool, sync_batchnorm) = false;
  /// Use deterministic algorithms only (as Lightning's deterministic=True: an op without a
  /// deterministic implementation throws; cuDNN deterministic and not benchmarking; cuBLAS
  /// with a fixed workspace unless CUBLAS_WORKSPACE_CONFIG is set). Default: false.
  TORCH_ARG(bool, deterministic) = false;
  /// cuDNN autotuning, as Lightning's `benchmark` (torch.backends.cudnn.benchmark): true times
  /// the convolution algorithms for each new input shape on first use and keeps the fastest
  /// (pays off when shapes repeat), false uses cuDNN's heuristics. Unset: false when
  /// deterministic, otherwise the process's current setting stays. Set for the whole process at
  /// construction, as Lightning does; true with deterministic warns (cuDNN then ignores
  /// determinism). No effect on CPU. Default: unset.
  TORCH_ARG(c10::optional<bool>, benchmark);
  /// Seed torch's RNG before building anything (seed_everything). Default: none.
  TORCH_ARG(c10::optional<uint64_t>, seed);
  /// Raise ValueError naming the step when a training loss is NaN or inf. Default: true.
  TORCH_ARG(bool, detect_nonfinite_loss) = true;
  /// Run every entry point under autograd's anomaly detection (Lightning's detect_anomaly;
  /// torch::autograd::DetectAnomalyGuard): a backward function that returns NaN fails the
  /// step with its name (e.g. "Function 'SqrtBackward0' returned nan values in its 0th
  /// output"), and a tensor modified in place after autograd saved it is reported. It checks
  /// every gradient on the host, so steps get much slower; for debugging. Process-wide while
  /// the entry point runs; graph_training_step then runs eagerly. Default: false.
  TORCH_ARG(bool, detect_anomaly) = false;
  /// Stop gracefully on SIGINT (Ctrl-C) and SIGTERM while an entry point runs, as Lightning's
  /// graceful shutdown: the first signal lets the current batch finish; then every rank stops
  /// at the same batch (multi-process runs agree on it with a small collective about every
  /// 0.1 s, so within about 0.2 s),
  /// callbacks run on_exception (OnExceptionCheckpoint saves a checkpoint that resumes
  /// exactly), loggers are finalized as interrupted and the entry point throws
  /// volt::Interrupted. A second signal ends the process at once (the default action). Only
  /// signals left at their default disposition are taken over, and only while the entry point
  /// runs; a program's own handlers (and ignored signals) are left alone. Default: true.
  TORCH_ARG(bool, handle_signals) = true;
  /// Replay the whole automatic-optimization step (training_step, backward, clipping by value,
  /// optimizer step) from a CUDA graph after graph_options().warmup_iters() eager steps, one
  /// graph per batch signature (at most graph_options().max_graphs()). What cannot be captured
  /// (no GPU, manual optimization, accumulation, mixed precision, several processes, clipping
  /// by norm, an optimizer that keeps its step on the host, a host sync in the step) runs
  /// eagerly, logged once with the reason. The step's inner hooks (on_before_backward,
  /// on_after_backward, on_before_optimizer_step) run at capture only. Default: false.
  TORCH_ARG(bool, graph_training_step) = false;
  /// Warm-up steps and graphs kept for graph_training_step. Default: GraphOptions().
  TORCH_ARG(GraphOptions, graph_options);
  /// Trace training_step with volt::TracedFunction (one trace per batch signature, at most 8)
  /// and replay it with its elementwise float32 CPU chains fused; backward, clipping and the
  /// optimizer run as usual. The trace is the ops the first step of a signature ran, so
  /// training_step must run the same ops for every batch of a signature: nothing decided by
  /// batch_idx, the step count or a tensor's value (a host read while tracing, item() or a
  /// tensor as a condition, and log(name, number) are refused). The step after each trace, each
  /// epoch's first step and the 16th, 32nd, 64th, ... traced steps run training_step under the
  /// tracer again and compare: other ops, constants or logged names (a branch on batch_idx, the
  /// epoch or the step count) turn the step eager, logged with the first difference and the
  /// replays since the last check, which may have repeated the trace's choice. Values
  /// training_step logs are outputs of the trace, logged after each replay. What cannot be
  /// traced (manual optimization, a module off the CPU, sync_batchnorm, a DeepSpeed strategy,
  /// a skipped batch, a refusal above, a signature that keeps changing: 8 traces dropped) runs
  /// eagerly, logged once with the reason. Exclusive with graph_training_step (ConfigError).
  /// Default: false.
  TORCH_ARG(bool, trace_training_step) = false;
  /// torch intra-op threads; 0 = volt's measured default: 1 on 2-CPU machines with OpenBLAS
  /// when the precision computes in fp32 or float64 (OpenBLAS threads its GEMMs itself),
  /// libtorch's own count under bf16-mixed, 16-mixed and bf16-true (see docs/PERFORMANCE.md);
  /// at most 1024.
  /// Default: 0.
  TORCH_ARG(int64_t, num_threads) = 0;
  /// Make the C library's malloc keep freed memory for reuse (reuse_freed_host_memory) at the
  /// start of the first run in this process, instead of returning large blocks to the kernel
  /// and faulting their pages in again every step. Not done under jemalloc or tcmalloc, or when
  /// the environment sets malloc's thresholds; logged once. It is process-wide and stays for the
  /// process's life. Default: true.
  TORCH_ARG(bool, reuse_host_memory) = true;
  /// Progress bar refresh period in seconds (it reads metric values at most this often).
  /// Default: 0.5.
  TORCH_ARG(double, progress_refresh_s) = 0.5;
  TORCH_ARG(std::vector<std::shared_ptr<Callback>>, callbacks);
  TORCH_ARG(std::vector<std::shared_ptr<Logger>>, loggers);
  /// Times every hook and loop stage (e.g. SimpleProfiler); null = no profiling. Default: null.
  TORCH_ARG(std::shared_ptr<Profiler>, profiler);
  /// How checkpoints are written and read (Lightning's CheckpointIO plugin), e.g.
  /// AsyncCheckpointIO to write them in the background; replaces the strategy's own. null =
  /// the strategy's (TorchCheckpointIO unless it was given another). Default: null.
  TORCH_ARG(std::shared_ptr<CheckpointIO>, checkpoint_io);

 public:
  /// Lightning's barebones mode, for measuring the Trainer's own overhead: every feature that
  /// may cost speed is off. true turns off checkpointing, the default logger, the progress bar,
  /// the model summary, the sanity check and the non-finite loss check (enable_checkpointing,
  /// logger, enable_progress_bar, enable_model_summary, num_sanity_val_steps = 0,
  /// detect_nonfinite_loss), and Module::log throws. Turning one of them on again afterwards,
  /// or fast_dev_run, detect_anomaly, a profiler, a logger in loggers, or a ModelCheckpoint or
  /// ProgressBar in callbacks, is a ConfigError when the Trainer is made. Callbacks of other
  /// kinds still run. Default: false.
  TrainerOptions& barebones(bool on);
  bool barebones() const { return barebones_; }

  /// Throws ConfigError on the first invalid value.
  void validate() const;

 private:
  bool barebones_ = false;
};

std::ostream& operator<<(std::ostream& os, const TrainerOptions& o);

}  // namespace volt
