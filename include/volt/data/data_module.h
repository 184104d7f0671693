#pragma once
/// DataModule: the loaders of one data set, built lazily for the stage that needs them.

#include <c10/util/Optional.h>

#include "volt/core/types.h"
#include "volt/data/data_loader.h"

namespace volt {

/// Override setup() to load data and the *_dataloader() methods the stages you run need.
class DataModule {
 public:
  virtual ~DataModule() = default;
  /// Called once per Trainer entry point before loaders are requested.
  virtual void setup(Stage stage) {}
  virtual void teardown(Stage stage) {}
  /// Required for fit(); the default throws ConfigError.
  virtual DataLoader train_dataloader();
  virtual c10::optional<DataLoader> val_dataloader() { return c10::nullopt; }
  virtual c10::optional<DataLoader> test_dataloader() { return c10::nullopt; }
  virtual c10::optional<DataLoader> predict_dataloader() { return c10::nullopt; }
};

}  // namespace volt
