#pragma once
/// DatasetsDataModule: a DataModule over data sets already built (Lightning's
/// LightningDataModule.from_datasets).
///
///   auto data = std::make_shared<volt::DatasetsDataModule>(
///       train_set, val_set, /*test=*/nullptr, /*predict=*/nullptr,
///       volt::DataLoaderOptions(64).num_workers(2).seed(42));
///   trainer.fit(model, *data);

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/data/dataset.h"

namespace volt {

/// Several data sets per stage for a DatasetsDataModule (Lightning's from_datasets given a
/// mapping of training sets and sequences of the others); each call adds one:
///
///   volt::DatasetsDataModule data(
///       volt::StageDatasets().train("clean", clean).train("noisy", noisy).val(a).val(b),
///       volt::DataLoaderOptions(64));
struct StageDatasets {
  /// A named training set. Named sets are combined into one loader (combined_loader with
  /// mode()), whose batches hold each set's batch as part `name`, even with one set (as
  /// Lightning's dict of loaders); set j shuffles with the loader options' seed + j (the global
  /// seed + j without one, read when fit asks for the loader).
  StageDatasets& train(std::string name, std::shared_ptr<const Dataset> data);
  /// The one unnamed training set: plain batches (it cannot be mixed with named ones).
  StageDatasets& train(std::shared_ptr<const Dataset> data);
  /// A validation / test / predict set: each becomes a loader of its own, run in turn
  /// (val_dataloaders(), ...; Module::dataloader_idx() is its position).
  StageDatasets& val(std::shared_ptr<const Dataset> data);
  StageDatasets& test(std::shared_ptr<const Dataset> data);
  StageDatasets& predict(std::shared_ptr<const Dataset> data);
  /// How the named training sets combine. Default: kMaxSizeCycle (Lightning's for training).
  StageDatasets& mode(CombineMode mode);

  std::vector<std::pair<std::string, std::shared_ptr<const Dataset>>> train_sets;
  std::vector<std::shared_ptr<const Dataset>> val_sets, test_sets, predict_sets;
  CombineMode combine_mode = CombineMode::kMaxSizeCycle;
};

/// Loaders built from `loader` (batch size, workers, seed, pin_memory ...) over the data sets
/// given: the training one shuffled, the others in order (as Lightning). A stage without its
/// data set has no loader (fit without a training set is a ConfigError). The batch size is
/// tunable (scale_batch_size, BatchSizeFinder).
class DatasetsDataModule : public DataModule {
 public:
  DatasetsDataModule(std::shared_ptr<const Dataset> train,
                     std::shared_ptr<const Dataset> val = nullptr,
                     std::shared_ptr<const Dataset> test = nullptr,
                     std::shared_ptr<const Dataset> predict = nullptr,
                     DataLoaderOptions loader = DataLoaderOptions(1));
  /// Several data sets per stage (StageDatasets); every loader takes `loader`'s options.
  /// ConfigError for no data set, a null one, an unnamed training set beside another training
  /// set, or names combined_loader refuses.
  explicit DatasetsDataModule(StageDatasets sets, DataLoaderOptions loader = DataLoaderOptions(1));

  DataLoader train_dataloader() override;
  /// The first of the stage's loaders (none without a data set).
  c10::optional<DataLoader> val_dataloader() override;
  c10::optional<DataLoader> test_dataloader() override;
  c10::optional<DataLoader> predict_dataloader() override;
  /// One loader per data set of the stage, in the order given.
  std::vector<DataLoader> val_dataloaders() override;
  std::vector<DataLoader> test_dataloaders() override;
  std::vector<DataLoader> predict_dataloaders() override;
  /// The batch size of each loader (each part of a combined training batch).
  c10::optional<int64_t> batch_size() const override { return loader_.batch_size(); }
  void set_batch_size(int64_t batch_size) override;

 private:
  std::vector<DataLoader> loaders(const std::vector<std::shared_ptr<const Dataset>>& sets) const;
  StageDatasets sets_;
  DataLoaderOptions loader_;
};

}  // namespace volt
