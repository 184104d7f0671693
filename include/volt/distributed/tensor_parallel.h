#pragma once
/// TensorParallelEngine: Megatron-style tensor parallelism (DeepSpeed inference's
/// `tensor_parallel: {tp_size: N}`, and Megatron-LM's training), on any C++ model without editing
/// it. Linear layers are split across the ranks of a process group: a column-parallel layer keeps
/// a slice of its output features (its output stays split), the row-parallel layer after it a
/// slice of its input features, and its partial outputs are summed with one all-reduce.
/// Embeddings can be split by vocabulary rows (one all-reduce). Parameters are resharded in place
/// (same tensors, so the model's members and state dicts still point at them); restore() gathers
/// them back.
///
/// Training: where autograd records, the split layers are differentiated as Megatron's
/// conjugate operators: a column-parallel layer's input gradient is summed over the group in
/// backward ("f"), a row-parallel layer's sum passes its gradient through ("g"), so every rank
/// gets one process's gradients for the whole weights it holds and its slice of the split ones,
/// with the same data on every rank. Build the optimizer after the engine (its state then has the
/// shards' shapes) and clip with clip_grad_norm_ below (the norm needs every rank's shards).
/// Random ops draw from the CPU generator, whose stream is the same on every rank of the group
/// (as dropout on whole activations needs: they stay equal across the group); dropout on split
/// activations (a rank's attention heads, a column-parallel layer's output) belongs inside a
/// SplitRegionRng, which gives each rank a stream of its own (below). Either way such a model
/// trains correctly but not bit-alike one process (its masks are drawn differently).

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <iosfwd>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace volt {

class ProcessGroup;

/// How one layer is split.
enum class TpStyle {
  kColwise,     ///< Linear: output features split; the output stays split across ranks.
  kColwiseQkv,  ///< Linear with packed [q; k; v] outputs: each third split (heads per rank).
  kRowwise,     ///< Linear: input features split, outputs all-reduced, bias added once.
                ///< Embedding: vocabulary rows split, lookups all-reduced.
  kReplicated,  ///< Kept whole on every rank.
};

/// "colwise", "colwise_qkv", "rowwise", "replicated" (ConfigError for anything else).
TpStyle parse_tp_style(const std::string& name);
std::string to_string(TpStyle style);

/// (pattern, style) pairs and (module type or path, row-parallel members) pairs, in order.
using TpPlan = std::vector<std::pair<std::string, TpStyle>>;
using TpInjectionPolicy = std::vector<std::pair<std::string, std::vector<std::string>>>;

struct TensorParallelOptions {
  /// Ranks the layers are split across; must equal the process group's size. Default: 1 (off).
  TORCH_ARG(int64_t, tp_size) = 1;
  /// PyTorch parallelize_module-style plan: module path glob ('*' any run of characters) ->
  /// style, e.g. {"qkv_*", kColwiseQkv}, {"proj_*", kRowwise}. Every entry must match a Linear
  /// (or, rowwise, an Embedding). Default: {}.
  TORCH_ARG(TpPlan, plan) = {};
  /// DeepSpeed's injection_policy: module type name (Module::name(), e.g. "Block") or path
  /// glob -> the member Linears whose outputs are all-reduced (row-parallel); every other Linear
  /// under a matched module is column-parallel (packed q/k/v when its name contains "qkv",
  /// "query_key_value" or "c_attn", as DeepSpeed's auto-TP). Default: {}.
  TORCH_ARG(TpInjectionPolicy, injection_policy) = {};
  /// Attention heads of the packed q/k/v layers; when set, tp_size must divide it. Default: 0
  /// (unknown: only the feature counts are checked).
  TORCH_ARG(int64_t, num_heads) = 0;
  /// Whole (unsplit) parameters used on split activations, as parameter-name globs (matched as
  /// the plan's: the whole name or a trailing part after a '.'), e.g. {"attn.q_norm.weight",
  /// "*.scale"}: a norm weight applied to this rank's heads, a scalar scale or a PReLU slope
  /// between a column- and a row-parallel layer. Each rank's backward gives such a parameter only
  /// the part of its gradient that its split activations carry; the engine sums that part over
  /// the group as each backward reaches the parameter (DTensor's Partial gradient made whole;
  /// Megatron's all-reduce of sequence-parallel gradients). A listed parameter must be used on
  /// split activations only: a use on whole activations would be counted tp_size times.
  /// ModelParallelStrategy refuses a run whose unlisted whole parameters get gradients that
  /// differ across the group (checked at the first optimizer step). Default: {}.
  TORCH_ARG(std::vector<std::string>, partial_grads) = {};
};

std::ostream& operator<<(std::ostream& os, const TensorParallelOptions& o);

/// Parses the CLI/YAML forms: plan entries "pattern=style" (e.g. "qkv_*=colwise_qkv") and
/// policy entries "Module: member, member" (e.g. "Block: attn.o, mlp.fc2"). ConfigError names
/// a malformed entry.
TpPlan parse_tp_plan(const std::vector<std::string>& entries);
TpInjectionPolicy parse_injection_policy(const std::vector<std::string>& entries);

/// The resolved plan: one row per parameter-owning layer that is split.
struct TpLayer {
  std::string path;  ///< module path, e.g. "net.fc1_0"
  std::string kind;  ///< "Linear" or "Embedding"
  TpStyle style;
};

/// Resolves `options` against `root` into the layers to split (the plan wins over the
/// injection policy for a layer both name). Throws ConfigError for a pattern matching nothing,
/// a non-Linear match, or a feature count tp_size does not divide.
std::vector<TpLayer> resolve_tensor_parallel_plan(torch::nn::Module& root,
                                                  const TensorParallelOptions& options);

class TensorParallelEngine {
 public:
  /// Splits `root`'s layers across `group` (every rank must hold the same weights: the strategy
  /// broadcasts them first). Throws ConfigError when tp_size != group size or the plan is bad.
  TensorParallelEngine(torch::nn::Module& root, std::shared_ptr<ProcessGroup> group,
                       TensorParallelOptions options);
  ~TensorParallelEngine();
  TensorParallelEngine(const TensorParallelEngine&) = delete;
  TensorParallelEngine& operator=(const TensorParallelEngine&) = delete;

  /// While a Scope lives on this thread, row-parallel layers all-reduce (and, where autograd
  /// records, the split layers are differentiated across the group). Outside one, forward on a
  /// split model is wrong: use a Scope around forward (backward needs none).
  class Scope {
   public:
    explicit Scope(TensorParallelEngine& engine);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
  };

  /// The norm of the gradients of `parameters` over the whole model: each split parameter's
  /// shards (one per rank) and every whole parameter once (its gradient is the same on every
  /// rank), as torch::nn::utils::clip_grad_norm_ computes it in one process. norm_type 2 or
  /// infinity (ValueError otherwise). Collective: every rank of the group calls it.
  double grad_norm(const std::vector<at::Tensor>& parameters, double norm_type = 2.0) const;
  /// grad_norm, then the gradients scaled by max_norm / (norm + 1e-6) where that is below 1
  /// (torch's clip_grad_norm_); returns the norm before clipping. Collective.
  double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                         double norm_type = 2.0);

  /// Whether `param` is split across the group now.
  bool is_split(const at::Tensor& param) const { return find_shard(param) != nullptr; }
  /// The whole shape of `param` (its own shape when it is not split).
  std::vector<int64_t> whole_sizes(const at::Tensor& param) const;
  /// `part` (shaped as this rank's shard of `param`: the parameter, its gradient, its optimizer
  /// state) joined with every rank's into the whole tensor. Collective: every rank calls it for
  /// the same parameters in the same order. A parameter not split gives `part` itself.
  at::Tensor gather_whole(const at::Tensor& param, const at::Tensor& part) const;
  /// This rank's shard of `whole` (shaped as `param` whole), a new tensor; what reshard keeps.
  /// A parameter not split gives `whole` itself.
  at::Tensor shard_of(const at::Tensor& param, const at::Tensor& whole) const;

  /// The names of the whole parameters outside partial_grads whose gradients differ across the
  /// group now (compared through two weighted sums per parameter, to 1e-4 of its gradient's
  /// absolute sum): used on split activations, each rank holds only a part of their gradient
  /// (list them in partial_grads). Empty when they agree or nothing is split; nullopt when a
  /// gradient is not finite on some rank (nothing to judge: ask at a later step). Collective.
  c10::optional<std::vector<std::string>> whole_grads_differing() const;
  /// Starts summing the gradients of partial_grads' parameters that require a gradient now; the
  /// constructor calls it, call it again after a listed parameter starts requiring one.
  void track_partial_grads();

  /// Gathers every split parameter back to its full shape (collective: all ranks call it).
  void restore();
  /// Splits again after restore() (e.g. once whole weights were loaded); no-op when split.
  void reshard();
  bool split() const { return split_; }
  const std::vector<TpLayer>& layers() const { return layers_; }
  /// Bytes of the root's parameters held by this rank now.
  int64_t parameter_bytes() const;
  /// Bytes the same parameters take whole (before splitting).
  int64_t full_parameter_bytes() const { return full_bytes_; }

  /// How a parameter is split, as a distributed checkpoint records it beside each shard:
  /// dim -1 when it is whole; packed for [q; k; v] along dim 0 with each third split.
  struct SplitLayout {
    int64_t dim = -1;
    bool packed = false;
  };
  SplitLayout split_layout(const at::Tensor& param) const;
  /// Every rank's shard (rank order) of a parameter split as `layout`, joined into the whole
  /// tensor as gather_whole joins them; no group needed (a checkpoint's consolidation).
  /// ValueError for shards whose shapes differ or an empty list.
  static at::Tensor join_shards(const std::vector<at::Tensor>& shards, const SplitLayout& layout);

  struct Shard;  // one split parameter (public for the interceptor)

 private:
  const Shard* find_shard(const at::Tensor& param) const;

  torch::nn::Module& root_;
  std::shared_ptr<ProcessGroup> group_;
  TensorParallelOptions options_;
  std::vector<TpLayer> layers_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t full_bytes_ = 0;
  bool split_ = false;
  // partial_grads' parameters and their gradient hooks (none until they require a gradient).
  struct PartialGrad {
    at::Tensor param;
    std::string name;
    c10::optional<unsigned> hook;
  };
  std::vector<PartialGrad> partial_;
};

/// Megatron-LM's model-parallel random state (`get_cuda_rng_tracker().fork()`), for dropout on
/// split activations: while a guard lives inside a TensorParallelEngine::Scope of a split
/// engine on this thread, the CPU generator draws from a stream of this rank's own, so the
/// ranks draw different masks for their different parts (with the shared stream the same mask
/// would repeat in every rank's part: attention head h and head h + heads/2 dropped alike at 2
/// ranks). Dropout outside the guard, on whole activations, keeps drawing the same on every
/// rank, as it must. The rank's stream is seeded from one draw of the shared stream and the
/// rank, then the shared stream is put back as it was after that draw: every rank's shared
/// stream advances alike, activation checkpointing replays the masks (it replays the shared
/// stream and the Scope), and a checkpoint's generator states resume them. Without such a Scope
/// (one process, tp_size 1, a forward outside one) it does nothing, so the model's code runs
/// unchanged. The CPU generator only (CUDA tensors draw from the CUDA generator: not run here).
///
///   {
///     volt::SplitRegionRng split_rng;  // this rank's heads get masks of their own
///     probs = torch::dropout(probs, 0.1, is_training());
///   }
class SplitRegionRng {
 public:
  SplitRegionRng();
  ~SplitRegionRng();
  SplitRegionRng(const SplitRegionRng&) = delete;
  SplitRegionRng& operator=(const SplitRegionRng&) = delete;

 private:
  at::Tensor shared_;  // the shared stream's state to put back (undefined: nothing forked)
};

}  // namespace volt
