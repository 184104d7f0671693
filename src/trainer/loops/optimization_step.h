#pragma once
// Private: one automatic-optimization step, as an object the Trainer holds and a later feature
// can replace or capture (e.g. a CUDA graph of the whole step, issue #15).

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>

#include "trainer/detail/nonfinite_check.h"
#include "volt/core/batch.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace volt {
namespace detail {

class Run;

/// One training micro-batch under automatic optimization:
///   forward (Strategy::training_step) → non-finite check (recorded on the device, read at the
///   logging cadence: see NonfiniteLossCheck) → loss / k → backward (the module's backward
///   hook), with the gradient sync only on the micro-batch that steps (no_sync while
///   accumulating) → when k micro-batches are in: the module's optimizer_step, whose step()
///   runs on_before_optimizer_step → Strategy::optimizer_step (unscale, the module's
///   configure_gradient_clipping, step) → on_before_zero_grad → the module's
///   optimizer_zero_grad → global_step and step-interval schedulers.
/// A step the precision skipped (inf/NaN gradients under loss scaling), or that the module's
/// optimizer_step did not take, advances neither the global step nor the schedulers.
class OptimizationStep {
 public:
  explicit OptimizationStep(Run& run) : run_(run) {}
  virtual ~OptimizationStep() = default;
  /// Runs micro-batch `batch_idx` of `num_batches`; true when the optimizer stepped.
  virtual bool run(const Batch& batch, int64_t batch_idx, int64_t num_batches);
  /// Reads the non-finite-loss flag of the steps not checked yet (throws ValueError naming the
  /// first bad one): the fit loop calls it at each training epoch's end, Run before writing a
  /// checkpoint.
  void check_losses() { nonfinite_.check(); }
  /// Before a checkpoint is written: check_losses(), and whatever makes the optimizer state
  /// current (a graphed step reads step counts back from the device).
  virtual void before_checkpoint() { check_losses(); }
  /// At the end of fit.
  virtual void finish() {}
  /// The module's set of trainable parameters changed (Run::check_trainable_parameters).
  virtual void trainable_parameters_changed() {}
  /// Forgets unchecked losses (a new fit).
  void reset_checks() { nonfinite_.reset(); }

 protected:
  /// Forward through the strategy; checks the loss (scalar, requires grad, finite).
  at::Tensor forward(const Batch& batch, int64_t batch_idx);
  /// Scales the loss for accumulation and backpropagates it between the backward hooks.
  void backward(const at::Tensor& loss, bool sync_gradients);
  /// The optimizer step of micro-batch `batch_idx` with zero_grad and the counters; true when
  /// the optimizer stepped (precision may skip it, the module's optimizer_step may not take it).
  bool optimizer_step(int64_t batch_idx);
  /// The on_before_zero_grad hooks (callbacks, then the module), after a step.
  void before_zero_grad(torch::optim::Optimizer& opt);
  /// The module's optimizer_step, whose step() is strategy_step(); no zero_grad, no counters:
  /// the part of optimizer_step() a graph can hold. True when the optimizer stepped.
  bool take_step(int64_t batch_idx);
  /// on_before_optimizer_step, then Strategy::optimizer_step (unscale, the module's
  /// configure_gradient_clipping, step).
  bool strategy_step();

  Run& run_;
  NonfiniteLossCheck nonfinite_;
  /// While a graph captures the step: the non-finite check is recorded after each replay
  /// instead (its buffer slot changes every step, a graph's addresses do not).
  bool capturing_ = false;
};

/// The step of TrainerOptions::graph_training_step (loops/graphed_step.cpp): replays the
/// whole step from CUDA graphs, and runs eagerly, logged once, where it cannot.
std::unique_ptr<OptimizationStep> make_graphed_step(Run& run);

/// The step of TrainerOptions::trace_training_step (loops/traced_step.cpp): training_step
/// replayed from a trace with fused elementwise chains, eager (logged once) where it cannot.
std::unique_ptr<OptimizationStep> make_traced_step(Run& run);

}  // namespace detail
}  // namespace volt
