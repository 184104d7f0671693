#pragma once
// Private: FusedSDPA on CUDA tensors through libtorch's own fused attention kernels
// (at::scaled_dot_product_attention picks FlashAttention, cuDNN or memory-efficient attention).
// Built with a CUDA libtorch >= 2.1 only; elsewhere available() is false.

#include <ATen/core/Tensor.h>

#include <string>

namespace volt {
namespace detail {

/// True when this build routes CUDA attention to libtorch's fused kernels.
bool sdpa_cuda_available();

/// softmax(q kᵀ · scale, causal top-left) v, with dropout from the CUDA generator; autograd
/// through libtorch. q [B,H,Lq,D], k [B,H,Lk,D], v [B,H,Lk,Dv] on one GPU.
at::Tensor sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout_p, double scale);

/// Why sdpa_cuda_varlen cannot take these tensors (empty when it can): FlashAttention's
/// variable-length kernel needs float16/bfloat16, one head size for q, k and v that is a
/// multiple of 8 and at most 256, and a GPU of compute capability 8.0 or newer.
std::string sdpa_cuda_varlen_unavailable(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v);

/// Causal self-attention over the valid tokens only (FusedSDPA's valid_seq_len): the valid
/// rows of every batch item are packed into one [tokens, H, D] sequence with cumulative offsets
/// and go through FlashAttention's variable-length kernel, so padded positions cost no compute;
/// padded output rows are zeros and get no gradient. q, k, v [B,H,L,D] on one GPU; `lens` a
/// CPU int64 [B] of lengths in [0, L], valid at the start of each row (right padding) or at
/// its end (left padding). Autograd through libtorch (the kernel recomputes in backward).
at::Tensor sdpa_cuda_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& lens, bool left_padding, double dropout_p,
                            double scale);

}  // namespace detail
}  // namespace volt
