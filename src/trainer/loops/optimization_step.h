#pragma once
// Private: one automatic-optimization step, as an object the Trainer holds and a later feature
// can replace or capture (e.g. a CUDA graph of the whole step, issue #15).

#include <ATen/Tensor.h>

#include <cstdint>

#include "volt/core/batch.h"

namespace volt {
namespace detail {

class Run;

/// One training micro-batch under automatic optimization:
///   forward (Strategy::training_step) → non-finite check → loss / k → backward, with the
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

 protected:
  /// Forward through the strategy; checks the loss (scalar, requires grad, finite).
  at::Tensor forward(const Batch& batch, int64_t batch_idx);
  /// Scales the loss for accumulation and backpropagates it between the backward hooks.
  void backward(const at::Tensor& loss, bool sync_gradients);
  /// The optimizer step proper; true when the optimizer stepped (precision may skip it).
  bool optimizer_step();

  Run& run_;
};

}  // namespace detail
}  // namespace volt
