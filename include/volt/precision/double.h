#pragma once
/// DoublePrecision: the whole model in float64 ("64-true", also "64"; Lightning's
/// DoublePrecision): weights, gradients, optimizer state and activations.

#include "volt/precision/true_precision.h"

namespace volt {

/// For numerically sensitive models and for checking a model's numerics against fp32 (gradient
/// checks, ill-conditioned losses): twice fp32's memory, and on CPU the GEMMs run in OpenBLAS's
/// dgemm at roughly half fp32's rate. Checkpoints hold float64 weights. TruePrecision says what
/// is converted; DeepSpeed's ZeRO refuses it (as Lightning's DeepSpeed precision does).
class DoublePrecision : public TruePrecision {
 public:
  DoublePrecision() : TruePrecision(c10::kDouble, "64-true") {}
};

}  // namespace volt
