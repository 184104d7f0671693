#include "volt/precision/precision.h"

#include <torch/nn/utils/clip_grad.h>

#include <limits>

#include "volt/core/log.h"
#include "volt/kernels/fused_clip_norm.h"

namespace volt {

void Precision::backward(const at::Tensor& loss) {
  loss.backward();
}

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
    // The fused pass reads every gradient once; libtorch's clip_grad_norm_ stays the reference
    // for what it cannot take (non-CPU, sparse, half, non-contiguous gradients).
    const std::string why = FusedClipNorm::unsupported_reason(params);
    if (why.empty()) return fused_clip_grad_norm_(params, value, 2.0);
    warn_once("clip-fallback:" + why, "Precision",
              "gradient clipping uses torch::nn::utils::clip_grad_norm_: " + why);
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
