#pragma once
/// ModelPruning: Lightning's callback of that name (torch.nn.utils.prune underneath): after
/// training epochs it zeroes a share of the weights (the smallest by magnitude, whole channels by
/// norm, or at random), keeps them at zero for the rest of the fit, and optionally rewinds the
/// survivors to their initial values (the lottery ticket hypothesis).

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

/// How much one pruning takes away: a fraction in [0, 1] or a number of the parameters (the
/// channels, for structured pruning) that are not pruned yet, as PyTorch's float or int amount.
struct PruningAmount {
  static PruningAmount fraction(double value);
  static PruningAmount count(int64_t value);
  bool is_count = false;
  double value = 0.0;
};

std::ostream& operator<<(std::ostream& os, const PruningAmount& a);

/// A parameter to prune: the registered path of its layer (e.g. "encoder.fc1") and its name in
/// that layer ("weight" or "bias").
using PrunedParameter = std::pair<std::string, std::string>;

struct ModelPruningOptions {
  /// "l1_unstructured", "random_unstructured", "ln_structured" or "random_structured"
  /// (torch.nn.utils.prune's functions of those names).
  explicit ModelPruningOptions(std::string pruning_fn) : pruning_fn_(std::move(pruning_fn)) {}
  TORCH_ARG(std::string, pruning_fn);
  /// What to prune; empty = the parameters named in parameter_names of every layer that holds
  /// one (containers such as Sequential excluded), all weights first, then all biases, as
  /// Lightning. Default: empty.
  TORCH_ARG(std::vector<PrunedParameter>, parameters_to_prune);
  /// Parameter names to prune when parameters_to_prune is empty. Default: {"weight", "bias"}.
  TORCH_ARG(std::vector<std::string>,
            parameter_names) = std::vector<std::string>({"weight", "bias"});
  /// One ranking over all the parameters together (unstructured methods only) instead of one
  /// per parameter. Default: true.
  TORCH_ARG(bool, use_global_unstructured) = true;
  /// How much each pruning removes. Default: fraction 0.5.
  TORCH_ARG(PruningAmount, amount) = PruningAmount::fraction(0.5);
  /// When set, called with the epoch at each pruning point instead of `amount`. Default: unset.
  TORCH_ARG(std::function<PruningAmount(int64_t)>, amount_fn);
  /// Whether to prune at all. Default: true.
  TORCH_ARG(bool, apply_pruning) = true;
  /// When set, called with the epoch instead of `apply_pruning`. Default: unset.
  TORCH_ARG(std::function<bool(int64_t)>, apply_pruning_fn);
  /// At the end of training, stop keeping pruned weights at zero (they are zero then, and the
  /// callback lets go of its masks). Default: true.
  TORCH_ARG(bool, make_pruning_permanent) = true;
  /// After each pruning, set the parameters that remain to their values when fit set up (the
  /// lottery ticket hypothesis). Default: true (as Lightning).
  TORCH_ARG(bool, use_lottery_ticket_hypothesis) = true;
  /// When set, called with the epoch instead of `use_lottery_ticket_hypothesis`. Default: unset.
  TORCH_ARG(std::function<bool(int64_t)>, use_lottery_ticket_hypothesis_fn);
  /// With the lottery ticket: new random values from the layer's own reset_parameters instead
  /// of the initial ones (libtorch's Linear, Bilinear, Conv and ConvTranspose, Embedding and norm
  /// layers; other layers get their initial values, as in Lightning). Default: false.
  TORCH_ARG(bool, resample_parameters) = false;
  /// The dimension whose slices (channels) structured pruning removes. Required for the
  /// structured methods. Default: unset.
  TORCH_ARG(c10::optional<int64_t>, pruning_dim);
  /// The norm ln_structured ranks channels by (torch.norm's p: 1, 2, inf ...). Required for
  /// ln_structured. Default: unset.
  TORCH_ARG(c10::optional<double>, pruning_norm);
  /// 0: quiet, 1: log the overall sparsity after each pruning, 2: also each parameter's.
  /// Default: 0.
  TORCH_ARG(int64_t, verbose) = 0;
  /// Prune when a training epoch ends; false: when the validation of fit ends. Default: true.
  TORCH_ARG(bool, prune_on_train_epoch_end) = true;
};

std::ostream& operator<<(std::ostream& os, const ModelPruningOptions& o);

/// C++ modules have no forward pre-hooks, so the pruning is kept by the parameters themselves:
/// each pruned weight is zero in the parameter (not `weight_orig * weight_mask` at every
/// forward), its gradient is masked after each backward (before clipping and the optimizer, so
/// they see what PyTorch's `weight_orig` gets) and the weights are masked again after each
/// training batch (an optimizer's momentum or weight decay would move them) and before each
/// checkpoint. The model's outputs and every surviving weight then follow PyTorch's pruning
/// exactly. The masks (and the lottery ticket's initial values) are part of the callback's
/// checkpointed state, so a resumed fit goes on pruned (Lightning keeps them only on the module,
/// and its checkpoints save the pruned weights without them). Refused with DeepSpeed (ZeRO owns
/// the gradients), with the pipeline and model_parallel strategies (each rank holds only a part
/// of the weights), and the random methods with several processes (each its own mask).
class ModelPruning : public Callback {
 public:
  explicit ModelPruning(ModelPruningOptions options);
  std::string state_key() const override { return "ModelPruning"; }
  const ModelPruningOptions& options() const { return options_; }

  /// Override to choose among the parameters resolved from the options (Lightning's
  /// filter_parameters_to_prune).
  virtual std::vector<PrunedParameter> filter_parameters_to_prune(
      std::vector<PrunedParameter> parameters) {
    return parameters;
  }
  /// Prunes `amount` more of the parameters now (what the epoch-end hook calls).
  void apply_pruning(PruningAmount amount);
  /// Sets the parameters to their values at set-up (or resampled ones), pruned ones kept at 0.
  void apply_lottery_ticket_hypothesis();
  /// Lets go of the masks: pruned weights stay at zero but are no longer held there.
  void make_pruning_permanent();

  /// The parameters being pruned, once fit has set up.
  const std::vector<PrunedParameter>& parameters_to_prune() const { return names_; }
  /// Each pruned parameter's mask by "<layer path>.<name>" (1 keeps, 0 prunes; the parameter's
  /// dtype); empty before the first pruning and after make_pruning_permanent.
  const std::map<std::string, at::Tensor>& masks() const { return masks_; }

  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_after_backward(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void on_validation_epoch_end(RunContext& run, Module& module) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_save_checkpoint(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

 private:
  void run_pruning(int64_t epoch);
  void mask_parameters();
  /// The i-th pruned parameter's value at set-up (the lottery ticket's starting point).
  const at::Tensor& initial_of(size_t i) const;

  ModelPruningOptions options_;
  std::vector<PrunedParameter> names_;
  std::vector<std::string> keys_;              // "<layer path>.<name>", as names_
  std::vector<at::Tensor> params_;             // the live parameters, as names_
  std::vector<torch::nn::Module*> layers_;     // their layers (for resample_parameters)
  std::map<std::string, at::Tensor> masks_;    // by keys_
  std::map<std::string, at::Tensor> initial_;  // lottery ticket: values at set-up, by keys_
};

}  // namespace volt
