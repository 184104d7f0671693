#pragma once
// Helpers for tests that drive a volt::ZeroEngine directly (tests/distributed/zero_engine_test.cpp,
// tests/distributed/nccl_test.cpp).

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>

#include "volt/distributed/zero_engine.h"

namespace volt_test {

/// The engine's parameter names: `m`'s named parameters by TensorImpl.
inline std::map<const c10::TensorImpl*, std::string> names_of(const torch::nn::Module& m) {
  std::map<const c10::TensorImpl*, std::string> out;
  for (const auto& p : m.named_parameters(true)) out[p.value().unsafeGetTensorImpl()] = p.key();
  return out;
}

/// One training step through the engine on `x`, the loss being the sum of the squared outputs
/// (in fp32): zero_grad, forward in a Scope, backward, prepare_step, then `before_step` (checks,
/// clipping) when given, the optimizer's step and gather_parameters.
inline void engine_step(volt::ZeroEngine& engine, torch::optim::Optimizer& opt,
                        const std::function<at::Tensor(const at::Tensor&)>& forward,
                        const at::Tensor& x, const std::function<void()>& before_step = nullptr) {
  engine.zero_grad();
  at::Tensor loss;
  {
    volt::ZeroEngine::Scope scope(engine);
    loss = forward(x).to(torch::kFloat).pow(2).sum();
  }
  engine.backward([&] { loss.backward(); }, /*sync=*/true);
  engine.prepare_step();
  if (before_step) before_step();
  opt.step();
  engine.gather_parameters();
}

}  // namespace volt_test
