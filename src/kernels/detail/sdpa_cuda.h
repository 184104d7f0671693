#pragma once
// Private: FusedSDPA on CUDA tensors through libtorch's own fused attention kernels
// (at::scaled_dot_product_attention picks FlashAttention, cuDNN or memory-efficient attention).
// Built with a CUDA libtorch >= 2.1 only; elsewhere available() is false.

#include <ATen/core/Tensor.h>

namespace volt {
namespace detail {

/// True when this build routes CUDA attention to libtorch's fused kernels.
bool sdpa_cuda_available();

/// softmax(q kᵀ · scale, causal top-left) v, with dropout from the CUDA generator; autograd
/// through libtorch. q [B,H,Lq,D], k [B,H,Lk,D], v [B,H,Lk,Dv] on one GPU.
at::Tensor sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout_p, double scale);

}  // namespace detail
}  // namespace volt
