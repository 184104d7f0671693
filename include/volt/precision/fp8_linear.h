#pragma once
/// Fp8Linear: a Linear layer whose matmuls take fp8 operands with per-tensor delayed scaling
/// (the reference's Transformer Engine Linear); output in bf16.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "volt/precision/fp8.h"

namespace volt {

/// y = x W^T + b with x and W rounded to E4M3 after scaling, and the incoming gradient rounded
/// to E5M2 (or E4M3) in backward; fp32 master weights, bf16 output. The scales come from each
/// tensor's amax history (DelayedScalingOptions); histories, scales and the step counter are
/// buffers, so checkpoints carry them and resume is exact. Training steps record amax; eval
/// forwards use the current scales without recording.
///
/// Where it runs: this build emulates fp8 (values on the fp8 grid via fp8_round, products in
/// fp32), bit-exact to the format; it is the reference a native fp8 GEMM is checked against.
class Fp8LinearImpl : public torch::nn::Cloneable<Fp8LinearImpl> {
 public:
  Fp8LinearImpl(int64_t in_features, int64_t out_features, bool bias = true,
                DelayedScalingOptions recipe = {});
  /// Takes over a Linear's weight and bias (copied).
  explicit Fp8LinearImpl(const torch::nn::Linear& from, DelayedScalingOptions recipe = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  const DelayedScalingOptions& recipe() const { return recipe_; }
  /// Current scales: {input, weight, grad_output}.
  at::Tensor scales() const { return scale; }

  at::Tensor weight, bias;
  /// [3, amax_history_len]: rows input, weight, grad_output; newest last.
  at::Tensor amax_history;
  at::Tensor scale;      ///< [3]
  at::Tensor grad_amax;  ///< [1]: max |incoming gradient| over the backwards since the last step
  at::Tensor steps;      ///< [1] int64: training forwards so far

 private:
  int64_t in_, out_;
  bool has_bias_;
  DelayedScalingOptions recipe_;
};
TORCH_MODULE(Fp8Linear);

}  // namespace volt
