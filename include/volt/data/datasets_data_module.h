#pragma once
/// DatasetsDataModule: a DataModule over data sets already built (Lightning's
/// LightningDataModule.from_datasets).
///
///   auto data = std::make_shared<volt::DatasetsDataModule>(
///       train_set, val_set, /*test=*/nullptr, /*predict=*/nullptr,
///       volt::DataLoaderOptions(64).num_workers(2).seed(42));
///   trainer.fit(model, *data);

#include <memory>

#include "volt/data/data_module.h"
#include "volt/data/dataset.h"

namespace volt {

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

  DataLoader train_dataloader() override;
  c10::optional<DataLoader> val_dataloader() override;
  c10::optional<DataLoader> test_dataloader() override;
  c10::optional<DataLoader> predict_dataloader() override;
  c10::optional<int64_t> batch_size() const override { return loader_.batch_size(); }
  void set_batch_size(int64_t batch_size) override;

 private:
  c10::optional<DataLoader> make(const std::shared_ptr<const Dataset>& data, bool shuffle) const;
  std::shared_ptr<const Dataset> train_, val_, test_, predict_;
  DataLoaderOptions loader_;
};

}  // namespace volt
