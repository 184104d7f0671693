#include "volt/data/data_module.h"

#include "core/detail/default_steps.h"
#include "volt/core/check.h"

namespace volt {

DataLoader DataModule::train_dataloader() {
  VOLT_CHECK(false, ConfigError,
             "[DataModule] fit() needs train_dataloader(); override it in "
             "your DataModule.");
  throw InternalError("unreachable");
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

}  // namespace volt
