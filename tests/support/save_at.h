#pragma once
// A callback that writes a checkpoint at one point of a fit, for the exact-resume tests.

#include <string>

#include "volt/callbacks/callback.h"

namespace volt_test {

/// Saves a checkpoint to `path` after batch `batch` of epoch `epoch`, or at the end of that epoch
/// when `batch` is -1; records how many micro-batches were accumulated then.
class SaveAt : public volt::Callback {
 public:
  SaveAt(int64_t epoch, int64_t batch, std::string path)
      : epoch_(epoch), batch_(batch), path_(std::move(path)) {}
  std::string state_key() const override { return "SaveAt" + path_; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t idx) override {
    if (batch_ >= 0 && run.state().epoch == epoch_ && idx == batch_) save(run);
  }
  void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
    if (batch_ < 0 && run.state().epoch == epoch_) save(run);
  }
  int64_t accumulated_at_save = -1;

 private:
  void save(volt::RunContext& run) {
    accumulated_at_save = run.state().accumulated;
    run.save_checkpoint(path_);
  }
  int64_t epoch_, batch_;
  std::string path_;
};

}  // namespace volt_test
