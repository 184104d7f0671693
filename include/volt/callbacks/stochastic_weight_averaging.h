#pragma once
/// StochasticWeightAveraging: averages the weights of the last epochs of training and puts the
/// average into the module at the end of fit, as Lightning's callback of that name (Izmailov et
/// al., "Averaging Weights Leads to Wider Optima and Better Generalization", 2018).
///
///   volt::TrainerOptions().max_epochs(20).callbacks(
///       {std::make_shared<volt::StochasticWeightAveraging>(
///           volt::StochasticWeightAveragingOptions({0.05}).swa_epoch_start(0.75))});
///
/// From the first SWA epoch on, the learning rate of each param group anneals to its swa_lr over
/// annealing_epochs epochs (torch.optim.swa_utils.SWALR's schedule) in place of the module's LR
/// scheduler, and the weights at the end of every SWA epoch join a running average. After the
/// last training batch of the last epoch (max_epochs) the average replaces the module's
/// parameters and, if the module has BatchNorm layers, their running statistics are recomputed
/// for the averaged weights with one forward pass over the training data (torch's update_bn), so
/// that epoch's validation, ModelCheckpoint and EarlyStopping see the averaged model. A fit that
/// stops earlier gets the average of the SWA epochs it ran when training ends; so does a fit
/// without max_epochs (-1: max_steps, max_time or a Timer ends it), which needs swa_epoch_start
/// as an epoch number, as Lightning's (its BatchNorm statistics are recomputed there too,
/// where Lightning leaves them as trained). The average, its
/// count and the schedule are in checkpoints: a resumed fit ends with the same weights as an
/// uninterrupted one.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/callbacks/average_fn.h"
#include "volt/callbacks/callback.h"
#include "volt/core/limit.h"
#include "volt/optim/lr_scheduler.h"

namespace volt {

/// Lightning's arguments and defaults.
struct StochasticWeightAveragingOptions {
  /// `swa_lrs`: the SWA learning rate, one value for every param group or one per group (> 0).
  StochasticWeightAveragingOptions(std::vector<double> swa_lrs)  // NOLINT: implicit by design
      : swa_lrs_(std::move(swa_lrs)) {}
  TORCH_ARG(std::vector<double>, swa_lrs);
  /// First SWA epoch: a count N >= 1 is the N-th epoch (0-based index N - 1); a fraction f in
  /// [0, 1] is the int(f * max_epochs)-th (index max(int(f * max_epochs) - 1, 0)).
  /// Default: 0.8.
  TORCH_ARG(Limit, swa_epoch_start) = Limit(0.8);
  /// Epochs over which the lr anneals to swa_lrs (0: at once). Default: 10.
  TORCH_ARG(int64_t, annealing_epochs) = 10;
  /// Default: AnnealStrategy::kCos.
  TORCH_ARG(AnnealStrategy, annealing_strategy) = AnnealStrategy::kCos;
  /// How a new epoch's weights join the average. Default (empty): the equal-weight mean,
  /// averaged + (current - averaged) / (n + 1).
  TORCH_ARG(AverageFn, avg_fn);
  /// Where the averaged weights are kept; nullopt = with the module's parameters.
  /// Default: the CPU (Lightning's default; keeps accelerator memory free).
  TORCH_ARG(c10::optional<c10::Device>, device) = c10::Device(c10::kCPU);
};

std::ostream& operator<<(std::ostream& os, const StochasticWeightAveragingOptions& o);

class StochasticWeightAveraging : public Callback {
 public:
  /// ConfigError when swa_lrs is empty or holds a value that is not positive and finite,
  /// swa_epoch_start is a count below 1 or a fraction outside [0, 1], or annealing_epochs < 0.
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);
  ~StochasticWeightAveraging() override;

  std::string state_key() const override { return "StochasticWeightAveraging"; }
  /// ConfigError with several optimizers, with a fraction swa_epoch_start and no max_epochs,
  /// with DeepSpeed (sharded weights,
  /// as Lightning refuses them), with swa_lrs not matching the param groups, with a start past
  /// the last epoch, and with BatchNorm layers under manual optimization.
  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_epoch_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_fit_end(RunContext& run, Module& module) override;
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  const StochasticWeightAveragingOptions& options() const { return options_; }
  /// 0-based index of the first SWA epoch (resolved at fit start; -1 before).
  int64_t swa_start() const { return swa_start_; }
  /// Epoch weights averaged so far.
  int64_t n_averaged() const;
  /// The averaged parameters by name (empty before the first average).
  std::vector<std::pair<std::string, at::Tensor>> averaged_parameters() const;

 private:
  struct State;
  /// Adds the module's current weights, which are those at the end of `epoch`, to the average.
  void update_average(int64_t epoch);
  /// From the first SWA epoch on: the module's scheduler held still, the lr set for `epoch`.
  void apply_schedule(RunContext& run, int64_t epoch);
  /// Adds the weights of the epoch that just ended, puts the average into the module and
  /// recomputes BatchNorm statistics; once per fit.
  void finish(RunContext& run, Module& module);
  /// Gives the module's scheduler back its place (at fit end or after an error).
  void release_scheduler(RunContext& run);

  StochasticWeightAveragingOptions options_;
  int64_t swa_start_ = -1;
  int64_t latest_update_epoch_ = -1;
  /// The epoch after whose training the average went into the module (-1: not yet).
  int64_t finished_epoch_ = -1;
  std::unique_ptr<State> state_;
};

}  // namespace volt
