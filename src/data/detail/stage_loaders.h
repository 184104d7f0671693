#pragma once
// Private: a DataModule's loaders for an evaluation stage, as the Trainer, the batch-size search
// and the CLI's export ask for them.

#include <vector>

#include "volt/core/types.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"

namespace volt {
namespace detail {

/// val_dataloaders(), test_dataloaders() or predict_dataloaders() for kValidate, kTest or
/// kPredict; `required`: ConfigError naming the method to override when there are none.
std::vector<DataLoader> stage_loaders(DataModule& data, Stage stage, bool required);

}  // namespace detail
}  // namespace volt
