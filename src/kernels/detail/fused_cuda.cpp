#include "fused_cuda.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cmath>

#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/version.h"

#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1)
#define VOLT_FUSED_CUDA 1
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#else
#define VOLT_FUSED_CUDA 0
#endif

namespace volt {
namespace detail {

bool fused_cuda_available() {
  return VOLT_FUSED_CUDA != 0;
}

std::string cuda_fusable_reason(const char* component, const char* reference, const at::Tensor& p,
                                const at::Tensor& grad) {
  auto os = detail::c_stream<std::ostringstream>();
  if (!fused_cuda_available()) {
    os << "[" << component << "] a parameter is on " << p.device()
       << "; this build has no fused CUDA kernels (they need libtorch >= 2.1 with CUDA); use "
       << reference << ".";
    return os.str();
  }
  const auto dt = p.scalar_type();
  const bool floating =
      dt == c10::kFloat || dt == c10::kDouble || dt == c10::kHalf || dt == c10::kBFloat16;
  if (p.layout() != c10::kStrided || grad.layout() != c10::kStrided) {
    os << "[" << component << "] a CUDA parameter of shape " << p.sizes()
       << " has a sparse gradient; the fused kernels need dense gradients; use " << reference
       << ".";
  } else if (!floating) {
    os << "[" << component << "] a CUDA parameter of shape " << p.sizes() << " has dtype " << dt
       << "; the fused CUDA kernels support float32, float64, float16 and bfloat16.";
  } else if (grad.device() != p.device() || grad.scalar_type() != dt ||
             !grad.sizes().equals(p.sizes())) {
    os << "[" << component << "] a parameter of shape " << p.sizes() << ", dtype " << dt << " on "
       << p.device() << " has a gradient of shape " << grad.sizes() << ", dtype "
       << grad.scalar_type() << " on " << grad.device()
       << "; gradients must match their parameter.";
  }
  return os.str();
}

void check_state_size(const char* component, const char* name, const at::Tensor& t,
                      const at::Tensor& p) {
  VOLT_CHECK(!t.defined() || t.numel() == p.numel(), CheckpointError, "[", component, "] the ",
             name, " state of a parameter of shape ", p.sizes(), " has ", t.numel(),
             " elements; the checkpoint was written for another model.");
}

at::Tensor state_like(const char* component, const char* name, const at::Tensor& t,
                      const at::Tensor& p) {
  if (!t.defined()) return at::zeros_like(p, at::MemoryFormat::Contiguous);
  check_state_size(component, name, t, p);
  if (t.device() == p.device() && t.scalar_type() == p.scalar_type() && t.is_contiguous() &&
      t.sizes().equals(p.sizes())) {
    return t;
  }
  return t.to(p.device(), p.scalar_type()).reshape(p.sizes()).contiguous();
}

const at::Tensor& group_lr(DeviceLrs& lrs, size_t group, double lr, const at::Device& device,
                           const char* component) {
  return device_lr(lrs[{group, device.index()}], lr, device, component);
}

void sync_device_lrs(DeviceLrs& lrs, const std::vector<torch::optim::OptimizerParamGroup>& groups,
                     const char* component) {
  for (auto& [where, slot] : lrs) {
    device_lr(slot, groups[where.first].options().get_lr(), slot.value.device(), component);
  }
}

#if VOLT_FUSED_CUDA

bool stream_capturing(const at::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

const at::Tensor& device_lr(DeviceLr& slot, double lr, const at::Device& device,
                            const char* component) {
  const bool fresh = !slot.value.defined() || slot.value.device() != device;
  if (!fresh && slot.written == lr) return slot.value;
  VOLT_CHECK(!stream_capturing(device), NotAvailable, "[", component,
             "] the learning rate changed (or was never written to the device) while a CUDA "
             "graph captures the step; call sync_lrs_to_device() before capturing, as the "
             "Trainer's graph_training_step does.");
  if (fresh) {
    slot.value = at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(device));
  } else {
    slot.value.fill_(lr);
  }
  slot.written = lr;
  return slot.value;
}

void adam_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
               const at::Tensor& lr, const AdamCudaArgs& a) {
  if (params.empty()) return;
  at::_foreach_add_(steps, 1);
  if (a.decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, a.beta1,
                      a.beta2, a.weight_decay, a.eps, a.amsgrad, /*maximize=*/false);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, a.beta1,
                     a.beta2, a.weight_decay, a.eps, a.amsgrad, /*maximize=*/false);
  }
}

void sgd_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& momentum_buffers, double weight_decay, double momentum,
              const at::Tensor& lr, double dampening, bool nesterov, bool first_step) {
  if (params.empty()) return;
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening, nesterov,
                  /*maximize=*/false, first_step);
}

at::Tensor norm_cuda(const std::vector<at::Tensor>& grads, double norm_type) {
  // The per-tensor norms in one multi-tensor launch (inf included), then their norm.
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, norm_type);
  return at::linalg_vector_norm(at::stack(norms), norm_type);
}

void scale_to_max_norm_cuda(const std::vector<at::Tensor>& grads, const at::Tensor& total,
                            double max_norm) {
  const at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  at::_foreach_mul_(grads, coef);
}

#else

[[noreturn]] static void no_cuda() {
  VOLT_ASSERT(false, "the fused CUDA path was reached in a build without it");
  std::abort();
}
bool stream_capturing(const at::Device&) {
  return false;
}
const at::Tensor& device_lr(DeviceLr&, double, const at::Device&, const char*) {
  no_cuda();
}
void adam_cuda(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
               const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
               const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, const at::Tensor&,
               const AdamCudaArgs&) {
  no_cuda();
}
void sgd_cuda(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
              const std::vector<at::Tensor>&, double, double, const at::Tensor&, double, bool,
              bool) {
  no_cuda();
}
at::Tensor norm_cuda(const std::vector<at::Tensor>&, double) {
  no_cuda();
}
void scale_to_max_norm_cuda(const std::vector<at::Tensor>&, const at::Tensor&, double) {
  no_cuda();
}

#endif

}  // namespace detail
}  // namespace volt
