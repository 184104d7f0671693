#pragma once
/// WeightAveraging and EMAWeightAveraging: an average of the weights kept beside training
/// (an exponential moving average by default for EMAWeightAveraging), as Lightning 2.6's
/// callbacks of those names.
///
///   volt::TrainerOptions().max_epochs(10).callbacks(
///       {std::make_shared<volt::EMAWeightAveraging>(
///           volt::EMAWeightAveragingOptions().decay(0.999).update_starting_at_step(100))});
///
/// After each optimizer step (or epoch, as should_update() decides) the module's parameters, and
/// by default its buffers, join the average. Validation runs on the averaged weights (swapped in
/// for the validation epoch and back after it), checkpoints written during fit hold the average
/// as the module's state (so a checkpoint loaded for validate/test/predict or inference is the
/// averaged model) and the training weights in the callback's state (so a resumed fit goes on
/// from them, exactly), and when training ends the module keeps the average.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "volt/callbacks/average_fn.h"
#include "volt/callbacks/callback.h"

namespace volt {

struct WeightAveragingOptions {
  /// Where the average is kept; nullopt = beside each of the module's tensors. Default: nullopt
  /// (Lightning's default; "cpu" saves accelerator memory).
  TORCH_ARG(c10::optional<c10::Device>, device);
  /// Average the module's buffers too (BatchNorm statistics; integer buffers such as step counts
  /// are copied). Default: true (Lightning's default).
  TORCH_ARG(bool, use_buffers) = true;
  /// averaged <- avg_fn(averaged, current, n). Default (empty): the equal-weight mean (SWA).
  TORCH_ARG(AverageFn, avg_fn);
};

std::ostream& operator<<(std::ostream& os, const WeightAveragingOptions& o);

class WeightAveraging : public Callback {
 public:
  explicit WeightAveraging(WeightAveragingOptions options = {});
  ~WeightAveraging() override;

  /// Called after every optimizer step with its 0-based index (epoch_idx unset) and after every
  /// training epoch with its index (step_idx unset): whether to add the weights to the average
  /// then. Default: after every optimizer step. Override it to choose.
  virtual bool should_update(c10::optional<int64_t> step_idx,
                             c10::optional<int64_t> epoch_idx) const;

  std::string state_key() const override { return "WeightAveraging"; }
  /// ConfigError with DeepSpeed (sharded weights, as Lightning warns).
  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void on_validation_epoch_start(RunContext& run, Module& module) override;
  void on_validation_epoch_end(RunContext& run, Module& module) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;
  void on_save_checkpoint(RunContext& run, Module& module) override;
  void on_save_checkpoint_end(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  const WeightAveragingOptions& options() const { return options_; }
  /// Weights added to the average so far in this fit.
  int64_t n_averaged() const;

 private:
  struct State;
  /// Adds the weights if an update is due for the latest optimizer step or finished epoch and
  /// was not made yet: at batch and epoch ends, and before validation and checkpoints, so a
  /// checkpoint holds every update before it whatever order callbacks run in.
  void catch_up(RunContext& run);
  /// Puts the training weights back if the average is swapped in.
  void swap_back();
  WeightAveragingOptions options_;
  int64_t latest_update_step_ = 0;
  int64_t latest_update_epoch_ = -1;
  std::unique_ptr<State> state_;
};

/// Lightning's EMAWeightAveraging arguments and defaults.
struct EMAWeightAveragingOptions {
  /// average <- decay * average + (1 - decay) * current. Default: 0.999.
  TORCH_ARG(double, decay) = 0.999;
  /// Update after every n-th optimizer step (0: never by step). Default: 1.
  TORCH_ARG(int64_t, update_every_n_steps) = 1;
  /// Update by step only from this 0-based step on. Default: nullopt (from the first).
  TORCH_ARG(c10::optional<int64_t>, update_starting_at_step);
  /// Also update after every epoch from this 0-based epoch on. Default: nullopt (never).
  TORCH_ARG(c10::optional<int64_t>, update_starting_at_epoch);
  TORCH_ARG(c10::optional<c10::Device>, device);
  TORCH_ARG(bool, use_buffers) = true;
};

std::ostream& operator<<(std::ostream& os, const EMAWeightAveragingOptions& o);

class EMAWeightAveraging : public WeightAveraging {
 public:
  /// ConfigError unless 0 <= decay <= 1, update_every_n_steps >= 0 and the starts are >= 0.
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});
  bool should_update(c10::optional<int64_t> step_idx,
                     c10::optional<int64_t> epoch_idx) const override;
  std::string state_key() const override { return "EMAWeightAveraging"; }
  const EMAWeightAveragingOptions& ema_options() const { return ema_; }

 private:
  EMAWeightAveragingOptions ema_;
};

}  // namespace volt
