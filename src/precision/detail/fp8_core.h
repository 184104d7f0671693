#pragma once
// The two fp8 linear computations shared by Fp8Linear, converted torch::nn::Linear layers and
// fp8 inference: delayed scaling (training) and static scales (quantized inference).

#include <ATen/core/Tensor.h>

#include "volt/precision/fp8.h"

namespace volt::detail {

/// The delayed-scaling state of one fp8 linear; the tensors are the owning module's buffers
/// (so checkpoints carry them): amax_history [3, len] (rows input, weight, grad_output; newest
/// last), scale [3], grad_amax [1], steps [1] int64.
struct Fp8DelayedState {
  at::Tensor amax_history, scale, grad_amax, steps;
  DelayedScalingOptions recipe;
};

/// max |t| in fp32; 0 for an empty tensor (a batch of no rows: nothing to record, and 0 leaves
/// an amax history's maximum as it was).
at::Tensor amax_of(const at::Tensor& t);

/// y = x W^T + b with x, W on the E4M3 grid and the incoming gradient on the E5M2 (or E4M3)
/// grid, scales from the amax history; `training` records this step's amax and advances the
/// recipe. Output bf16.
at::Tensor fp8_linear_delayed(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const Fp8DelayedState& state, bool training);

/// y = x W^T + b with x and W on the E4M3 grid under fixed scales {input, weight} (quantized
/// inference). Output bf16.
at::Tensor fp8_linear_static(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& scales);

}  // namespace volt::detail
