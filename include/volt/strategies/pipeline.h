#pragma once
/// PipelineStrategy ("pipeline"): pipeline parallelism under the Trainer. One process per
/// device, each running one stage of the model's volt::Pipeline (volt/nn/pipeline.h);
/// every process reads the same batches (the pipeline is not data parallel), runs the module's
/// own training_step (the pipeline's output reaches every rank) and steps the optimizer for its
/// stage's parameters. Gradient-norm clipping spans every stage, loss-scaling ranks agree on
/// inf/NaN gradients, and checkpoints hold the whole model and every stage's optimizer state (a
/// pipeline checkpoint resumes at any number of stages, or in one process without a pipeline).
/// When a fit ends every rank holds the whole trained model. With `stages` below the world size
/// the pipeline is replicated (pipeline × data parallel, DeepSpeed's pipe and data axes).

#include <torch/arg.h>

#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "volt/strategies/ddp.h"

namespace volt {

class PipelineImpl;

struct PipelineStrategyOptions {
  /// Micro-batches per batch; 0 keeps the model's PipelineOptions::chunks. Default: 0.
  TORCH_ARG(int64_t, chunks) = 0;
  /// Stages per pipeline; the world size divided by it is the number of data-parallel replicas
  /// of the pipeline (consecutive ranks form a pipeline, rank = replica × stages + stage; each
  /// replica reads its shard of the data and the replicas of a stage average their gradients).
  /// 0: one pipeline of every process. Default: 0.
  TORCH_ARG(int64_t, stages) = 0;
  /// Activation checkpointing of each micro-batch's run through a stage: "never", "always" or
  /// "except_last" (PipelineOptions::checkpoint); empty keeps the model's. Default: "".
  TORCH_ARG(std::string, checkpoint) = "";
  /// Checkpointed runs of this many layers of a stage (PipelineOptions::
  /// activation_checkpoint_interval; 0: off); -1 keeps the model's. Default: -1.
  TORCH_ARG(int64_t, activation_checkpoint_interval) = -1;
  /// true: the pipeline's BatchNorm entries move their running statistics once per batch
  /// (PipelineOptions::deferred_batch_norm); false keeps the model's. Default: false.
  TORCH_ARG(bool, deferred_batch_norm) = false;
  /// Bound on rendezvous, every collective and every transfer between stages (seconds).
  /// Default: 60.
  TORCH_ARG(double, timeout_s) = 60.0;
  /// Each rank frees the weights of the layers the other stages train, keeping its own stage's
  /// (and what lies outside the pipeline): they are gathered for a checkpoint and when a fit
  /// ends. false keeps every weight on every rank (a callback that reads all of them during fit
  /// then sees the other stages' as of the last gather). Default: true.
  TORCH_ARG(bool, release_other_stages) = true;
  /// "auto" (gloo on CPU, nccl on CUDA), "gloo" or "nccl". Default: "auto".
  TORCH_ARG(std::string, process_group_backend) = "auto";
};

std::ostream& operator<<(std::ostream& os, const PipelineStrategyOptions& o);

class PipelineStrategy : public DdpStrategy {
 public:
  PipelineStrategy(PipelineStrategyOptions options, std::shared_ptr<Accelerator> accelerator,
                   std::shared_ptr<Precision> precision, int64_t devices, int64_t num_nodes = 1,
                   std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  ~PipelineStrategy() override;
  std::string name() const override { return "pipeline"; }
  const PipelineStrategyOptions& pipeline_options() const { return options_; }

  /// The ranks of one pipeline read the same batches; each replica its own shard.
  DataShard data_shard() const override { return {replica_, replicas_}; }
  void setup_environment() override;
  void teardown() override;
  void setup_module(Module& module) override;
  void trainable_parameters_changed(Module& module) override {}
  void backward(const at::Tensor& loss, Module& module, bool sync_gradients) override;
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

  /// The module's pipeline once setup_module ran (nullptr before).
  PipelineImpl* pipeline() const { return pipe_.get(); }
  /// Stages per pipeline and replicas of it, once setup_environment ran.
  int64_t stages() const { return stages_; }
  int64_t replicas() const { return replicas_; }

 private:
  /// Every rank gets the whole model: each stage's layers from it, the rest from rank 0.
  void gather_model(const Module& module) const;
  int64_t owner(const std::string& name) const;
  bool trains(const at::Tensor& p) const;

  /// Averages the gradients of this stage's replicas (ProcessGroup::all_reduce_).
  void average_over_replicas(const Module& module);

  PipelineStrategyOptions options_;
  int64_t stages_ = 1, replicas_ = 1, replica_ = 0;
  std::shared_ptr<ProcessGroup> pipe_group_;  // this rank's pipeline (the whole group when one)
  std::shared_ptr<ProcessGroup> dp_group_;    // this stage's replicas (none when one)
  std::shared_ptr<PipelineImpl> pipe_;
  const Module* module_ = nullptr;  // the module set up, until teardown
  // Pipeline parameters only: the first stage that holds each (a tied one is held by several).
  std::unordered_map<const c10::TensorImpl*, int64_t> stage_of_;
  std::unordered_set<const c10::TensorImpl*> mine_;  // the parameters this rank's stage holds
  std::map<std::string, int64_t> owner_by_name_;     // every parameter: the rank holding its truth
};

}  // namespace volt
