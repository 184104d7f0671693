#pragma once
/// The tuners as Lightning's callbacks: LearningRateFinder and BatchSizeFinder run lr_find and
/// scale_batch_size inside an entry point (in Trainers of their own) and give the run what they
/// found: the rate its optimizer starts at, the batch size its DataModule's loaders are built at.

#include <c10/util/Optional.h>

#include <string>

#include "volt/callbacks/callback.h"
#include "volt/tuner/batch_size_finder.h"
#include "volt/tuner/lr_finder.h"

namespace volt {

/// When fit starts (on_fit_start: after the optimizers are configured and a checkpoint is
/// restored), runs volt::lr_find on the fit's training loader (a DataModule's is asked for
/// again, so a BatchSizeFinder listed before this callback has set its size) with the Trainer's
/// options, in a Trainer of its own, which calls the module's configure_optimizers and hooks
/// again (a module keeping its optimizer in a member sees the trial's); the module's weights,
/// buffers and CPU random state are put back afterwards. With update_attr (the default) every
/// param group of the fit's optimizer then starts at the suggested rate, its LR scheduler
/// started again from it (LRScheduler::restart_at), so the fit trains as if configure_optimizers
/// had used that rate. Lightning also sets the module's `lr` / `learning_rate` attribute; a C++
/// module has none, so read optimal_lr().
///
/// The result is checkpointed: a resumed fit does not run the test again (its optimizer state
/// holds the rate). Strategy single_device or ddp (ConfigError in setup otherwise): in a DDP fit
/// the trial runs on the fit's processes, each rank on its shard with averaged gradients, and
/// each step's loss is the mean over the ranks (Lightning records rank 0's), so every rank
/// finds the same rate. With fast_dev_run it does nothing (warned), as Lightning. Fit only.
class LearningRateFinder : public Callback {
 public:
  explicit LearningRateFinder(LrFinderOptions options = LrFinderOptions(), bool update_attr = true);

  std::string state_key() const override { return "LearningRateFinder"; }
  const LrFinderOptions& options() const { return options_; }
  bool update_attr() const { return update_attr_; }
  /// What the range test measured (empty before it ran, and after fast_dev_run).
  const LrFinderResult& result() const { return result_; }
  /// The suggested rate (LrFinderResult::suggestion()), unset before the test or when it
  /// suggested none.
  c10::optional<double> optimal_lr() const { return optimal_lr_; }

  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_fit_start(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

 private:
  LrFinderOptions options_;
  bool update_attr_;
  LrFinderResult result_;
  c10::optional<double> optimal_lr_;
  bool done_ = false;  // the test ran in this fit or the checkpoint it resumes from
};

/// Runs volt::scale_batch_size for the entry point it is part of, in Trainers of its own built
/// from the Trainer's options (the module's weights, buffers and CPU random state are put back
/// afterwards), and sets the size found on the entry point's DataModule:
/// - fit: when fit starts (on_fit_start: after a checkpoint is restored); the fit then rebuilds
///   its training and validation loaders at that size, as Lightning resets its loaders. The size
///   is checkpointed, so a resumed fit takes it from the checkpoint without searching (an exact
///   resume needs the same batches).
/// - validate, test, predict: in setup, before the entry point asks the DataModule for its
///   loader.
/// Needs a DataModule that overrides batch_size() and set_batch_size() (Lightning's
/// batch_arg_name) and one process on one device (strategy single_device): ConfigError in setup
/// otherwise, as Lightning's refusals of loaders passed directly and of distributed strategies.
/// The options' `stage` is not used: the entry point decides. With fast_dev_run it does nothing
/// (warned), as Lightning.
class BatchSizeFinder : public Callback {
 public:
  explicit BatchSizeFinder(BatchSizeFinderOptions options = BatchSizeFinderOptions());

  std::string state_key() const override { return "BatchSizeFinder"; }
  const BatchSizeFinderOptions& options() const { return options_; }
  /// The last search's trials and size (empty before one ran).
  const BatchSizeFinderResult& result() const { return result_; }
  /// The size the last entry point ran at by this callback's choice (searched, or for a resumed
  /// fit, the checkpoint's), unset before.
  c10::optional<int64_t> optimal_batch_size() const { return optimal_batch_size_; }

  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_fit_start(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

 private:
  /// Searches for `stage` with the DataModule's `make` loader and sets the size found.
  void search(RunContext& run, Module& module, Stage stage);
  BatchSizeFinderOptions options_;
  BatchSizeFinderResult result_;
  c10::optional<int64_t> optimal_batch_size_;
  c10::optional<int64_t> fit_batch_size_;  // the fit's size, from the search or a checkpoint
};

}  // namespace volt
