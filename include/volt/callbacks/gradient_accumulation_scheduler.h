#pragma once
/// GradientAccumulationScheduler: changes the batches accumulated per optimizer step by epoch,
/// as Lightning's callback of that name (e.g. accumulate 8 batches at first, 4 from epoch 4,
/// none from epoch 8).

#include <cstdint>
#include <map>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

class GradientAccumulationScheduler : public Callback {
 public:
  /// `scheduling` maps a 0-based epoch to the factor from that epoch on, e.g. {{0, 8}, {4, 4},
  /// {8, 1}}; epochs before the first key accumulate nothing (factor 1). ConfigError when it is
  /// empty, an epoch is negative or a factor is below 1.
  explicit GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling);
  /// Parses the CLI's form "0:8, 4:4, 8:1" (epoch:factor pairs); ConfigError when malformed.
  static std::map<int64_t, int64_t> parse_scheduling(const std::string& text);

  /// The factor for `epoch`.
  int64_t accumulate_grad_batches(int64_t epoch) const;
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }
  /// Whether some epoch accumulates (a factor above 1), Lightning's
  /// going_to_accumulate_grad_batches.
  bool going_to_accumulate_grad_batches() const;

  std::string state_key() const override { return "GradientAccumulationScheduler"; }
  /// As Lightning: ConfigError with manual optimization, with the Trainer's own
  /// accumulate_grad_batches set above 1, or with a strategy that fixes the factor (DeepSpeed).
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_epoch_start(RunContext& run, Module& module) override;

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace volt
