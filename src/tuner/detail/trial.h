#pragma once
// What the tuners share about their trial runs (short fits in Trainers of their own): the
// options such a Trainer runs with, and what is put back afterwards: a module's parameters and
// buffers (copied into the same tensors, so tied weights stay tied and holders see the old
// values; gradients dropped) and torch's random state (the CPU generator and each GPU's).

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/detail/default_steps.h"
#include "core/detail/rng_states.h"
#include "volt/data/data_module.h"
#include "volt/trainer/trainer.h"
#include "volt/trainer/trainer_options.h"
#include "volt/tuner/batch_size_finder.h"
#include "volt/tuner/lr_finder.h"

namespace volt {

class Callback;
class DataModule;
class Module;
class RunContext;

namespace detail {

/// `options` for a trial: no stop but the trial's own (max_epochs -1, no minima, no max_time),
/// no sanity check, overfit_batches, checkpoints, progress bar, summary, loggers, callbacks,
/// profiler or CheckpointIO (a tuner callback's trials run inside a fit that owns those).
/// The caller adds its stop and batch limits.
TrainerOptions trial_options(TrainerOptions options);

/// A trial's loader as a DataModule that forwards the batch hooks (on_before_batch_transfer,
/// transfer_batch_to_device, on_after_batch_transfer) to the run's DataModule, so a trial
/// transforms its batches as the run will (Lightning's trials run inside the Trainer, with its
/// datamodule): a transform that makes a batch valid (a cast) or that costs memory (on-device
/// augmentation) was left out of the trials. Nothing else: no set-up, no other loaders.
class TrialData : public DataModule {
 public:
  TrialData(DataModule& hooks, DataLoader loader, Stage stage);
  DataLoader train_dataloader() override;
  c10::optional<DataLoader> val_dataloader() override;
  c10::optional<DataLoader> test_dataloader() override;
  c10::optional<DataLoader> predict_dataloader() override;
  Batch on_before_batch_transfer(Batch batch) override;
  Batch transfer_batch_to_device(Batch batch, c10::Device device) override;
  Batch on_after_batch_transfer(Batch batch) override;

 private:
  c10::optional<DataLoader> at(Stage stage);
  Batch forward_hook(DefaultSteps::Bit bit, const std::function<Batch()>& call);
  DataModule& hooks_;
  DataLoader loader_;
  Stage stage_;
};

/// Runs `stage` (fit, validate, test or predict) of `trainer` on `loader`, through TrialData
/// when the run has a DataModule (`hooks`, else null).
void run_trial_stage(Trainer& trainer, Module& module, Stage stage, const DataLoader& loader,
                     DataModule* hooks);

/// What the standalone tuners on a DataModule (lr_find, scale_batch_size) run first: the
/// DataModule's and the module's prepare_data, with the random state put back as the Trainer
/// does. Lightning's Tuner runs inside trainer.fit, which prepares the data before anything; the
/// trials themselves skip it (a tuner callback's run prepared already).
void prepare_data_once(Module& module, DataModule& data);

class ModuleSnapshot {
 public:
  /// `tag` names the tuner in the error raised when the module's tensors changed in between.
  ModuleSnapshot(Module& module, std::string tag);
  void restore();
  /// For the trials' callbacks: takes the module's tensors again at the start of a trial's fit,
  /// validation, test or predict (after configure_model) when the module has other tensors than
  /// the snapshot holds: a module that builds its layers in configure_model (Lightning's place
  /// for large models) gets them back as built, not as the trials trained them (restore()
  /// failed with an InternalError). The callback must not outlive this snapshot.
  std::shared_ptr<Callback> after_configure_model();

 private:
  Module& module_;
  std::string tag_;
  std::vector<RngState> rng_;  // each default generator's state
  std::vector<at::Tensor> params_, buffers_;
};

/// scale_batch_size on a DataModule already set up for finder.stage() (the public form sets
/// it up and tears it down around this): each trial's loader comes from the DataModule at the
/// trial's size; afterwards the DataModule has the size found, or the one it had when the search
/// threw or did not run (fast_dev_run). ConfigError when it does not say its batch size.
BatchSizeFinderResult scale_data_module(Module& module, DataModule& data, TrainerOptions options,
                                        BatchSizeFinderOptions finder);

/// For the tuner callbacks (LearningRateFinder, BatchSizeFinder), whose trials run inside an
/// entry point in Trainers of their own: ConfigError unless the run's strategy is
/// "single_device", or "ddp" where `ddp` is true (LearningRateFinder, as Lightning's lr_find
/// under DDP; Lightning's batch size finder refuses DDP).
void check_trial_strategy(RunContext& run, const std::string& tag, bool ddp);

/// The options a tuner callback's trials run with (before trial_options): the run's, with a DDP
/// run's strategy replaced by one over the run's processes and group
/// (DdpStrategy::sharing_processes_of) holding a precision of its own, made from the options'
/// precision name (the options' object itself when they hold one), so that the trials leave
/// the run's strategy and precision as they were.
TrainerOptions run_trial_options(RunContext& run);

/// lr_find inside a run (LearningRateFinder): `options` from run_trial_options, so a DDP run's
/// trial shares its processes. Each step's loss is the mean over the ranks, so every rank
/// records the same result. The public lr_find refuses every strategy but single_device.
LrFinderResult lr_find_in_run(Module& module, DataLoader train, DataModule* hooks,
                              TrainerOptions options, LrFinderOptions finder);

/// Runs a tuner callback's `trials`, then gives the run's precision back as it was when the
/// trials' Trainers shared it (a Precision object in TrainerOptions is used by every Trainer
/// given those options): their set-up and teardown replaced its op lists and size rule (the fit
/// went on without them) and their steps moved its loss scaler. It is set up again on the run's
/// device with the state it had before (Lightning restores the trials' checkpoint likewise).
void keeping_run_precision(RunContext& run, const std::function<void()>& trials);

/// Puts the module back on the device it is on at construction when it goes out of scope: a
/// trial's Trainer ends, as every entry point, with a model trained on a GPU moved back to the
/// CPU, while a tuner callback's fit has its module placed already.
class KeepDevice {
 public:
  explicit KeepDevice(Module& module);
  ~KeepDevice();
  KeepDevice(const KeepDevice&) = delete;
  KeepDevice& operator=(const KeepDevice&) = delete;

 private:
  Module& module_;
  c10::optional<c10::Device> device_;
};

}  // namespace detail
}  // namespace volt
