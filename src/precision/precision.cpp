#include "volt/precision/precision.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/utils/clip_grad.h>

#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/kernels/fused_clip_norm.h"

namespace volt {

void Precision::backward(const at::Tensor& loss, Module* module) {
  // Out of autocast, wherever it is called from (manual_backward inside a training_step runs
  // under the forward's autocast, and autograd runs the backward with the caller's state): the
  // backward of manual optimization then equals automatic optimization's, and GEMMs a forward
  // kept in fp32 (the CPU size rule) are not differentiated in bf16. PyTorch's AMP guidance:
  // backward passes under autocast are not recommended.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (module != nullptr) {
    module->backward(loss);
  } else {
    loss.backward();
  }
}

at::Tensor Precision::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                     ClipAlgorithm algorithm) {
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) params.push_back(p);
    }
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  if (params.empty()) return algorithm == ClipAlgorithm::kNorm ? at::zeros({}, f64) : at::Tensor();
  if (algorithm == ClipAlgorithm::kNorm) {
    // The fused pass reads every gradient once (on CUDA it leaves the norm on the device);
    // libtorch's clip_grad_norm_ stays the reference for what it cannot take (sparse, half,
    // non-contiguous CPU gradients; CUDA ones in a build without libtorch's fused kernels), and
    // reads its norm.
    const std::string why = FusedClipNorm::unsupported_reason(params);
    if (why.empty()) return FusedClipNorm(FusedClipNormOptions(value)).clip(params);
    warn_once("clip-fallback:" + why, "Precision",
              "gradient clipping uses torch::nn::utils::clip_grad_norm_: " + why);
    return at::scalar_tensor(torch::nn::utils::clip_grad_norm_(params, value, 2.0), f64);
  }
  torch::nn::utils::clip_grad_value_(params, value);
  return at::Tensor();
}

bool Precision::optimizer_step(torch::optim::Optimizer& optimizer) {
  optimizer.step();
  return true;
}

}  // namespace volt
