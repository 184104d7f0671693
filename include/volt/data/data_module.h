#pragma once
/// DataModule: the loaders of one data set, built lazily for the stage that needs them.

#include <c10/util/Optional.h>
#include <exception>
#include <map>
#include <string>

#include <vector>

#include "volt/core/types.h"
#include "volt/data/data_loader.h"

namespace torch {
namespace serialize {
class InputArchive;
class OutputArchive;
}  // namespace serialize
}  // namespace torch

namespace volt {

namespace detail {
struct DefaultSteps;
}  // namespace detail

/// Override setup() to load data and the *_dataloader() methods the stages you run need.
class DataModule {
 public:
  virtual ~DataModule() = default;
  /// As Module::prepare_data (which runs after this one): downloads or writes what the data
  /// needs, once per node (prepare_data_per_node() true, the default) or once per job, before
  /// setup, while the other processes wait.
  virtual void prepare_data() {}
  virtual bool prepare_data_per_node() const { return true; }
  /// Called once per Trainer entry point, after prepare_data and before the callbacks' and the
  /// module's setup, on every process; the loaders are asked for after it.
  virtual void setup(Stage stage) {}
  virtual void teardown(Stage stage) {}
  /// When an entry point fails (after the callbacks' on_exception, before the teardown hooks),
  /// with the error (Lightning's LightningDataModule.on_exception). An error it raises is logged
  /// and the original one goes on.
  virtual void on_exception(const std::exception& error) {}
  /// Required for fit(); the default throws ConfigError.
  virtual DataLoader train_dataloader();
  virtual c10::optional<DataLoader> val_dataloader() { return c10::nullopt; }
  virtual c10::optional<DataLoader> test_dataloader() { return c10::nullopt; }
  virtual c10::optional<DataLoader> predict_dataloader() { return c10::nullopt; }
  /// Several validation / test / predict loaders (Lightning's list of loaders): the Trainer asks
  /// these, whose defaults return the singular method's loader (or none). A pass runs the
  /// loaders one after the other; Module::dataloader_idx() says whose batch a step has, and
  /// values logged from the steps are named after their loader (LogOptions::add_dataloader_idx).
  virtual std::vector<DataLoader> val_dataloaders();
  virtual std::vector<DataLoader> test_dataloaders();
  virtual std::vector<DataLoader> predict_dataloaders();

  /// The batch size the loaders are built with, for scale_batch_size (Lightning's
  /// `batch_arg_name` attribute): override both methods to let it be tuned. Unset (the default)
  /// = not tunable.
  virtual c10::optional<int64_t> batch_size() const { return c10::nullopt; }
  /// Sets the batch size the next *_dataloader() calls build with. The default throws ConfigError.
  virtual void set_batch_size(int64_t batch_size);

  /// State kept in checkpoints (Lightning's LightningDataModule.state_dict/load_state_dict): every
  /// checkpoint a run given this DataModule writes holds what save_state writes; load_state
  /// reads it back when fit resumes (the loaders are then built again from the restored state)
  /// and when validate/test/predict load a checkpoint (before their loader is asked for), if the
  /// checkpoint holds the state of this DataModule's type (a run given another type skips it, as
  /// Lightning keys it by class).
  virtual void save_state(torch::serialize::OutputArchive& archive) const {}
  virtual void load_state(torch::serialize::InputArchive& archive) {}

  /// The batch hooks of Lightning's LightningDataModule. Each one a DataModule overrides is used
  /// in place of the Module's hook of the same name (which then does not run for this run's
  /// batches), so a data set brings its own transfer and augmentation; the defaults leave it to
  /// the Module.
  virtual Batch on_before_batch_transfer(Batch batch);
  virtual Batch transfer_batch_to_device(Batch batch, c10::Device device);
  virtual Batch on_after_batch_transfer(Batch batch);

  /// Hyper-parameters of the data (batch size, paths), recorded by loggers (hparams.yaml) beside
  /// the module's, as Lightning's LightningDataModule.save_hyperparameters: a key both set to
  /// different values is a ConfigError when the run logs them.
  void save_hyperparameters(std::map<std::string, std::string> hp) { hparams_ = std::move(hp); }
  const std::map<std::string, std::string>& hparams() const { return hparams_; }

  /// The epoch the Trainer asks for loaders of, for epoch-dependent data (a curriculum): 0 as
  /// fit starts; with TrainerOptions::reload_dataloaders_every_n_epochs = N, train_dataloader()
  /// at N, 2N... and val_dataloader() at a validation N or more epochs after its last build. A
  /// resumed fit asks again for the loaders the uninterrupted fit is using (the training one of
  /// the last multiple of N at or before the resumed epoch, the validation ones of their build).
  int64_t current_epoch() const { return current_epoch_; }

 private:
  friend class Trainer;
  friend struct detail::DefaultSteps;
  int64_t current_epoch_ = 0;
  /// Which batch hooks ran as their default since the Trainer cleared these bits
  /// (src/core/detail/default_steps.h).
  unsigned default_steps_ran_ = 0;
  std::map<std::string, std::string> hparams_;
};

}  // namespace volt
