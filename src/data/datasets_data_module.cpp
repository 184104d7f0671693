#include "volt/data/datasets_data_module.h"

#include <utility>

#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/seed.h"

namespace volt {

StageDatasets& StageDatasets::train(std::string name, std::shared_ptr<const Dataset> data) {
  train_sets.emplace_back(std::move(name), std::move(data));
  return *this;
}

StageDatasets& StageDatasets::train(std::shared_ptr<const Dataset> data) {
  train_sets.emplace_back(std::string(), std::move(data));
  return *this;
}

StageDatasets& StageDatasets::val(std::shared_ptr<const Dataset> data) {
  val_sets.push_back(std::move(data));
  return *this;
}

StageDatasets& StageDatasets::test(std::shared_ptr<const Dataset> data) {
  test_sets.push_back(std::move(data));
  return *this;
}

StageDatasets& StageDatasets::predict(std::shared_ptr<const Dataset> data) {
  predict_sets.push_back(std::move(data));
  return *this;
}

StageDatasets& StageDatasets::mode(CombineMode mode) {
  combine_mode = mode;
  return *this;
}

namespace {

// The one-set-per-stage form as StageDatasets (a null set: none for that stage).
StageDatasets one_each(std::shared_ptr<const Dataset> train, std::shared_ptr<const Dataset> val,
                       std::shared_ptr<const Dataset> test,
                       std::shared_ptr<const Dataset> predict) {
  StageDatasets s;
  if (train) s.train(std::move(train));
  if (val) s.val(std::move(val));
  if (test) s.test(std::move(test));
  if (predict) s.predict(std::move(predict));
  return s;
}

// The first of a stage's loaders; none without a data set.
c10::optional<DataLoader> first_of(const std::vector<DataLoader>& loaders) {
  if (loaders.empty()) return c10::nullopt;
  return loaders.front();
}

}  // namespace

DatasetsDataModule::DatasetsDataModule(std::shared_ptr<const Dataset> train,
                                       std::shared_ptr<const Dataset> val,
                                       std::shared_ptr<const Dataset> test,
                                       std::shared_ptr<const Dataset> predict,
                                       DataLoaderOptions loader)
    : DatasetsDataModule(
          one_each(std::move(train), std::move(val), std::move(test), std::move(predict)),
          std::move(loader)) {}

DatasetsDataModule::DatasetsDataModule(StageDatasets sets, DataLoaderOptions loader)
    : sets_(std::move(sets)), loader_(std::move(loader)) {
  VOLT_CHECK(!sets_.train_sets.empty() || !sets_.val_sets.empty() || !sets_.test_sets.empty() ||
                 !sets_.predict_sets.empty(),
             ConfigError,
             "[DatasetsDataModule] no data set given; pass at least one of train, val, test and "
             "predict.");
  VOLT_CHECK(loader_.batch_size() >= 1, ConfigError,
             "[DatasetsDataModule] batch_size=", loader_.batch_size(), " must be >= 1.");
  for (const auto& [name, data] : sets_.train_sets) {
    VOLT_CHECK(data != nullptr, ConfigError, "[DatasetsDataModule] the training set '", name,
               "' is null; pass a Dataset.");
    VOLT_CHECK(!name.empty() || sets_.train_sets.size() == 1, ConfigError,
               "[DatasetsDataModule] an unnamed training set beside another training set; name "
               "each (StageDatasets::train(name, data)) to combine them.");
  }
  for (const auto* stage : {&sets_.val_sets, &sets_.test_sets, &sets_.predict_sets}) {
    for (const auto& data : *stage) {
      VOLT_CHECK(data != nullptr, ConfigError,
                 "[DatasetsDataModule] a validation, test or predict set is null; pass a "
                 "Dataset.");
    }
  }
  if (sets_.train_sets.size() > 1 ||
      (!sets_.train_sets.empty() && !sets_.train_sets[0].first.empty())) {
    // combined_loader checks the names now rather than when fit starts.
    DatasetsDataModule::train_dataloader();
  }
}

std::vector<DataLoader> DatasetsDataModule::loaders(
    const std::vector<std::shared_ptr<const Dataset>>& sets) const {
  std::vector<DataLoader> out;
  // Evaluation reads every sample in order: drop_last is the training loader's only.
  for (const auto& data : sets) {
    out.emplace_back(data, DataLoaderOptions(loader_).shuffle(false).drop_last(false));
  }
  return out;
}

DataLoader DatasetsDataModule::train_dataloader() {
  VOLT_CHECK(!sets_.train_sets.empty(), ConfigError,
             "[DatasetsDataModule] fit needs a training data set and none was given; pass one "
             "as the first argument.");
  const auto& first = sets_.train_sets.front();
  if (first.first.empty())
    return DataLoader(first.second, DataLoaderOptions(loader_).shuffle(true));
  std::vector<std::pair<std::string, DataLoader>> parts;
  for (size_t j = 0; j < sets_.train_sets.size(); ++j) {
    const auto& [name, data] = sets_.train_sets[j];
    parts.emplace_back(name, DataLoader(data, DataLoaderOptions(loader_).shuffle(true).seed(
                                                  loader_.seed().value_or(global_seed()) + j)));
  }
  return combined_loader(std::move(parts), sets_.combine_mode);
}

c10::optional<DataLoader> DatasetsDataModule::val_dataloader() {
  return first_of(loaders(sets_.val_sets));
}

c10::optional<DataLoader> DatasetsDataModule::test_dataloader() {
  return first_of(loaders(sets_.test_sets));
}

c10::optional<DataLoader> DatasetsDataModule::predict_dataloader() {
  return first_of(loaders(sets_.predict_sets));
}

std::vector<DataLoader> DatasetsDataModule::val_dataloaders() {
  return loaders(sets_.val_sets);
}

std::vector<DataLoader> DatasetsDataModule::test_dataloaders() {
  return loaders(sets_.test_sets);
}

std::vector<DataLoader> DatasetsDataModule::predict_dataloaders() {
  return loaders(sets_.predict_sets);
}

void DatasetsDataModule::set_batch_size(int64_t batch_size) {
  VOLT_CHECK(batch_size >= 1, ConfigError, "[DatasetsDataModule] batch_size=", batch_size,
             " must be >= 1.");
  loader_.batch_size(batch_size);
}

}  // namespace volt
