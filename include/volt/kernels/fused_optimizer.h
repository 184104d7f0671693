#pragma once
/// What volt's fused optimizers share beyond torch::optim::Optimizer.

#include <torch/optim/optimizer.h>

#include <memory>

namespace volt {

/// Implemented by FusedSGD and FusedAdamW so checkpoint loading (volt::load_optimizer_state)
/// can build their per-parameter state objects without knowing each type.
class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;
  /// A new, empty per-parameter state object of the type this optimizer keeps in state().
  virtual std::unique_ptr<torch::optim::OptimizerParamState> make_param_state() const = 0;
};

}  // namespace volt
