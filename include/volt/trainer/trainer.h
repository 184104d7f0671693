#pragma once
/// Trainer: runs fit / validate / test / predict for a volt::Module.

#include <c10/util/Optional.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/loop_state.h"
#include "volt/core/module.h"
#include "volt/core/seed.h"  // seed_everything, which Trainer users call
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/trainer/threads.h"
#include "volt/trainer/trainer_options.h"

namespace volt {

class Strategy;
class Callback;
class Logger;

/// Hides the loop. Options are validated in the constructor; a Trainer may run several
/// entry points in sequence (fit, then test) and keeps its callbacks and loggers between them.
class Trainer {
 public:
  explicit Trainer(TrainerOptions options = TrainerOptions());
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains; with ckpt_path resumes exactly from that checkpoint. "last" resumes from the newest
  /// last*.ckpt of the run's ModelCheckpoint (or starts fresh, with a warning, when there is
  /// none), "best" from its best checkpoint; other entry points load the weights the same way.
  /// Every entry point ends, as Lightning's, with a model trained on a GPU moved back to the CPU.
  /// Validation runs over every loader of DataModule::val_dataloaders(), one after the other.
  void fit(Module& module, DataModule& data, const std::string& ckpt_path = "");
  /// Without a validation loader the module's are used (Module::val_dataloaders(), none by
  /// default), as Lightning's fit(model, train_dataloaders).
  void fit(Module& module, DataLoader train, c10::optional<DataLoader> val = c10::nullopt,
           const std::string& ckpt_path = "");
  /// With several validation loaders (their values logged as "<name>/dataloader_idx_<N>"); an
  /// empty list: no validation.
  void fit(Module& module, DataLoader train, std::vector<DataLoader> val,
           const std::string& ckpt_path = "");
  /// On the module's own data (Lightning's trainer.fit(model)): Module::train_dataloader() and
  /// val_dataloaders(), asked for as a DataModule's would be (reloads and BatchSizeFinder
  /// included). The same holds for validate, test and predict given only the module.
  void fit(Module& module, const std::string& ckpt_path = "");

  /// Runs one validation pass and returns its epoch metrics as the loggers get them (values
  /// logged with logger(false) are in callback_metrics() only). From a DataModule with several
  /// val_dataloaders() the pass runs each, and the result holds every loader's values (named
  /// "<name>/dataloader_idx_<N>") and what the epoch hooks logged.
  Metrics validate(Module& module, DataModule& data, const std::string& ckpt_path = "");
  Metrics validate(Module& module, DataLoader val, const std::string& ckpt_path = "");
  Metrics validate(Module& module, const std::string& ckpt_path = "");
  /// One pass over each loader in turn; returns one Metrics per loader (Lightning's list of
  /// dicts): what was logged during its batches, and what the epoch hooks logged.
  std::vector<Metrics> validate(Module& module, std::vector<DataLoader> val,
                                const std::string& ckpt_path = "");
  /// Runs one test pass and returns its epoch metrics (several loaders: as validate).
  Metrics test(Module& module, DataModule& data, const std::string& ckpt_path = "");
  Metrics test(Module& module, DataLoader test, const std::string& ckpt_path = "");
  Metrics test(Module& module, const std::string& ckpt_path = "");
  std::vector<Metrics> test(Module& module, std::vector<DataLoader> test,
                            const std::string& ckpt_path = "");
  /// Returns predict_step's outputs, one per batch (none with
  /// TrainerOptions::return_predictions(false)). From a DataModule with several
  /// predict_dataloaders(): every loader's, in loader order.
  std::vector<at::Tensor> predict(Module& module, DataModule& data,
                                  const std::string& ckpt_path = "");
  std::vector<at::Tensor> predict(Module& module, DataLoader data,
                                  const std::string& ckpt_path = "");
  std::vector<at::Tensor> predict(Module& module, const std::string& ckpt_path = "");
  /// One list of outputs per loader (Lightning's list of lists).
  std::vector<std::vector<at::Tensor>> predict(Module& module, std::vector<DataLoader> data,
                                               const std::string& ckpt_path = "");

  /// Saves a full checkpoint of the module attached to the current/last fit; the file is on
  /// disk when it returns, whatever the CheckpointIO (an AsyncCheckpointIO is flushed).
  /// weights_only: the weights, loop counters, the DataModule's and the module's own state
  /// (for validate/test/predict and load_weights; a fit cannot resume from it).
  void save_checkpoint(const std::string& path, bool weights_only = false);

  /// Build the model inside the returned object's life (Lightning's trainer.init_module()): its
  /// parameters and buffers are made in the dtype the precision trains them in (bf16-true:
  /// bfloat16), so a large model never holds an fp32 copy; nothing changes under the precisions
  /// whose weights stay fp32. Made on the CPU (C++ has no default device; fit moves them). The
  /// dtype is the process's default while the object lives (as torch.set_default_dtype).
  /// `empty_init`: the parameters' initializers do not run (volt::EmptyInit,
  /// volt/nn/empty_init.h), for a model whose weights a checkpoint replaces before use.
  [[nodiscard]] std::shared_ptr<void> init_module(bool empty_init = false) const;

  const LoopState& state() const;
  const Metrics& callback_metrics() const;
  const Metrics& logged_metrics() const;
  const TrainerOptions& options() const;
  Strategy& strategy() const;
  const std::vector<std::shared_ptr<Callback>>& callbacks() const;
  const std::vector<std::shared_ptr<Logger>>& loggers() const;
  std::string log_dir() const;

 private:
  void fit_with_restarts(Module& module, const std::string& ckpt_path,
                         const std::function<void(const std::string&)>& body);
  /// `make_loaders` runs after the setup hooks (a BatchSizeFinder may have resized the data).
  /// Returns each loader's metrics; `merged`, when given, gets all of them in one map.
  std::vector<Metrics> run_eval(Module& module, Stage stage,
                                const std::function<std::vector<DataLoader>()>& make_loaders,
                                const std::string& ckpt_path, Metrics* merged = nullptr);
  std::vector<std::vector<at::Tensor>> run_predict(
      Module& module, const std::function<std::vector<DataLoader>()>& make_loaders,
      const std::string& ckpt_path);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
