#pragma once
// The per-element tensors of one optimizer state object (the moments of Adam and AdamW, SGD's
// momentum buffer, ...) for the optimizers ZeRO supports, as handles sharing the state's
// TensorImpls: ZeroEngine counts their bytes, OptimizerSwapper set_()s them to swap the state
// in and out. Unknown state types give none.

#include <torch/optim.h>

#include <functional>
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

/// Replaces each per-element tensor of `s` (as state_tensors lists them) with fn(tensor); an
/// undefined one stays undefined; false for an unknown state type (nothing changed). On a state
/// object a fused optimizer holds, the replacement detaches it from the optimizer's flat buffer:
/// the optimizer copies the new tensor's values in on its next step (as after a checkpoint
/// load), so map a copy (`clone()`) unless that is what is wanted.
inline bool map_state_tensors(torch::optim::OptimizerParamState& s,
                              const std::function<at::Tensor(const at::Tensor&)>& fn) {
  using namespace torch::optim;
  auto f = [&](const at::Tensor& t) { return t.defined() ? fn(t) : t; };
  auto adam = [&](auto* a) {
    a->exp_avg(f(a->exp_avg()));
    a->exp_avg_sq(f(a->exp_avg_sq()));
    a->max_exp_avg_sq(f(a->max_exp_avg_sq()));
  };
  if (auto* a = dynamic_cast<AdamWParamState*>(&s)) {
    adam(a);
  } else if (auto* a = dynamic_cast<AdamParamState*>(&s)) {
    adam(a);
  } else if (auto* a = dynamic_cast<SGDParamState*>(&s)) {
    a->momentum_buffer(f(a->momentum_buffer()));
  } else if (auto* a = dynamic_cast<RMSpropParamState*>(&s)) {
    a->square_avg(f(a->square_avg()));
    a->momentum_buffer(f(a->momentum_buffer()));
    a->grad_avg(f(a->grad_avg()));
  } else if (auto* a = dynamic_cast<AdagradParamState*>(&s)) {
    a->sum(f(a->sum()));
  } else if (auto* a = dynamic_cast<FusedAdamWParamState*>(&s)) {
    adam(a);
  } else if (auto* a = dynamic_cast<FusedSGDParamState*>(&s)) {
    a->momentum_buffer(f(a->momentum_buffer()));
  } else {
    return false;
  }
  return true;
}

}  // namespace detail
}  // namespace volt
