#pragma once
/// EarlyStopping: stops fit when a monitored metric stops improving or crosses a threshold.

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <iosfwd>

#include <string>

#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"

namespace volt {

/// Why EarlyStopping stopped the fit (Lightning's EarlyStoppingReason, same values).
enum class EarlyStoppingReason {
  kNotStopped = 0,
  kStoppingThreshold = 1,    ///< the metric got better than stopping_threshold
  kDivergenceThreshold = 2,  ///< the metric got worse than divergence_threshold
  kPatienceExhausted = 3,    ///< patience checks without an improvement
  kNonFiniteMetric = 4,      ///< the metric became NaN or inf (check_finite)
};

struct EarlyStoppingOptions {
  explicit EarlyStoppingOptions(std::string monitor) : monitor_(std::move(monitor)) {}
  /// Metric to watch (required).
  TORCH_ARG(std::string, monitor);
  /// Minimum change that counts as an improvement. Default: 0.0.
  TORCH_ARG(double, min_delta) = 0.0;
  /// Validation checks without improvement before stopping. Default: 3.
  TORCH_ARG(int64_t, patience) = 3;
  /// kMin or kMax. Default: kMin.
  TORCH_ARG(Mode, mode) = Mode::kMin;
  /// Stop when the metric becomes NaN or inf. Default: true.
  TORCH_ARG(bool, check_finite) = true;
  /// Stop as soon as the metric is better than this. Default: none.
  TORCH_ARG(c10::optional<double>, stopping_threshold);
  /// Stop as soon as the metric is worse than this. Default: none.
  TORCH_ARG(c10::optional<double>, divergence_threshold);
  /// Throw ConfigError when the monitored metric is missing. Default: true.
  TORCH_ARG(bool, strict) = true;
  /// true: check at each train epoch's end (after its validation, the epoch's metrics reduced);
  /// false: at each validation's end. Unset: Lightning's rule, at the epoch's end when
  /// val_check_interval is 1.0 and check_val_every_n_epoch is 1 (also when the fit does not
  /// validate), else after each validation. Default: unset.
  TORCH_ARG(c10::optional<bool>, check_on_train_epoch_end);
  /// Log each improvement ("Metric val_loss improved by 0.012 >= min_delta = 0.0. New best
  /// score: 0.410") and the reason for a stop, as Lightning. Default: false.
  TORCH_ARG(bool, verbose) = false;
  /// With verbose in a multi-process run: log on rank 0 only; false logs on every rank, each
  /// line prefixed "[rank: N]" (Lightning's log_rank_zero_only). Default: false.
  TORCH_ARG(bool, log_rank_zero_only) = false;
};

std::ostream& operator<<(std::ostream& os, const EarlyStoppingOptions& o);

/// Lightning's EarlyStopping; patience counts validation checks, not epochs. Off under
/// fast_dev_run, as Lightning (it neither stops nor checks the monitor there).
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);
  std::string state_key() const override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  int64_t wait_count() const { return wait_count_; }
  double best_score() const { return best_score_; }
  /// The epoch whose check stopped the fit; 0 when it did not stop it (Lightning's).
  int64_t stopped_epoch() const { return stopped_epoch_; }
  /// Why the last stop was requested ("" if none): Lightning's stopping_reason_message.
  const std::string& stop_reason() const { return stop_reason_; }
  /// Why the fit was stopped, as Lightning's stopping_reason; on every rank the reason of the
  /// first rank (in rank order) whose own check stopped it. Saved in checkpoints.
  EarlyStoppingReason stopping_reason() const { return stopping_reason_; }

 private:
  void check(RunContext& run);
  bool checks_on_train_epoch_end(const RunContext& run) const;
  EarlyStoppingOptions options_;
  int64_t wait_count_ = 0;
  double best_score_;
  int64_t stopped_epoch_ = 0;
  std::string stop_reason_;
  EarlyStoppingReason stopping_reason_ = EarlyStoppingReason::kNotStopped;
};

}  // namespace volt
