// The defaults of volt::Module's data hooks (volt/core/module.h), defined here where
// DataLoader is complete: the core layer that declares Module knows it by name only. And the
// DataModule those hooks make (detail/module_data.h).

#include "data/detail/module_data.h"

#include "volt/core/check.h"

namespace volt {

namespace detail {
std::vector<DataLoader> listed(c10::optional<DataLoader> loader) {
  std::vector<DataLoader> out;
  if (loader) out.push_back(std::move(*loader));
  return out;
}
}  // namespace detail
using detail::listed;

DataLoader Module::train_dataloader() {
  VOLT_CHECK(false, ConfigError,
             "[Trainer] fit() was given no training data and the module defines none; override "
             "Module::train_dataloader(), or pass a DataLoader or a DataModule to fit().");
  throw InternalError("unreachable");
}
c10::optional<DataLoader> Module::val_dataloader() {
  return c10::nullopt;
}
c10::optional<DataLoader> Module::test_dataloader() {
  return c10::nullopt;
}
c10::optional<DataLoader> Module::predict_dataloader() {
  return c10::nullopt;
}
std::vector<DataLoader> Module::val_dataloaders() {
  return listed(val_dataloader());
}
std::vector<DataLoader> Module::test_dataloaders() {
  return listed(test_dataloader());
}
std::vector<DataLoader> Module::predict_dataloaders() {
  return listed(predict_dataloader());
}

c10::optional<int64_t> Module::batch_size() const {
  return c10::nullopt;
}
void Module::set_batch_size(int64_t) {
  VOLT_CHECK(false, ConfigError,
             "[Module] this module's batch size cannot be set; override batch_size() and "
             "set_batch_size(int64_t) to build its loaders with the size given (BatchSizeFinder "
             "needs both).");
}

namespace detail {

DataLoader ModuleData::train_dataloader() {
  return module_.train_dataloader();
}
std::vector<DataLoader> ModuleData::val_dataloaders() {
  return module_.val_dataloaders();
}
std::vector<DataLoader> ModuleData::test_dataloaders() {
  return module_.test_dataloaders();
}
std::vector<DataLoader> ModuleData::predict_dataloaders() {
  return module_.predict_dataloaders();
}
c10::optional<int64_t> ModuleData::batch_size() const {
  return module_.batch_size();
}
void ModuleData::set_batch_size(int64_t batch_size) {
  module_.set_batch_size(batch_size);
}

}  // namespace detail
}  // namespace volt
