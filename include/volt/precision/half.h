#pragma once
/// HalfPrecision: the whole model in bf16 ("bf16-true"): weights, gradients, optimizer state and
/// activations.

#include "volt/precision/precision.h"

namespace volt {

/// Casts the module's floating parameters and buffers to bf16 at setup and every batch's
/// floating tensors to bf16 before each step, so the model computes in bf16 end to end (half the
/// memory of fp32, no fp32 master weights: small updates can round away, so it suits
/// fine-tuning and inference more than training from scratch). Checkpoints hold bf16 weights.
class HalfPrecision : public Precision {
 public:
  HalfPrecision() = default;
  std::string name() const override { return "bf16-true"; }
  c10::ScalarType compute_dtype() const override { return c10::kBFloat16; }
  /// bfloat16 as the default dtype while the returned object lives.
  std::shared_ptr<void> tensor_init_context() override;
  void convert_module(torch::nn::Module& module) override;
  Batch convert_input(const Batch& batch) const override;
};

}  // namespace volt
