#pragma once
// The size rule of the CPU autocast policy: on CPUs where bf16 GEMMs lose to fp32 below some
// size (casts and oneDNN's fixed costs outweigh the faster multiply), GEMMs smaller than the
// measured threshold stay in fp32 and larger ones run in bf16. It covers the three ops a Linear
// layer reaches: aten::linear (at::linear), aten::addmm (torch::nn::Linear on 2-D input with a
// bias: addmm(bias, x, W^T)) and aten::matmul (other inputs: matmul(x, W^T)).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace volt::detail {

/// Multiply-adds of x [..., K] times a [K, N] matrix; -1 when `kn` is not 2-D or K differs.
int64_t gemm_macs(const at::Tensor& x, const at::Tensor& kn);

/// Multiply-adds of linear(x [..., K], weight [N, K]); -1 when the shapes do not fit.
int64_t linear_macs(const at::Tensor& x, const at::Tensor& weight);

/// Registers, for the lifetime of the returned handle, kernels for aten::linear, addmm and
/// matmul (minus those named in `skip`, e.g. because the user's op lists decide them) on the
/// AutocastCPU key that run GEMMs under `min_macs` multiply-adds in fp32 and the rest in
/// autocast's dtype, and makes cpu_gemm_dtype() apply the same rule. Dropping the handle
/// restores the policy underneath.
std::shared_ptr<void> install_cpu_linear_size_rule(int64_t min_macs,
                                                   const std::vector<std::string>& skip);

/// The dtype a CPU-autocast GEMM of `macs` multiply-adds gets now (macs < 0: unknown size):
/// fp32 under the installed rule's threshold, else `lower`.
c10::ScalarType cpu_gemm_dtype(int64_t macs, c10::ScalarType lower);

}  // namespace volt::detail
