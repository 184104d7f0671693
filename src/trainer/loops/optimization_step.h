#pragma once
// Private: one automatic-optimization step, as an object the Trainer holds and a later feature
// can replace or capture (e.g. a CUDA graph of the whole step, issue #15).

#include <ATen/Tensor.h>

#include <cstdint>

#include "trainer/detail/nonfinite_check.h"
#include "volt/core/batch.h"

namespace volt {
namespace detail {

class Run;

/// One training micro-batch under automatic optimization:
///   forward (Strategy::training_step) → non-finite check (recorded on the device, read at the
///   logging cadence: see NonfiniteLossCheck) → loss / k → backward, with the
///   gradient sync only on the micro-batch that steps (no_sync while accumulating) →
///   when k micro-batches are in: on_before_optimizer_step → Strategy::optimizer_step (unscale,
///   clip, step) → zero_grad → global_step and step-interval schedulers.
/// A step the precision skipped (inf/NaN gradients under loss scaling) advances neither the
/// global step nor the schedulers.
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
  /// Forgets unchecked losses (a new fit).
  void reset_checks() { nonfinite_.reset(); }

 protected:
  /// Forward through the strategy; checks the loss (scalar, requires grad, finite).
  at::Tensor forward(const Batch& batch, int64_t batch_idx);
  /// Scales the loss for accumulation and backpropagates it between the backward hooks.
  void backward(const at::Tensor& loss, bool sync_gradients);
  /// The optimizer step proper; true when the optimizer stepped (precision may skip it).
  bool optimizer_step();

  Run& run_;
  NonfiniteLossCheck nonfinite_;
};

}  // namespace detail
}  // namespace volt
