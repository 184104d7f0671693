#pragma once
/// DdpStrategy: distributed data parallel over c10d ("ddp"): one process per device, gradients
/// averaged by c10d's Reducer during backward, Gloo on CPU (NCCL on CUDA where built).

#include <torch/arg.h>
#include <iosfwd>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "volt/distributed/cluster_environment.h"
#include "volt/strategies/strategy.h"

namespace volt {

class GradientReducer;
class LocalLauncher;
class ProcessGroup;
struct RendezvousStore;
class SyncBatchNorm;

struct DdpStrategyOptions {
  /// Gradient bucket size in MiB: each bucket is one all-reduce, overlapped with backward.
  /// Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Each parameter's .grad is a view into its bucket (no copies, one buffer less); gradients
  /// are then zeroed in place instead of being set to none. Default: false.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// The used parameters and their order never change (skips the per-step graph search, a
  /// parameter used twice is reduced once). Default: false.
  TORCH_ARG(bool, static_graph) = false;
  /// Find parameters without a gradient in each step (models whose used parameters vary).
  /// Default: false.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Broadcast buffers (e.g. BatchNorm statistics) from rank 0 before every training forward.
  /// Default: true.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Bound on rendezvous and on every collective, in seconds; past it the job fails with
  /// DistributedError naming what was lost. Default: 60.
  TORCH_ARG(double, timeout_s) = 60.0;
  /// "auto" (gloo on CPU, nccl on CUDA), "gloo" or "nccl". Default: "auto".
  TORCH_ARG(std::string, process_group_backend) = "auto";
  /// Elastic restarts: when a rank dies or hangs, each node's launching process kills its local
  /// workers, relaunches them (VOLT_RESTART_COUNT=k in their environment), the ranks re-form the
  /// group through the store rank 0 kept serving, and fit() resumes from rank 0's newest last
  /// checkpoint (on several nodes it must be on a filesystem they share), up to this many times.
  /// Applies where volt launched the workers itself; give every node the same value. Under
  /// torchrun use its --max-restarts: its restarted attempts resume the same way. Default: 0.
  TORCH_ARG(int64_t, max_restarts) = 0;
};

std::ostream& operator<<(std::ostream& os, const DdpStrategyOptions& o);

/// Lightning's DDPStrategy on c10d. A plain process started with devices = N launches its N-1
/// local workers itself (re-executing the same binary); under torchrun, Slurm, Open MPI or the
/// reference's MASTER_ADDR / NODE_RANK variables it joins that job instead
/// (detect_cluster_environment). Parameters and buffers are broadcast from rank 0 at set-up;
/// checkpoints are written by rank 0 and hold the full model, so any world size loads them.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(DdpStrategyOptions options, std::shared_ptr<Accelerator> accelerator,
              std::shared_ptr<Precision> precision, int64_t devices, int64_t num_nodes = 1,
              std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  ~DdpStrategy() override;
  /// For a tuner's trial inside a run of `run` (LearningRateFinder in a DDP fit): a strategy
  /// over the same processes, already launched and joined (`run`'s options, accelerator, cluster
  /// environment and process group), with `precision` and gradient buckets of its own, so the
  /// trial's Trainer leaves `run` as it was. It launches nothing and rendezvouses with no one;
  /// `run` must have its process group already (InternalError otherwise).
  static std::shared_ptr<DdpStrategy> sharing_processes_of(const DdpStrategy& run,
                                                           std::shared_ptr<Precision> precision);
  std::string name() const override { return "ddp"; }
  const DdpStrategyOptions& options() const { return options_; }

  void launch() override;
  void setup_environment() override;
  int64_t rank() const override { return env_.global_rank; }
  int64_t local_rank() const override { return env_.local_rank; }
  int64_t node_rank() const override { return env_.node_rank; }
  int64_t world_size() const override { return env_.world_size; }
  /// The detected environment (valid after launch()).
  const ClusterEnvironment& environment() const { return env_; }
  void teardown() override;
  bool restart_after_failure(const std::exception& error, const std::string& checkpoint) override;
  std::string restart_checkpoint() const override { return restart_checkpoint_; }

  c10::Device root_device() const override;
  /// Broadcasts rank 0's parameters and buffers and builds the module's gradient buckets (and
  /// its SyncBatchNorm layers). Several modules may be set up (Fabric: a generator and a
  /// discriminator); each keeps its own buckets, and setting one up again replaces its own.
  void setup_module(Module& module) override;
  /// Builds the gradient buckets again over the parameters that now require a gradient.
  void trainable_parameters_changed(Module& module) override;
  /// Broadcasts rank 0's buffers of `module` (broadcast_buffers), then, with sync_batchnorm over
  /// several processes, runs its BatchNorm layers over the whole batch while the object lives.
  std::shared_ptr<void> training_forward_context(Module& module) override;
  /// The first validation step after training steps broadcasts rank 0's buffers first (with
  /// broadcast_buffers), as the DDP-wrapped module Lightning validates through during fit
  /// does: each rank's BatchNorm statistics moved with its own shard.
  void validation_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  void backward(const at::Tensor& loss, Module& module, bool sync_gradients) override;
  /// Arms the buckets of every module in `modules` (those that sync), then runs one backward:
  /// each module's gradients are averaged over the ranks as backward(loss, module) would
  /// average them.
  void backward_through(const at::Tensor& loss, const std::vector<Reached>& modules) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;

  at::Tensor reduce(const at::Tensor& value, Reduce op) const override;
  at::Tensor broadcast(const at::Tensor& value, int64_t src = 0) const override;
  std::vector<at::Tensor> all_gather(const at::Tensor& value) const override;
  void barrier(const std::string& name = "") override;
  void run_preparation(const std::string& name, bool per_node,
                       const std::function<void()>& work) override;
  bool reduce_boolean_decision(bool decision, bool all = true) const override;
  StopRequest agree_on_stop(const StopRequest& local, bool lagged) override;

  /// Every rank's partial gradients (they differ while accumulating without sync).
  void save_accumulated_gradients(const Module& module,
                                  torch::serialize::OutputArchive& ar) const override;
  void load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar) override;
  /// Every rank's generator states, so each rank resumes its own dropout stream.
  std::map<std::string, at::Tensor> rng_states() const override;
  void set_rng_states(const std::map<std::string, at::Tensor>& states) override;
  void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) override;
  void flush_checkpoints() override;

  /// The gradient reducer of `module` (after setup_module; null before): bucket buffers,
  /// parameters.
  GradientReducer* reducer(const Module& module) const;

 protected:
  ProcessGroup& group() const;
  /// Broadcasts the module's parameters and buffers from rank 0 (every rank starts alike) and
  /// keeps its buffers for the broadcast before each training forward.
  void broadcast_module_state(Module& module);
  /// After a backward: replaces the precision's rank_max_state() (fp8 amax histories) with its
  /// max over the ranks, one all-reduce for all of it, so that every rank derives the same fp8
  /// scales for the next forward. A no-op when the precision has none.
  void agree_on_precision_state();
  /// (Re)builds the gradient reducer over the module's parameters that require a gradient,
  /// averaging over `over` (default: every process; ModelParallelStrategy: the data-parallel
  /// replicas of this rank's shards).
  void build_reducer(Module& module, std::shared_ptr<ProcessGroup> over = nullptr);
  /// Removes `module`'s gradient reducer (its autograd hooks and buckets), e.g. when the
  /// parameters it was built over change shape for good.
  void drop_reducer(const Module& module);
  /// Synchronises `module`'s BatchNorm layers over `over` (SyncBatchNorm; logged with the
  /// number of layers), replacing what it synchronised before; DdpStrategy's setup_module calls
  /// it over every process with sync_batchnorm, ModelParallelStrategy over the data-parallel
  /// replicas.
  void sync_batchnorm_over(Module& module, std::shared_ptr<ProcessGroup> over);
  /// The SyncBatchNorm scope of `module` for a training forward (nullptr when none).
  std::shared_ptr<void> sync_batchnorm_scope(const Module& module);
  /// The process group (after setup_environment).
  std::shared_ptr<ProcessGroup> group_;

 private:
  DdpStrategyOptions options_;
  int64_t devices_;
  int64_t num_nodes_;
  ClusterEnvironment env_;
  bool launched_ = false;
  int64_t restarts_ = 0;
  std::string restart_checkpoint_;
  std::unique_ptr<LocalLauncher> launcher_;
  /// The store rank 0 hosts, kept through elastic restarts (the next attempt joins it again).
  std::shared_ptr<RendezvousStore> rendezvous_;
  /// What each set-up module synchronizes: its gradient reducer, SyncBatchNorm layers
  /// (sync_batchnorm with several processes) and buffers; created by setup_module.
  struct ModuleSync;
  ModuleSync* find_sync(const Module& module) const;
  ModuleSync& sync_of(const Module& module);
  std::vector<std::unique_ptr<ModuleSync>> synced_;
  /// The lagged stop vote under way (agree_on_stop), if any.
  struct StopVote;
  std::unique_ptr<StopVote> stop_vote_;
};

}  // namespace volt
