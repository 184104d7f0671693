#include "trainer/loops/optimization_step.h"

#include <torch/torch.h>

#include <cmath>

#include "trainer/detail/run.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

bool OptimizationStep::run(const Batch& batch, int64_t batch_idx, int64_t num_batches) {
  Run& r = run_;
  r.scope = LogScope::kTrainStep;
  r.current_batch_size = batch.size();
  at::Tensor loss = forward(batch, batch_idx);
  if (!r.module->automatic_optimization()) return false;
  if (loss.defined()) {
    // Gradients are synchronised (all-reduced under DDP) only on the micro-batch that steps.
    const bool steps_next =
        r.st.accumulated + 1 >= r.st.accumulate_grad_batches || batch_idx + 1 == num_batches;
    backward(loss, steps_next);
    ++r.st.accumulated;
  }
  const bool step_now = r.st.accumulated > 0 && (r.st.accumulated >= r.st.accumulate_grad_batches ||
                                                 batch_idx + 1 == num_batches);
  if (!step_now) return false;
  return optimizer_step(batch_idx);
}

at::Tensor OptimizationStep::forward(const Batch& batch, int64_t batch_idx) {
  Run& r = run_;
  at::Tensor loss;
  {
    Run::Part part(r, "training_step");
    ProfileScope p(r.prof, "training_step");
    loss = r.strategy().training_step(*r.module, batch, batch_idx);
  }
  if (!loss.defined() || !r.module->automatic_optimization()) return loss;
  VOLT_CHECK(loss.numel() == 1, ValueError, "[Trainer] training_step returned a tensor of shape ",
             loss.sizes(), " at step ", r.st.global_step, "; return a scalar loss.");
  VOLT_CHECK(loss.requires_grad(), ValueError,
             "[Trainer] the loss returned by training_step at "
             "step ",
             r.st.global_step,
             " does not require grad; compute it from the module's "
             "parameters (and not under NoGradGuard).");
  if (r.opts.detect_nonfinite_loss() && !capturing_) {
    // Read on the host once per logging interval (in micro-batches), not per step.
    nonfinite_.set_every(r.opts.log_every_n_steps() * r.st.accumulate_grad_batches);
    nonfinite_.record(loss, {r.st.global_step, r.st.epoch, batch_idx});
  }
  return loss;
}

void OptimizationStep::backward(const at::Tensor& loss, bool sync_gradients) {
  Run& r = run_;
  Module& m = *r.module;
  const int64_t accum = r.st.accumulate_grad_batches;
  at::Tensor scaled = accum > 1 ? loss / static_cast<double>(accum) : loss;
  r.hook(
      "on_before_backward", [&](Module& mm) { mm.on_before_backward(loss); },
      [&](Callback& c) { c.on_before_backward(r, m, loss); });
  {
    Run::Part part(r, "backward");
    ProfileScope p(r.prof, "backward");
    r.strategy().backward(scaled, m, sync_gradients);
  }
  r.hook(
      "on_after_backward", [&](Module& mm) { mm.on_after_backward(); },
      [&](Callback& c) { c.on_after_backward(r, m); });
}

bool OptimizationStep::strategy_step() {
  Run& r = run_;
  Module& m = *r.module;
  auto& opt = *r.optimizers.front().optimizer();
  r.unscale_for_hooks(opt);
  r.hook(
      "on_before_optimizer_step", [&](Module& mm) { mm.on_before_optimizer_step(opt); },
      [&](Callback& c) { c.on_before_optimizer_step(r, m, opt); });
  Run::Part part(r, "optimizer_step");
  ProfileScope p(r.prof, "optimizer_step");
  return r.strategy().optimizer_step(
      opt, r.opts.gradient_clip_val(), r.opts.gradient_clip_algorithm(),
      [&](c10::optional<double> value, ClipAlgorithm algorithm) {
        r.module_hook("configure_gradient_clipping",
                      [&](Module& mm) { mm.configure_gradient_clipping(opt, value, algorithm); });
      });
}

bool OptimizationStep::take_step(int64_t batch_idx) {
  Run& r = run_;
  auto& opt = *r.optimizers.front().optimizer();
  bool stepped = false;
  int calls = 0;
  const std::function<bool()> step = [&] {
    VOLT_CHECK(++calls == 1, ValueError,
               "[Trainer] the module's optimizer_step called step() twice at global step ",
               r.st.global_step,
               "; call it at most once (each call would be another optimizer step on the same "
               "gradients).");
    stepped = strategy_step();
    return stepped;
  };
  r.module_hook("optimizer_step",
                [&](Module& mm) { mm.optimizer_step(r.st.epoch, batch_idx, opt, step); });
  return stepped;
}

void OptimizationStep::before_zero_grad(torch::optim::Optimizer& opt) {
  Run& r = run_;
  Module& m = *r.module;
  r.hook(
      "on_before_zero_grad", [&](Module& mm) { mm.on_before_zero_grad(opt); },
      [&](Callback& c) { c.on_before_zero_grad(r, m, opt); });
}

bool OptimizationStep::optimizer_step(int64_t batch_idx) {
  Run& r = run_;
  const bool stepped = take_step(batch_idx);
  auto& opt = *r.optimizers.front().optimizer();
  before_zero_grad(opt);
  r.module_hook("optimizer_zero_grad",
                [&](Module& mm) { mm.optimizer_zero_grad(r.st.epoch, batch_idx, opt); });
  r.st.accumulated = 0;
  if (!stepped) return false;  // skipped by the precision: no step happened
  ++r.st.global_step;
  r.step_schedulers(Interval::kStep);
  return true;
}

}  // namespace detail
}  // namespace volt
