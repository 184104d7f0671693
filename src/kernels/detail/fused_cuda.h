#pragma once
// The CUDA side of FusedAdamW, FusedSGD and FusedClipNorm: libtorch's own multi-tensor kernels
// (aten::_fused_adamw_ / _fused_adam_ / _fused_sgd_, _foreach_norm / _foreach_mul_), which
// launch a handful of kernels per step for any number of parameters. They exist in libtorch
// >= 2.1 built with CUDA; elsewhere fused_cuda_available() is false and CUDA tensors get
// NotAvailable from the optimizers.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class OptimizerParamGroup;
}  // namespace torch::optim

namespace volt {
namespace detail {

/// True when this build runs the fused optimizers on CUDA tensors.
bool fused_cuda_available();

/// Why `p` and `grad` cannot take the CUDA path ("" when they can): both dense CUDA tensors of
/// one device, dtype (float, double, half or bfloat16) and shape.
std::string cuda_fusable_reason(const char* component, const char* reference, const at::Tensor& p,
                                const at::Tensor& grad);

/// Throws CheckpointError when a defined state tensor `t` (named `name`) has another element
/// count than its parameter `p`: a checkpoint written for another model.
void check_state_size(const char* component, const char* name, const at::Tensor& t,
                      const at::Tensor& p);

/// `t` as a dense contiguous tensor with p's device, dtype and shape: itself when it already is,
/// zeros when undefined, else a copy (a state loaded from a checkpoint written on another
/// device). Throws CheckpointError when its element count differs from p's.
at::Tensor state_like(const char* component, const char* name, const at::Tensor& t,
                      const at::Tensor& p);

/// A param group's learning rate where the CUDA kernels read it: a float32 scalar on the
/// device (libtorch's tensor-lr kernel overloads). A step captured in a CUDA graph then reads,
/// at every replay, the value last written there, not the value at capture.
struct DeviceLr {
  at::Tensor value;    // float32, 0-dim, on the parameters' device
  double written = 0;  // the host lr it holds
};
/// Per (param group, device index).
using DeviceLrs = std::map<std::pair<size_t, int64_t>, DeviceLr>;

/// True while `device`'s current stream is capturing a CUDA graph.
bool stream_capturing(const at::Device& device);

/// slot.value holding `lr`: made, or filled when the host lr changed (one kernel, no sync).
/// Never during graph capture (a fill would be recorded with the value of the capture and
/// replayed ever after): there the slot is read as it stands, and a missing or stale one is
/// NotAvailable (write it before capturing: the optimizers' sync_lrs_to_device).
const at::Tensor& device_lr(DeviceLr& slot, double lr, const at::Device& device,
                            const char* component);

/// device_lr for param group `group` on `device`: its slot in `lrs`, made on first use.
const at::Tensor& group_lr(DeviceLrs& lrs, size_t group, double lr, const at::Device& device,
                           const char* component);

/// device_lr on every slot of `lrs` with its group's current lr (the optimizers'
/// sync_lrs_to_device).
void sync_device_lrs(DeviceLrs& lrs, const std::vector<torch::optim::OptimizerParamGroup>& groups,
                     const char* component);

struct AdamCudaArgs {
  double beta1, beta2, weight_decay, eps;
  bool amsgrad, decoupled;  // decoupled: AdamW (weight decay on the parameter), else L2 (Adam)
};

/// One fused Adam/AdamW update of every tensor in the lists; `steps` are float32 scalars on the
/// device, incremented here before the update (as torch.optim does); `lr` a DeviceLr's value.
void adam_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
               const at::Tensor& lr, const AdamCudaArgs& args);

/// One fused SGD update; `first_step`: the buffers are new and become the (decayed) gradient;
/// `lr` a DeviceLr's value.
void sgd_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& momentum_buffers, double weight_decay, double momentum,
              const at::Tensor& lr, double dampening, bool nesterov, bool first_step);

/// Total `norm_type` norm of `grads`: a 0-dim tensor on their device, in their dtype, computed
/// there (no host read), as torch::nn::utils::clip_grad_norm_ does.
at::Tensor norm_cuda(const std::vector<at::Tensor>& grads, double norm_type);
/// Scales `grads` in place by min(1, max_norm / (total + 1e-6)), on the device.
void scale_to_max_norm_cuda(const std::vector<at::Tensor>& grads, const at::Tensor& total,
                            double max_norm);

}  // namespace detail
}  // namespace volt
