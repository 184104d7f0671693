#pragma once
/// TensorParallelEngine: Megatron-style tensor parallelism for inference (DeepSpeed inference's
/// `tensor_parallel: {tp_size: N}`), on any C++ model without editing it. Linear layers are split
/// across the ranks of a process group: a column-parallel layer keeps a slice of its output
/// features (its output stays split), the row-parallel layer after it a slice of its input
/// features, and its partial outputs are summed with one all-reduce. Embeddings can be split by
/// vocabulary rows (one all-reduce). Parameters are resharded in place (same tensors, so the
/// model's members and state dicts still point at them); restore() gathers them back.

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

  /// While a Scope lives on this thread, row-parallel layers all-reduce (forward only: the
  /// engine is for inference). Outside one, forward on a split model is wrong: use a Scope.
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

  struct Shard;  // one split parameter (public for the interceptor)

 private:
  torch::nn::Module& root_;
  std::shared_ptr<ProcessGroup> group_;
  TensorParallelOptions options_;
  std::vector<TpLayer> layers_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t full_bytes_ = 0;
  bool split_ = false;
};

}  // namespace volt
