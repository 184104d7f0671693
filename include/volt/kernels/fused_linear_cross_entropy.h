#pragma once
/// A language model's output layer and its loss in one op, without the [tokens, vocabulary]
/// logits: cross_entropy(input Wᵀ + b, target) computed chunk by chunk of rows. Each chunk's
/// logits exist only while its loss and its share of the gradients (for input, weight and bias)
/// are computed, in the forward pass; backward only scales those gradients by the incoming one.
/// The plain composition materialises the logits, their float32 copy and the gradient of both:
/// for GPT-2 at batch 16 × 1024 (16,384 rows × 50,257 classes) 3.3 GB in float32 alone. Here
/// the extra memory is one chunk's float32 logits (`chunk_rows` × vocabulary) beside the
/// gradients themselves.
///
///   at::Tensor loss = volt::fused_linear_cross_entropy(hidden.reshape({-1, dim}),
///                                                      lm_head_weight, {}, targets.reshape({-1}));
///
/// The GEMMs go through at::linear / at::mm, so autocast (and volt's CPU GEMM policy) choose
/// their dtype as for the composition: under bf16 autocast the logits are bf16 and the softmax
/// runs in float32, as `cross_entropy(linear(x, W).to(float))` does.
///
/// Differences from the composition, as the gradients are computed in the forward: one backward
/// per forward (a second one, with retain_graph, is a ValueError), and no higher-order
/// gradients (under create_graph the gradients returned carry no graph to the inputs).

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>

namespace volt {

/// How the per-row losses combine.
enum class LossReduction {
  kMean,  ///< the sum over the rows whose target is not ignore_index, divided by their count
  kSum,   ///< the sum over those rows
};

/// Settings of fused_linear_cross_entropy.
struct LinearCrossEntropyOptions {
  /// Rows per chunk, >= 0; 0 picks the most whose float32 logits fit in 256 MiB (at least one
  /// row). Default: 0.
  TORCH_ARG(int64_t, chunk_rows) = 0;
  /// A target equal to it adds nothing to the loss, its row gets no gradient, and it is not
  /// counted by the mean (as torch's cross_entropy). Default: -100.
  TORCH_ARG(int64_t, ignore_index) = -100;
  /// Default: kMean.
  TORCH_ARG(LossReduction, reduction) = LossReduction::kMean;
  /// The GEMMs see the classes padded with zero rows of weight (and bias) to a multiple of this,
  /// so every leading dimension is aligned: GPT-2's 50,257 classes make cuBLAS take slow
  /// unaligned kernels (43% of an H200 step). Costs one padded copy of weight per call, in the
  /// GEMMs' dtype; the loss and gradients are those of the unpadded classes. 0 = automatic: 64
  /// on CUDA when the classes are not a multiple of 8, no padding on the CPU (GPT-2's head on
  /// the reference CPU: the same speed for 1.4x the memory in float32, 4% faster under bf16
  /// autocast); 1 = never. Default: 0.
  TORCH_ARG(int64_t, pad_classes_to) = 0;
};

std::ostream& operator<<(std::ostream& os, const LinearCrossEntropyOptions& o);

/// cross_entropy(linear(input, weight, bias) in float32, target): a 0-dim float32 loss, with
/// autograd to input, weight and bias (those that require it). input [N, D], weight [V, D], bias
/// [V] or undefined, target int64 [N] with values in [0, V) or ignore_index, all on one device.
/// A mean over no counted row is NaN (as torch's), and then every gradient is zero. Throws
/// ValueError for shapes, dtypes or devices that do not fit, and for a target out of range when
/// it is on the CPU (on a GPU, reading it would wait for the device: the gather's device-side
/// check reports it, as in torch's cross_entropy); ConfigError for chunk_rows < 0 or
/// pad_classes_to < 0.
at::Tensor fused_linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight,
                                      const at::Tensor& bias, const at::Tensor& target,
                                      const LinearCrossEntropyOptions& options = {});

/// The composition the fused op is tested against: at::cross_entropy_loss of
/// at::linear(input, weight, bias) cast to float32, with the same ignore_index and reduction.
at::Tensor linear_cross_entropy_reference(const at::Tensor& input, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& target,
                                          const LinearCrossEntropyOptions& options = {});

}  // namespace volt
