#include "volt/data/datasets_data_module.h"

#include <utility>

#include "volt/core/check.h"
#include "volt/core/errors.h"

namespace volt {

DatasetsDataModule::DatasetsDataModule(std::shared_ptr<const Dataset> train,
                                       std::shared_ptr<const Dataset> val,
                                       std::shared_ptr<const Dataset> test,
                                       std::shared_ptr<const Dataset> predict,
                                       DataLoaderOptions loader)
    : train_(std::move(train)),
      val_(std::move(val)),
      test_(std::move(test)),
      predict_(std::move(predict)),
      loader_(std::move(loader)) {
  VOLT_CHECK(train_ || val_ || test_ || predict_, ConfigError,
             "[DatasetsDataModule] no data set given; pass at least one of train, val, test and "
             "predict.");
  VOLT_CHECK(loader_.batch_size() >= 1, ConfigError,
             "[DatasetsDataModule] batch_size=", loader_.batch_size(), " must be >= 1.");
}

c10::optional<DataLoader> DatasetsDataModule::make(const std::shared_ptr<const Dataset>& data,
                                                   bool shuffle) const {
  if (!data) return c10::nullopt;
  return DataLoader(data, DataLoaderOptions(loader_).shuffle(shuffle));
}

DataLoader DatasetsDataModule::train_dataloader() {
  VOLT_CHECK(train_ != nullptr, ConfigError,
             "[DatasetsDataModule] fit needs a training data set and none was given; pass one "
             "as the first argument.");
  return *make(train_, /*shuffle=*/true);
}

c10::optional<DataLoader> DatasetsDataModule::val_dataloader() {
  return make(val_, false);
}

c10::optional<DataLoader> DatasetsDataModule::test_dataloader() {
  return make(test_, false);
}

c10::optional<DataLoader> DatasetsDataModule::predict_dataloader() {
  return make(predict_, false);
}

void DatasetsDataModule::set_batch_size(int64_t batch_size) {
  VOLT_CHECK(batch_size >= 1, ConfigError, "[DatasetsDataModule] batch_size=", batch_size,
             " must be >= 1.");
  loader_.batch_size(batch_size);
}

}  // namespace volt
