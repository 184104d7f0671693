#include "volt/data/data_module.h"

#include "volt/core/check.h"

namespace volt {

DataLoader DataModule::train_dataloader() {
  VOLT_CHECK(false, ConfigError,
             "[DataModule] fit() needs train_dataloader(); override it in "
             "your DataModule.");
  throw InternalError("unreachable");
}

}  // namespace volt
