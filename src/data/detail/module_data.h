#pragma once
// Private: a module's own loaders (Module::train_dataloader() and the others) as the DataModule
// of the entry points given no DataModule, so that they are asked for, reloaded and resized
// where a DataModule's are.

#include <c10/util/Optional.h>

#include <vector>

#include "volt/core/module.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"

namespace volt {
namespace detail {

/// Asks `module`'s data hooks; its batch size is the module's.
class ModuleData final : public DataModule {
 public:
  explicit ModuleData(Module& module) : module_(module) {}
  DataLoader train_dataloader() override;
  std::vector<DataLoader> val_dataloaders() override;
  std::vector<DataLoader> test_dataloaders() override;
  std::vector<DataLoader> predict_dataloaders() override;
  c10::optional<int64_t> batch_size() const override;
  void set_batch_size(int64_t batch_size) override;

 private:
  Module& module_;
};

/// The list of one loader, or none: the plural data hooks' default.
std::vector<DataLoader> listed(c10::optional<DataLoader> loader);

}  // namespace detail
}  // namespace volt
