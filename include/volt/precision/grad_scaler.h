#pragma once
/// GradScaler: dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's algorithm).

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <iosfwd>

namespace volt {

struct GradScalerOptions {
  /// Scale the first step's loss is multiplied by. Default: 65536 (2^16).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Factor the scale grows by after growth_interval steps without inf/NaN. Default: 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Factor the scale shrinks by when a step's gradients hold inf/NaN. Default: 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive finite steps before the scale grows. Default: 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false: a static scale (init_scale throughout); steps with inf/NaN gradients are still
  /// skipped, as DeepSpeed's ZeRO does with a fixed `loss_scale`. Default: true.
  TORCH_ARG(bool, dynamic) = true;
  /// DeepSpeed's `hysteresis` (delayed shift): how many steps with inf/NaN gradients it takes to
  /// back the scale off; the ones before only skip. 1 backs off at every one, as torch's
  /// GradScaler. Default: 1.
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// DeepSpeed's `consecutive_hysteresis`: true refills the hysteresis after every finite step,
  /// so it counts consecutive inf/NaN steps; false refills it only when the scale grows.
  /// Default: false.
  TORCH_ARG(bool, consecutive_hysteresis) = false;
  /// Floor of the scale (DeepSpeed's `min_loss_scale`); 0: none, as torch's GradScaler.
  /// Default: 0.
  TORCH_ARG(double, min_scale) = 0.0;
  /// At the floor, a step whose gradients still hold inf/NaN stops the run with a ValueError
  /// instead of skipping (DeepSpeed raises there: the run is diverging). Needs min_scale > 0.
  /// Default: false.
  TORCH_ARG(bool, error_at_min_scale) = false;
};
std::ostream& operator<<(std::ostream& os, const GradScalerOptions& o);

/// Multiplies the loss by a scale so small fp16 gradients do not flush to zero, divides the
/// gradients back before clipping and stepping, skips the optimizer step when any gradient is
/// inf/NaN (shrinking the scale), and grows the scale after a run of good steps. Its state
/// (scale, growth tracker) is part of checkpoints, so resume continues the same schedule.
/// Device-generic tensor ops; one host read per step (the skip decision).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  const GradScalerOptions& options() const { return options_; }

  /// loss × scale.
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides this optimizer's gradients by the scale in place (once per step: a second call
  /// before step() is a no-op) and records whether any of them is inf/NaN.
  void unscale(torch::optim::Optimizer& optimizer);
  /// Unscales if not done yet, runs optimizer.step() unless inf/NaN were found, then updates
  /// the scale. Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// After unscale(), when each process holds only part of the gradients (ZeRO): replaces this
  /// step's inf/NaN finding with `any_rank(finding)`, whether any process found one, so that
  /// every process skips or steps together and their scales stay equal.
  void agree_on_found_inf(const std::function<bool(bool)>& any_rank);

  double current_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Steps with inf/NaN gradients still allowed before the scale backs off (options'
  /// hysteresis when none is pending).
  int64_t hysteresis_left() const { return hysteresis_left_; }
  /// Steps skipped for inf/NaN gradients since construction (or the checkpoint's value).
  int64_t skipped_steps() const { return skipped_; }

  void save_state(torch::serialize::OutputArchive& archive) const;
  void load_state(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_left_;
  int64_t skipped_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace volt
