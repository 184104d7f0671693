#pragma once
/// TruePrecision: the whole model in one floating dtype (Lightning's HalfPrecision and
/// DoublePrecision): "bf16-true" (half.h) and "64-true" (double.h).

#include <c10/core/ScalarType.h>

#include <memory>
#include <string>

#include "volt/precision/precision.h"

namespace volt {

/// Casts the module's floating parameters and buffers to `dtype` at setup and every batch's
/// floating tensors to `dtype` before each step, so the model computes in that dtype end to
/// end: weights, gradients, optimizer state (made from the weights) and activations. Integer
/// tensors (labels, token ids, BatchNorm's num_batches_tracked) are left as they are.
/// Checkpoints hold the weights in `dtype`.
///
/// Departure from Lightning: its forward_context also makes `dtype` the default dtype while a
/// step runs. torch's default dtype is process-wide, and volt's DataLoader workers are threads
/// of the same process, so a batch made while a step runs would take that dtype too; volt only
/// sets it in tensor_init_context (the program building its model) and converts what reaches
/// the step instead. A floating tensor the step makes itself without a dtype is float32.
class TruePrecision : public Precision {
 public:
  TruePrecision(c10::ScalarType dtype, std::string name);
  std::string name() const override { return name_; }
  c10::ScalarType compute_dtype() const override { return dtype_; }
  /// `dtype` as the default dtype while the returned object lives.
  std::shared_ptr<void> tensor_init_context() override;
  void convert_module(torch::nn::Module& module) override;
  Batch convert_input(const Batch& batch) const override;

 private:
  c10::ScalarType dtype_;
  std::string name_;
};

}  // namespace volt
