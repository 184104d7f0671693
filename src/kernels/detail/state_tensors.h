#pragma once
// The per-element tensors of one optimizer state object (the moments of Adam and AdamW, SGD's
// momentum buffer, ...) for the optimizers ZeRO supports, as handles sharing the state's
// TensorImpls: ZeroEngine counts their bytes, OptimizerSwapper set_()s them to swap the state
// in and out. Unknown state types give none.

#include <torch/optim.h>

#include <vector>

#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"

namespace volt {
namespace detail {

inline std::vector<at::Tensor> state_tensors(const torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (auto* a = dynamic_cast<const AdamWParamState*>(&s)) {
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  }
  if (auto* a = dynamic_cast<const AdamParamState*>(&s)) {
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  }
  if (auto* a = dynamic_cast<const SGDParamState*>(&s)) return {a->momentum_buffer()};
  if (auto* a = dynamic_cast<const RMSpropParamState*>(&s)) {
    return {a->square_avg(), a->momentum_buffer(), a->grad_avg()};
  }
  if (auto* a = dynamic_cast<const AdagradParamState*>(&s)) return {a->sum()};
  if (auto* a = dynamic_cast<const FusedAdamWParamState*>(&s)) {
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  }
  if (auto* a = dynamic_cast<const FusedSGDParamState*>(&s)) return {a->momentum_buffer()};
  return {};
}

}  // namespace detail
}  // namespace volt
