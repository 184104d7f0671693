#include "volt/data/data_module.h"

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

}  // namespace volt
