#pragma once
/// Timer: measures time spent in fit / validate / test and stops fit after a maximum duration,
/// as Lightning's Timer callback; the elapsed training time survives checkpoint/resume.

#include <torch/arg.h>
#include <iosfwd>

#include <chrono>
#include <map>
#include <string>

#include "volt/callbacks/callback.h"
#include "volt/core/optimizer_config.h"

namespace volt {

struct TimerOptions {
  /// Maximum training time in seconds; unset = only measure. Default: unset.
  TORCH_ARG(c10::optional<double>, duration_s);
  /// Check the limit after every training batch (kStep) or epoch (kEpoch). Default: kStep.
  TORCH_ARG(Interval, interval) = Interval::kStep;
  /// Print a line when the limit stops training. Default: true.
  TORCH_ARG(bool, verbose) = true;
};

std::ostream& operator<<(std::ostream& os, const TimerOptions& o);

class Timer : public Callback {
 public:
  explicit Timer(TimerOptions options = {});
  /// Parses Lightning's "DD:HH:MM:SS" duration (days, then two digits each for hours, minutes
  /// and seconds) into seconds; ConfigError when malformed.
  static double parse_duration(const std::string& dd_hh_mm_ss);
  std::string state_key() const override { return "Timer"; }
  /// A fit resumed with its time spent asks to stop here, as Lightning's: the fit then trains
  /// nothing and runs no train start or end hooks.
  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_validation_start(RunContext& run, Module& module) override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_test_start(RunContext& run, Module& module) override;
  void on_test_end(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  /// Seconds spent in a stage (kFit = training, incl. time restored from a checkpoint).
  double time_elapsed(Stage stage = Stage::kFit) const;
  /// Seconds of duration_s left after the time spent in `stage` (Lightning's time_remaining);
  /// none when no duration is set.
  c10::optional<double> time_remaining(Stage stage = Stage::kFit) const;
  /// When `stage` last started and ended (Lightning's start_time / end_time); none before it
  /// did. kFit is training (on_train_start to on_train_end).
  c10::optional<std::chrono::steady_clock::time_point> start_time(Stage stage = Stage::kFit) const;
  c10::optional<std::chrono::steady_clock::time_point> end_time(Stage stage = Stage::kFit) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Span {
    c10::optional<Clock::time_point> start, end;
    double offset = 0;  // seconds from a resumed checkpoint
  };
  void check(RunContext& run);
  TimerOptions options_;
  std::map<Stage, Span> spans_;
};

}  // namespace volt
