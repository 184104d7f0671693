#pragma once
/// GradScaler: dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's algorithm).

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <unordered_map>

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

  /// loss × scale (each call counts as a backward to come: see unscale()).
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides this optimizer's gradients by the scale in place and records whether any of them is
  /// inf/NaN. Each optimizer keeps its own state until its step(): a second call before it, with
  /// no backward in between, is a no-op (clipping then stepping unscales once). Unscaling an
  /// optimizer again after a backward that came after its first unscale, with no step between,
  /// is a ValueError (that backward added scaled gradients to unscaled ones), as torch's
  /// GradScaler raises there.
  void unscale(torch::optim::Optimizer& optimizer);
  /// Unscales if not done yet, runs optimizer.step() unless this optimizer's gradients hold
  /// inf/NaN, then updates the scale by that finding (as Lightning's precision plugin updates
  /// after each optimizer's step). Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// After unscale(), when each process holds only part of the gradients (ZeRO): replaces the
  /// inf/NaN finding of the optimizer unscaled last with `any_rank(finding)`, whether any process
  /// found one, so that every process skips or steps together and their scales stay equal.
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
  // Per optimizer, from its unscale() to its step().
  struct Unscaled {
    bool found_inf = false;
    int64_t backwards = 0;  // backwards_ when it was unscaled
  };
  std::unordered_map<const torch::optim::Optimizer*, Unscaled> unscaled_;
  const torch::optim::Optimizer* last_unscaled_ = nullptr;  // compared, never dereferenced
  mutable int64_t backwards_ = 0;                           // scale() calls
  // The scale the last scale() used: gradients are divided by what multiplied them, even when
  // another optimizer's step has moved the scale since (none yet: the current scale).
  mutable c10::optional<double> scaled_with_;
};

}  // namespace volt
