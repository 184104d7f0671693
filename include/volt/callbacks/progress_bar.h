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
  /// Validation and test passes get their own line ("Validation 12/40 [1s<2s, 9.8 it/s]"); on a
  /// terminal it replaces the training line while they run and is cleared after. Without a
  /// terminal only standalone validate()/test() passes print one final line.
  void on_validation_start(RunContext& run, Module& module) override;
  void on_validation_batch_end(RunContext& run, Module& module, const Batch& batch,
                               int64_t batch_idx) override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_test_start(RunContext& run, Module& module) override;
  void on_test_batch_end(RunContext& run, Module& module, const Batch& batch,
                         int64_t batch_idx) override;
  void on_test_end(RunContext& run, Module& module) override;
  /// Number of lines drawn so far (for tests of the throttle).
  int64_t redraws() const { return redraws_; }

 private:
  struct Line {
    std::chrono::steady_clock::time_point start, last_draw;
    int64_t start_done = 0;
  };
  void draw(RunContext& run, int64_t done, bool final_line);
  void eval_start(const char* label);
  void eval_batch(RunContext& run, int64_t done);
  void eval_end(RunContext& run);
  /// The evaluation line's head: its label, and "DataLoader <N>" with several loaders.
  std::string eval_head() const;
  /// Ends the current loader's line: kept in a standalone pass, cleared inside fit.
  void eval_line_done(RunContext& run);
  /// "<head> done/total [elapsed<eta, rate it/s]"
  std::string progress(const std::string& head, const Line& line, int64_t done,
                       int64_t total) const;
  void emit(const std::string& text, bool final_line);
  double refresh_s_;
  std::FILE* out_;
  Line train_, eval_;
  const char* eval_label_ = "";
  int64_t eval_done_ = 0;
  int64_t eval_total_ = 0;    // the batches of the loader the line shows
  int64_t eval_loader_ = 0;   // which loader that is
  int64_t eval_loaders_ = 1;  // of how many
  int64_t redraws_ = 0;
  bool tty_ = false;
};

}  // namespace volt
