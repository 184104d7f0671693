#pragma once
/// Pipeline: pipeline parallelism (DeepSpeed's PipelineModule, GPipe's schedule) for a model
/// written as a sequence of layers. Each rank of a process group runs one stage, a contiguous run
/// of the layers; a batch is cut into micro-batches ("chunks") that flow through the stages, so
/// stage s works on micro-batch i while stage s+1 works on micro-batch i-1; backward runs the
/// micro-batches back in reverse order. Activations go forward and their gradients back with
/// point-to-point transfers (ProcessGroup::send / recv_).
///
/// Used as a layer of a model: `forward` returns the whole batch's output on every rank (the
/// last stage broadcasts it), so the code after it (a loss, metrics, logging) runs unchanged on
/// every rank, and `loss.backward()` drives the pipeline's backward. Without distribute() it is a
/// plain torch::nn::Sequential; its parameters have the Sequential's names ("0.weight", ...), so
/// checkpoints move between the two.
///
/// Every rank keeps every layer object; each trains only its stage's parameters (the others get
/// no gradient), and activations, gradients and optimizer state are per stage. The other stages'
/// weights stay replicated unless release_other_stages() frees them (PipelineStrategy does);
/// gather() brings every stage's parameters and buffers to every rank.
///
/// A parameter that layers of several stages share (tied weights, as DeepSpeed's TiedLayerSpec:
/// an embedding and the output projection) is held and trained by each of those stages: each
/// computes the gradient of its own uses, and the pipeline's backward sums those over the stages
/// that hold it (one all-reduce among them per backward; the other stages take no part), so each
/// holds the whole gradient and steps the weight alike. Optimizers must list it once: libtorch's
/// `parameters()` lists a shared layer's tensors once per name, so build them over
/// volt::distinct_parameters(module) (volt/nn/parameters.h). Buffers cannot be shared across
/// stages (ConfigError).
///
/// Activation memory: GPipe's schedule keeps each micro-batch's activations from its forward to
/// its backward; forward_loss() runs the 1F1B schedule instead (the loss computed inside the
/// pipeline, each micro-batch's backward started before the later ones' forwards), so stage s
/// holds at most stages - s micro-batches at once; PipelineOptions::checkpoint ("always",
/// "except_last") keeps only each micro-batch's input to the stage and recomputes the rest in
/// backward, and activation_checkpoint_interval (DeepSpeed's) checkpoints runs of a few layers.
///
/// BatchNorm: each micro-batch is normalised by its own statistics (as GPipe's); with
/// PipelineOptions::deferred_batch_norm the running statistics move once per batch, as the
/// whole batch's.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace volt {

class ProcessGroup;

struct PipelineOptions {
  /// Micro-batches each forward cuts its batch into along dim 0 (GPipe's chunks; fewer when the
  /// batch has fewer rows). More chunks keep more stages busy at once. Default: 1.
  TORCH_ARG(int64_t, chunks) = 1;
  /// Layers per stage, in order (GPipe's balance); must have one entry (>= 1) per stage and sum
  /// to the number of layers. Empty: partition_method decides. Default: {}.
  TORCH_ARG(std::vector<int64_t>, balance) = {};
  /// When balance is empty: "parameters" (DeepSpeed's default: contiguous stages whose largest
  /// parameter count is as small as it can be) or "uniform" (equal layer counts).
  /// Default: "parameters".
  TORCH_ARG(std::string, partition_method) = "parameters";
  /// Activation checkpointing of each micro-batch's run through a stage (GPipe's, as
  /// torchgpipe's and PyTorch Pipe's `checkpoint`): "never" keeps every micro-batch's
  /// activations until its backward; "always" keeps only what each micro-batch brings to the
  /// stage and recomputes its layers in backward (volt::checkpoint: the forward's random and
  /// autocast state replayed, the result the same); "except_last" spares the last micro-batch,
  /// whose backward comes first (and under forward_loss's 1F1B every one of the last stage,
  /// whose backward follows its forward). Undistributed: one (last) micro-batch. Default: "never".
  TORCH_ARG(std::string, checkpoint) = "never";
  /// DeepSpeed PipelineModule's activation_checkpoint_interval: in micro-batches that
  /// `checkpoint` leaves, each run of this many consecutive layers of a stage is checkpointed
  /// on its own (only the activations between runs are kept). 0: off. Default: 0.
  TORCH_ARG(int64_t, activation_checkpoint_interval) = 0;
  /// torchgpipe's deferred_batch_norm: the BatchNorm layers that are entries of the pipeline's
  /// Sequential update their running statistics once per batch, from all its micro-batches (as
  /// one BatchNorm over the whole batch would: the mean and the unbiased variance of every row),
  /// instead of once per micro-batch; each micro-batch is still normalised by its own statistics,
  /// so outputs and gradients are unchanged. A BatchNorm inside an entry is called by that
  /// entry's own code, which the pipeline cannot reach: ConfigError. Default: false.
  TORCH_ARG(bool, deferred_batch_norm) = false;
};

/// Whether `mode` names a PipelineOptions::checkpoint mode ("never", "always", "except_last").
bool is_checkpoint_mode(const std::string& mode);

std::ostream& operator<<(std::ostream& os, const PipelineOptions& o);

/// The first layer of each stage and, last, the number of layers (stages + 1 entries) for
/// `weights` (one per layer) split into `stages` non-empty contiguous runs: by `balance` when
/// given, else by `method` ("parameters": the largest run's weight as small as it can be, ties
/// to the earliest cut; "uniform": equal counts, the first stages one more). ConfigError for
/// more stages than layers, a bad balance or an unknown method.
std::vector<int64_t> partition_layers(const std::vector<int64_t>& weights, int64_t stages,
                                      const std::vector<int64_t>& balance,
                                      const std::string& method);

class PipelineImpl : public torch::nn::Module {
 public:
  explicit PipelineImpl(torch::nn::Sequential layers, PipelineOptions options = {});

  /// The layers' output for `x` (one tensor in, one out per layer). Distributed: every rank must
  /// call it (collective); stage 0 reads `x`, and every rank gets the last stage's output.
  /// Differentiable: the backward through it is a collective too. When stage 0's `x` needs a
  /// gradient (layers before the pipeline, or a pipeline fed its own output), the backward
  /// broadcasts it from stage 0 to every rank whose `x` needs one as well, so the code before the
  /// pipeline trains alike everywhere; such an `x` must have stage 0's element count and dtype
  /// (ValueError), which the same code on every rank gives. Random layers (dropout) draw from
  /// the CPU generator as one process running the layers in turn would: its state travels with
  /// each micro-batch, and every rank returns with the last stage's state, so code after the
  /// pipeline draws alike on every rank (with one micro-batch the draws are one process's).
  at::Tensor forward(const at::Tensor& x);

  /// The loss of a batch: a mean over its rows, as `loss_fn(output, target)` gives it.
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  /// `loss_fn(forward(x), target)`, with the stages running the 1F1B schedule (PipeDream-Flush,
  /// as DeepSpeed's TrainSchedule and Megatron's) when distributed and recording gradients:
  /// stage s runs min(stages - s - 1, micro-batches) forwards, then one forward and one backward
  /// in turn, then the remaining backwards, so it holds the activations of at most stages - s
  /// micro-batches at once where forward()'s GPipe schedule holds all of them. The last stage
  /// computes `loss_fn` on each micro-batch's output and its rows of `target` (dim 0, as `x` is
  /// cut) and backpropagates it at once, weighted by the micro-batch's share of the rows; every
  /// rank returns the weighted sum, which equals `loss_fn` over the whole batch when `loss_fn`
  /// is a mean over rows (cross entropy, MSE: the default reductions). The backward runs inside
  /// this call, with a gradient of 1; the returned loss's own backward scales those gradients by
  /// the gradient it receives (the accumulation factor, a loss scale) and adds them to the
  /// parameters' (and `x`'s, as forward() gives it) gradients, so `loss.backward()` and the code
  /// around it work as with forward(); without a backward the gradients stay as they were.
  /// `loss_fn` runs on the last stage only: it may hold no parameters (put trainable layers in
  /// the pipeline; ConfigError otherwise) and must return one element (ValueError). `target` is
  /// read on the last stage; every rank must call it (collective). Undistributed, or without
  /// gradients: exactly `loss_fn(forward(x), target)`. `output`, when given, receives what
  /// forward() would have returned, without its graph, on every rank (for metrics such as
  /// accuracy; it costs one more broadcast, and the last stage keeps each micro-batch's output).
  at::Tensor forward_loss(const at::Tensor& x, const at::Tensor& target, const LossFn& loss_fn,
                          at::Tensor* output = nullptr);

  /// Splits the layers over `group`'s ranks, one stage each (ConfigError for a bad partition or
  /// a buffer that layers of two stages share).
  /// The group must live while forward and backward run.
  void distribute(std::shared_ptr<ProcessGroup> group);
  /// Runs whole again (call gather() first to keep what the other stages learned).
  void undistribute();
  bool distributed() const { return group_ != nullptr; }
  /// Broadcasts each stage's parameters and buffers from its rank (collective): afterwards
  /// every rank holds the whole trained model (released tensors are allocated again first).
  void gather();
  /// Frees the other stages' parameters and buffers on this rank (each becomes an empty tensor
  /// of its dtype and device, the same tensor object, so optimizers and members still hold it):
  /// the rank keeps only its stage's weights. restore_other_stages() allocates them again as
  /// zeros (gather() or a load fills them). No-op when not distributed.
  void release_other_stages();
  void restore_other_stages();
  bool released() const { return !released_.empty(); }
  /// `t`'s shape, or the shape it had before release_other_stages() freed it.
  std::vector<int64_t> whole_shape(const at::Tensor& t) const;
  /// Values kept beside the module's tensors (an average of the weights, say), with the
  /// pipeline's as their stages hold them: `values[i]` is kept beside `tensors[i]`. Each entry
  /// beside a stage's parameter or buffer comes from that stage's rank (allocated at its whole
  /// shape elsewhere); the other entries are returned as given. `dst` >= 0: only the pipeline
  /// rank `dst` gathers (each stage sends its entries there); the other ranks get `values` back
  /// as given and allocate nothing. Collective over the pipeline's ranks (every rank passes the
  /// same tensors and `dst`); returns `values` when not distributed.
  std::vector<at::Tensor> gather_beside(const std::vector<at::Tensor>& tensors,
                                        std::vector<at::Tensor> values, int64_t dst = -1) const;

  int64_t stage() const { return stage_; }
  int64_t num_stages() const { return static_cast<int64_t>(bounds_.size()) - 1; }
  /// [first, last) layer indices of `stage`.
  std::pair<int64_t, int64_t> stage_layers(int64_t stage) const;
  /// The parameters of `stage`'s layers (a tied one in each stage that holds it).
  std::vector<at::Tensor> stage_parameters(int64_t stage) const;
  /// Parameters this rank does not train (the other stages' that its own does not share); empty
  /// when not distributed.
  std::vector<at::Tensor> foreign_parameters() const;
  /// The parameters and (defined) buffers of `stage`'s layers.
  std::vector<at::Tensor> stage_state(int64_t stage) const;

  const PipelineOptions& options() const { return options_; }
  void set_chunks(int64_t chunks);
  /// PipelineOptions::checkpoint (ConfigError for another value than "never", "always" or
  /// "except_last").
  void set_checkpoint(const std::string& mode);
  /// PipelineOptions::activation_checkpoint_interval (ConfigError below 0).
  void set_activation_checkpoint_interval(int64_t layers);
  /// PipelineOptions::deferred_batch_norm (ConfigError, when turned on, for a BatchNorm nested
  /// inside an entry).
  void set_deferred_batch_norm(bool on);
  const torch::nn::Sequential& layers() const { return layers_; }

  void pretty_print(std::ostream& stream) const override;

 private:
  /// The running statistics of the stage's BatchNorm entries over one forward's micro-batches.
  struct DeferredNorms;
  /// Layers [first, last) on `x`; with `deferred`, its BatchNorm entries normalise `x` without
  /// moving their statistics and add `x`'s to it.
  at::Tensor run_layers(int64_t first, int64_t last, at::Tensor x, DeferredNorms* deferred);
  /// run_layers as the checkpoint options say: the whole run checkpointed (`whole`), or in
  /// checkpointed runs of activation_checkpoint_interval layers, or plain (a recomputation adds
  /// nothing to `deferred`).
  at::Tensor run_stage(int64_t first, int64_t last, const at::Tensor& x, bool whole,
                       DeferredNorms* deferred);
  /// Under deferred_batch_norm, the training BatchNorm entries with running statistics among
  /// layers [first, last) into `out`.
  void collect_deferred(int64_t first, int64_t last, DeferredNorms* out);
  /// Whether micro-batch `i` of `chunks` runs checkpointed whole (PipelineOptions::checkpoint).
  bool checkpointed(int64_t i, int64_t chunks) const;

  torch::nn::Sequential layers_;
  PipelineOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  int64_t stage_ = 0;
  std::vector<int64_t> bounds_;
  std::vector<std::pair<at::Tensor, std::vector<int64_t>>> released_;  // tensor, whole shape
  std::vector<at::Tensor> tied_;  // parameters that layers of several stages share
  // Per tied parameter, on a stage that holds it: the group of the stages holding it (the
  // pipeline's own when every stage does), which sums its gradient; null elsewhere.
  std::vector<std::shared_ptr<ProcessGroup>> tied_groups_;
};

TORCH_MODULE(Pipeline);

}  // namespace volt
