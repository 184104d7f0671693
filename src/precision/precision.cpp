#include "volt/precision/precision.h"

#include <torch/nn/utils/clip_grad.h>

#include <limits>

namespace volt {

void Precision::backward(const at::Tensor& loss) { loss.backward(); }

double Precision::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                 ClipAlgorithm algorithm) {
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) params.push_back(p);
    }
  }
  if (params.empty()) return 0.0;
  if (algorithm == ClipAlgorithm::kNorm) {
    return torch::nn::utils::clip_grad_norm_(params, value, 2.0);
  }
  torch::nn::utils::clip_grad_value_(params, value);
  return std::numeric_limits<double>::quiet_NaN();
}

bool Precision::optimizer_step(torch::optim::Optimizer& optimizer) {
  optimizer.step();
  return true;
}

}  // namespace volt
