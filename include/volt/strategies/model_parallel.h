#pragma once
/// ModelParallelStrategy ("model_parallel"): tensor-parallel training under the Trainer, with
/// data parallelism across the tensor-parallel groups (Lightning's ModelParallelStrategy: a 2-D
/// mesh of data_parallel_size × tensor_parallel_size processes; Megatron-LM's tensor and data
/// axes). Consecutive ranks form a tensor-parallel group that splits the model's Linear (and
/// Embedding) layers by a plan (TensorParallelEngine); the groups read different shards of the
/// data, and the ranks holding the same shard of a layer in different groups average their
/// gradients during backward (c10d's Reducer over those ranks: buckets all-reduced as they fill,
/// overlapped with the rest of backward, as DDP). Checkpoints are a folder of the
/// tensor-parallel ranks' shards (save_distributed_checkpoint, Lightning's default: no rank holds
/// the whole model to save it), or one file of the whole model and optimizer state; either
/// resumes at any layout and loads in one process. Every rank holds the whole trained model when
/// a run ends. With sync_batchnorm, BatchNorm layers (on whole activations: the ranks of a
/// tensor-parallel group see the same batch) normalise over the data-parallel replicas' batches.

#include <torch/arg.h>

#include <iosfwd>
#include <memory>
#include <string>

#include "volt/distributed/tensor_parallel.h"
#include "volt/strategies/ddp.h"

namespace volt {

struct ModelParallelStrategyOptions {
  /// Ranks each split layer is split across; the world size over it is the data-parallel size.
  /// 0: every process of a node (Lightning's "auto": devices per node). Default: 0.
  TORCH_ARG(int64_t, tensor_parallel_size) = 0;
  /// Which layers are split and how: TensorParallelOptions' plan (module path glob -> style),
  /// injection_policy (module type -> its row-parallel members) and num_heads (checked against
  /// the tensor-parallel size). One of plan / injection_policy must name a layer.
  TORCH_ARG(TpPlan, plan) = {};
  TORCH_ARG(TpInjectionPolicy, injection_policy) = {};
  TORCH_ARG(int64_t, num_heads) = 0;
  /// TensorParallelOptions::partial_grads: whole parameters used on split activations, whose
  /// gradients are summed over the tensor-parallel group. A run whose other whole parameters get
  /// gradients that differ across the group stops at its first optimizer step with a
  /// ConfigError naming them. Default: {}.
  TORCH_ARG(std::vector<std::string>, partial_grads) = {};
  /// The data-parallel replicas' gradient buckets (DDP's, over each rank's shards; none with
  /// one replica), with DdpStrategyOptions' meanings: bucket size in MiB; find_unused_parameters
  /// for a forward that skips some parameters (not with activation checkpointing, whose
  /// recomputation DDP's search cannot see); static_graph for a graph that never changes (also
  /// covers skipped parameters, and activation checkpointing). Defaults: 25, false, false.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  TORCH_ARG(bool, find_unused_parameters) = false;
  TORCH_ARG(bool, static_graph) = false;
  /// Lightning's save_distributed_checkpoint. true: a checkpoint is a folder in which each rank
  /// of the first tensor-parallel group writes its shards of the weights and optimizer state
  /// (the other replicas hold the same); the same tensor-parallel size resumes from each rank's
  /// own file, anything else (another size, one process, load_weights, other strategies) joins
  /// the shards first (consolidate_model_parallel_checkpoint). false: the weights and optimizer
  /// state are gathered whole and rank 0 writes one file. Default: true.
  TORCH_ARG(bool, save_distributed_checkpoint) = true;
  /// Bound on rendezvous and every collective (seconds). Default: 60.
  TORCH_ARG(double, timeout_s) = 60.0;
  /// "auto" (gloo on CPU, nccl on CUDA), "gloo" or "nccl". Default: "auto".
  TORCH_ARG(std::string, process_group_backend) = "auto";
};

std::ostream& operator<<(std::ostream& os, const ModelParallelStrategyOptions& o);

class ModelParallelStrategy : public DdpStrategy {
 public:
  ModelParallelStrategy(ModelParallelStrategyOptions options,
                        std::shared_ptr<Accelerator> accelerator,
                        std::shared_ptr<Precision> precision, int64_t devices,
                        int64_t num_nodes = 1,
                        std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  ~ModelParallelStrategy() override;
  std::string name() const override { return "model_parallel"; }
  const ModelParallelStrategyOptions& model_parallel_options() const { return options_; }

  /// The ranks of a tensor-parallel group read the same batches; each group its own shard.
  DataShard data_shard() const override { return {dp_rank_, dp_size_}; }
  void setup_environment() override;
  void teardown() override;
  void setup_module(Module& module) override;
  void setup_optimizers(Module& module, std::vector<OptimizerConfig>& optimizers) override;
  void trainable_parameters_changed(Module& module) override;
  std::shared_ptr<void> training_forward_context(Module& module) override;
  void validation_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  void test_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  void backward(const at::Tensor& loss, Module& module, bool sync_gradients) override;
  void backward_through(const at::Tensor& loss, const std::vector<Reached>& modules) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer, c10::optional<double> clip_value,
                      ClipAlgorithm algorithm, const ClipCall& clip) override;
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, double value,
                            ClipAlgorithm algorithm) override;

  void save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const override;
  void load_model_state(Module& module, torch::serialize::InputArchive& ar,
                        bool strict) const override;
  void save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                            torch::serialize::OutputArchive& ar) const override;
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                            torch::serialize::InputArchive& ar) const override;
  void save_accumulated_gradients(const Module& module,
                                  torch::serialize::OutputArchive& ar) const override;
  void load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar) override;
  /// save_distributed_checkpoint: a folder of shards, written by the first tensor-parallel
  /// group's ranks, swapped in whole (the previous checkpoint stays until then).
  void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) override;
  /// A folder of this tensor-parallel size: this rank's own shards; anything else consolidated.
  torch::serialize::InputArchive load_checkpoint(const std::string& path) override;

  /// The tensor-parallel engine of the module set up (nullptr before setup_module / after
  /// teardown).
  TensorParallelEngine* engine() const { return engine_.get(); }
  /// The mesh, once setup_environment ran.
  int64_t tensor_parallel_size() const { return tp_size_; }
  int64_t data_parallel_size() const { return dp_size_; }

 private:
  ModelParallelStrategyOptions options_;
  int64_t devices_;  // processes per node
  int64_t tp_size_ = 1, dp_size_ = 1, dp_rank_ = 0;
  std::shared_ptr<ProcessGroup> tp_group_;  // this rank's tensor-parallel group
  std::shared_ptr<ProcessGroup> dp_group_;  // the same shard in every group (none when one)
  std::unique_ptr<TensorParallelEngine> engine_;
  const Module* module_ = nullptr;    // the module set up, until teardown
  bool whole_grads_checked_ = false;  // whether a step compared the whole gradients

  // At the first step with finite gradients: a ConfigError naming the whole parameters whose
  // gradients differ across the tensor-parallel group (used on split activations, unlisted in
  // partial_grads). Collective.
  void check_whole_grads();

  // Whether checkpoints are written as shards now (the option, and the weights are split).
  bool shards_checkpoints() const;
  // The first of `module`'s parameters a shard's record (detail::kTpRecord) splits otherwise
  // than the engine does now ("" when none).
  std::string split_difference(const Module& module, torch::serialize::InputArchive& record) const;
};

/// True when `path` is a complete checkpoint folder ModelParallelStrategy wrote with
/// save_distributed_checkpoint (its metadata file is written last).
bool is_model_parallel_checkpoint(const std::string& path);

/// Joins such a folder's shards into one ordinary volt checkpoint file at `out`: the whole
/// weights, the whole optimizer states (unless weights_only) and everything else rank 0 saved,
/// wherever the checkpoint keeps them (a Trainer's weights and optimizers, a Fabric state's
/// modules and optimizers). Any strategy, any layout and one process load the result; every
/// strategy also reads the folder itself this way. CheckpointError for an incomplete folder or
/// a missing or inconsistent shard.
void consolidate_model_parallel_checkpoint(const std::string& folder, const std::string& out,
                                           bool weights_only = false);

}  // namespace volt
