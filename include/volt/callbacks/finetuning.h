#pragma once
/// BaseFinetuning and BackboneFinetuning: train part of a model first and unfreeze the rest later
/// with a param group of its own, as Lightning's callbacks of those names (transfer learning: a
/// pretrained backbone frozen while a new head learns, then fine-tuned at a smaller rate).

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

/// Freezes in setup (before configure_optimizers and before a DDP strategy builds its gradient
/// buckets) what freeze_before_training chooses, and calls finetune_function when each training
/// epoch starts, once per optimizer, to unfreeze and change learning rates. Its checkpointed
/// state (which parameters were frozen, the param groups it added, the BatchNorm layers it
/// froze) puts a resumed fit where the interrupted one was, so a resume is exact; a resumed epoch
/// does not call finetune_function a second time.
///
/// A frozen BatchNorm layer (freeze with train_bn=false) keeps its running statistics as they
/// are: libtorch's BatchNorm updates them even with track_running_stats off, so its momentum is
/// set to 0 while frozen and given back by make_trainable (with num_batches_tracked as it was
/// when frozen). In training it normalises with the
/// batch's statistics, in evaluation with the running ones, as PyTorch's frozen layer.
class BaseFinetuning : public Callback {
 public:
  /// Freezes what must not train at first (e.g. `freeze(*module.named_children()["backbone"])`).
  virtual void freeze_before_training(Module& module) = 0;
  /// Unfreezes (unfreeze_and_add_param_group) and sets learning rates when training epoch
  /// `epoch` starts; called for every optimizer of the module.
  virtual void finetune_function(Module& module, int64_t epoch,
                                 torch::optim::Optimizer& optimizer) = 0;

  // Helpers, as Lightning's BaseFinetuning static methods. Freezing a BatchNorm layer keeps its
  // momentum to give back, so the ones that may touch one are members.

  /// `modules` and its submodules that have no children or parameters of their own.
  static std::vector<torch::nn::Module*> flatten_modules(torch::nn::Module& modules);
  /// The parameters of those modules whose requires_grad equals `requires_grad`; BatchNorm
  /// layers' are left out when train_bn is false.
  static std::vector<at::Tensor> filter_params(torch::nn::Module& modules, bool train_bn = true,
                                               bool requires_grad = true);
  /// `params` less those already in one of the optimizer's param groups (warned once per call
  /// that skips any). Lightning compares values here; volt compares the tensors themselves.
  static std::vector<at::Tensor> filter_on_optimizer(const torch::optim::Optimizer& optimizer,
                                                     const std::vector<at::Tensor>& params);
  /// Every parameter of `modules` requires a gradient again; frozen BatchNorm layers get their
  /// momentum back.
  void make_trainable(torch::nn::Module& modules);
  /// `module`'s own parameters stop requiring a gradient (a BatchNorm layer's running statistics
  /// stop updating).
  void freeze_module(torch::nn::Module& module);
  /// Freezes every module of `modules`; BatchNorm layers stay trainable when train_bn is true.
  void freeze(torch::nn::Module& modules, bool train_bn = true);
  /// make_trainable(modules), then adds their trainable parameters that the optimizer does not
  /// hold yet as a new param group (the optimizer's default options) with learning rate `lr`,
  /// or the first group's rate / initial_denom_lr when `lr` is not given. Nothing is added when
  /// no parameter is left. ConfigError when lr or initial_denom_lr is not positive.
  void unfreeze_and_add_param_group(torch::nn::Module& modules, torch::optim::Optimizer& optimizer,
                                    c10::optional<double> lr = c10::nullopt,
                                    double initial_denom_lr = 10.0, bool train_bn = true);

  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_load_optimizer_states(RunContext& run, Module& module) override;
  void on_train_epoch_start(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

 private:
  /// What a frozen BatchNorm layer gets back when made trainable: its momentum, and its
  /// num_batches_tracked (libtorch counts the batches of a layer that trains, frozen or not;
  /// PyTorch's frozen layer does not).
  struct FrozenBatchNorm {
    c10::optional<double> momentum;
    int64_t num_batches_tracked = 0;
  };
  struct Saved {
    int64_t finetuned_epoch = -1;
    std::vector<std::string> frozen_params;
    std::map<std::string, FrozenBatchNorm> frozen_bn;           // by the layer's name
    std::vector<std::vector<std::vector<std::string>>> groups;  // optimizer -> group -> names
  };
  void record_groups(RunContext& run, Module& module);

  Module* root_ = nullptr;  // the module of the current run (setup)
  int64_t finetuned_epoch_ = -1;
  std::map<torch::nn::Module*, FrozenBatchNorm> frozen_bn_;
  std::vector<std::vector<std::vector<std::string>>> groups_;
  c10::optional<Saved> loaded_;
};

/// Options of BackboneFinetuning, with Lightning's defaults.
struct BackboneFinetuningOptions {
  /// The epoch (from 0) at which the backbone is unfrozen. Default: 10.
  TORCH_ARG(int64_t, unfreeze_backbone_at_epoch) = 10;
  /// Each epoch after the unfreeze, the backbone's rate is multiplied by lambda_func(epoch + 1).
  /// Default: 2 (Lightning's `multiplicative`).
  TORCH_ARG(std::function<double(int64_t)>, lambda_func) = [](int64_t) { return 2.0; };
  /// The backbone starts at this fraction of the first param group's rate (0: it stays still,
  /// as lambda_func returning 0 holds it). Default: 0.1.
  TORCH_ARG(double, backbone_initial_ratio_lr) = 0.1;
  /// The backbone's starting rate; overrides backbone_initial_ratio_lr. Default: none.
  TORCH_ARG(c10::optional<double>, backbone_initial_lr);
  /// The backbone's rate never grows above the first param group's. Default: true.
  TORCH_ARG(bool, should_align) = true;
  /// Passed to unfreeze_and_add_param_group (used there only without a rate). Default: 10.
  TORCH_ARG(double, initial_denom_lr) = 10.0;
  /// BatchNorm layers of the backbone train while it is frozen. Default: true.
  TORCH_ARG(bool, train_bn) = true;
  /// Logs the head's and the backbone's rates each epoch from the unfreeze on. Default: false.
  TORCH_ARG(bool, verbose) = false;
  /// Decimals of the rates logged with verbose. Default: 12.
  TORCH_ARG(int64_t, rounding) = 12;
  /// The submodule to freeze: its name, or a dotted path ("encoder.backbone"), among the
  /// module's registered submodules (Lightning: the `backbone` attribute). Default: "backbone".
  TORCH_ARG(std::string, backbone) = "backbone";
};

std::ostream& operator<<(std::ostream& os, const BackboneFinetuningOptions& o);

/// Lightning's BackboneFinetuning: the module's `backbone` submodule is frozen until epoch
/// unfreeze_backbone_at_epoch, then added to the optimizer as a param group at
/// backbone_initial_lr (or backbone_initial_ratio_lr × the first group's rate), whose rate is
/// then multiplied by lambda_func(epoch + 1) each epoch, capped at the first group's rate when
/// should_align. With a DDP strategy the gradient buckets are rebuilt at the unfreeze, so the
/// backbone's gradients are averaged over the ranks from then on; ZeRO (DeepSpeed) refuses the
/// change (ConfigError). CLI: `--trainer.callbacks+=BackboneFinetuning`.
class BackboneFinetuning : public BaseFinetuning {
 public:
  /// ConfigError on an option out of range.
  explicit BackboneFinetuning(BackboneFinetuningOptions options = {});
  const BackboneFinetuningOptions& options() const { return options_; }
  /// The rate this callback last gave the backbone's group (none before the unfreeze).
  c10::optional<double> backbone_lr() const { return previous_backbone_lr_; }

  std::string state_key() const override { return "BackboneFinetuning"; }
  /// A new fit starts with the backbone frozen again and no rate of its own.
  void setup(RunContext& run, Module& module, Stage stage) override;
  /// ConfigError when the module has no submodule at options().backbone().
  void freeze_before_training(Module& module) override;
  void finetune_function(Module& module, int64_t epoch,
                         torch::optim::Optimizer& optimizer) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

 private:
  torch::nn::Module& backbone_of(Module& module) const;

  BackboneFinetuningOptions options_;
  c10::optional<double> previous_backbone_lr_;
};

}  // namespace volt
