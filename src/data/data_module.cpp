#include "volt/data/data_module.h"

#include "core/detail/default_steps.h"
#include "data/detail/module_data.h"
#include "data/detail/stage_loaders.h"
#include "volt/core/check.h"

namespace volt {

DataLoader DataModule::train_dataloader() {
  VOLT_CHECK(false, ConfigError,
             "[DataModule] fit() needs train_dataloader(); override it in "
             "your DataModule.");
  throw InternalError("unreachable");
}

using detail::listed;

std::vector<DataLoader> DataModule::val_dataloaders() {
  return listed(val_dataloader());
}
std::vector<DataLoader> DataModule::test_dataloaders() {
  return listed(test_dataloader());
}
std::vector<DataLoader> DataModule::predict_dataloaders() {
  return listed(predict_dataloader());
}

void DataModule::set_batch_size(int64_t) {
  VOLT_CHECK(false, ConfigError,
             "[DataModule] this DataModule's batch size cannot be set; override batch_size() and "
             "set_batch_size(int64_t) to build its loaders with the size given (scale_batch_size "
             "needs both).");
}

// The defaults leave the batch to the Module's hooks: the Trainer sees the mark and calls them.
Batch DataModule::on_before_batch_transfer(Batch batch) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kBeforeBatchTransfer);
  return batch;
}

Batch DataModule::transfer_batch_to_device(Batch batch, c10::Device) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kTransferBatch);
  return batch;
}

Batch DataModule::on_after_batch_transfer(Batch batch) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kAfterBatchTransfer);
  return batch;
}

namespace detail {

std::vector<DataLoader> stage_loaders(DataModule& data, Stage stage, bool required) {
  std::vector<DataLoader> loaders = stage == Stage::kValidate ? data.val_dataloaders()
                                    : stage == Stage::kTest   ? data.test_dataloaders()
                                                              : data.predict_dataloaders();
  const char* name = stage == Stage::kValidate ? "val" : to_string(stage);
  if (dynamic_cast<const ModuleData*>(&data) != nullptr) {
    VOLT_CHECK(!required || !loaders.empty(), ConfigError, "[Trainer] ", to_string(stage),
               "() was given no data and the module defines none; override Module::", name,
               "_dataloader() (or ", name,
               "_dataloaders() for several loaders), or pass loaders or a DataModule to ",
               to_string(stage), "().");
  }
  VOLT_CHECK(!required || !loaders.empty(), ConfigError, "[Trainer] ", to_string(stage),
             "() needs DataModule::", name, "_dataloader() (or ", name,
             "_dataloaders() for several loaders); override it.");
  return loaders;
}

}  // namespace detail
}  // namespace volt
