#pragma once
/// ProgressBar: one throttled terminal line per stage (epoch, step/total, it/s, ETA, metrics).

#include <chrono>
#include <cstdio>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

/// Redraws at most once per `refresh_s` seconds (and at stage ends). It reads metric values
/// only when it redraws, so it never forces a device sync more often than its refresh rate.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(double refresh_s = 0.5, std::FILE* out = stderr);
  std::string state_key() const override { return "ProgressBar"; }
  void on_train_epoch_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  /// Number of lines drawn so far (for tests of the throttle).
  int64_t redraws() const { return redraws_; }

 private:
  void draw(RunContext& run, int64_t done, bool final_line);
  double refresh_s_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point epoch_start_, last_draw_;
  int64_t start_batch_ = 0;
  int64_t redraws_ = 0;
  bool tty_ = false;
};

}  // namespace volt
