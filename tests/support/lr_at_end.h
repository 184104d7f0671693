#pragma once
// A callback that reads the first optimizer's learning rate when training ends (the module is
// detached from the run after fit, so tests read it from here).

#include <string>

#include "volt/callbacks/callback.h"

namespace volt_test {

class LrAtEnd : public volt::Callback {
 public:
  std::string state_key() const override { return "LrAtEnd"; }
  void on_train_end(volt::RunContext& run, volt::Module&) override {
    lr = run.optimizer_configs().front().optimizer()->param_groups().front().options().get_lr();
  }
  double lr = -1;
};

}  // namespace volt_test
