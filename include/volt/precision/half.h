#pragma once
/// HalfPrecision: the whole model in bf16 ("bf16-true"): weights, gradients, optimizer state and
/// activations.

#include "volt/precision/true_precision.h"

namespace volt {

/// The model computes in bf16 end to end (half the memory of fp32, no fp32 master weights: small
/// updates can round away, so it suits fine-tuning and inference more than training from
/// scratch). Checkpoints hold bf16 weights. TruePrecision says what is converted.
class HalfPrecision : public TruePrecision {
 public:
  HalfPrecision() : TruePrecision(c10::kBFloat16, "bf16-true") {}
};

}  // namespace volt
